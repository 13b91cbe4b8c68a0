package tui

import (
	"fmt"
	"net/http"
	"sort"
	"strings"

	"github.com/charmbracelet/bubbles/viewport"
	"github.com/charmbracelet/lipgloss"
	"sigs.k8s.io/yaml"

	"github.com/kproxy/kproxy/internal/flowview"
	"github.com/kproxy/kproxy/internal/record"
)

// The detail view's tabs.
var detailTabs = []string{"Verdict", "Stages", "Request", "Response", "Trace"}

// detailView shows one flow; its content is built when the flow or the
// tab changes, never per frame.
type detailView struct {
	flow *record.Record
	tab  int
	vp   viewport.Model
}

func (m *Model) openDetail(r *record.Record) {
	m.detail.flow = r
	m.detail.vp = viewport.New(m.width, max(m.height-4, 1))
	m.refreshDetail()
}

func (m *Model) refreshDetail() {
	r := m.detail.flow
	if r == nil {
		return
	}
	w := m.width
	var content string
	switch detailTabs[m.detail.tab] {
	case "Verdict":
		content = m.renderVerdict(r, w)
	case "Stages":
		content = m.renderWaterfall(r, w)
	case "Request":
		content = m.renderRequest(r, w)
	case "Response":
		content = m.renderResponse(r, w)
	case "Trace":
		content = m.renderTrace(r, w)
	}
	m.detail.vp.Width, m.detail.vp.Height = w, max(m.height-4, 1)
	m.detail.vp.SetContent(content)
	m.detail.vp.GotoTop()
}

func (m *Model) renderDetail() string {
	r := m.detail.flow
	mark, _ := flowview.Agreement(r)
	title := fmt.Sprintf("%s %s  %s  predicted %s  actual %s  %s", r.Request.Method, flowview.Resource(r),
		flowview.Caller(r), flowview.Predicted(r), actualStatus(r), mark)
	var tabs []string
	for i, t := range detailTabs {
		label := fmt.Sprintf("%d %s", i+1, t)
		if i == m.detail.tab {
			tabs = append(tabs, m.st.tabActive.Render("["+label+"]"))
		} else {
			tabs = append(tabs, m.st.tab.Render(" "+label+" "))
		}
	}
	return strings.Join([]string{
		m.st.title.Render(fit(title, m.width, false)),
		strings.Join(tabs, " "),
		m.detail.vp.View(),
	}, "\n")
}

// wrap breaks text to width, keeping the words whole where it can.
func wrap(s string, width int) string {
	return lipgloss.NewStyle().Width(max(width, 10)).Render(s)
}

// kv renders aligned "key: value" lines, skipping empty values.
func kv(width int, pairs ...string) string {
	keyW := 0
	for i := 0; i+1 < len(pairs); i += 2 {
		if pairs[i+1] != "" {
			keyW = max(keyW, len(pairs[i]))
		}
	}
	var b strings.Builder
	for i := 0; i+1 < len(pairs); i += 2 {
		if pairs[i+1] == "" {
			continue
		}
		v := wrap(pairs[i+1], width-keyW-4)
		v = strings.ReplaceAll(v, "\n", "\n"+strings.Repeat(" ", keyW+4))
		fmt.Fprintf(&b, "  %-*s  %s\n", keyW, pairs[i], v)
	}
	return b.String()
}

func statusText(code int) string {
	if code == 0 {
		return ""
	}
	return fmt.Sprintf("%d %s", code, http.StatusText(code))
}

