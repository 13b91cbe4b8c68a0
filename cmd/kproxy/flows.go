package main

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"math"
	"slices"
	"sort"
	"strings"
	"time"

	"github.com/spf13/cobra"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/cli-runtime/pkg/printers"
	"sigs.k8s.io/yaml"

	"github.com/kproxy/kproxy/internal/filter"
	"github.com/kproxy/kproxy/internal/flowview"
	"github.com/kproxy/kproxy/internal/record"
	"github.com/kproxy/kproxy/internal/source"
)

// exitBadInput is kproxy flows' exit status for input it cannot use (a
// filter that does not parse, flags that do not go together).
const exitBadInput = 2

type flowsOptions struct {
	api    flowAPIFlags
	filter string
	follow bool
	stats  bool
	output *outputFlags
	// location is the TIME column's time zone.
	location *time.Location
}

func newFlowsCommand() *cobra.Command { return newFlowsCommandIn(time.Local) }

// newFlowsCommandIn prints times in loc (tests use UTC).
func newFlowsCommandIn(loc *time.Location) *cobra.Command {
	o := &flowsOptions{output: newOutputFlags("table", "table"), location: loc}
	cmd := &cobra.Command{
		Use:   "flows [FILE|-]",
		Short: "Print recorded flows (from a capture file, stdin or kproxy serve's flow API) for scripts and pipes",
		Long: `Print the flows kproxy recorded, one per request, with what the replay
predicted and what the apiserver answered, or a summary of them (--stats).

Flows come from a capture file (kproxy serve --capture FILE), from standard
input (-), or from a running kproxy serve's flow API (--connect URL; with
neither FILE nor --connect, ` + defaultFlowAPI + `, the default of
kproxy serve --api-listen). --follow keeps printing new flows as they are
recorded, until Ctrl-C: a file is followed as tail -F follows it
(truncation and rotation included), the API's live stream is read. A
rotated file gzipped by --capture-compress (FILE-TIME.jsonl.gz) is read as
it is.

Columns: TIME, CALLER (the user, or how kproxy forwarded a caller without
one), VERB, RESOURCE (resource[/subresource] and namespace/name, or the
path), PREDICTED ("403 @authorization": the status and the stage that
decides it; "201": predicted to succeed; "unknown"), ACTUAL (the
apiserver's status), AGREE ("=" agree, "!=" disagree, "?" unknown), TOTAL;
-o wide adds UPSTREAM, REPLAY, REASON and ID.

-o json and yaml print a kproxy.dev/v1alpha1 FlowList whose items are the
capture records; with --follow, json prints one record per line (JSON
Lines) and yaml one document per record. -o jsonpath and go-template see
the FlowList ({.items[*].id}), or each record with --follow ({.id}).
-o name prints flow.kproxy.dev/ID.

--stats summarises the matching flows: by deciding stage (predicted),
denials (status >= 400) by user, agreement of prediction and answer,
unknown predictions by reason, p50/p99 latencies; -o json|yaml print it as
a FlowStats document.

Exit status: 0, 1 when flows cannot be read, 2 for bad input (a filter
that does not parse, flags that do not go together).

  kproxy flows /tmp/kproxy.jsonl
  kproxy flows /tmp/kproxy.jsonl --filter '~x | ~unknown' -o wide
  kproxy flows --connect http://127.0.0.1:7070 --filter '~u alice ~c 4xx' --follow
  kproxy flows /tmp/kproxy.jsonl --stats
  kproxy flows - -o jsonpath='{.items[*].id}' < capture.jsonl

` + filter.Help,
		Args: cobra.MaximumNArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			return runFlows(cmd, o, args)
		},
	}
	f := cmd.Flags()
	o.api.addFlags(f)
	f.StringVar(&o.filter, "filter", "", "print only the flows this filter expression selects (see below)")
	f.BoolVarP(&o.follow, "follow", "f", false, "keep printing new flows until Ctrl-C (a file as tail -F, the API's live stream)")
	f.BoolVar(&o.stats, "stats", false, "summarise the matching flows instead of listing them")
	o.output.addFlags(f, "wide", "name")
	return cmd
}

// badInput reports input kproxy flows cannot use on stderr and ends with
// exit status 2.
func badInput(cmd *cobra.Command, format string, args ...any) error {
	fmt.Fprintf(cmd.ErrOrStderr(), "kproxy "+cmd.Name()+": "+format+"\n", args...)
	return exitCode(exitBadInput)
}

