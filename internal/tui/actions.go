package tui

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"time"

	tea "github.com/charmbracelet/bubbletea"

	"github.com/kproxy/kproxy/internal/filter"
	"github.com/kproxy/kproxy/internal/flowview"
	"github.com/kproxy/kproxy/internal/record"
)

func asSyntax(err error, se **filter.SyntaxError) bool { return errors.As(err, se) }

// commandHelp lists the `:` commands.
const commandHelp = `:export har FILE     write the marked flows (or, with none marked, the filtered ones) as HAR 1.2
:export jsonl FILE   the same, as a capture file kproxy tui can open again
:filter EXPR         set the filter (as /)
:replay-filter [EXPR] show or set what the live kproxy replays (:replay-all: every request)
:follow              follow the newest flow
:unmark              clear all marks
:q, :quit            quit`

// runCommand runs a `:` command line.
func (m *Model) runCommand(line string) tea.Cmd {
	f := strings.Fields(line)
	if len(f) == 0 {
		return nil
	}
	switch f[0] {
	case "q", "quit":
		return tea.Quit
	case "export":
		format, path, err := exportArgs(line)
		if err != nil {
			m.setMessage(err.Error(), true)
			return nil
		}
		recs := m.flows.selection()
		if len(recs) == 0 {
			m.setMessage("nothing to export: no flow is marked or matches the filter", true)
			return nil
		}
		version := m.opts.Version
		what := "filtered"
		if len(m.flows.marks) > 0 {
			what = "marked"
		}
		return func() tea.Msg {
			if err := exportFile(format, path, recs, version); err != nil {
				return actionDone{err: err}
			}
			return actionDone{message: fmt.Sprintf("exported %d %s flows to %s (%s)", len(recs), what, path, format)}
		}
	case "filter":
		return m.startFilter(strings.TrimSpace(strings.TrimPrefix(line, "filter")))
	case "follow":
		m.list.follow = true
		m.inDetail = false
		return nil
	case "unmark":
		m.flows.marks = map[string]bool{}
		m.setMessage("marks cleared", false)
		return nil
	case "help":
		m.showHelp = true
		return nil
	case "replay-filter":
		return m.replayFilter(strings.TrimSpace(strings.TrimPrefix(line, "replay-filter")), len(f) > 1)
	case "replay-all":
		return m.replayFilter("", true)
	}
	m.setMessage(fmt.Sprintf("unknown command %q: use export, filter, follow, unmark, replay-filter, replay-all, quit (? lists them)", f[0]), true)
	return nil
}

// replayFilter shows the live kproxy's replay filter, or, with set,
// changes it to expr ("" replays every request).
func (m *Model) replayFilter(expr string, set bool) tea.Cmd {
	rf := m.opts.ReplayFilter
	if rf == nil {
		m.setMessage("the replay filter is the live kproxy's: kproxy tui --connect URL (a capture file replays nothing)", true)
		return nil
	}
	return func() tea.Msg {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		get := rf.ReplayFilter
		if set {
			get = func(ctx context.Context) (string, error) { return rf.SetReplayFilter(ctx, expr) }
		}
		now, err := get(ctx)
		if err != nil {
			return actionDone{err: fmt.Errorf("replay filter: %w", err)}
		}
		if now == "" {
			return actionDone{message: "kproxy replays every request"}
		}
		return actionDone{message: "kproxy replays only: " + now + " (the others are recorded, not replayed; :replay-all undoes)"}
	}
}

// rerun asks the live kproxy to replay the focused flow now, and shows
// what changed since it was recorded.
func (m *Model) rerun() tea.Cmd {
	r := m.focused()
	if r == nil {
		return nil
	}
	if m.opts.Replayer == nil {
		m.setMessage("re-running needs a live kproxy: kproxy tui --connect URL (a capture file holds no credentials to replay with)", true)
		return nil
	}
	rp := m.opts.Replayer
	m.setMessage("re-running the replay of "+r.ID+"…", false)
	return func() tea.Msg {
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		now, err := rp.Replay(ctx, r.ID)
		if err != nil {
			return actionDone{err: fmt.Errorf("re-run %s: %w", r.ID, err)}
		}
		return actionDone{message: "re-ran " + r.ID + " (a dry replay, never forwarded)", popup: rerunDiff(r, now)}
	}
}