func (m *Model) renderVerdict(r *record.Record, w int) string {
	p, a := r.Predicted, r.Actual
	var b strings.Builder
	mark, kind := flowview.Agreement(r)
	verdict := map[flowview.AgreementKind]string{
		flowview.Match:    "kproxy's prediction matches the apiserver's answer",
		flowview.Mismatch: "kproxy's prediction DISAGREES with the apiserver's answer (a kproxy bug: please report it with this record)",
		flowview.Unknown:  "kproxy could not predict this request, and says why below",
	}[kind]
	b.WriteString(m.st.title.Render(mark+" "+verdict) + "\n\n")

	half := max((w-4)/2, 20)
	predicted := kv(half, "status", statusText(p.Status), "reason", p.Reason, "stage", stageOrSuccess(p), "flow schema", p.FlowSchema, "priority level", p.PriorityLevel)
	actual := kv(half, "status", statusText(a.Status), "reason", a.Reason, "audit ID", a.AuditID, "flow schema", a.FlowSchema, "priority level", a.PriorityLevel)
	left := m.st.header.Render("Predicted (kproxy's replay)") + "\n" + predicted
	right := m.st.header.Render("Actual (the apiserver)") + "\n" + actual
	b.WriteString(lipgloss.JoinHorizontal(lipgloss.Top, lipgloss.NewStyle().Width(half+2).Render(left), right) + "\n")

	if r.Server != nil && r.Server.Summary != "" {
		b.WriteString(m.st.header.Render("Where the apiserver spent the time") + "\n" + indent(wrap(r.Server.Summary, w-4), 2) + "\n\n")
	}
	// The messages first (short), then the deciding stage's explanation
	// (it can be long: RBAC's nearest misses and the grant that would do).
	if p.Message != "" && p.Stage != record.StageUnknown {
		b.WriteString(m.st.header.Render("Predicted message") + "\n" + indent(wrap(p.Message, w-4), 2) + "\n\n")
	}
	if a.Message != "" {
		b.WriteString(m.st.header.Render("The apiserver's message") + "\n" + indent(wrap(a.Message, w-4), 2) + "\n\n")
	}
	if a.Error != "" {
		// A watch the client stopped, a stream cut short: the apiserver
		// had answered (its status above); only what came after is cut.
		heading := "The answer was cut short"
		if a.NoAnswer() {
			heading = "No answer from the apiserver"
		}
		b.WriteString(m.st.header.Render(heading) + "\n" + indent(wrap(a.Error, w-4), 2) + "\n\n")
	}
	for _, warn := range a.Warnings {
		b.WriteString("  warning: " + warn + "\n")
	}
	if deciding := decidingStage(r); deciding != nil {
		b.WriteString(m.st.header.Render("Deciding stage: "+deciding.Name+" ("+deciding.Outcome+")") + "\n")
		b.WriteString(indent(wrap(deciding.Explanation, w-4), 2) + "\n\n")
	} else if p.Stage == record.StageUnknown {
		b.WriteString(m.st.header.Render("Why kproxy cannot say") + "\n")
		b.WriteString(indent(wrap(p.Message, w-4), 2) + "\n\n")
	}
	b.WriteString(m.st.header.Render("Stages") + "\n")
	for _, s := range r.Stages {
		fmt.Fprintf(&b, "  %-22s %-7s %s\n", s.Name, s.Outcome, firstLine(s.Explanation, w-34))
	}
	return b.String()
}

func stageOrSuccess(p record.Prediction) string {
	if p.Stage == "" && p.Status != 0 {
		return "(none: predicted to succeed)"
	}
	return p.Stage
}

// decidingStage is the stage that decided the prediction, if one did.
func decidingStage(r *record.Record) *record.StageResult {
	if r.Predicted.Stage == "" || r.Predicted.Stage == record.StageUnknown {
		return nil
	}
	for i := range r.Stages {
		if r.Stages[i].Name == r.Predicted.Stage {
			return &r.Stages[i]
		}
	}
	return nil
}

func firstLine(s string, w int) string {
	s, _, _ = strings.Cut(s, "\n")
	return fit(s, max(w, 10), false)
}

func indent(s string, n int) string {
	pad := strings.Repeat(" ", n)
	return pad + strings.ReplaceAll(s, "\n", "\n"+pad)
}