// parseFilter parses --filter; a mistake is bad input, shown with a caret
// under it (kproxy flows and kproxy tui).
func parseFilter(cmd *cobra.Command, expr string) (*filter.Expr, error) {
	e, err := filter.Parse(expr)
	if err == nil {
		return e, nil
	}
	var se *filter.SyntaxError
	if errors.As(err, &se) {
		return nil, badInput(cmd, "--filter: %s at position %d:\n%s\n(kproxy %s --help lists the filter language)", se.Msg, se.Pos+1, strings.TrimSuffix(indent(se.Caret(), "  "), "\n"), cmd.Name())
	}
	return nil, badInput(cmd, "--filter: %v", err)
}

func runFlows(cmd *cobra.Command, o *flowsOptions, args []string) error {
	format := *o.output.print.OutputFormat
	if err := o.output.validate("wide", "name"); err != nil {
		return badInput(cmd, "%v", err)
	}
	file := ""
	if len(args) == 1 {
		file = args[0]
	}
	switch {
	case file != "" && o.api.connect != "":
		return badInput(cmd, "give a capture FILE or --connect URL, not both")
	case file != "" && o.api.credentials():
		return badInput(cmd, "--token, --token-file, --certificate-authority, --client-certificate and --client-key are for the flow API (--connect); a capture FILE needs none")
	case o.stats && o.follow:
		return badInput(cmd, "--stats summarises the flows there are; it does not go with --follow (drop one)")
	case o.stats && format == "name":
		return badInput(cmd, "-o name lists flows; --stats prints a summary: use -o table, json or yaml")
	}
	expr, err := parseFilter(cmd, o.filter)
	if err != nil {
		return err
	}

	p := &flowPrinter{o: o, w: cmd.OutOrStdout(), format: format}
	if file != "" {
		src := source.File(file, o.follow)
		if file == "-" {
			src = source.Reader("stdin", cmd.InOrStdin())
		}
		return p.run(cmd, src, expr)
	}
	url := o.api.url()
	c, err := o.api.client()
	if err != nil {
		return err
	}
	hint := func(err error) error {
		if o.api.connect == "" && !errors.Is(err, context.Canceled) {
			return fmt.Errorf("%w; or read a capture file: kproxy flows FILE", err)
		}
		return err
	}
	if o.follow {
		return hint(p.run(cmd, source.Named(url, source.API(c, o.filter)), expr))
	}
	// The API keeps its newest flows; ask for all of them (it answers at
	// most its buffer's size).
	recs, err := c.List(cmd.Context(), o.filter, math.MaxInt32)
	if err != nil {
		return hint(err)
	}
	return p.finish(cmd, url, matching(recs, expr), 0)
}

func matching(recs []*record.Record, expr *filter.Expr) []*record.Record {
	out := make([]*record.Record, 0, len(recs))
	for _, r := range recs {
		if expr.Match(r) {
			out = append(out, r)
		}
	}
	return out
}

// flowPrinter prints flows in the -o format, all at once or as they come.
type flowPrinter struct {
	o      *flowsOptions
	w      io.Writer
	format string
	// table and tw are kept across batches, so that --follow prints the
	// header once and its rows stay aligned (kubectl get -w does the same).
	table   printers.ResourcePrinter
	tw      flusher
	printer printers.ResourcePrinter
	printed int
}

// run reads src: to its end, then prints (or summarises) what matched;
// or, with --follow, printing each batch as it comes until Ctrl-C.
func (p *flowPrinter) run(cmd *cobra.Command, src source.Source, expr *filter.Expr) error {
	ctx, cancel := context.WithCancel(cmd.Context())
	defer cancel()
	events := make(chan source.Event)
	errc := make(chan error, 1)
	go func() { errc <- src.Run(ctx, events) }()
	stderr := cmd.ErrOrStderr()
	var all []*record.Record
	skipped := 0
	for {
		select {
		case ev := <-events:
			recs := matching(ev.Records, expr)
			if !p.o.follow {
				all = append(all, recs...)
				skipped += ev.Skipped
				continue
			}
			if ev.Status != "" {
				fmt.Fprintf(stderr, "# %s\n", ev.Status)
			}
			if ev.Skipped > 0 {
				fmt.Fprintf(stderr, "# skipped %d %s of %s that %s not capture records\n", ev.Skipped, plural(ev.Skipped, "line", "lines"), src.Name(), plural(ev.Skipped, "is", "are"))
			}
			if ev.Missed > 0 {
				fmt.Fprintf(stderr, "# missed %d %s: the flow API dropped them because this reader fell behind\n", ev.Missed, plural(ev.Missed, "flow", "flows"))
			}
			if err := p.stream(recs); err != nil {
				return err
			}
		case err := <-errc:
			// Run has returned: every event it sent has been taken.
			switch {
			case err != nil:
				return err
			case cmd.Context().Err() != nil:
				return nil // Ctrl-C ends --follow
			case p.o.follow:
				return nil // stdin ended
			}
			return p.finish(cmd, src.Name(), all, skipped)
		}
	}
}

