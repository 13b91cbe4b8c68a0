package tui

import (
	"context"
	"fmt"
	"strings"
	"time"

	"github.com/charmbracelet/bubbles/cursor"
	"github.com/charmbracelet/bubbles/help"
	"github.com/charmbracelet/bubbles/key"
	"github.com/charmbracelet/bubbles/textinput"
	tea "github.com/charmbracelet/bubbletea"
	"github.com/charmbracelet/lipgloss"
	"k8s.io/utils/clock"

	"github.com/kproxy/kproxy/internal/filter"
	"github.com/kproxy/kproxy/internal/flowview"
	"github.com/kproxy/kproxy/internal/record"
	"github.com/kproxy/kproxy/internal/source"
)

// Replayer re-runs kproxy's replay of a recorded flow now (the flow API's
// POST /api/v1/flows/{id}/replay); nil when the TUI reads a file.
type Replayer interface {
	Replay(ctx context.Context, id string) (*record.Record, error)
}

// ReplayFilterer reads and changes the live kproxy's replay filter (the
// flow API's /api/v1/replay-filter); nil when the TUI reads a file.
type ReplayFilterer interface {
	ReplayFilter(ctx context.Context) (string, error)
	SetReplayFilter(ctx context.Context, expr string) (string, error)
}

// Options configure the TUI.
type Options struct {
	Source   source.Source
	Replayer Replayer
	// ReplayFilter, when set, lets :replay-filter and :replay-all change
	// which requests the live kproxy replays.
	ReplayFilter ReplayFilterer
	// JaegerURL, when set, links each flow's trace (JaegerURL/trace/ID).
	JaegerURL string
	// MaxFlows bounds the flows held (the oldest go first); 100,000 when 0.
	MaxFlows int
	// Location is the time zone of the TIME column (time.Local when nil).
	Location *time.Location
	// Renderer makes the styles (the terminal's by default; tests pass an
	// ASCII one).
	Renderer *lipgloss.Renderer
	// Version names kproxy in exported HAR files.
	Version string
	// Clipboard, when set, receives what `c` copies (an OSC 52 writer for
	// a terminal).
	Clipboard func(string)
	// Filter is the filter to start with.
	Filter string
	// Clock times the filter (the real clock when nil).
	Clock clock.PassiveClock
}

// Minimum terminal size: the list's fixed columns and a detail tab need it.
const minWidth, minHeight = 80, 15

type inputMode int

const (
	inputNone inputMode = iota
	inputFilter
	inputCommand
)

// Model is the TUI's state: the flows, the list and the open flow, and
// what the status bar says.
type Model struct {
	// slowWalk: the last key was S (slower).
	slowWalk bool
	opts     Options
	st       styles
	keys     keyMap
	help     help.Model

	width, height int
	flows         *store
	list          listView
	detail        detailView
	inDetail      bool
	showHelp      bool

	input inputMode
	ti    textinput.Model

	// The status bar.
	srcName, srcStatus string
	srcDone            bool
	skipped, missed    int
	dropped            int // flows let go past MaxFlows
	message            string
	messageErr         bool
	messageAt          time.Time
	popup              string

	filterGen int // the newest filter computation; older results are stale
	events    <-chan source.Event
}

// New makes the model; events is the source's channel (see Run).
func New(opts Options, events <-chan source.Event) *Model {
	if opts.Location == nil {
		opts.Location = time.Local
	}
	if opts.Clock == nil {
		opts.Clock = clock.RealClock{}
	}
	if opts.Renderer == nil {
		opts.Renderer = lipgloss.DefaultRenderer()
	}
	ti := textinput.New()
	ti.Prompt = ""
	ti.CharLimit = 1024
	// A steady cursor: a blinking one redraws the screen twice a second
	// for nothing.
	ti.Cursor.SetMode(cursor.CursorStatic)
	m := &Model{
		opts: opts, st: newStyles(opts.Renderer), keys: newKeyMap(), help: help.New(),
		flows: newStore(opts.MaxFlows), list: listView{follow: true}, ti: ti,
		events: events, width: 120, height: 40,
	}
	if opts.Source != nil {
		m.srcName = opts.Source.Name()
	}
	return m
}

