package citest

import (
	"fmt"
	"regexp"
	"slices"
	"strings"
	"time"

	"github.com/kproxy/kproxy/internal/record"
	"github.com/kproxy/kproxy/internal/testfile"
)

// Verdict is what a request got: the apiserver's answer (cluster engine)
// or kproxy's prediction (local engine), and the stage that decided it.
type Verdict struct {
	Status int `json:"status,omitempty"`
	// Stage is the deciding stage, testfile.StageNone when no stage
	// refused the request, or "unknown".
	Stage    string   `json:"stage"`
	Reason   string   `json:"reason,omitempty"`
	Message  string   `json:"message,omitempty"`
	Warnings []string `json:"warnings,omitempty"`
	// Explanation is the deciding stage's explanation (or, for a request
	// that passes, the last stage's).
	Explanation string `json:"explanation,omitempty"`
	// Unknown says why there is no verdict to compare (kproxy cannot
	// predict the request, or the engine could not send it).
	Unknown string `json:"unknown,omitempty"`
	// Predicted is kproxy's prediction of the same request (cluster
	// engine), and Disagreement how it differs from the apiserver's
	// answer ("" when they agree).
	Predicted    *record.Prediction `json:"predicted,omitempty"`
	Disagreement string             `json:"disagreement,omitempty"`
	// WarningsUnknown: the engine does not know the answer's warnings
	// (the local engine does not predict them), so they are not compared.
	WarningsUnknown bool `json:"warningsUnknown,omitempty"`
	// Stages are the replay's verdicts, stage by stage.
	Stages []record.StageResult `json:"stages,omitempty"`
}

// Summary is the verdict in a few words: "403 Forbidden at authorization";
// the cluster engine's answer whose deciding stage kproxy cannot tell is
// still the apiserver's ("403 Forbidden, stage unknown"); "unknown" when
// there is no answer at all.
func (v Verdict) Summary() string {
	if v.Unknown != "" || (v.Stage == record.StageUnknown && v.Status == 0) {
		return "unknown"
	}
	s := v.answer()
	switch v.Stage {
	case "", testfile.StageNone:
	case record.StageUnknown:
		s += ", stage unknown"
	default:
		s += " at " + v.Stage
	}
	return s
}

// answer is the status and reason alone: "403 Forbidden".
func (v Verdict) answer() string {
	s := fmt.Sprint(v.Status)
	if v.Reason != "" {
		s += " " + v.Reason
	}
	return s
}

// Result is one case's outcome.
type Result struct {
	File string `json:"file"`
	Line int    `json:"line,omitempty"`
	Name string `json:"name"`
	// Method and Path are the request, for reports.
	Method string  `json:"method"`
	Path   string  `json:"path"`
	Got    Verdict `json:"got"`
	// Failures are the expectations that did not hold, one sentence each.
	Failures []string `json:"failures,omitempty"`
	// NotCompared are expectations left out on purpose, with why (the
	// storage stage's outcome depends on the state at snapshot time).
	NotCompared []string `json:"notCompared,omitempty"`
	// Error is an engine failure for this case (exit status 2).
	Error    string        `json:"error,omitempty"`
	Duration time.Duration `json:"durationNs"`
	// Outcome is passed, failed or error, set by Summarize for the
	// printed report (a reader need not infer it).
	Outcome string `json:"outcome,omitempty"`
}

// Passed reports whether every compared expectation held.
func (r Result) Passed() bool { return len(r.Failures) == 0 && r.Error == "" }

// Change is a case whose verdict an overlay or a changed flag changes.
type Change struct {
	File   string  `json:"file"`
	Name   string  `json:"name"`
	Before Verdict `json:"before"`
	After  Verdict `json:"after"`
}

// Report is one run of a suite.
type Report struct {
	// APIVersion and Kind name the document in -o json and yaml
	// (kproxy.dev/v1alpha1, ReportKind); the report reads without them.
	APIVersion string `json:"apiVersion,omitempty"`
	Kind       string `json:"kind,omitempty"`

	Engine   string        `json:"engine"`
	Snapshot string        `json:"snapshot,omitempty"`
	Started  time.Time     `json:"started"`
	Duration time.Duration `json:"durationNs"`
	Results  []Result      `json:"results"`
	// WhatIf describes the overlays and flags compared against the
	// baseline; Changes are the cases whose verdict they change.
	WhatIf  []string `json:"whatIf,omitempty"`
	Changes []Change `json:"changes,omitempty"`
	// Disagreements counts cases where kproxy's prediction and the
	// apiserver disagree (cluster engine).
	Disagreements int `json:"disagreements"`
	// Summary is the totals, set by Summarize for the printed report.
	Summary *Summary `json:"summary,omitempty"`
}

// Summary is a report's totals.
type Summary struct {
	Cases   int `json:"cases"`
	Passed  int `json:"passed"`
	Failed  int `json:"failed"`
	Errored int `json:"errored"`
}

// The outcomes of a case in a printed report.
const (
	OutcomePassed = "passed"
	OutcomeFailed = "failed"
	OutcomeError  = "error"
)

// Summarize sets the report's Summary and each result's Outcome.
func (r *Report) Summarize() {
	passed, failed, errored := r.Counts()
	r.Summary = &Summary{Cases: len(r.Results), Passed: passed, Failed: failed, Errored: errored}
	for i := range r.Results {
		res := &r.Results[i]
		switch {
		case res.Error != "":
			res.Outcome = OutcomeError
		case len(res.Failures) > 0:
			res.Outcome = OutcomeFailed
		default:
			res.Outcome = OutcomePassed
		}
	}
}

