package main

import (
	"fmt"
	"log/slog"
	"os"
	"strings"

	"github.com/spf13/cobra"
	"github.com/spf13/pflag"
	corev1 "k8s.io/api/core/v1"
	"sigs.k8s.io/yaml"

	"github.com/kproxy/kproxy/internal/stages/apiserver"
)

// apiserverConfig is how a command learns the apiserver's configuration:
// the kube-apiserver flags kproxy mirrors, given as the apiserver has them,
// or read from its static-pod manifest (flags given on kproxy's command
// line win). kube-apiserver's own option structs parse them.
type apiserverConfig struct {
	opts     *apiserver.Options
	manifest string
	flags    *pflag.FlagSet // where the mirrored flags were added
}

func newAPIServerConfig() *apiserverConfig {
	return &apiserverConfig{opts: apiserver.NewOptions()}
}

// addFlags gives cmd its flags in two groups for --help: own (kproxy's,
// with --apiserver-manifest and the replay's knobs added when replay is
// set) and the mirrored kube-apiserver flags. Every other kube-apiserver
// flag is accepted, hidden, and reported as unused, so an apiserver's flag
// list can be handed over as is; any other flag is an error naming the
// nearest real one (a mistyped --token must never silently run as someone
// else). A command with subcommands gets them as persistent flags.
func (a *apiserverConfig) addFlags(cmd *cobra.Command, own *pflag.FlagSet, manifestUsage string, replay bool) {
	own.StringVar(&a.manifest, "apiserver-manifest", "", manifestUsage)
	if replay {
		a.opts.AddReplayFlags(own)
	}
	mirrored := pflag.NewFlagSet("kube-apiserver", pflag.ContinueOnError)
	a.opts.AddFlags(mirrored)
	fs := cmd.Flags()
	if cmd.HasSubCommands() || cmd.Run == nil && cmd.RunE == nil {
		fs = cmd.PersistentFlags()
	}
	fs.AddFlagSet(own)
	fs.AddFlagSet(mirrored)
	apiserver.AddOtherAPIServerFlags(fs)
	a.flags = fs
	cmd.SetFlagErrorFunc(flagError)
	cmd.SetUsageFunc(func(c *cobra.Command) error {
		w := c.OutOrStderr()
		fmt.Fprintf(w, "Usage:\n  %s\n", c.UseLine())
		if c.HasAvailableSubCommands() {
			fmt.Fprintf(w, "\nCommands:\n")
			for _, sub := range c.Commands() {
				if sub.IsAvailableCommand() {
					fmt.Fprintf(w, "  %-8s %s\n", sub.Name(), sub.Short)
				}
			}
		}
		if local := c.LocalNonPersistentFlags(); local.HasAvailableFlags() && c != cmd {
			fmt.Fprintf(w, "\nFlags:\n%s", local.FlagUsages())
		}
		fmt.Fprintf(w, "\nkproxy flags:\n%s\n", own.FlagUsages())
		fmt.Fprintf(w, "kube-apiserver flags kproxy mirrors (parsed by kube-apiserver's own options; give them as the apiserver has them, or use --apiserver-manifest;\nother kube-apiserver flags are accepted and ignored):\n%s", mirrored.FlagUsages())
		return nil
	})
}

// load reads the manifest, when given, reports the kube-apiserver flags
// kproxy accepted without using, and completes the options as
// kube-apiserver does (complete: false leaves validation to the caller,
// for commands that need only part of the configuration).
func (a *apiserverConfig) load(log *slog.Logger, complete bool) error {
	if a.manifest != "" {
		args, err := manifestArgs(a.manifest)
		if err != nil {
			return err
		}
		ignored, err := a.opts.ParseAPIServerArgs(a.flags, args)
		if err != nil {
			return fmt.Errorf("--apiserver-manifest=%s: %w", a.manifest, err)
		}
		log.Info("read the apiserver's flags from its manifest", "file", a.manifest, "ignored", len(ignored))
		log.Debug("apiserver flags in the manifest kproxy does not mirror", "flags", strings.Join(ignored, " "))
	}
	if ignored := apiserver.GivenOtherAPIServerFlags(a.flags); len(ignored) > 0 {
		log.Info("kube-apiserver flags kproxy does not use (ignored)", "flags", strings.Join(ignored, " "))
	}
	if complete {
		return a.opts.Complete()
	}
	return nil
}

// flagError names the nearest real flag for a mistyped one.
func flagError(c *cobra.Command, err error) error {
	if name, ok := strings.CutPrefix(err.Error(), "unknown flag: --"); ok {
		if near := nearestFlag(c.Flags(), name); near != "" {
			return fmt.Errorf("%w (did you mean --%s?); see %s --help", err, near, c.CommandPath())
		}
		return fmt.Errorf("%w: it is neither a kproxy flag nor a kube-apiserver flag; see %s --help", err, c.CommandPath())
	}
	return fmt.Errorf("%w; see %s --help", err, c.CommandPath())
}

// nearestFlag is the visible flag whose name is closest to name, if it
// is close enough to be a typo.
func nearestFlag(fs *pflag.FlagSet, name string) string {
	best, bestD := "", 3
	fs.VisitAll(func(f *pflag.Flag) {
		if f.Hidden {
			return
		}
		if d := editDistance(name, f.Name); d < bestD {
			best, bestD = f.Name, d
		}
	})
	return best
}

// editDistance is the Levenshtein distance of a and b.
func editDistance(a, b string) int {
	prev := make([]int, len(b)+1)
	for j := range prev {
		prev[j] = j
	}
	for i := 1; i <= len(a); i++ {
		cur := make([]int, len(b)+1)
		cur[0] = i
		for j := 1; j <= len(b); j++ {
			cost := 1
			if a[i-1] == b[j-1] {
				cost = 0
			}
			cur[j] = min(prev[j]+1, cur[j-1]+1, prev[j-1]+cost)
		}
		prev = cur
	}
	return prev[len(b)]
}

// manifestArgs reads the kube-apiserver container's command line from a
// static-pod manifest.
func manifestArgs(path string) ([]string, error) {
	b, err := os.ReadFile(path)
	if err != nil {
		return nil, fmt.Errorf("--apiserver-manifest: %w", err)
	}
	var pod corev1.Pod
	if err := yaml.Unmarshal(b, &pod); err != nil {
		return nil, fmt.Errorf("--apiserver-manifest=%s is not a Pod manifest: %w", path, err)
	}
	for _, c := range pod.Spec.Containers {
		if c.Name == "kube-apiserver" || len(pod.Spec.Containers) == 1 {
			return append(append([]string{}, c.Command...), c.Args...), nil
		}
	}
	return nil, fmt.Errorf("--apiserver-manifest=%s has no kube-apiserver container", path)
}
