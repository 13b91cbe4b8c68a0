// Package tui is kproxy's terminal UI, the incident cockpit: a live list of
// flows (one per capture record), a filter language, and a detail view with
// the verdict, the stage waterfall, the request, the response and the trace.
//
// It consumes records only: from a capture file, stdin, or a running
// kproxy's flow API (internal/source), and it asks that API, never the
// replay itself, to re-run a request. It never imports the proxy or the
// stages.
//
// The shape follows the bubbletea apps incident responders already know
// (k9s, gh-dash, soft-serve): one Model owning small components, each with
// a View that is a pure function of its state and a size, so every screen
// is a golden string in the tests. Update never does I/O: reading a
// source, filtering a large list, exporting and re-running are tea.Cmds
// whose results come back as messages. Only the visible rows of the flow
// list are rendered, and source events arrive in batches, so 100,000 flows
// and a feed of thousands a second stay smooth (bubbletea itself coalesces
// frames). Styles come from one lipgloss.Renderer, injected, so tests pin
// the ASCII colour profile without touching globals.
package tui