func headerLines(h map[string][]string) string {
	if len(h) == 0 {
		return "  (not recorded)\n"
	}
	keys := make([]string, 0, len(h))
	for k := range h {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	var b strings.Builder
	for _, k := range keys {
		for _, v := range h[k] {
			fmt.Fprintf(&b, "  %s: %s\n", k, v)
		}
	}
	return b.String()
}

func (m *Model) renderRequest(r *record.Record, w int) string {
	q := r.Request
	var b strings.Builder
	res := q.Resource
	if q.Subresource != "" {
		res += "/" + q.Subresource
	}
	gv := q.APIVersion
	if q.APIGroup != "" {
		gv = q.APIGroup + "/" + q.APIVersion
	}
	b.WriteString(kv(w, "method", q.Method, "path", q.Path, "query", q.Query,
		"user", q.User, "groups", strings.Join(q.Groups, ", "), "acting as", q.ActingAs,
		"identity", r.Identity, "verb", q.Verb, "group/version", gv, "resource", res,
		"namespace", q.Namespace, "name", q.Name, "user agent", q.UserAgent,
		"content type", q.ContentType, "body", bodyNote(q)))
	b.WriteString("\n" + m.st.header.Render("Headers (credentials redacted)") + "\n")
	b.WriteString(headerLines(q.Headers))
	if len(q.Body) > 0 {
		b.WriteString("\n" + m.st.header.Render("Body (secrets redacted)") + "\n")
		if y, err := yaml.JSONToYAML(q.Body); err == nil {
			b.WriteString(indent(strings.TrimRight(string(y), "\n"), 2) + "\n")
		} else {
			b.WriteString(indent(string(q.Body), 2) + "\n")
		}
	}
	return b.String()
}

func bodyNote(q record.Request) string {
	switch {
	case q.BodyBytes == 0:
		return ""
	case len(q.Body) > 0:
		return fmt.Sprintf("%d bytes, below", q.BodyBytes)
	case q.BodyNote != "":
		return fmt.Sprintf("%d bytes, %s", q.BodyBytes, q.BodyNote)
	}
	return fmt.Sprintf("%d bytes (not recorded: kproxy serve --capture-bodies records write bodies)", q.BodyBytes)
}

func (m *Model) renderResponse(r *record.Record, w int) string {
	a := r.Actual
	var b strings.Builder
	events := ""
	if a.Events != nil {
		events = fmt.Sprint(*a.Events)
	}
	b.WriteString(kv(w, "status", statusText(a.Status), "retry after", a.RetryAfter,
		"body", sizeNote(a.ResponseBytes), "events", events, "error", a.Error))
	if a.Reason != "" || a.Message != "" {
		b.WriteString("\n" + m.st.header.Render("Status") + "\n")
		b.WriteString(kv(w, "kind", "Status", "code", fmt.Sprint(a.Status), "reason", a.Reason, "message", a.Message))
	}
	if se := a.StreamError; se != nil {
		// A watch the apiserver ended inside its 200.
		b.WriteString("\n" + m.st.header.Render("Stream ended by an ERROR event") + "\n")
		b.WriteString(kv(w, "kind", "Status", "code", fmt.Sprint(se.Code), "reason", se.Reason, "message", se.Message))
	}
	if len(a.Warnings) > 0 {
		b.WriteString("\n" + m.st.header.Render("Warnings") + "\n")
		for _, warn := range a.Warnings {
			b.WriteString("  " + warn + "\n")
		}
	}
	b.WriteString("\n" + m.st.header.Render("Headers") + "\n")
	b.WriteString(headerLines(a.Headers))
	return b.String()
}

func sizeNote(n int64) string {
	if n == 0 {
		return ""
	}
	return fmt.Sprintf("%d bytes", n)
}

func (m *Model) renderTrace(r *record.Record, w int) string {
	ui, api := "(start the TUI with --jaeger-url to link into Jaeger)", ""
	if j := strings.TrimRight(m.opts.JaegerURL, "/"); j != "" && r.TraceID != "" {
		ui, api = j+"/trace/"+r.TraceID, j+"/api/traces/"+r.TraceID
	}
	var b strings.Builder
	b.WriteString(kv(w, "flow ID", r.ID, "trace ID", r.TraceID, "audit ID", r.Actual.AuditID,
		"Jaeger UI", ui, "Jaeger API", api, "started", r.Start.In(m.opts.Location).Format("2006-01-02 15:04:05.000000 MST"),
		"mode", r.Mode, "replayed as", r.KubernetesVersion))
	if st := r.Server; st != nil && st.TraceID != "" && st.TraceID != r.TraceID {
		// The apiserver continues a traceparent only from callers it
		// trusts with one; for the others its spans are a trace of their
		// own, linked (a probe looked for them under kproxy's).
		sui := "(start the TUI with --jaeger-url to link into Jaeger)"
		if j := strings.TrimRight(m.opts.JaegerURL, "/"); j != "" {
			sui = j + "/trace/" + st.TraceID
		}
		b.WriteString(kv(w, "apiserver's trace", st.TraceID, "its Jaeger UI", sui))
		b.WriteString("\n" + indent(wrap("The apiserver traced this request in a trace of its own, linked to kproxy's upstream span: it continues a caller's traceparent only for system:masters and system:monitoring.", w-4), 2) + "\n")
	}
	b.WriteString("\n" + indent(wrap("kproxy's spans (a server span, replay with one child per stage, and upstream) share the trace ID; the apiserver's audit log names the audit ID.", w-4), 2) + "\n")
	return b.String()
}
