package bench

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"os"
	"slices"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/kproxy/kproxy/internal/record"
)

// Issue 16's budget for a capture record: what people can afford to keep.
const (
	getRecordBudget   = 1500 // bytes, median of a GET's records
	writeRecordBudget = 3000 // bytes, median of a write's records
)

// recordsNS is where BenchmarkRecordSize reads and writes: its records are
// told from the other benchmarks' by namespace.
const recordsNS = "bench-records"

// kubectlHeaders are the headers kubectl sends besides its credential:
// the records measured are those of the most common client.
func kubectlHeaders(req *http.Request, command string) {
	req.Header.Set("Accept", "application/json")
	req.Header.Set("User-Agent", "kubectl/v1.37.2 (linux/amd64) kubernetes/$Format")
	req.Header.Set("Kubectl-Command", command)
	req.Header.Set("Kubectl-Session", "2b71d42e-fa61-4c52-9924-8bc37923832e")
}

// BenchmarkRecordSize: the median size of the capture records the
// "kproxy" target writes for a GET of one object and for a create, sent as
// kubectl sends them (budget: <= 1.5 KB for a GET, <= 3 KB for a write).
// The bench's apiserver exports no spans, so the records have no "server"
// part (where it has, 1 to 1.5 KB more).
func BenchmarkRecordSize(b *testing.B) {
	kp := targetNamed("kproxy")
	ensureNamespace(b, recordsNS)
	cm := &corev1.ConfigMap{ObjectMeta: metav1.ObjectMeta{Name: "records-cm"}, Data: map[string]string{"k": "v"}}
	if _, err := e.admin.CoreV1().ConfigMaps(recordsNS).Create(context.Background(), cm, metav1.CreateOptions{}); err != nil && !strings.Contains(err.Error(), "already exists") {
		b.Fatal(err)
	}
	getCM := func() {
		req, _ := http.NewRequest("GET", kp.base+"/api/v1/namespaces/"+recordsNS+"/configmaps/records-cm", nil)
		kubectlHeaders(req, "kubectl get")
		if err := send(kp, req); err != nil {
			b.Fatal(err)
		}
	}
	// Until kproxy has synced the cluster's state, its records are of
	// requests it cannot predict: not the records measured.
	warm := time.Now()
	for deadline := warm.Add(time.Minute); ; {
		getCM()
		if gets, _, _, _ := readRecords(b, e.capture, warm); len(gets) > 0 {
			break
		}
		if time.Now().After(deadline) {
			b.Fatal("kproxy predicts no GET a minute after it started")
		}
		time.Sleep(200 * time.Millisecond)
	}
	n := count(40)
	start := time.Now()
	for i := 0; i < n; i++ {
		getCM()
		body := fmt.Sprintf(`{"apiVersion":"v1","kind":"ConfigMap","metadata":{"name":"rec-%d-%d"},"data":{"k":"v"}}`, start.UnixNano(), i)
		req, _ := http.NewRequest("POST", kp.base+"/api/v1/namespaces/"+recordsNS+"/configmaps", strings.NewReader(body))
		kubectlHeaders(req, "kubectl create")
		req.Header.Set("Content-Type", "application/json")
		if err := send(kp, req); err != nil {
			b.Fatal(err)
		}
	}
	gets, writes, unknown, why := waitRecords(b, e.capture, start, n)
	if unknown > 0 {
		b.Logf("%d records not predicted, left out; the last: %s", unknown, why)
	}
	getMedian, writeMedian := median(gets), median(writes)
	b.ReportMetric(float64(len(getMedian)), "get-record-B")
	b.ReportMetric(float64(len(writeMedian)), "write-record-B")
	b.Logf("median capture record: GET %d B (budget %d B: %s), create %d B (budget %d B: %s); of the %d GETs and %d creates predicted\n  GET:    %s\n  create: %s",
		len(getMedian), getRecordBudget, verdict(len(getMedian), getRecordBudget),
		len(writeMedian), writeRecordBudget, verdict(len(writeMedian), writeRecordBudget), len(gets), len(writes),
		breakdown(getMedian), breakdown(writeMedian))
}

// waitRecords reads the capture until it holds the records of the n GETs
// and n creates sent in recordsNS since start (records are written once
// the replay is over too), and returns the lines of those kproxy
// predicted; unknown counts the others (a replay shed, state not synced),
// why says why the last of them was not.
func waitRecords(b *testing.B, capture string, start time.Time, n int) (gets, writes [][]byte, unknown int, why string) {
	b.Helper()
	deadline := time.Now().Add(30 * time.Second)
	for {
		var all int
		gets, writes, all, why = readRecords(b, capture, start)
		unknown = all - len(gets) - len(writes)
		if all >= 2*n {
			break
		}
		if time.Now().After(deadline) {
			b.Fatalf("the capture holds %d of the %d records of the requests sent", all, 2*n)
		}
		time.Sleep(100 * time.Millisecond)
	}
	if len(gets) == 0 || len(writes) == 0 {
		b.Fatalf("kproxy predicted %d of the %d GETs and %d of the %d creates (%s)", len(gets), n, len(writes), n, why)
	}
	return gets, writes, unknown, why
}

