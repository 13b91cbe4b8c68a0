package tui

import (
	"fmt"
	"strings"

	"github.com/charmbracelet/bubbles/key"
	"github.com/charmbracelet/lipgloss"

	"github.com/kproxy/kproxy/internal/filter"
)

// View renders the screen: the list or the open flow, then two status
// lines (the source and counts; the filter, input or last message).
func (m *Model) View() string {
	if m.width < minWidth || m.height < minHeight {
		return wrap(fmt.Sprintf("kproxy tui needs a terminal of at least %dx%d; this one is %dx%d. Enlarge it (or use kproxy flows).",
			minWidth, minHeight, m.width, m.height), m.width)
	}
	var body string
	switch {
	case m.showHelp:
		body = m.renderHelp()
	case m.inDetail:
		body = m.renderDetail()
	default:
		body = m.renderList(m.rows())
	}
	if m.popup != "" {
		// The box wraps its text to the screen (a long curl command).
		w := min(lipgloss.Width(m.popup), m.width-4)
		body = m.centred(m.st.popup.Width(w + 2).Render(m.popup))
	}
	bottom := m.bottomLines()
	body = clipLines(body, m.height-1-len(bottom))
	return body + "\n" + m.statusLine() + "\n" + strings.Join(bottom, "\n")
}

// clipLines makes s exactly n lines.
func clipLines(s string, n int) string {
	lines := strings.Split(s, "\n")
	if len(lines) > n {
		lines = lines[:n]
	}
	for len(lines) < n {
		lines = append(lines, "")
	}
	return strings.Join(lines, "\n")
}

// centred places box in the middle of the screen, in place of the view.
func (m *Model) centred(box string) string {
	return lipgloss.Place(m.width, m.height-2, lipgloss.Center, lipgloss.Center, box,
		lipgloss.WithWhitespaceChars(" "))
}

func (m *Model) statusLine() string {
	s := m.flows
	parts := []string{m.srcName}
	if m.srcStatus != "" {
		parts = append(parts, m.srcStatus)
	}
	parts = append(parts, fmt.Sprintf("%d flows", len(s.all)))
	if s.text != "" {
		parts = append(parts, fmt.Sprintf("%d shown", len(s.shown)))
	}
	if len(s.marks) > 0 {
		parts = append(parts, fmt.Sprintf("%d marked", len(s.marks)))
	}
	if m.skipped > 0 {
		parts = append(parts, fmt.Sprintf("%d unreadable lines skipped", m.skipped))
	}
	if m.missed > 0 {
		parts = append(parts, fmt.Sprintf("%d flows missed (slow reader)", m.missed))
	}
	if m.dropped > 0 {
		parts = append(parts, fmt.Sprintf("%d oldest dropped", m.dropped))
	}
	if m.list.follow && !m.inDetail {
		parts = append(parts, "follow")
	}
	return m.st.status.Render(fit(" "+strings.Join(parts, " · "), m.width, false))
}

// bottomLines are the input line, or the last message (an error may take
// more than one line: a filter's expression and the caret under it), or
// the filter and a reminder of the keys.
func (m *Model) bottomLines() []string {
	switch m.input {
	case inputFilter:
		return []string{"/" + m.ti.View()}
	case inputCommand:
		return []string{":" + m.ti.View()}
	}
	if m.message != "" && (m.messageErr || m.opts.Clock.Since(m.messageAt) <= messageTTL) {
		lines := strings.Split(m.message, "\n")
		if len(lines) > 3 {
			lines = lines[:3]
		}
		for i, l := range lines {
			if m.messageErr {
				lines[i] = m.st.errText.Render(fit(l, m.width, false))
			} else {
				lines[i] = fit(l, m.width, false)
			}
		}
		return lines
	}
	filterText := "no filter"
	if m.flows.text != "" {
		filterText = "filter: " + m.flows.text
	}
	return []string{m.st.hint.Render(fit(filterText+" · "+m.help.ShortHelpView(m.keys.ShortHelp()), m.width, false))}
}

func (m *Model) renderHelp() string {
	return strings.Join([]string{
		m.st.title.Render("Keys"), m.keysHelp(), "",
		m.st.title.Render("Commands"), commandHelp, "",
		m.st.title.Render("Filter language"), filter.Help, "",
		m.st.hint.Render("(any key closes)"),
	}, "\n")
}

// keysHelp lays the key groups side by side as far as the terminal is
// wide, the rest below (help.Model would cut them off: at 80 columns the
// filter, command, re-run and quit keys were not shown).
func (m *Model) keysHelp() string {
	h := m.help
	h.Width = 0
	var rows, row []string
	width := 0
	for _, g := range m.keys.FullHelp() {
		block := h.FullHelpView([][]key.Binding{g})
		w := lipgloss.Width(block)
		if len(row) > 0 && width+len(h.FullSeparator)+w > m.width {
			rows = append(rows, lipgloss.JoinHorizontal(lipgloss.Top, row...))
			row, width = nil, 0
		}
		if len(row) > 0 {
			row = append(row, h.FullSeparator)
			width += len(h.FullSeparator)
		}
		row = append(row, block)
		width += w
	}
	return strings.Join(append(rows, lipgloss.JoinHorizontal(lipgloss.Top, row...)), "\n")
}
