package citest

import (
	"bytes"
	"encoding/json"
	"encoding/xml"
	"fmt"
	"io"
	"path"
	"path/filepath"
	"slices"
	"strings"
	"text/tabwriter"
	"time"
	"unicode"
	"unicode/utf8"

	"github.com/kproxy/kproxy/internal/record"
	"github.com/kproxy/kproxy/internal/testfile"
)

// Labels of a result in the table.
const (
	labelPass  = "PASS"
	labelFail  = "FAIL"
	labelError = "ERROR"
)

// maxRequest is how wide the table's REQUEST column gets (without wide):
// longer requests are cut in the middle, keeping the method, the start of
// the path and its end (the resource's name).
const maxRequest = 60

// detailIndent is how far detail lines sit under their row.
const detailIndent = "    "

// resultLabel is a result's RESULT column.
func resultLabel(res Result) string {
	switch {
	case res.Error != "":
		return labelError
	case len(res.Failures) > 0:
		return labelFail
	}
	return labelPass
}

// WriteTable writes r as a table, like kubectl's: one row per case
// (RESULT, CASE, REQUEST, GOT; wide adds the case's file:line and does
// not shorten requests), under each failing case its failures and the
// deciding stage's explanation, then what the what-if overlays change and
// the totals. The output is deterministic: durations are rounded and
// control characters in names and messages are replaced.
func WriteTable(w io.Writer, r *Report, wide bool) error {
	var out bytes.Buffer
	if len(r.Results) == 0 {
		out.WriteString("No cases.\n")
	} else {
		header := []string{"RESULT", "CASE", "REQUEST", "GOT"}
		if wide {
			header = append(header, "FILE")
		}
		rows := [][]string{header}
		for _, res := range r.Results {
			req := requestLine(res.Method, res.Path)
			if !wide {
				req = truncateMiddle(req, maxRequest)
			}
			got := res.Got.Summary()
			if res.Error != "" {
				got = "-"
			}
			row := []string{resultLabel(res), flatLine(res.Name), req, flatLine(got)}
			if wide {
				row = append(row, flatLine(fileLine(res.File, res.Line)))
			}
			rows = append(rows, row)
		}
		lines, err := tabulate(rows)
		if err != nil {
			return err
		}
		out.WriteString(lines[0] + "\n")
		for i, res := range r.Results {
			out.WriteString(lines[i+1] + "\n")
			for _, d := range tableDetails(res) {
				out.WriteString(detailIndent + d + "\n")
			}
		}
	}

	if len(r.Changes) > 0 {
		out.WriteString("\n" + whatIfHeadline(r) + "\n")
		header := []string{"CASE", "BEFORE", "", "AFTER"}
		if wide {
			header = append(header, "FILE")
		}
		rows := [][]string{header}
		for _, c := range r.Changes {
			row := []string{flatLine(c.Name), flatLine(c.Before.Summary()), "->", flatLine(c.After.Summary())}
			if wide {
				row = append(row, flatLine(fileLine(c.File, caseLine(r, c.File, c.Name))))
			}
			rows = append(rows, row)
		}
		lines, err := tabulate(rows)
		if err != nil {
			return err
		}
		out.WriteString("  " + lines[0] + "\n")
		for i, c := range r.Changes {
			out.WriteString("  " + lines[i+1] + "\n")
			if e := firstTextLine(verdictExplanation(c.After)); e != "" {
				out.WriteString("  " + detailIndent + "explanation: " + e + "\n")
			} else if c.After.Unknown != "" {
				out.WriteString("  " + detailIndent + "after, unknown: " + firstTextLine(c.After.Unknown) + "\n")
			}
			// An unknown before says why, or the change reads as the
			// overlay's doing.
			if c.Before.Unknown != "" {
				out.WriteString("  " + detailIndent + "before, unknown: " + firstTextLine(c.Before.Unknown) + "\n")
			}
		}
	}

	out.WriteString("\n" + countsLine(r) + " (" + runInfo(r) + ")\n")
	if r.Disagreements > 0 {
		out.WriteString(disagreementsLine(r.Disagreements) + "\n")
	}
	_, err := w.Write(out.Bytes())
	return err
}

