package serve

import (
	"bufio"
	"context"
	"fmt"
	"log/slog"
	"regexp"
	"strings"

	"k8s.io/apimachinery/pkg/util/version"
	"k8s.io/apiserver/pkg/util/feature"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"
	"k8s.io/component-base/featuregate"

	"github.com/kproxy/kproxy/internal/stages"
)

// Discovery is what kproxy learnt from the apiserver itself.
type Discovery struct {
	Version  string          // the apiserver's gitVersion
	Features map[string]bool // from kubernetes_feature_enabled on /metrics
}

var featureLine = regexp.MustCompile(`^kubernetes_feature_enabled\{name="([^"]+)",stage="[^"]*"\} ([01])`)

// Discover reads the apiserver's version and, where kproxy's identity may
// read /metrics, its feature gates. It warns when the apiserver's minor
// version differs from the one the replay models.
func Discover(ctx context.Context, cfg *rest.Config, log *slog.Logger) Discovery {
	var d Discovery
	cs, err := kubernetes.NewForConfig(cfg)
	if err != nil {
		return d
	}
	if v, err := cs.Discovery().ServerVersion(); err != nil {
		log.Warn("cannot read the apiserver's /version", "error", err)
	} else {
		d.Version = v.GitVersion
		want := version.MustParseGeneric(stages.KubernetesVersion)
		if got, err := version.ParseGeneric(v.GitVersion); err == nil && (got.Major() != want.Major() || got.Minor() != want.Minor()) {
			log.Warn("the apiserver runs another minor version than the replay models: predictions follow "+stages.KubernetesVersion+" rules",
				"apiserver", v.GitVersion, "replay", stages.KubernetesVersion)
		}
	}
	body, err := cs.CoreV1().RESTClient().Get().AbsPath("/metrics").DoRaw(ctx)
	if err != nil {
		log.Info("cannot read the apiserver's feature gates from /metrics; using --feature-gates and v1.37 defaults", "error", firstLine(err.Error()))
		return d
	}
	d.Features = map[string]bool{}
	sc := bufio.NewScanner(strings.NewReader(string(body)))
	sc.Buffer(make([]byte, 1<<20), 1<<20)
	for sc.Scan() {
		if m := featureLine.FindStringSubmatch(sc.Text()); m != nil {
			d.Features[m[1]] = m[2] == "1"
		}
	}
	return d
}

// ApplyFeatures sets the replay's feature gates to what the apiserver
// reports, except the gates given with --feature-gates (those win), and
// gates kproxy does not know or cannot change (locked to their default).
func ApplyFeatures(d Discovery, given map[string]bool, log *slog.Logger) {
	known := feature.DefaultMutableFeatureGate.GetAll()
	changed := map[string]bool{}
	for name, on := range d.Features {
		if _, ok := given[name]; ok {
			continue
		}
		if _, ok := known[featureName(name)]; !ok {
			continue
		}
		if feature.DefaultFeatureGate.Enabled(featureName(name)) != on {
			changed[name] = on
		}
	}
	for name, on := range changed {
		if err := feature.DefaultMutableFeatureGate.SetFromMap(map[string]bool{name: on}); err != nil {
			log.Warn("cannot mirror the apiserver's feature gate", "gate", name, "enabled", on, "error", err)
			delete(changed, name)
		}
	}
	if len(changed) > 0 {
		log.Info("mirrored the apiserver's feature gates", "gates", fmt.Sprint(changed))
	}
}

func firstLine(s string) string {
	l, _, _ := strings.Cut(s, "\n")
	return l
}

// featureName converts for the feature gate maps.
func featureName(s string) featuregate.Feature { return featuregate.Feature(s) }
