package tui

import "github.com/charmbracelet/bubbles/key"

// keyMap holds the bindings, k9s's and vim's: what incident responders'
// fingers already know. `?` shows them (bubbles/help reads the same map).
type keyMap struct {
	Up, Down, Top, Bottom, PageUp, PageDown key.Binding
	Open, Back, Filter, Command, Quit       key.Binding
	Follow, Mark, Rerun, Copy, Help         key.Binding
	Slowest                                 key.Binding
	NextTab, PrevTab                        key.Binding
}

func newKeyMap() keyMap {
	b := func(help string, desc string, keys ...string) key.Binding {
		return key.NewBinding(key.WithKeys(keys...), key.WithHelp(help, desc))
	}
	return keyMap{
		Up:       b("k/↑", "up", "k", "up"),
		Down:     b("j/↓", "down", "j", "down"),
		Top:      b("g", "first flow", "g", "home"),
		Bottom:   b("G", "newest flow (follows)", "G", "end"),
		PageUp:   b("pgup", "page up", "pgup", "ctrl+b"),
		PageDown: b("pgdn", "page down", "pgdown", "ctrl+f"),
		Open:     b("enter", "open the flow", "enter"),
		Back:     b("esc", "back", "esc"),
		Filter:   b("/", "filter", "/"),
		Command:  b(":", "command", ":"),
		Quit:     b("q", "quit", "q", "ctrl+c"),
		Follow:   b("F", "follow newest on/off", "F"),
		Slowest:  b("S", "slowest flow, then the next", "S"),
		Mark:     b("m", "mark the flow", "m"),
		Rerun:    b("e", "re-run the replay now", "e"),
		Copy:     b("c", "copy as curl/kubectl", "c"),
		Help:     b("?", "help", "?"),
		NextTab:  b("tab/l", "next tab", "tab", "l", "right"),
		PrevTab:  b("shift+tab/h", "previous tab", "shift+tab", "h", "left"),
	}
}

// ShortHelp is the status line's reminder.
func (k keyMap) ShortHelp() []key.Binding {
	return []key.Binding{k.Open, k.Filter, k.Command, k.Follow, k.Help, k.Quit}
}

// FullHelp is the `?` screen, by column.
func (k keyMap) FullHelp() [][]key.Binding {
	return [][]key.Binding{
		{k.Up, k.Down, k.Top, k.Bottom, k.PageUp, k.PageDown, k.Slowest},
		{k.Open, k.Back, k.NextTab, k.PrevTab, k.Follow, k.Mark},
		{k.Filter, k.Command, k.Rerun, k.Copy, k.Help, k.Quit},
	}
}