// Messages.
type (
	eventsMsg   []source.Event
	sourceEnded struct{}
	filterDone  struct {
		gen  int
		text string
		expr *filter.Expr
		snap snapshot
		seqs []int
		took time.Duration
	}
	actionDone struct {
		message string
		err     error
		popup   string
	}
)

// Init starts reading the source.
func (m *Model) Init() tea.Cmd {
	if m.opts.Filter != "" {
		return tea.Batch(m.waitEvents(), m.startFilter(m.opts.Filter))
	}
	return m.waitEvents()
}

// waitEvents delivers the source's next events, as many as are ready at
// once (up to a bound): one message, one redraw, however fast the feed.
func (m *Model) waitEvents() tea.Cmd {
	ch := m.events
	if ch == nil {
		return nil
	}
	return func() tea.Msg {
		ev, ok := <-ch
		if !ok {
			return sourceEnded{}
		}
		batch := eventsMsg{ev}
		for len(batch) < 256 {
			select {
			case ev, ok := <-ch:
				if !ok {
					return batch
				}
				batch = append(batch, ev)
			default:
				return batch
			}
		}
		return batch
	}
}

// Update handles one message; it never does I/O itself.
func (m *Model) Update(msg tea.Msg) (tea.Model, tea.Cmd) {
	switch msg := msg.(type) {
	case tea.WindowSizeMsg:
		m.width, m.height = msg.Width, msg.Height
		m.help.Width = msg.Width
		if m.inDetail {
			m.refreshDetail()
		}
		return m, nil
	case eventsMsg:
		for _, ev := range msg {
			m.applyEvent(ev)
		}
		return m, m.waitEvents()
	case sourceEnded:
		m.events = nil
		return m, nil
	case filterDone:
		if msg.gen != m.filterGen {
			return m, nil // a newer filter was typed since
		}
		m.flows.setFilter(msg.text, msg.expr, msg.snap, msg.seqs)
		m.list.cursor, m.list.offset = len(m.flows.shown)-1, 0
		m.list.follow = true
		m.setMessage(fmt.Sprintf("filter %q: %d of %d flows (%s)", msg.text, len(m.flows.shown), len(m.flows.all), msg.took.Round(time.Millisecond)), false)
		if msg.text == "" {
			m.setMessage("filter cleared", false)
		}
		return m, nil
	case actionDone:
		if msg.err != nil {
			m.setMessage(msg.err.Error(), true)
		} else {
			m.setMessage(msg.message, false)
		}
		if msg.popup != "" {
			m.popup = msg.popup
		}
		return m, nil
	case tea.KeyMsg:
		return m.handleKey(msg)
	}
	return m, nil
}

func (m *Model) setMessage(s string, isErr bool) {
	m.message, m.messageErr, m.messageAt = s, isErr, m.opts.Clock.Now()
}

// messageTTL is how long a message that is not an error stays shown: a
// filter's count or a re-run's note goes stale as flows arrive (a probe
// saw "9 of 72 flows" for minutes while the status bar counted on).
const messageTTL = 10 * time.Second

func (m *Model) applyEvent(ev source.Event) {
	if len(ev.Records) > 0 {
		m.dropped += m.flows.add(ev.Records)
	}
	m.skipped += ev.Skipped
	m.missed += ev.Missed
	if ev.Status != "" {
		m.srcStatus = ev.Status
	}
	if ev.Done {
		m.srcDone = true
	}
}

// rows is how many flows fit: the screen less the header and two status
// lines.
func (m *Model) rows() int { return max(m.height-3, 1) }