// ReportKind is the kind of the report as kproxy test run -o json and yaml
// print it.
const ReportKind = "TestReport"

// Counts are the report's totals.
func (r *Report) Counts() (passed, failed, errored int) {
	for _, res := range r.Results {
		switch {
		case res.Error != "":
			errored++
		case len(res.Failures) > 0:
			failed++
		default:
			passed++
		}
	}
	return
}

// Exit statuses of kproxy test run (the contract's).
const (
	ExitPassed   = 0 // every expectation held
	ExitFailed   = 1 // an expectation failed
	ExitBadInput = 2 // bad input or an engine failure
)

// ExitCode is the status kproxy test run exits with for r.
func (r *Report) ExitCode() int {
	_, failed, errored := r.Counts()
	switch {
	case errored > 0:
		return ExitBadInput
	case failed > 0:
		return ExitFailed
	}
	return ExitPassed
}

// CompareOptions say what is compared.
type CompareOptions struct {
	// Storage compares the storage stage's outcomes (404, 409) too; by
	// default a case decided at storage on either side passes when the
	// other side also got through every stage before storage, because
	// those outcomes depend on the state when the snapshot was taken.
	Storage bool
}

// Compare checks v against the case's expectations: the failures, and
// what was not compared on purpose.
func Compare(e testfile.Expect, v Verdict, o CompareOptions) (failures, notCompared []string) {
	if v.Unknown != "" {
		return []string{"no verdict to compare: " + v.Unknown}, nil
	}
	gotStage := v.Stage
	if gotStage == "" {
		gotStage = testfile.StageNone
	}
	if !o.Storage && storageDecides(e, gotStage) {
		// Both sides got through every stage before storage: what storage
		// answers depends on the state, which is not compared by default.
		if e.Stage != gotStage || (e.Status != 0 && e.Status != v.Status) {
			notCompared = append(notCompared, fmt.Sprintf("storage: want %s, got %s; the storage stage's outcome (404, 409) depends on the state when the snapshot was taken and is not compared (--compare-storage compares it)",
				describeExpect(e), v.Summary()))
		}
		return nil, notCompared
	}
	if e.Status != 0 && e.Status != v.Status {
		failures = append(failures, fmt.Sprintf("status: want %d, got %s", e.Status, v.Summary()))
	}
	if e.Stage != "" && e.Stage != gotStage {
		if gotStage == record.StageUnknown {
			failures = append(failures, fmt.Sprintf("stage: want %s; the deciding stage is unknown (%s)", e.Stage, unknownStageWhy(v)))
		} else {
			failures = append(failures, fmt.Sprintf("stage: want %s, got %s", e.Stage, gotStage))
		}
	}
	if e.Reason != "" && e.Reason != v.Reason {
		failures = append(failures, fmt.Sprintf("reason: want %s, got %q", e.Reason, v.Reason))
	}
	if e.Message != "" {
		if re, err := regexp.Compile(e.Message); err == nil && !re.MatchString(v.Message) {
			failures = append(failures, fmt.Sprintf("message: want a match for %q, got %q", e.Message, v.Message))
		}
	}
	if v.WarningsUnknown && len(e.Warnings) > 0 {
		notCompared = append(notCompared, "warnings: the local engine does not predict the apiserver's warnings (--engine cluster compares them)")
	}
	for _, w := range e.Warnings {
		if v.WarningsUnknown {
			break
		}
		re, err := regexp.Compile(w)
		if err != nil {
			continue
		}
		if !slices.ContainsFunc(v.Warnings, re.MatchString) {
			failures = append(failures, fmt.Sprintf("warnings: want one matching %q, got %q", w, v.Warnings))
		}
	}
	return failures, notCompared
}

// unknownStageWhy says briefly why the deciding stage is unknown: the
// reports print the disagreement itself beside the failures.
func unknownStageWhy(v Verdict) string {
	if v.Predicted != nil && v.Predicted.Stage == record.StageUnknown {
		return "kproxy could not predict it"
	}
	if v.Predicted != nil {
		return "kproxy's prediction disagrees with the apiserver"
	}
	return v.Disagreement
}

// storageDecides reports whether the expectation or the verdict is the
// storage stage's, and the other side got through every stage before it.
func storageDecides(e testfile.Expect, got string) bool {
	wantStorage := e.Stage == record.StageStorage || (e.Stage == "" && (e.Status == 404 || e.Status == 409))
	if !wantStorage && got != record.StageStorage {
		return false
	}
	wantPasses := e.Stage == "" || e.Stage == record.StageStorage || e.Stage == testfile.StageNone
	gotPasses := got == record.StageStorage || got == testfile.StageNone
	return wantPasses && gotPasses
}

func describeExpect(e testfile.Expect) string {
	var parts []string
	if e.Status != 0 {
		parts = append(parts, fmt.Sprint(e.Status))
	}
	if e.Reason != "" {
		parts = append(parts, e.Reason)
	}
	if e.Stage != "" {
		parts = append(parts, "at "+e.Stage)
	}
	if len(parts) == 0 {
		return "(any)"
	}
	return strings.Join(parts, " ")
}