// readRecords reads the capture's records of GETs and creates in
// recordsNS since start: the lines of those kproxy predicted, how many
// there are in all, and why the last it did not predict was not.
func readRecords(b *testing.B, capture string, start time.Time) (gets, writes [][]byte, all int, why string) {
	b.Helper()
	f, err := os.Open(capture)
	if err != nil {
		b.Fatal(err)
	}
	defer f.Close()
	sc := bufio.NewScanner(f)
	sc.Buffer(make([]byte, 1<<20), 16<<20)
	var bad error // a line that is not a record: the last may be half written
	for sc.Scan() {
		if bad != nil {
			b.Fatalf("a capture line is not a record: %v", bad)
		}
		var r record.Record
		if bad = json.Unmarshal(sc.Bytes(), &r); bad != nil {
			continue
		}
		if r.Request.Namespace != recordsNS || r.Start.Before(start) || (r.Request.Verb != "get" && r.Request.Verb != "create") {
			continue
		}
		all++
		if r.Predicted.Stage == record.StageUnknown {
			why = r.Predicted.Message
			continue
		}
		line := bytes.Clone(sc.Bytes())
		if r.Request.Verb == "get" {
			gets = append(gets, line)
		} else {
			writes = append(writes, line)
		}
	}
	if err := sc.Err(); err != nil {
		b.Fatal(err)
	}
	return gets, writes, all, why
}

// median is the record of median size.
func median(lines [][]byte) []byte {
	s := slices.Clone(lines)
	slices.SortFunc(s, func(a, c []byte) int { return len(a) - len(c) })
	return s[len(s)/2]
}

func verdict(size, budget int) string {
	if size <= budget {
		return "met"
	}
	return fmt.Sprintf("over by %d B", size-budget)
}

// breakdown lists a record's bytes by part, largest first: the top-level
// fields, with the headers and the stages' explanations and children
// apart.
func breakdown(line []byte) string {
	var top map[string]json.RawMessage
	if err := json.Unmarshal(line, &top); err != nil {
		return err.Error()
	}
	type part struct {
		name string
		size int
	}
	var parts []part
	less := map[string]int{} // bytes of a field listed apart
	split := func(field, sub string) {
		var m map[string]json.RawMessage
		if json.Unmarshal(top[field], &m) != nil || m[sub] == nil {
			return
		}
		parts = append(parts, part{field + "." + sub, len(m[sub])})
		less[field] = len(m[sub])
	}
	split("request", "headers")
	split("actual", "headers")
	var stages []record.StageResult
	if json.Unmarshal(top["stages"], &stages) == nil {
		expl, children := 0, 0
		for _, s := range stages {
			q, _ := json.Marshal(s.Explanation)
			expl += len(q) - 2
			if len(s.Children) > 0 {
				c, _ := json.Marshal(s.Children)
				children += len(c)
			}
		}
		parts = append(parts, part{"stages.explanation", expl}, part{"stages.children", children})
		parts = append(parts, part{"stages (the rest)", len(top["stages"]) - expl - children})
		delete(top, "stages")
	}
	for k, v := range top {
		parts = append(parts, part{k, len(v) - less[k]})
	}
	slices.SortFunc(parts, func(a, c part) int {
		if a.size != c.size {
			return c.size - a.size
		}
		return strings.Compare(a.name, c.name)
	})
	out := make([]string, 0, len(parts))
	for _, p := range parts {
		out = append(out, fmt.Sprintf("%s %d", p.name, p.size))
	}
	return strings.Join(out, ", ")
}

// reportPredicted logs how many of the records the "kproxy" target wrote
// for requests in ns since start were predicted, and why the others were
// not (a replay shed, a read past --replay-*-qps): a throughput measured
// while replays are shed is not the cost of replaying every request.
func reportPredicted(b *testing.B, ns string, start time.Time, sent int) {
	b.Helper()
	var total, predicted int
	var why map[string]int
	// Records are written once their replay is over: wait for all of them.
	for deadline := time.Now().Add(30 * time.Second); ; time.Sleep(200 * time.Millisecond) {
		total, predicted, why = countPredicted(b, ns, start)
		if total >= sent {
			break
		}
		if time.Now().After(deadline) {
			b.Logf("the capture holds %d records of the %d requests sent to kproxy 30s after they were answered", total, sent)
			break
		}
	}
	b.ReportMetric(float64(predicted)/float64(max(1, total)), "kproxy-predicted-share")
	reasons := make([]string, 0, len(why))
	for w, n := range why {
		reasons = append(reasons, fmt.Sprintf("%d: %s", n, w))
	}
	slices.Sort(reasons)
	b.Logf("kproxy predicted %d of its %d records (%.0f%%); unknown: %v", predicted, total, 100*float64(predicted)/float64(max(1, total)), reasons)
}

func countPredicted(b *testing.B, ns string, start time.Time) (total, predicted int, why map[string]int) {
	b.Helper()
	f, err := os.Open(e.capture)
	if err != nil {
		b.Fatal(err)
	}
	defer f.Close()
	why = map[string]int{}
	sc := bufio.NewScanner(f)
	sc.Buffer(make([]byte, 1<<20), 16<<20)
	for sc.Scan() {
		var r record.Record
		if json.Unmarshal(sc.Bytes(), &r) != nil || r.Request.Namespace != ns || r.Start.Before(start) {
			continue
		}
		total++
		if r.Predicted.Stage != record.StageUnknown {
			predicted++
			continue
		}
		w := r.Predicted.Message
		if i := strings.Index(w, " ("); i > 0 && len(w) > 120 {
			w = w[:i]
		}
		why[w]++
	}
	if err := sc.Err(); err != nil {
		b.Fatal(err)
	}
	return total, predicted, why
}
