package tui

import (
	"context"

	tea "github.com/charmbracelet/bubbletea"

	"github.com/kproxy/kproxy/internal/source"
)

// Run shows the TUI on the terminal until the user quits or ctx ends. The
// source runs in its own goroutine; its events reach the model in batches.
// inputTTY reads keys from the terminal itself (when stdin carries flows).
func Run(ctx context.Context, opts Options, inputTTY bool) error {
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	events := make(chan source.Event, 64)
	srcErr := make(chan error, 1)
	go func() {
		defer close(events)
		srcErr <- opts.Source.Run(ctx, events)
	}()
	m := New(opts, events)
	popts := []tea.ProgramOption{tea.WithContext(ctx), tea.WithAltScreen()}
	if inputTTY {
		popts = append(popts, tea.WithInputTTY())
	}
	p := tea.NewProgram(m, popts...)
	go func() {
		// A source that fails (a file that cannot be read) is reported in
		// the status bar; the flows already read stay on screen.
		if err := <-srcErr; err != nil && ctx.Err() == nil {
			p.Send(actionDone{err: err})
		}
	}()
	_, err := p.Run()
	if err == tea.ErrProgramKilled && ctx.Err() != nil {
		return nil
	}
	return err
}
