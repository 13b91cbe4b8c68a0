package tui

import (
	"fmt"
	"strings"
	"unicode/utf8"

	"github.com/charmbracelet/lipgloss"

	"github.com/kproxy/kproxy/internal/flowview"
	"github.com/kproxy/kproxy/internal/record"
)

// waterfallRow is one bar: a stage or one of its children.
type waterfallRow struct {
	label    string
	outcome  string
	off, dur int64
	depth    int
	blank    bool // a stage not reached: no bar
}

// waterfallRows lays the stages and their children on the replay's time
// axis. Stages carry their offset; records written before offsets existed,
// and children (which run one after another inside their stage), are laid
// end to end.
func waterfallRows(stages []record.StageResult) (rows []waterfallRow, total int64) {
	var cursor int64
	for _, s := range stages {
		off := s.OffsetNs
		if off == 0 && s.DurationNs > 0 {
			off = cursor
		}
		rows = append(rows, waterfallRow{s.Name, s.Outcome, off, s.DurationNs, 0, s.Outcome == record.Skip && s.DurationNs == 0})
		c := off
		for _, ch := range s.Children {
			rows = append(rows, waterfallRow{ch.Name, ch.Outcome, c, ch.DurationNs, 1, false})
			c += ch.DurationNs
		}
		if end := off + s.DurationNs; end > cursor {
			cursor = end
		}
		if c > cursor {
			cursor = c
		}
	}
	return rows, cursor
}

// bar draws [off, off+dur) of total on width cells; a zero-length span is
// a dot where it happened.
func bar(off, dur, total int64, width int) string {
	if total <= 0 || width <= 0 {
		return strings.Repeat(" ", max(width, 0))
	}
	from := int(off * int64(width) / total)
	to := int((off + dur) * int64(width) / total)
	from = min(max(from, 0), width-1)
	to = min(max(to, from), width)
	cells := []rune(strings.Repeat(" ", width))
	if to == from {
		cells[from] = '·'
	} else {
		for i := from; i < to; i++ {
			cells[i] = '█'
		}
	}
	return string(cells)
}

func (m *Model) barStyle(outcome string) lipgloss.Style {
	switch outcome {
	case record.Pass:
		return m.st.barPass
	case record.Reject:
		return m.st.barReject
	case record.Error:
		return m.st.barError
	case "upstream":
		return m.st.barUpstream
	}
	return m.st.barSkip
}

// renderWaterfall is the Stages tab: the request's own times (total and
// upstream, as kproxy saw them), then the replay's stages and children on
// one time axis, each with its outcome and duration.
func (m *Model) renderWaterfall(r *record.Record, width int) string {
	const labelW, outcomeW, durW = 24, 7, 8
	barW := max(width-labelW-outcomeW-durW-4, 10)
	var b strings.Builder
	line := func(label, outcome string, off, dur, total int64, depth int, blank bool) {
		l := strings.Repeat("  ", depth+1) + label
		shown := outcome
		if outcome == "upstream" {
			shown = ""
		}
		drawn := strings.Repeat(" ", barW)
		if !blank {
			drawn = bar(off, dur, total, barW)
		}
		fmt.Fprintf(&b, "%s %s %s %s\n", fit(l, labelW, false), m.barStyle(outcome).Render(drawn),
			fit(shown, outcomeW, false), fit(flowview.Duration(dur), durW, true))
	}
	axis := func(total int64) string {
		end := flowview.Duration(total)
		return fit("", labelW, false) + " 0" + strings.Repeat("─", max(barW-2-utf8.RuneCountInString(end), 1)) + " " + end + "\n"
	}

	b.WriteString(m.st.title.Render("The request, as kproxy saw it") + "\n")
	total := max(r.Latency.TotalNs, r.Latency.UpstreamNs)
	b.WriteString(axis(total))
	line("total", "", 0, r.Latency.TotalNs, total, 0, false)
	line("upstream (apiserver)", "upstream", 0, r.Latency.UpstreamNs, total, 0, false)
	b.WriteString("\n")

	if r.Server != nil {
		m.renderServer(&b, r.Server, width)
	}

	rows, replayTotal := waterfallRows(r.Stages)
	if r.Latency.ReplayNs > replayTotal {
		replayTotal = r.Latency.ReplayNs
	}
	b.WriteString(m.st.title.Render("kproxy's replay (its own cost, not the apiserver's time)") + "\n")
	b.WriteString(axis(replayTotal))
	for _, row := range rows {
		line(row.label, row.outcome, row.off, row.dur, replayTotal, row.depth, row.blank)
	}
	if len(rows) == 0 {
		b.WriteString("  (no stages recorded)\n")
	}
	if r.Server == nil {
		b.WriteString("\n" + m.st.hint.Render("Where the apiserver itself spent the time needs its own spans (kproxy serve --otlp-receiver-listen) or audit annotations (--audit-webhook-listen); the replay's bars are kproxy's."))
	}
	return b.String()
}

// renderServer draws the apiserver's own layers: from its spans, on its
// time axis (duration bars, with each layer's self time); from audit
// annotations (self times only), end to end.
func (m *Model) renderServer(b *strings.Builder, s *record.Server, width int) {
	const labelW, durW = 40, 8
	barW := max(width-labelW-2*durW-4, 10)
	from := "its spans"
	if s.Source == record.ServerFromAudit {
		from = "its audit annotations: self times, only for slow requests"
	}
	b.WriteString(m.st.title.Render("The apiserver's own time (from "+from+")") + "\n")
	if s.Summary != "" {
		b.WriteString("  " + s.Summary + "\n")
	}
	end := flowview.Duration(s.TotalNs)
	fmt.Fprintf(b, "%s 0%s %s %s %s\n", fit("", labelW, false), strings.Repeat("─", max(barW-2-utf8.RuneCountInString(end), 1)), end,
		fit("self", durW, true), fit("total", durW, true))
	var cursor int64
	for _, l := range s.Layers {
		off, dur := l.OffsetNs, l.DurationNs
		if s.Source == record.ServerFromAudit {
			off, dur = cursor, l.SelfNs
			cursor += l.SelfNs
		}
		fmt.Fprintf(b, "%s %s %s %s\n", fit(strings.Repeat("  ", l.Depth+1)+l.Name, labelW, false),
			m.st.barUpstream.Render(bar(off, dur, s.TotalNs, barW)),
			fit(flowview.Duration(l.SelfNs), durW, true), fit(flowview.Duration(l.DurationNs), durW, true))
	}
	b.WriteString("\n")
}
