package stages

import (
	"context"
	"fmt"
	"strings"
)

// storage reports the storage part of the write path's run: existence and
// resourceVersion/uid preconditions checked against the object as it was
// read from the cluster (the registry runs in dry run and never writes).
// Reads (get, list, watch) are not modelled yet.
type storageStage struct{ m *machinery }

func newStorage(m *machinery) Stage { return storageStage{m} }

func (storageStage) Name() string { return "storage" }

func (storageStage) recorded() {}

func (storageStage) Run(_ context.Context, req *Request) Result {
	if !IsWrite(req.Info) {
		return notModelled() // reads
	}
	run, none := writeRunOf(req)
	if run == nil {
		return none
	}
	var reads []string
	seen := map[string]bool{}
	for i := len(run.reads) - 1; i >= 0; i-- {
		r := run.reads[i]
		if seen[r.Key] {
			continue // the registry may read an object twice; say the last
		}
		seen[r.Key] = true
		s := r.Key + ": "
		if r.Found {
			s += "found at resourceVersion " + r.ResourceVersion
		} else {
			s += "not found"
		}
		if r.Snapshot != "" {
			s += fmt.Sprintf(" as of resourceVersion %s, before the request's own write", r.Snapshot)
		}
		reads = append(reads, fmt.Sprintf("%s (read through the apiserver in %v)", s, r.Duration.Round(10_000)))
	}
	start, end, reached := run.phaseTimes(phaseStorage)
	if !reached {
		start, end = run.end, run.end
	}
	var res Result
	switch {
	case run.decided == "storage":
		res = Reject(run.status, "storage refuses: "+statusMessage(run.status)+explainReads(reads))
	case run.decided != "":
		res = Skip(notReached(run))
	default:
		res = Pass("dry run: the registry accepts the write" + explainReads(reads))
	}
	res.Began, res.Ended = start, end
	return res
}

func explainReads(reads []string) string {
	if len(reads) == 0 {
		return ""
	}
	return "; read " + strings.Join(reads, "; ")
}