// tableDetails are the lines shown under a case's row.
func tableDetails(res Result) []string {
	var d []string
	if res.Error != "" {
		lines := textLines(res.Error)
		d = append(d, "error: "+lines[0])
		for _, l := range lines[1:] {
			d = append(d, "  "+l)
		}
	}
	for _, f := range res.Failures {
		d = append(d, flatLine(f))
	}
	if len(res.Failures) > 0 {
		if e := firstTextLine(verdictExplanation(res.Got)); e != "" {
			d = append(d, "explanation: "+e)
		}
	}
	for _, n := range res.NotCompared {
		d = append(d, "note: "+flatLine(n))
	}
	if res.Got.Disagreement != "" {
		d = append(d, "kproxy's prediction disagrees: "+flatLine(res.Got.Disagreement))
	}
	return d
}

// tabulate aligns rows into columns (3 spaces apart, like kubectl's
// printers), one line per row, without trailing blanks.
func tabulate(rows [][]string) ([]string, error) {
	var b bytes.Buffer
	tw := tabwriter.NewWriter(&b, 6, 4, 3, ' ', 0)
	for _, row := range rows {
		fmt.Fprintln(tw, strings.Join(row, "\t"))
	}
	if err := tw.Flush(); err != nil {
		return nil, err
	}
	lines := strings.Split(strings.TrimSuffix(b.String(), "\n"), "\n")
	for i, l := range lines {
		lines[i] = strings.TrimRight(l, " ")
	}
	return lines, nil
}

// whatIfHeadline is "What-if (overlays): N cases change".
func whatIfHeadline(r *Report) string {
	s := "What-if"
	if len(r.WhatIf) > 0 {
		s += " (" + flatLine(strings.Join(r.WhatIf, ", ")) + ")"
	}
	return s + ": " + countNoun(len(r.Changes), "case changes", "cases change")
}

// countsLine is "N passed, M failed, K errors".
func countsLine(r *Report) string {
	passed, failed, errored := r.Counts()
	return fmt.Sprintf("%d passed, %d failed, %s", passed, failed, countNoun(errored, "error", "errors"))
}

// runInfo is "engine local, snapshot DIR, 1.234s".
func runInfo(r *Report) string {
	parts := []string{"engine " + dashIfEmpty(r.Engine)}
	if r.Snapshot != "" {
		parts = append(parts, "snapshot "+flatLine(r.Snapshot))
	}
	parts = append(parts, roundDuration(r.Duration).String())
	return strings.Join(parts, ", ")
}

func disagreementsLine(n int) string {
	return "kproxy's prediction disagreed with the apiserver on " + countNoun(n, "case", "cases")
}

// WriteJSON writes r as indented JSON, a kproxy.dev/v1alpha1 TestReport.
func WriteJSON(w io.Writer, r *Report) error {
	doc := *r
	doc.Results = slices.Clone(r.Results)
	doc.Summarize()
	doc.APIVersion, doc.Kind = testfile.APIVersion, ReportKind
	enc := json.NewEncoder(w)
	enc.SetIndent("", "  ")
	enc.SetEscapeHTML(false)
	return enc.Encode(&doc)
}

// JUnit XML, as Jenkins, GitLab and the GitHub reporters
// (dorny/test-reporter, mikepenz/action-junit-report) read it.
type junitSuites struct {
	XMLName   xml.Name     `xml:"testsuites"`
	Name      string       `xml:"name,attr,omitempty"`
	Tests     int          `xml:"tests,attr"`
	Failures  int          `xml:"failures,attr"`
	Errors    int          `xml:"errors,attr"`
	Skipped   int          `xml:"skipped,attr"`
	Time      string       `xml:"time,attr"`
	Timestamp string       `xml:"timestamp,attr,omitempty"`
	Suites    []junitSuite `xml:"testsuite"`
}

