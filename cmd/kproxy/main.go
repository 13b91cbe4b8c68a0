// Command kproxy is a request-path tracing and debugging proxy for
// Kubernetes: it sits in front of a kube-apiserver, forwards every request
// untouched, replays it through the apiserver's stages to say which layer
// decides it and why, and traces each stage with OpenTelemetry.
package main

import (
	"context"
	"errors"
	"fmt"
	"os"
	"os/signal"
	"runtime"
	"syscall"

	"github.com/spf13/cobra"
)

// version is set by the Makefile.
var version = "dev"

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	go func() {
		// The first signal stops kproxy gracefully (a bounded flush); once
		// it is taken, a second one ends the process at once.
		<-ctx.Done()
		stop()
	}()
	if err := newRootCommand().ExecuteContext(ctx); err != nil {
		var code exitCode
		if errors.As(err, &code) {
			os.Exit(int(code))
		}
		fmt.Fprintln(os.Stderr, "kproxy:", err)
		os.Exit(1)
	}
}

// exitCode ends kproxy with that status and no message: the command has
// said what it had to (kproxy explain's verdicts).
type exitCode int

func (c exitCode) Error() string { return fmt.Sprintf("exit status %d", int(c)) }

func newRootCommand() *cobra.Command {
	root := &cobra.Command{
		Use:   "kproxy",
		Short: "Trace and explain every request to a Kubernetes apiserver",
		Long: `kproxy sits in front of a kube-apiserver and terminates TLS. For every
request it forwards the request unchanged and records what the apiserver
answered, replays it through the apiserver's own stages (authentication,
impersonation, flowcontrol, authorization, decode, mutating admission,
validation, validating admission, storage) to say which one decides it and
why, and exports one OpenTelemetry span per stage.`,
		SilenceUsage:  true,
		SilenceErrors: true,
	}
	root.AddCommand(newServeCommand(), newExplainCommand(), newTestCommand(), newSnapshotCommand(), newDecodeCommand(), newEtcdCommand(), newKubeconfigCommand(), newDemoCommand(), newTUICommand(), newFlowsCommand(), newVersionCommand())
	return root
}

func newVersionCommand() *cobra.Command {
	cmd := &cobra.Command{
		Use:   "version",
		Short: "Print kproxy's version and the Kubernetes version its replay models",
		Args:  cobra.NoArgs,
	}
	out := newOutputFlags("text", "text")
	out.addFlags(cmd.Flags())
	cmd.RunE = func(cmd *cobra.Command, _ []string) error {
		if out.isHuman() {
			fmt.Fprintf(cmd.OutOrStdout(), "kproxy %s (replays Kubernetes %s)\n", version, kubeVersion)
			return nil
		}
		if err := out.validate(); err != nil {
			return err
		}
		// As kubectl version -o json names its parts.
		return out.printDocument(cmd.OutOrStdout(), "Version", map[string]string{"kproxyVersion": version, "kubernetesVersion": kubeVersion, "goVersion": runtime.Version()})
	}
	return cmd
}
