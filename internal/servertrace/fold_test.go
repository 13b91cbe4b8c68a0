package servertrace

import (
	"math/rand/v2"
	"slices"
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"

	"github.com/kproxy/kproxy/internal/record"
)

// TestFoldACreate: of the create's layers (TestLayersOfACreateWithASlowWebhook),
// those under 5% of its 400 ms that split a layer of their own stage fold
// into it; the filter chain, the handler, admission, the webhook, etcd and
// the serialization stay.
func TestFoldACreate(t *testing.T) {
	tr, root := createWithSlowWebhook(1, "audit-1")
	full := analyze(root, tr.spans)
	s := analyzeFolding(root, tr.spans, true)
	want := []layer{
		{rootName, record.StageAuthentication, 0, 0, 400, 1.5},
		{"audit", record.LayerAudit, 1, 1, 398.5, 1.5},
		{"impersonation", record.StageImpersonation, 2, 2, 397, 1.5},
		{"APF (queue wait and dispatch)", record.StageFlowControl, 3, 3, 395.5, 1.5},
		{"authorization", record.StageAuthorization, 4, 4, 394, 5},
		// read request body (1 ms) and decode and convert (0.5 ms)
		{"handler Create", record.StageDecode, 5, 6, 389, 7.5 + 1 + 0.5},
		{"admission and validation", record.StageValidation, 6, 9, 371, 21},
		{"validating webhook policy.example.com", record.StageValidatingAdmission, 6, 20, 320, 320},
		{"etcd Create", record.StageStorage, 6, 345, 30, 30},
		{"write response", record.LayerSerialization, 6, 381, 9, 2},
		// encode (4 ms) and write to the connection (2 ms)
		{"serialize response", record.LayerSerialization, 6, 382, 7, 1 + 4 + 2},
	}
	if d := cmp.Diff(want, layers(s)); d != "" {
		t.Errorf("layers (-want +got):\n%s", d)
	}
	if selfSum(s) != s.TotalNs || s.Summary != full.Summary || s.TraceID != full.TraceID || s.Source != full.Source {
		t.Errorf("compacted: total %d, self times %d, summary %q (was %q)", s.TotalNs, selfSum(s), s.Summary, full.Summary)
	}
	if o := observe(root, tr.spans); !cmp.Equal(o.Server, s) {
		t.Errorf("the observation's layers are not the folded ones: %+v", o.Server)
	}
}

// TestFoldMovesLayersUp: a folded layer's own layers move up a level; a
// layer of another stage stays however small, and so does a big one.
func TestFoldMovesLayersUp(t *testing.T) {
	tr := newTrace(11)
	root := tr.root("a", 0, 100)
	h := tr.child(tr.chain(root), "Get", 6, 95)
	cache := tr.child(h, "cacher.GetList", 10, 60) // storage, under the handler: stays
	event(cache, "Ready", 11)
	event(cache, "Listed items from cache", 12) // a 1 ms phase of the cache's own stage: folds
	tr.child(cache, "Get etcd3", 20, 22)        // storage too: folds, however it nests
	ser := tr.child(h, "SerializeObject", 61, 90)
	event(ser, "About to start writing response", 89.5) // encode: 28.5 ms, stays
	event(ser, "Write call succeeded", 89.7)            // write to the connection: 0.2 ms, folds
	got := layers(analyzeFolding(root, tr.spans, true))
	want := []layer{
		{rootName, record.StageAuthentication, 0, 0, 100, 1.5},
		{"audit", record.LayerAudit, 1, 1, 98.5, 1.5},
		{"impersonation", record.StageImpersonation, 2, 2, 97, 1.5},
		{"APF (queue wait and dispatch)", record.StageFlowControl, 3, 3, 95.5, 1.5},
		{"authorization", record.StageAuthorization, 4, 4, 94, 5},
		{"handler Get", record.StageDecode, 5, 6, 89, 10},
		// its own 47 ms, wait for fresh cache (1 ms) and etcd Get (2 ms)
		{"watch cache GetList", record.StageStorage, 6, 10, 50, 47 + 1 + 2},
		// its own 0.3 ms and write to the connection (0.2 ms)
		{"serialize response", record.LayerSerialization, 6, 61, 29, 0.5},
		{"encode", record.LayerSerialization, 7, 61, 28.5, 28.5},
	}
	if d := cmp.Diff(want, got); d != "" {
		t.Errorf("layers (-want +got):\n%s", d)
	}
}