type junitSuite struct {
	Name       string          `xml:"name,attr"`
	Tests      int             `xml:"tests,attr"`
	Failures   int             `xml:"failures,attr"`
	Errors     int             `xml:"errors,attr"`
	Skipped    int             `xml:"skipped,attr"`
	Time       string          `xml:"time,attr"`
	Timestamp  string          `xml:"timestamp,attr,omitempty"`
	File       string          `xml:"file,attr,omitempty"`
	Properties []junitProperty `xml:"properties>property"`
	Cases      []junitCase     `xml:"testcase"`
}

type junitProperty struct {
	Name  string `xml:"name,attr"`
	Value string `xml:"value,attr"`
}

type junitCase struct {
	Name      string        `xml:"name,attr"`
	Classname string        `xml:"classname,attr"`
	File      string        `xml:"file,attr,omitempty"`
	Line      int           `xml:"line,attr,omitempty"`
	Time      string        `xml:"time,attr"`
	Failure   *junitProblem `xml:"failure,omitempty"`
	Error     *junitProblem `xml:"error,omitempty"`
	SystemOut *junitText    `xml:"system-out,omitempty"`
}

type junitProblem struct {
	Message string `xml:"message,attr"`
	Type    string `xml:"type,attr"`
	Body    string `xml:",cdata"`
}

type junitText struct {
	Body string `xml:",cdata"`
}

// junitTimestamp is the JUnit schema's timestamp: ISO 8601 without a
// zone, here in UTC.
const junitTimestamp = "2006-01-02T15:04:05"

// WriteJUnit writes r as JUnit XML: one testsuite per test file, one
// testcase per case. A failed expectation is a <failure> (its message the
// first failure; its text every failure, the verdict, the deciding
// stage's explanation and the request), an engine failure an <error>;
// expectations not compared, disagreements between kproxy's prediction
// and the apiserver, and what-if changes go to <system-out>.
func WriteJUnit(w io.Writer, r *Report, suiteName string) error {
	stamp := ""
	if !r.Started.IsZero() {
		stamp = r.Started.UTC().Format(junitTimestamp)
	}
	props := []junitProperty{{Name: "engine", Value: xmlSafe(r.Engine)}}
	if r.Snapshot != "" {
		props = append(props, junitProperty{Name: "snapshot", Value: xmlSafe(r.Snapshot)})
	}
	for _, wi := range r.WhatIf {
		props = append(props, junitProperty{Name: "whatIf", Value: xmlSafe(wi)})
	}
	passed, failed, errored := r.Counts()
	doc := junitSuites{
		Name:      xmlSafe(suiteName),
		Tests:     passed + failed + errored,
		Failures:  failed,
		Errors:    errored,
		Time:      junitSeconds(r.Duration),
		Timestamp: stamp,
	}
	changes := changesByCase(r)
	suites := map[string]int{}
	var durations []time.Duration
	for _, res := range r.Results {
		i, ok := suites[res.File]
		if !ok {
			i = len(doc.Suites)
			suites[res.File] = i
			doc.Suites = append(doc.Suites, junitSuite{
				Name:       xmlSafe(slashPath(res.File)),
				File:       xmlSafe(slashPath(res.File)),
				Timestamp:  stamp,
				Properties: props,
			})
			durations = append(durations, 0)
		}
		s := &doc.Suites[i]
		s.Tests++
		durations[i] += res.Duration
		tc := junitCase{
			Name:      xmlSafe(res.Name),
			Classname: xmlSafe(classname(res.File)),
			File:      xmlSafe(slashPath(res.File)),
			Line:      res.Line,
			Time:      junitSeconds(res.Duration),
		}
		switch {
		case res.Error != "":
			s.Errors++
			tc.Error = &junitProblem{
				Message: xmlSafe(firstTextLine(res.Error)),
				Type:    "engine",
				Body:    xmlSafe(res.Error + "\n\nrequest: " + requestLine(res.Method, res.Path) + "\nat: " + fileLine(res.File, res.Line)),
			}
		case len(res.Failures) > 0:
			s.Failures++
			tc.Failure = &junitProblem{
				Message: xmlSafe(res.Failures[0]),
				Type:    "expectation",
				Body:    xmlSafe(failureText(res)),
			}
		}
		if out := systemOut(res, changes[changeKey{res.File, res.Name}], r.WhatIf); out != "" {
			tc.SystemOut = &junitText{Body: xmlSafe(out)}
		}
		s.Cases = append(s.Cases, tc)
	}
	for i := range doc.Suites {
		doc.Suites[i].Time = junitSeconds(durations[i])
	}
	if _, err := io.WriteString(w, xml.Header); err != nil {
		return err
	}
	enc := xml.NewEncoder(w)
	enc.Indent("", "  ")
	if err := enc.Encode(doc); err != nil {
		return err
	}
	_, err := io.WriteString(w, "\n")
	return err
}