// rerunDiff says what changed between the recorded replay and one run now.
func rerunDiff(then, now *record.Record) string {
	var b strings.Builder
	b.WriteString("Re-run of " + then.Request.Method + " " + flowview.Resource(then) + " (a dry replay now; nothing was forwarded)\n\n")
	fmt.Fprintf(&b, "  then: %-28s recorded %s\n", flowview.Predicted(then), then.Start.Format(time.RFC3339))
	fmt.Fprintf(&b, "  now:  %-28s\n", flowview.Predicted(now))
	fmt.Fprintf(&b, "  the apiserver answered then: %s\n\n", actualStatus(then))
	changed := 0
	nowByName := map[string]record.StageResult{}
	for _, s := range now.Stages {
		nowByName[s.Name] = s
	}
	for _, s := range then.Stages {
		n, ok := nowByName[s.Name]
		// An explanation quoting an error list may list it in another
		// order, or name another of several culprits, as the apiserver
		// does (record.SameMessageAt).
		if !ok || (n.Outcome == s.Outcome && record.SameMessageAt(s.Name, n.Explanation, s.Explanation)) {
			continue
		}
		changed++
		fmt.Fprintf(&b, "  %s: %s -> %s\n", s.Name, s.Outcome, n.Outcome)
		if !record.SameMessageAt(s.Name, n.Explanation, s.Explanation) {
			fmt.Fprintf(&b, "    now: %s\n", firstLine(n.Explanation, 100))
		}
	}
	if changed == 0 {
		b.WriteString("  every stage decides as it did then\n")
	}
	b.WriteString("\n(any key closes)")
	return b.String()
}

// copyFlow shows the focused flow as curl and kubectl commands and puts
// them on the clipboard when the terminal takes OSC 52.
func (m *Model) copyFlow() tea.Cmd {
	r := m.focused()
	if r == nil {
		return nil
	}
	text := copyText(r)
	m.popup = "Copied (credentials are placeholders: set $APISERVER, $CA and $TOKEN or $CERT/$KEY)\n\n" + text + "\n\n(any key closes)"
	if m.opts.Clipboard != nil {
		clip := m.opts.Clipboard
		return func() tea.Msg { clip(text); return nil }
	}
	return nil
}

// exportArgs reads ":export FORMAT FILE": the file is the rest of the
// line (spaces kept), quoted or not, a leading ~/ the home directory.
func exportArgs(line string) (format, path string, err error) {
	rest := strings.TrimSpace(strings.TrimPrefix(strings.TrimSpace(line), "export"))
	format, path, _ = strings.Cut(rest, " ")
	path = strings.TrimSpace(path)
	if len(path) >= 2 && (path[0] == '"' || path[0] == '\'') && path[len(path)-1] == path[0] {
		path = path[1 : len(path)-1]
	}
	switch {
	case format == "" || path == "":
		return "", "", errors.New(":export wants a format and a file: :export har flows.har, or :export jsonl flows.jsonl")
	case format != "har" && format != "jsonl":
		return "", "", fmt.Errorf(":export %s: not a format; har (HAR 1.2) or jsonl (a capture kproxy tui can open)", format)
	}
	if p, ok := strings.CutPrefix(path, "~/"); ok {
		home, err := os.UserHomeDir()
		if err != nil {
			return "", "", fmt.Errorf(":export %s: ~ is not known here (%v); give the whole path", path, err)
		}
		path = filepath.Join(home, p)
	}
	return format, path, nil
}