func (m *Model) handleKey(msg tea.KeyMsg) (tea.Model, tea.Cmd) {
	if msg.String() == "ctrl+c" {
		return m, tea.Quit
	}
	if m.input != inputNone {
		return m.handleInput(msg)
	}
	// Keys typed faster than the terminal is read arrive as one message
	// ("gjj"): outside a text input, each is a command of its own.
	if msg.Type == tea.KeyRunes && len(msg.Runes) > 1 && !msg.Paste {
		var cmds []tea.Cmd
		for _, r := range msg.Runes {
			_, cmd := m.handleKey(tea.KeyMsg{Type: tea.KeyRunes, Runes: []rune{r}})
			cmds = append(cmds, cmd)
		}
		return m, tea.Batch(cmds...)
	}
	if m.popup != "" {
		m.popup = "" // any key closes it
		return m, nil
	}
	if m.showHelp {
		m.showHelp = false
		return m, nil
	}
	k := m.keys
	switch {
	case key.Matches(msg, k.Quit):
		return m, tea.Quit
	case key.Matches(msg, k.Help):
		m.showHelp = true
	case key.Matches(msg, k.Filter):
		m.input = inputFilter
		m.ti.SetValue(m.flows.text)
		m.ti.CursorEnd()
		return m, m.ti.Focus()
	case key.Matches(msg, k.Command):
		m.input = inputCommand
		m.ti.SetValue("")
		return m, m.ti.Focus()
	case m.inDetail:
		return m.detailKey(msg)
	default:
		return m.listKey(msg)
	}
	return m, nil
}

func (m *Model) listKey(msg tea.KeyMsg) (tea.Model, tea.Cmd) {
	k, n, rows := m.keys, len(m.flows.shown), m.rows()
	// S walks the flows from the slowest while it is pressed again.
	walking := m.slowWalk
	m.slowWalk = false
	move := func(to int) {
		m.list.follow = false
		m.list.cursor = min(max(to, 0), max(n-1, 0))
	}
	switch {
	case key.Matches(msg, k.Up):
		move(m.list.cursor - 1)
	case key.Matches(msg, k.Down):
		move(m.list.cursor + 1)
		if m.list.cursor == n-1 {
			m.list.follow = true // at the newest flow: keep following it
		}
	case key.Matches(msg, k.Top):
		move(0)
	case key.Matches(msg, k.Bottom):
		move(n - 1)
		m.list.follow = true
	case key.Matches(msg, k.PageUp):
		move(m.list.cursor - rows)
	case key.Matches(msg, k.PageDown):
		move(m.list.cursor + rows)
	case key.Matches(msg, k.Slowest):
		if i, ok := m.slower(walking); ok {
			move(i)
			m.slowWalk = true
			if r := m.focused(); r != nil {
				m.setMessage("total "+flowview.Duration(r.Latency.TotalNs)+": S again for the next slowest", false)
			}
		}
	case key.Matches(msg, k.Follow):
		m.list.follow = !m.list.follow
		m.setMessage(map[bool]string{true: "following the newest flow", false: "follow off"}[m.list.follow], false)
	case key.Matches(msg, k.Mark):
		if r := m.focused(); r != nil {
			m.flows.toggleMark(r.ID)
			move(m.list.cursor + 1)
		}
	case key.Matches(msg, k.Open):
		if r := m.focused(); r != nil {
			m.inDetail = true
			m.openDetail(r)
		}
	case key.Matches(msg, k.Back):
		if m.flows.text != "" {
			return m, m.startFilter("")
		}
	case key.Matches(msg, k.Rerun):
		return m, m.rerun()
	case key.Matches(msg, k.Copy):
		return m, m.copyFlow()
	}
	return m, nil
}