// failureText is a failed case in full: what failed, what it got, why,
// and the request.
func failureText(res Result) string {
	var b strings.Builder
	for _, f := range res.Failures {
		b.WriteString(f + "\n")
	}
	b.WriteString("\ngot: " + res.Got.Summary() + "\n")
	if res.Got.Unknown != "" {
		b.WriteString("unknown: " + res.Got.Unknown + "\n")
	}
	if res.Got.Message != "" {
		b.WriteString("message: " + res.Got.Message + "\n")
	}
	for _, wn := range res.Got.Warnings {
		b.WriteString("warning: " + wn + "\n")
	}
	if e := verdictExplanation(res.Got); e != "" {
		b.WriteString("explanation (" + dashIfEmpty(decidingStage(res.Got)) + "): " + e + "\n")
	}
	b.WriteString("request: " + requestLine(res.Method, res.Path) + "\n")
	b.WriteString("at: " + fileLine(res.File, res.Line))
	return b.String()
}

// systemOut is what a case's report says besides pass or fail.
func systemOut(res Result, changes []Change, whatIf []string) string {
	var lines []string
	for _, n := range res.NotCompared {
		lines = append(lines, "note: "+n)
	}
	if res.Got.Disagreement != "" {
		lines = append(lines, "kproxy's prediction disagrees: "+res.Got.Disagreement)
		if p := res.Got.Predicted; p != nil {
			lines = append(lines, fmt.Sprintf("kproxy predicted: %s", Verdict{Status: p.Status, Stage: p.Stage, Reason: p.Reason}.Summary()))
		}
	}
	for _, c := range changes {
		s := "what-if"
		if len(whatIf) > 0 {
			s += " (" + strings.Join(whatIf, ", ") + ")"
		}
		lines = append(lines, s+": "+c.Before.Summary()+" -> "+c.After.Summary())
		if e := verdictExplanation(c.After); e != "" {
			lines = append(lines, "explanation: "+e)
		}
	}
	return strings.Join(lines, "\n")
}

type changeKey struct{ file, name string }

func changesByCase(r *Report) map[changeKey][]Change {
	m := map[changeKey][]Change{}
	for _, c := range r.Changes {
		k := changeKey{c.File, c.Name}
		m[k] = append(m[k], c)
	}
	return m
}

// classname is the file's path without its extension (JUnit groups
// cases by class).
func classname(file string) string {
	p := slashPath(file)
	return strings.TrimSuffix(p, path.Ext(p))
}

// junitSeconds is a JUnit time: seconds with 3 decimals.
func junitSeconds(d time.Duration) string {
	return fmt.Sprintf("%.3f", d.Seconds())
}