// finish prints the flows read (or their summary), with a word on stderr
// about what matched nothing or could not be read.
func (p *flowPrinter) finish(cmd *cobra.Command, from string, recs []*record.Record, skipped int) error {
	stderr := cmd.ErrOrStderr()
	if skipped > 0 {
		fmt.Fprintf(stderr, "kproxy flows: skipped %d %s of %s that %s not capture records\n", skipped, plural(skipped, "line", "lines"), from, plural(skipped, "is", "are"))
	}
	if p.o.stats {
		return p.printStats(computeFlowStats(recs))
	}
	if len(recs) == 0 && (p.o.output.isHuman("wide") || p.format == "name") {
		what := "No flows"
		if p.o.filter != "" {
			what += " matching --filter " + p.o.filter
		}
		fmt.Fprintf(stderr, "%s in %s.\n", what, from)
		return nil
	}
	switch {
	case p.o.output.isHuman("wide"):
		return p.rows(recs)
	case p.format == "name":
		return p.names(recs)
	}
	if recs == nil {
		recs = []*record.Record{} // "items": [], not null
	}
	return p.o.output.printDocument(p.w, "FlowList", flowList{Items: recs})
}

// flusher is kubectl's tabwriter (printers.GetNewTabWriter), which the
// table printer writes to without flushing.
type flusher interface {
	io.Writer
	Flush() error
}

// flowList is the -o json|yaml document of kproxy flows.
type flowList struct {
	Items []*record.Record `json:"items"`
}

// stream prints one --follow batch: table rows (the header once), or one
// document per record.
func (p *flowPrinter) stream(recs []*record.Record) error {
	if len(recs) == 0 {
		return nil
	}
	switch {
	case p.o.output.isHuman("wide"):
		return p.rows(recs)
	case p.format == "name":
		return p.names(recs)
	case p.format == "json":
		for _, r := range recs {
			b, err := json.Marshal(r)
			if err != nil {
				return fmt.Errorf("encode flow %s: %w", r.ID, err)
			}
			if _, err := p.w.Write(append(b, '\n')); err != nil {
				return err
			}
		}
		return nil
	case p.format == "yaml":
		for _, r := range recs {
			b, err := yaml.Marshal(r)
			if err != nil {
				return fmt.Errorf("encode flow %s: %w", r.ID, err)
			}
			if p.printed > 0 {
				if _, err := io.WriteString(p.w, "---\n"); err != nil {
					return err
				}
			}
			if _, err := p.w.Write(b); err != nil {
				return err
			}
			p.printed++
		}
		return nil
	}
	pr, err := p.structured()
	if err != nil {
		return err
	}
	for _, r := range recs {
		obj, err := flowObject(r)
		if err != nil {
			return err
		}
		if err := pr.PrintObj(obj, p.w); err != nil {
			return err
		}
	}
	return nil
}

func (p *flowPrinter) structured() (printers.ResourcePrinter, error) {
	if p.printer == nil {
		pr, err := p.o.output.print.ToPrinter()
		if err != nil {
			return nil, err
		}
		p.printer = pr
	}
	return p.printer, nil
}

// names prints flow.kproxy.dev/ID per flow, with kubectl's name printer.
func (p *flowPrinter) names(recs []*record.Record) error {
	pr := &printers.NamePrinter{}
	for _, r := range recs {
		u := &unstructured.Unstructured{}
		u.SetAPIVersion(outputAPIVersion)
		u.SetKind("Flow")
		u.SetName(r.ID)
		if err := pr.PrintObj(u, p.w); err != nil {
			return err
		}
	}
	return nil
}

// flowObject is a record as an object kubectl's printers take: a
// kproxy.dev/v1alpha1 Flow.
func flowObject(r *record.Record) (*unstructured.Unstructured, error) {
	b, err := json.Marshal(r)
	if err != nil {
		return nil, fmt.Errorf("encode flow %s: %w", r.ID, err)
	}
	u := &unstructured.Unstructured{}
	if err := json.Unmarshal(b, &u.Object); err != nil {
		return nil, err
	}
	u.SetAPIVersion(outputAPIVersion)
	u.SetKind("Flow")
	return u, nil
}