// TestFoldKeepsWhatTheSummaryNames: reading the body takes 4.5% of the
// request, under the fold's 5% but in the summary's three: it stays a
// layer of its own.
func TestFoldKeepsWhatTheSummaryNames(t *testing.T) {
	tr := newTrace(12)
	root := tr.root("a", 0, 100)
	h := tr.child(tr.chain(root), "Create", 6, 95)
	event(h, "limitedReadBody succeeded", 10.5) // 4.5 ms
	event(h, "About to store object in database", 11)
	event(h, "Write to database call succeeded", 93)
	tr.child(h, "Create etcd3", 12, 93)
	s := analyzeFolding(root, tr.spans, true)
	if !strings.Contains(s.Summary, "4.5 ms in reading the request body") {
		t.Fatalf("summary %q", s.Summary)
	}
	if !slices.ContainsFunc(s.Layers, func(l record.ServerLayer) bool { return l.Name == "read request body" }) {
		t.Errorf("the summary names the body's reading, the layers lack it: %+v", layers(s))
	}
}

// TestFoldKeepsEveryStage builds random span trees (as
// TestSelfTimesAlwaysAddUp) and checks what folding keeps: the self
// times' sum, each stage's time and the stages present, the summary,
// depths that nest, and every layer that is not a sliver of its parent's
// stage.
func TestFoldKeepsEveryStage(t *testing.T) {
	rng := rand.New(rand.NewPCG(3, 4))
	names := []string{"audit", "authorization", "Create", "Get", "Get etcd3", "Call validating webhook", "SerializeObject", "GuaranteedUpdate etcd3", "cacher.GetList", "other"}
	evs := []string{"Conversion done", "About to convert to expected version", "limitedReadBody succeeded", "About to store object in database",
		"About to Encode", "initial value restored", "About to write a response", "About to start writing response", "Ready", "Listed items from cache"}
	folded := 0
	for i := range 2000 {
		tr, root := randomTrace(rng, uint64(5000+i), names, evs)
		full := analyze(root, tr.spans)
		s := analyzeFolding(root, tr.spans, true)
		folded += len(full.Layers) - len(s.Layers)
		if selfSum(s) != s.TotalNs || s.Summary != full.Summary {
			t.Fatalf("trace %d: self times add up to %d, total %d; summary %q, unfolded %q", i, selfSum(s), s.TotalNs, s.Summary, full.Summary)
		}
		if d := cmp.Diff(stageTimes(full), stageTimes(s)); d != "" {
			t.Fatalf("trace %d: the stages' times changed (-full +compacted):\n%s", i, d)
		}
		// The analysis's layers, self times and depths aside (some are
		// alike: count them), and how many of each cannot fold.
		left, must := map[record.ServerLayer]int{}, map[record.ServerLayer]int{}
		var stack []record.ServerLayer // a layer's ancestors
		for _, l := range full.Layers {
			stack = append(stack[:l.Depth], l)
			cannot := l.Depth == 0 || stack[l.Depth-1].Stage != l.Stage || l.SelfNs*100 >= full.TotalNs*foldPercent
			l.SelfNs, l.Depth = 0, 0
			left[l]++
			if cannot {
				must[l]++
			}
		}
		for k, l := range s.Layers {
			if k > 0 && l.Depth > s.Layers[k-1].Depth+1 || k == 0 && l.Depth != 0 {
				t.Fatalf("trace %d: layer %d (%s) at depth %d after depth %d", i, k, l.Name, l.Depth, s.Layers[max(k-1, 0)].Depth)
			}
			l.SelfNs, l.Depth = 0, 0
			if left[l] == 0 {
				t.Fatalf("trace %d: layer %+v is not one of the analysis's", i, l)
			}
			left[l]--
		}
		kept := map[record.ServerLayer]int{}
		for _, l := range s.Layers {
			l.SelfNs, l.Depth = 0, 0
			kept[l]++
		}
		for l, n := range must {
			if kept[l] < n {
				t.Fatalf("trace %d: layer %+v was folded", i, l)
			}
		}
	}
	if folded == 0 {
		t.Error("no layer was ever folded")
	}
}

// stageTimes is the self time of each stage, and which stages have layers.
func stageTimes(s record.Server) map[string]int64 {
	m := map[string]int64{}
	for _, l := range s.Layers {
		m[l.Stage] += l.SelfNs
	}
	return m
}