// xmlSafe replaces the characters XML 1.0 cannot hold (control characters
// but tab, newline and carriage return) with U+FFFD; encoding/xml escapes
// the rest, but passes CDATA through as is.
func xmlSafe(s string) string {
	return strings.Map(func(r rune) rune {
		switch {
		case r == '\t' || r == '\n' || r == '\r':
			return r
		case r < 0x20, r == 0xFFFE, r == 0xFFFF, r >= 0xD800 && r <= 0xDFFF:
			return utf8.RuneError
		}
		return r
	}, strings.ToValidUTF8(s, string(utf8.RuneError)))
}

// WriteGitHub writes r as GitHub Actions workflow commands to w (an
// ::error annotation on each failed case's line, a ::warning for each
// disagreement between kproxy's prediction and the apiserver and each
// what-if change) and, when summary is not nil, a Markdown step summary
// to it (the caller opens $GITHUB_STEP_SUMMARY).
func WriteGitHub(w io.Writer, summary io.Writer, r *Report) error {
	var b strings.Builder
	for _, res := range r.Results {
		switch {
		case res.Error != "":
			b.WriteString(ghCommand("error", res.File, res.Line, "kproxy test: "+res.Name+" (engine error)",
				res.Error+"\nrequest: "+requestLine(res.Method, res.Path)))
		case len(res.Failures) > 0:
			msg := strings.Join(res.Failures, "\n") + "\ngot: " + res.Got.Summary()
			if e := verdictExplanation(res.Got); e != "" {
				msg += "\nexplanation (" + dashIfEmpty(decidingStage(res.Got)) + "): " + e
			}
			msg += "\nrequest: " + requestLine(res.Method, res.Path)
			b.WriteString(ghCommand("error", res.File, res.Line, "kproxy test: "+res.Name, msg))
		}
		if res.Got.Disagreement != "" {
			b.WriteString(ghCommand("warning", res.File, res.Line, "kproxy's prediction disagrees: "+res.Name,
				res.Got.Disagreement+"\napiserver: "+res.Got.Summary()+"\nrequest: "+requestLine(res.Method, res.Path)))
		}
	}
	for _, c := range r.Changes {
		title := "kproxy what-if: " + c.Name
		msg := c.Before.Summary() + " -> " + c.After.Summary()
		if len(r.WhatIf) > 0 {
			msg += " (" + strings.Join(r.WhatIf, ", ") + ")"
		}
		if e := verdictExplanation(c.After); e != "" {
			msg += "\nexplanation (" + dashIfEmpty(decidingStage(c.After)) + "): " + e
		}
		b.WriteString(ghCommand("warning", c.File, caseLine(r, c.File, c.Name), title, msg))
	}
	// One plain line for the log, whatever the step summary.
	fmt.Fprintf(&b, "kproxy test: %s of %s (%s)\n", countsLine(r), countNoun(len(r.Results), "case", "cases"), runInfo(r))
	if _, err := io.WriteString(w, b.String()); err != nil {
		return err
	}
	if summary == nil {
		return nil
	}
	_, err := io.WriteString(summary, stepSummary(r))
	return err
}

// ghCommand is one workflow command line: ::level file=F,line=L,title=T::MESSAGE.
func ghCommand(level, file string, line int, title, msg string) string {
	var props []string
	if file != "" {
		props = append(props, "file="+ghProperty(slashPath(file)))
	}
	if file != "" && line > 0 {
		props = append(props, fmt.Sprintf("line=%d", line))
	}
	props = append(props, "title="+ghProperty(title))
	return "::" + level + " " + strings.Join(props, ",") + "::" + ghData(msg) + "\n"
}

// ghData escapes a workflow command's message (the runner's escapeData).
func ghData(s string) string {
	return strings.NewReplacer("%", "%25", "\r", "%0D", "\n", "%0A").Replace(s)
}

// ghProperty escapes a workflow command's property value (the runner's
// escapeProperty).
func ghProperty(s string) string {
	return strings.NewReplacer("%", "%25", "\r", "%0D", "\n", "%0A", ":", "%3A", ",", "%2C").Replace(s)
}

