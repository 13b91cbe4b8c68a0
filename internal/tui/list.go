package tui

import (
	"fmt"
	"strings"
	"time"

	"github.com/charmbracelet/lipgloss"
	"github.com/charmbracelet/x/ansi"

	"github.com/kproxy/kproxy/internal/flowview"
	"github.com/kproxy/kproxy/internal/record"
)

// column is one column of the flow list; RESOURCE takes what is left.
type column struct {
	title string
	width int
	right bool
	cell  func(r *record.Record, loc *time.Location) string
}

var listColumns = []column{
	{"TIME", 12, false, func(r *record.Record, loc *time.Location) string { return r.Start.In(loc).Format("15:04:05.000") }},
	{"CALLER", 14, false, func(r *record.Record, _ *time.Location) string { return flowview.Caller(r) }},
	{"VERB", 6, false, func(r *record.Record, _ *time.Location) string { return r.Request.Verb }},
	{"RESOURCE", 0, false, func(r *record.Record, _ *time.Location) string { return flowview.Resource(r) }},
	{"PREDICTED", 25, false, func(r *record.Record, _ *time.Location) string { return flowview.Predicted(r) }},
	{"ACT", 3, true, func(r *record.Record, _ *time.Location) string { return actualStatus(r) }},
	{"", 2, false, func(r *record.Record, _ *time.Location) string { m, _ := flowview.Agreement(r); return m }},
	{"TOTAL", 7, true, func(r *record.Record, _ *time.Location) string { return flowview.Duration(r.Latency.TotalNs) }},
	{"UPSTRM", 7, true, func(r *record.Record, _ *time.Location) string { return flowview.Duration(r.Latency.UpstreamNs) }},
	{"REPLAY", 7, true, func(r *record.Record, _ *time.Location) string { return flowview.Duration(r.Latency.ReplayNs) }},
}

func actualStatus(r *record.Record) string {
	if r.Actual.Status == 0 {
		return "-"
	}
	return fmt.Sprint(r.Actual.Status)
}

// fit pads or truncates s to exactly w cells.
func fit(s string, w int, right bool) string {
	if w <= 0 {
		return ""
	}
	if ansi.StringWidth(s) > w {
		s = ansi.Truncate(s, w, "…")
	}
	pad := w - ansi.StringWidth(s)
	if right {
		return strings.Repeat(" ", pad) + s
	}
	return s + strings.Repeat(" ", pad)
}

// listLayout gives each column its width for the terminal's width:
// RESOURCE, the column that tells flows apart, gets what is left, at
// least minResource cells. When it is narrow REPLAY and UPSTRM go
// first, then PREDICTED and CALLER narrow (to minPredicted and
// minCaller: the status and reason, the user), and then TOTAL goes. No
// row is wider than the terminal, down to the 80 columns the UI needs.
func listLayout(width int) []column {
	const minResource, minPredicted, minCaller = 16, 14, 10
	cols := append([]column(nil), listColumns...)
	used := func() int {
		n := 2 // the cursor and mark
		for _, c := range cols {
			n += c.width + 1
		}
		return n
	}
	// REPLAY and UPSTRM go first; TOTAL stays while PREDICTED and CALLER
	// can narrow instead (a probe at 80 columns missed every latency).
	for used()+minResource > width && len(cols) > 8 {
		cols = cols[:len(cols)-1]
	}
	for _, shrink := range []struct {
		title string
		min   int
	}{{"PREDICTED", minPredicted}, {"CALLER", minCaller}} {
		for i := range cols {
			if over := used() + minResource - width; over > 0 && cols[i].title == shrink.title {
				cols[i].width = max(shrink.min, cols[i].width-over)
			}
		}
	}
	for used()+minResource > width && len(cols) > 7 {
		cols = cols[:len(cols)-1]
	}
	for i := range cols {
		if cols[i].title == "RESOURCE" {
			cols[i].width = max(width-used(), 1)
		}
	}
	return cols
}

// listView renders the visible rows only: cost is per row shown, not per
// flow held.
type listView struct {
	cursor int // index into store.shown
	offset int // first shown row on screen
	follow bool
}

func (l *listView) clamp(n, rows int) {
	if l.follow || l.cursor >= n {
		l.cursor = n - 1
	}
	if l.cursor < 0 {
		l.cursor = 0
	}
	if l.cursor < l.offset {
		l.offset = l.cursor
	}
	if rows > 0 && l.cursor >= l.offset+rows {
		l.offset = l.cursor - rows + 1
	}
	if l.offset > max(n-rows, 0) {
		l.offset = max(n-rows, 0)
	}
}

func (m *Model) renderList(rows int) string {
	cols := listLayout(m.width)
	var b strings.Builder
	b.WriteString("  ")
	for i, c := range cols {
		if i > 0 {
			b.WriteByte(' ')
		}
		b.WriteString(fit(c.title, c.width, c.right))
	}
	out := []string{m.st.header.Render(fit(b.String(), m.width, false))}
	s := m.flows
	m.list.clamp(len(s.shown), rows)
	for i := m.list.offset; i < len(s.shown) && i < m.list.offset+rows; i++ {
		r := s.at(s.shown[i])
		b.Reset()
		cursor, mark := " ", " "
		if i == m.list.cursor {
			cursor = ">"
		}
		if s.marks[r.ID] {
			mark = "*"
		}
		b.WriteString(cursor + mark)
		for j, c := range cols {
			if j > 0 {
				b.WriteByte(' ')
			}
			b.WriteString(fit(c.cell(r, m.opts.Location), c.width, c.right))
		}
		line := fit(b.String(), m.width, false)
		if i == m.list.cursor {
			line = m.st.selected.Render(line)
		} else {
			line = m.rowStyle(r).Render(line)
		}
		out = append(out, line)
	}
	if len(s.shown) == 0 {
		out = append(out, m.st.dim.Render(m.emptyListHint()))
	}
	for len(out) < rows+1 {
		out = append(out, "")
	}
	return strings.Join(out, "\n")
}

func (m *Model) emptyListHint() string {
	switch {
	case len(m.flows.all) > 0:
		return fmt.Sprintf("  no flow matches %q (of %d); / to change the filter, esc to clear it", m.flows.text, len(m.flows.all))
	case m.srcDone:
		return "  " + m.srcName + " holds no flows"
	default:
		return "  waiting for flows from " + m.srcName + " …"
	}
}

// rowStyle colours a row by outcome: a disagreement above all, then the
// actual status class.
func (m *Model) rowStyle(r *record.Record) lipgloss.Style {
	_, kind := flowview.Agreement(r)
	switch {
	case kind == flowview.Mismatch:
		return m.st.mismatch
	case r.Actual.Status >= 500 || r.Actual.Status == 0:
		return m.st.failed
	case r.Actual.Status >= 400:
		return m.st.denied
	case kind == flowview.Unknown:
		return m.st.unknown
	}
	return m.st.ok
}
