package apiserver

import (
	"context"
	"fmt"
	"net/http"
	"slices"

	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/client-go/informers"

	"github.com/kproxy/kproxy/internal/record"
)

// LimitRanger applies the LimitRanges of a request's namespace in the
// order its lister returns them: the namespace index's set, walked as a
// Go map, drawn again for every request. With two or more the outcome can
// hang on the draw: the first LimitRange to give a container a default
// request or limit sets it (the others find it set), and the first that
// refuses is the one reported. Two LimitRanges, one defaulting a CPU
// limit of 2, the other capping CPU at 1 with a default of 500m: the same
// pod create is admitted or refused as the draw goes. The apiserver and
// the replay draw apart. So a verdict LimitRanger decided, where the
// apiserver answered otherwise and the namespace has several
// LimitRanges, is unknown.

// limitRangesIn counts a namespace's LimitRanges as the replay's
// LimitRanger lists them; nil when the plugin is not enabled.
type limitRangesIn func(namespace string) int

func newLimitRangesIn(f informers.SharedInformerFactory, plugins []string) limitRangesIn {
	if !slices.Contains(plugins, "LimitRanger") {
		return nil
	}
	lister := f.Core().V1().LimitRanges().Lister()
	return func(namespace string) int {
		items, err := lister.LimitRanges(namespace).List(labels.Everything())
		if err != nil {
			return 0
		}
		return len(items)
	}
}

// limitRangeOrder says why, for a namespace with n LimitRanges.
func limitRangeOrder(n int) string {
	return fmt.Sprintf("LimitRanger applies a namespace's LimitRanges in an order it draws again for each request "+
		"(the first to default a request or limit sets it, the first to refuse is reported), and this namespace has %d, "+
		"so the apiserver's draw, and with it the outcome, is not known", n)
}

// limitRangeOrderHere says why the replay's refusal by LimitRanger,
// where the apiserver answered otherwise, is not a prediction, or "".
func (r *Run) limitRangeOrderHere(ctx context.Context) string {
	if r.PluginErrName != "LimitRanger" || r.actual == nil || r.limitRanges == nil || r.Status == nil {
		return ""
	}
	aw, ok := r.actual(ctx)
	switch {
	case !ok || aw.Status == http.StatusTooManyRequests:
		return ""
	case aw.Refusal != nil && aw.Status == r.Code && aw.Refusal.Message == r.Status.Message:
		return "" // refused alike
	}
	n := r.limitRanges(r.namespace)
	if n < 2 {
		return ""
	}
	answered := fmt.Sprintf("admitted the write (%d)", aw.Status)
	if aw.Refusal != nil {
		answered = fmt.Sprintf("refused it otherwise (%d: %s)", aw.Status, aw.Refusal.Message)
	}
	return fmt.Sprintf("the replay's LimitRanger refused the write (%d: %s), and the apiserver %s: %s",
		r.Code, r.Status.Message, answered, limitRangeOrder(n))
}

// limitRangeOrderThere says why the replay's admission of a write the
// apiserver's LimitRanger refused (aw) is not a prediction, or "".
func (r *Run) limitRangeOrderThere(aw Answer) string {
	if r.limitRanges == nil || aw.Refusal == nil || aw.Status != http.StatusForbidden || !record.LimitRangerRefusal(aw.Refusal.Message) {
		return ""
	}
	n := r.limitRanges(r.namespace)
	if n < 2 {
		return ""
	}
	return fmt.Sprintf("the apiserver's LimitRanger refused the write (%d: %s), and the replay's admits it: %s",
		aw.Status, aw.Refusal.Message, limitRangeOrder(n))
}
