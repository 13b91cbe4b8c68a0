package serve

import (
	"context"
	"errors"
	"fmt"
	"time"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"
)

// ReachTimeout bounds Reachable's one request.
const ReachTimeout = 10 * time.Second

// Reachable asks the apiserver for /version, once, and says whether it
// answered at all: any HTTP answer (a 403 for an identity that may not
// read it included) means it is there. Without it, the one-shot commands
// (explain, snapshot, test run --engine cluster) would wait out the
// state's sync (a minute and more) and then blame kproxy's permissions.
func Reachable(ctx context.Context, cfg *rest.Config) error {
	c := rest.CopyConfig(cfg)
	c.Timeout = ReachTimeout
	cs, err := kubernetes.NewForConfig(c)
	if err != nil {
		return fmt.Errorf("the apiserver %s: %w", cfg.Host, err)
	}
	rc := cs.Discovery().RESTClient()
	ctx, cancel := context.WithTimeout(ctx, ReachTimeout)
	defer cancel()
	err = rc.Get().AbsPath("/version").MaxRetries(0).Do(ctx).Error()
	var status apierrors.APIStatus
	if err == nil || errors.As(err, &status) {
		return nil
	}
	return fmt.Errorf("cannot reach the apiserver at %s: %w (check the apiserver address and kubeconfig kproxy was given, and that the apiserver is up)", cfg.Host, err)
}