// stepSummary is the Markdown step summary.
func stepSummary(r *Report) string {
	var b strings.Builder
	passed, failed, errored := r.Counts()
	verdict := "passed"
	if failed+errored > 0 {
		verdict = "failed"
	}
	fmt.Fprintf(&b, "## kproxy test %s: %s\n\n", verdict, countsLine(r))
	fmt.Fprintf(&b, "Engine %s", mdCode(dashIfEmpty(r.Engine)))
	if r.Snapshot != "" {
		fmt.Fprintf(&b, ", snapshot %s", mdCode(r.Snapshot))
	}
	fmt.Fprintf(&b, ", %s.", roundDuration(r.Duration))
	if r.Disagreements > 0 {
		b.WriteString(" " + disagreementsLine(r.Disagreements) + ".")
	}
	b.WriteString("\n")

	if failed+errored > 0 {
		b.WriteString("\n### Failed cases\n\n")
		b.WriteString("| Case | Request | Failures | Got | Deciding stage |\n")
		b.WriteString("| --- | --- | --- | --- | --- |\n")
		for _, res := range r.Results {
			if res.Passed() {
				continue
			}
			var fails, got, why string
			if res.Error != "" {
				fails = "engine error: " + res.Error
				got, why = "-", "-"
			} else {
				fails = strings.Join(res.Failures, "\n")
				got = res.Got.Summary()
				why = dashIfEmpty(decidingStage(res.Got))
				if e := verdictExplanation(res.Got); e != "" {
					why += ": " + e
				}
			}
			fmt.Fprintf(&b, "| %s<br>%s | %s | %s | %s | %s |\n",
				mdText(res.Name), mdCode(fileLine(res.File, res.Line)), mdCode(requestLine(res.Method, res.Path)),
				mdText(fails), mdText(got), mdText(why))
		}
	}

	if len(r.Changes) > 0 {
		b.WriteString("\n### " + mdText(whatIfHeadline(r)) + "\n\n")
		b.WriteString("| Case | Before | After | Why |\n")
		b.WriteString("| --- | --- | --- | --- |\n")
		for _, c := range r.Changes {
			why := dashIfEmpty(decidingStage(c.After))
			if e := verdictExplanation(c.After); e != "" {
				why += ": " + e
			}
			fmt.Fprintf(&b, "| %s<br>%s | %s | %s | %s |\n",
				mdText(c.Name), mdCode(fileLine(c.File, caseLine(r, c.File, c.Name))),
				mdText(c.Before.Summary()), mdText(c.After.Summary()), mdText(why))
		}
	}

	var disagree, notes []string
	for _, res := range r.Results {
		if res.Got.Disagreement != "" {
			disagree = append(disagree, fmt.Sprintf("- %s (%s): %s", mdText(res.Name), mdCode(fileLine(res.File, res.Line)), mdText(res.Got.Disagreement)))
		}
		for _, n := range res.NotCompared {
			notes = append(notes, fmt.Sprintf("- %s (%s): %s", mdText(res.Name), mdCode(fileLine(res.File, res.Line)), mdText(n)))
		}
	}
	if len(disagree) > 0 {
		b.WriteString("\n### kproxy's prediction disagrees with the apiserver\n\n")
		b.WriteString(strings.Join(disagree, "\n") + "\n")
	}
	if len(notes) > 0 {
		fmt.Fprintf(&b, "\n<details><summary>%s not compared</summary>\n\n", countNoun(len(notes), "expectation", "expectations"))
		b.WriteString(strings.Join(notes, "\n") + "\n\n</details>\n")
	}
	if passed > 0 {
		fmt.Fprintf(&b, "\n<details><summary>%d passed</summary>\n\n", passed)
		for _, res := range r.Results {
			if res.Passed() {
				fmt.Fprintf(&b, "- %s %s %s\n", mdText(res.Name), mdCode(requestLine(res.Method, res.Path)), mdText(res.Got.Summary()))
			}
		}
		b.WriteString("\n</details>\n")
	}
	return b.String()
}