// The flow table's columns; Priority 1 columns are shown by -o wide.
var flowColumns = []metav1.TableColumnDefinition{
	{Name: "Time", Type: "string"},
	{Name: "Caller", Type: "string"},
	{Name: "Verb", Type: "string"},
	{Name: "Resource", Type: "string"},
	{Name: "Predicted", Type: "string"},
	{Name: "Actual", Type: "string"},
	{Name: "Agree", Type: "string"},
	{Name: "Total", Type: "string"},
	{Name: "Upstream", Type: "string", Priority: 1},
	{Name: "Replay", Type: "string", Priority: 1},
	{Name: "Reason", Type: "string", Priority: 1},
	{Name: "ID", Type: "string", Priority: 1},
}

// rows prints flows as table rows, as kubectl get does; the header is
// printed once per command and the column widths remembered, so
// --follow's batches continue one table.
func (p *flowPrinter) rows(recs []*record.Record) error {
	if p.table == nil {
		p.table = printers.NewTablePrinter(printers.PrintOptions{Wide: p.format == "wide"})
		p.tw = printers.GetNewTabWriter(p.w)
	}
	t := &metav1.Table{ColumnDefinitions: flowColumns}
	for _, r := range recs {
		t.Rows = append(t.Rows, metav1.TableRow{Cells: flowRow(r, p.o.location)})
	}
	if err := p.table.PrintObj(t, p.tw); err != nil {
		return err
	}
	return p.tw.Flush()
}

// flowRow is one flow's cells, in flowColumns' order.
func flowRow(r *record.Record, loc *time.Location) []any {
	mark, _ := flowview.Agreement(r)
	reason := flowview.Reason(r)
	if reason == "" {
		reason = flowview.None
	}
	return []any{
		r.Start.In(loc).Format("15:04:05.000"),
		flowview.Caller(r),
		flowview.Verb(r),
		flowview.Resource(r),
		flowview.Predicted(r),
		flowview.Actual(r),
		mark,
		flowview.Duration(r.Latency.TotalNs),
		flowview.Duration(r.Latency.UpstreamNs),
		flowview.Duration(r.Latency.ReplayNs),
		reason,
		r.ID,
	}
}

func plural(n int, one, many string) string {
	if n == 1 {
		return one
	}
	return many
}

// flowStats is kproxy flows --stats: a summary of the matching flows (the
// FlowStats document of -o json|yaml).
type flowStats struct {
	// Flows is how many flows matched.
	Flows int `json:"flows"`
	// ByStage counts flows by the stage predicted to decide them: "none"
	// for those predicted to succeed, "unknown" for those kproxy could
	// not predict; in the apiserver's stage order.
	ByStage []statCount `json:"byStage"`
	// DenialsByUser counts flows the apiserver answered with a status of
	// 400 or more, by caller; most first.
	DenialsByUser []statCount `json:"denialsByUser"`
	// Agreement counts match, mismatch and unknown (flowview.Agreement).
	Agreement []statCount `json:"agreement"`
	// UnknownByReason counts unknown predictions by the gist of their
	// message (flowview.UnknownReason); most first.
	UnknownByReason []statCount `json:"unknownByReason"`
	// Latency has the p50 and p99 of total, upstream and replay latency.
	Latency []latencyStat `json:"latency"`
}

// statCount is a number of flows, and its share of all matching flows.
type statCount struct {
	Name    string  `json:"name"`
	Flows   int     `json:"flows"`
	Percent float64 `json:"percent"`
}

// latencyStat is one latency's percentiles, nearest rank, in nanoseconds.
type latencyStat struct {
	Name  string `json:"name"`
	P50Ns int64  `json:"p50Ns"`
	P99Ns int64  `json:"p99Ns"`
}

// stageNone is the byStage name of flows predicted to succeed.
const stageNone = "none"

