package tui

import "github.com/charmbracelet/lipgloss"

// styles are every colour and emphasis the views use, made from one
// renderer (the terminal's, or an ASCII one in tests).
type styles struct {
	header, selected, dim, title, tabActive, tab, status, errText, hint lipgloss.Style
	// Rows and marks by outcome.
	ok, denied, failed, mismatch, unknown lipgloss.Style
	// Waterfall bars by stage outcome.
	barPass, barReject, barSkip, barError, barUpstream lipgloss.Style
	popup                                              lipgloss.Style
}

func newStyles(r *lipgloss.Renderer) styles {
	s := r.NewStyle
	return styles{
		header:      s().Bold(true),
		selected:    s().Reverse(true),
		dim:         s().Faint(true),
		title:       s().Bold(true),
		tabActive:   s().Bold(true).Underline(true),
		tab:         s().Faint(true),
		status:      s().Reverse(true),
		errText:     s().Foreground(lipgloss.Color("9")).Bold(true),
		hint:        s().Faint(true),
		ok:          s().Foreground(lipgloss.Color("2")),
		denied:      s().Foreground(lipgloss.Color("3")),
		failed:      s().Foreground(lipgloss.Color("1")),
		mismatch:    s().Foreground(lipgloss.Color("13")).Bold(true),
		unknown:     s().Foreground(lipgloss.Color("8")),
		barPass:     s().Foreground(lipgloss.Color("2")),
		barReject:   s().Foreground(lipgloss.Color("1")),
		barSkip:     s().Foreground(lipgloss.Color("8")),
		barError:    s().Foreground(lipgloss.Color("5")),
		barUpstream: s().Foreground(lipgloss.Color("4")),
		popup:       s().Border(lipgloss.RoundedBorder()).Padding(0, 1),
	}
}