// mdText escapes s for a Markdown table cell: punctuation Markdown or
// HTML would take is backslash-escaped, line breaks become <br>.
func mdText(s string) string {
	var b strings.Builder
	for i, l := range textLines(s) {
		if i > 0 {
			b.WriteString("<br>")
		}
		for _, r := range l {
			if strings.ContainsRune("\\`*_[]<>|~&#", r) {
				b.WriteByte('\\')
			}
			if unicode.IsControl(r) {
				r = ' '
			}
			b.WriteRune(r)
		}
	}
	return b.String()
}

// mdCode is s as a code span in a Markdown table cell.
func mdCode(s string) string {
	s = strings.ReplaceAll(flatLine(s), "|", "\\|")
	fence := "`"
	for strings.Contains(s, fence) {
		fence += "`"
	}
	if strings.Contains(s, "`") {
		return fence + " " + s + " " + fence
	}
	return fence + s + fence
}

// verdictExplanation is the deciding stage's explanation: the verdict's,
// or else the deciding stage's among the replay's stages (for a request no
// stage refuses, the last stage it passed).
func verdictExplanation(v Verdict) string {
	if v.Explanation != "" {
		return v.Explanation
	}
	passes := v.Stage == "" || v.Stage == testfile.StageNone
	for i := len(v.Stages) - 1; i >= 0; i-- {
		s := v.Stages[i]
		if s.Explanation != "" && ((passes && s.Outcome == record.Pass) || (!passes && s.Name == v.Stage)) {
			return s.Explanation
		}
	}
	return ""
}

// decidingStage is the verdict's deciding stage, "none" when none refused it.
func decidingStage(v Verdict) string {
	if v.Stage == "" {
		return testfile.StageNone
	}
	return v.Stage
}

// caseLine is the line of the case named name in file, from r's results.
func caseLine(r *Report, file, name string) int {
	for _, res := range r.Results {
		if res.File == file && res.Name == name {
			return res.Line
		}
	}
	return 0
}

func requestLine(method, p string) string {
	if method == "" {
		method = "GET"
	}
	return flatLine(method + " " + p)
}

func fileLine(file string, line int) string {
	file = slashPath(file)
	if line > 0 {
		return fmt.Sprintf("%s:%d", file, line)
	}
	return file
}

func slashPath(p string) string {
	if p == "" {
		return ""
	}
	return filepath.ToSlash(filepath.Clean(p))
}

// truncateMiddle shortens s to n characters, cutting its middle.
func truncateMiddle(s string, n int) string {
	rs := []rune(s)
	if len(rs) <= n {
		return s
	}
	const dots = "..."
	keep := n - len(dots)
	head := keep / 2
	tail := keep - head
	return string(rs[:head]) + dots + string(rs[len(rs)-tail:])
}

// flatLine puts s on one line: control characters (line breaks, tabs)
// become spaces.
func flatLine(s string) string {
	return strings.Map(func(r rune) rune {
		if unicode.IsControl(r) {
			return ' '
		}
		return r
	}, strings.TrimSpace(s))
}

// firstTextLine is s's first non-empty line, on one line.
func firstTextLine(s string) string {
	for _, l := range textLines(s) {
		if strings.TrimSpace(l) != "" {
			return flatLine(l)
		}
	}
	return ""
}

func textLines(s string) []string {
	return strings.Split(strings.ReplaceAll(strings.TrimRight(s, "\r\n"), "\r\n", "\n"), "\n")
}

func roundDuration(d time.Duration) time.Duration {
	if d >= time.Millisecond || d <= -time.Millisecond {
		return d.Round(time.Millisecond)
	}
	return d.Round(time.Microsecond)
}

func countNoun(n int, one, many string) string {
	if n == 1 {
		return "1 " + one
	}
	return fmt.Sprintf("%d %s", n, many)
}

func dashIfEmpty(s string) string {
	if s == "" {
		return "-"
	}
	return s
}