// computeFlowStats summarises flows.
func computeFlowStats(recs []*record.Record) flowStats {
	s := flowStats{Flows: len(recs), ByStage: []statCount{}, DenialsByUser: []statCount{}, UnknownByReason: []statCount{}}
	stages := map[string]int{}
	denials := map[string]int{}
	unknown := map[string]int{}
	agreement := map[flowview.AgreementKind]int{}
	var total, upstream, replay []int64
	for _, r := range recs {
		stage := r.Predicted.Stage
		if stage == "" {
			stage = stageNone
		}
		stages[stage]++
		if r.Actual.Status >= 400 {
			denials[flowview.Caller(r)]++
		}
		_, kind := flowview.Agreement(r)
		agreement[kind]++
		if why := flowview.UnknownReason(r); why != "" {
			unknown[why]++
		}
		total = append(total, r.Latency.TotalNs)
		upstream = append(upstream, r.Latency.UpstreamNs)
		replay = append(replay, r.Latency.ReplayNs)
	}
	count := func(name string, n int) statCount {
		c := statCount{Name: name, Flows: n}
		if len(recs) > 0 {
			c.Percent = math.Round(1000*float64(n)/float64(len(recs))) / 10
		}
		return c
	}
	order := append(append([]string{stageNone}, record.StageOrder[:]...), record.StageUnknown)
	for _, st := range order {
		if n := stages[st]; n > 0 {
			s.ByStage = append(s.ByStage, count(st, n))
			delete(stages, st)
		}
	}
	// A stage this kproxy does not know (a newer capture): after the rest.
	s.ByStage = append(s.ByStage, mostFirst(stages, count)...)
	for _, k := range []flowview.AgreementKind{flowview.Match, flowview.Mismatch, flowview.Unknown} {
		s.Agreement = append(s.Agreement, count(k.String(), agreement[k]))
	}
	s.DenialsByUser = append(s.DenialsByUser, mostFirst(denials, count)...)
	s.UnknownByReason = append(s.UnknownByReason, mostFirst(unknown, count)...)
	s.Latency = []latencyStat{
		percentiles("total", total),
		percentiles("upstream", upstream),
		percentiles("replay", replay),
	}
	return s
}

// mostFirst orders counts by size, then name.
func mostFirst(m map[string]int, count func(string, int) statCount) []statCount {
	out := make([]statCount, 0, len(m))
	for name, n := range m {
		out = append(out, count(name, n))
	}
	sort.Slice(out, func(i, j int) bool {
		if out[i].Flows != out[j].Flows {
			return out[i].Flows > out[j].Flows
		}
		return out[i].Name < out[j].Name
	})
	return out
}

// percentiles are the nearest-rank p50 and p99 of vs (zero for none).
func percentiles(name string, vs []int64) latencyStat {
	l := latencyStat{Name: name}
	if len(vs) == 0 {
		return l
	}
	vs = slices.Clone(vs)
	slices.Sort(vs)
	rank := func(p float64) int64 {
		i := int(math.Ceil(p/100*float64(len(vs)))) - 1
		return vs[min(max(i, 0), len(vs)-1)]
	}
	l.P50Ns, l.P99Ns = rank(50), rank(99)
	return l
}

// printStats prints the summary: tables by default, a FlowStats document
// for the structured formats.
func (p *flowPrinter) printStats(s flowStats) error {
	if !p.o.output.isHuman("wide") {
		return p.o.output.printDocument(p.w, "FlowStats", s)
	}
	w := p.w
	what := "flows"
	if p.o.filter != "" {
		what += " matching " + p.o.filter
	}
	fmt.Fprintf(w, "%d %s\n", s.Flows, what)
	if s.Flows == 0 {
		return nil
	}
	section := func(title string, columns []string, rows [][]any) error {
		fmt.Fprintln(w)
		if len(rows) == 0 {
			fmt.Fprintf(w, "%s: none\n", title)
			return nil
		}
		return printTable(w, append([]string{title}, columns...), rows)
	}
	counts := func(cs []statCount, percent bool) [][]any {
		var rows [][]any
		for _, c := range cs {
			row := []any{c.Name, fmt.Sprint(c.Flows)}
			if percent {
				row = append(row, fmt.Sprintf("%.1f%%", c.Percent))
			}
			rows = append(rows, row)
		}
		return rows
	}
	if err := section("Deciding stage (predicted)", []string{"Flows", "%"}, counts(s.ByStage, true)); err != nil {
		return err
	}
	if err := section("Agreement", []string{"Flows", "%"}, counts(s.Agreement, true)); err != nil {
		return err
	}
	if err := section("Denied caller", []string{"Flows"}, counts(s.DenialsByUser, false)); err != nil {
		return err
	}
	if err := section("Unknown because", []string{"Flows"}, counts(s.UnknownByReason, false)); err != nil {
		return err
	}
	var lat [][]any
	for _, l := range s.Latency {
		lat = append(lat, []any{l.Name, flowview.Duration(l.P50Ns), flowview.Duration(l.P99Ns)})
	}
	return section("Latency", []string{"p50", "p99"}, lat)
}
