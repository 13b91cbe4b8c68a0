package main

import (
	"errors"
	"os"

	osc52 "github.com/aymanbagabas/go-osc52/v2"
	"github.com/spf13/cobra"
	"golang.org/x/term"

	"github.com/kproxy/kproxy/internal/filter"
	"github.com/kproxy/kproxy/internal/source"
	"github.com/kproxy/kproxy/internal/tui"
)

func newTUICommand() *cobra.Command {
	var api flowAPIFlags
	var jaegerURL, filterExpr string
	var maxFlows int
	cmd := &cobra.Command{
		Use:   "tui [FILE|-]",
		Short: "The incident cockpit: watch flows live, filter them, open one to see which stage decides it and why",
		Long: `Show kproxy's flows in the terminal: live from a running kproxy serve (its
flow API, --api-listen, by default ` + defaultFlowAPI + `), or from a capture
file, followed like tail -F (through truncation and rotation; a rotated
file gzipped by --capture-compress is read as it is), or from stdin (-).

The list shows each flow's caller, verb, resource, the predicted verdict
(403 @authorization), the apiserver's actual status, whether they agree
(= match, != mismatch, ? unknown) and the latencies. enter opens a flow:
its verdict and the deciding stage's explanation, the stage waterfall
(kproxy's replay on one time axis), the request, the response and the
trace. ? lists the keys, / filters, : runs a command (:export har FILE).

` + filter.Help,
		Example: `  kproxy tui                                   # the local kproxy serve
  kproxy tui --connect https://kproxy.example:7070 --token-file api-token
  kproxy tui capture.jsonl --filter '~c 403 | ~x'
  kubectl logs deploy/kproxy | kproxy tui -`,
		Args: cobra.MaximumNArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			if _, err := parseFilter(cmd, filterExpr); err != nil {
				return err
			}
			if !term.IsTerminal(int(os.Stdout.Fd())) {
				return errors.New("kproxy tui needs a terminal on stdout; for scripts and pipes use kproxy flows (same sources, --filter and -o)")
			}
			opts := tui.Options{JaegerURL: jaegerURL, MaxFlows: maxFlows, Version: version, Filter: filterExpr,
				Clipboard: func(s string) { _, _ = osc52.New(s).WriteTo(os.Stderr) }}
			inputTTY := false
			switch {
			case len(args) == 1 && api.connect != "":
				return errors.New("give a FILE or --connect, not both")
			case len(args) == 1 && args[0] == "-":
				opts.Source = source.Reader("stdin", cmd.InOrStdin())
				inputTTY = true // keys come from the terminal, flows from stdin
			case len(args) == 1:
				opts.Source = source.File(args[0], true)
			default:
				c, err := api.client()
				if err != nil {
					return err
				}
				opts.Source, opts.Replayer, opts.ReplayFilter = source.Named(api.url(), source.API(c, "")), c, c
			}
			return tui.Run(cmd.Context(), opts, inputTTY)
		},
	}
	api.addFlags(cmd.Flags())
	fs := cmd.Flags()
	fs.StringVar(&jaegerURL, "jaeger-url", os.Getenv("KPROXY_JAEGER_URL"), "link each flow's trace into this Jaeger UI (e.g. http://localhost:16686); default $KPROXY_JAEGER_URL")
	fs.StringVar(&filterExpr, "filter", "", "start with this filter (the language below)")
	fs.IntVar(&maxFlows, "max-flows", 100_000, "flows held in memory; the oldest go first past it")
	return cmd
}