func (m *Model) detailKey(msg tea.KeyMsg) (tea.Model, tea.Cmd) {
	k := m.keys
	switch {
	case key.Matches(msg, k.Back):
		m.inDetail = false
	case key.Matches(msg, k.NextTab):
		m.detail.tab = (m.detail.tab + 1) % len(detailTabs)
		m.refreshDetail()
	case key.Matches(msg, k.PrevTab):
		m.detail.tab = (m.detail.tab + len(detailTabs) - 1) % len(detailTabs)
		m.refreshDetail()
	case msg.String() >= "1" && msg.String() <= "5" && len(msg.String()) == 1:
		m.detail.tab = int(msg.String()[0] - '1')
		m.refreshDetail()
	case key.Matches(msg, k.Rerun):
		return m, m.rerun()
	case key.Matches(msg, k.Copy):
		return m, m.copyFlow()
	case key.Matches(msg, k.Mark):
		m.flows.toggleMark(m.detail.flow.ID)
	case key.Matches(msg, k.Top):
		m.detail.vp.GotoTop()
	case key.Matches(msg, k.Bottom):
		m.detail.vp.GotoBottom()
	default:
		var cmd tea.Cmd
		m.detail.vp, cmd = m.detail.vp.Update(msg)
		return m, cmd
	}
	return m, nil
}

// focused is the flow under the cursor (or open).
func (m *Model) focused() *record.Record {
	if m.inDetail {
		return m.detail.flow
	}
	if m.list.cursor < 0 || m.list.cursor >= len(m.flows.shown) {
		return nil
	}
	return m.flows.at(m.flows.shown[m.list.cursor])
}

func (m *Model) handleInput(msg tea.KeyMsg) (tea.Model, tea.Cmd) {
	switch msg.Type {
	case tea.KeyEsc:
		m.input = inputNone
		m.ti.Blur()
		return m, nil
	case tea.KeyEnter:
		text := strings.TrimSpace(m.ti.Value())
		mode := m.input
		m.input = inputNone
		m.ti.Blur()
		if mode == inputFilter {
			return m, m.startFilter(text)
		}
		return m, m.runCommand(text)
	}
	var cmd tea.Cmd
	m.ti, cmd = m.ti.Update(msg)
	return m, cmd
}

// startFilter parses at once (a bad expression is reported with its
// position and the list stays as it was) and matches in the background.
func (m *Model) startFilter(text string) tea.Cmd {
	expr, err := filter.Parse(text)
	if err != nil {
		msg := err.Error()
		var se *filter.SyntaxError
		if asSyntax(err, &se) {
			msg = "bad filter: " + se.Msg + "\n" + se.Caret()
		}
		m.setMessage(msg, true)
		return nil
	}
	m.filterGen++
	gen, snap, clk := m.filterGen, m.flows.snapshot(), m.opts.Clock
	m.setMessage("filtering…", false)
	return func() tea.Msg {
		start := clk.Now()
		seqs := filterSnapshot(snap, expr)
		return filterDone{gen: gen, text: text, expr: expr, snap: snap, seqs: seqs, took: clk.Since(start)}
	}
}

// slower is the shown flow "S" goes to: the slowest by total latency,
// then, pressed again, the next one down that ranking (S, S, S walks
// from the slowest to faster ones); after any other key, or past the
// fastest, the slowest again.
func (m *Model) slower(walking bool) (int, bool) {
	s := m.flows
	n := len(s.shown)
	if n == 0 {
		return 0, false
	}
	total := func(i int) int64 { return s.at(s.shown[i]).Latency.TotalNs }
	cur := m.list.cursor
	pick := func(walk bool) int {
		best := -1
		for i := range n {
			// Ranked by total, ties by position.
			if walk && total(i) > total(cur) || walk && total(i) == total(cur) && i <= cur {
				continue
			}
			if best < 0 || total(i) > total(best) || (total(i) == total(best) && i < best) {
				best = i
			}
		}
		return best
	}
	best := -1
	if walking && cur >= 0 && cur < n {
		best = pick(true)
	}
	if best < 0 {
		best = pick(false)
	}
	return best, true
}
