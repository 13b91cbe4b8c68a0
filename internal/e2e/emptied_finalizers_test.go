package e2e

import (
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/kproxy/kproxy/internal/record"
)

// TestFinalizersEmptiedByUpdate: a patch that removes the last finalizers
// of an object being deleted. The apiserver deletes the object instead of
// storing the update, and answers 200 with the request's object at the
// resourceVersion it met (the store's deleteWithoutFinalizers). Before,
// the replay took that resourceVersion for the patch's own write and read
// the state before it: for an object whose delete added its finalizer
// (foreground deletion adds foregroundDeletion), a state with no
// finalizers at all, where "remove /metadata/finalizers" fails: predicted
// 422 for the apiserver's 200 (found by a probe: kubectl delete
// --cascade=foreground, then kubectl patch removing the finalizers).
// The "-compacted" case's object was last written before an etcd
// compaction (an object left terminating for minutes: probe AL, said
// unknown, "too old", 5 of 5): it is read as it stood just before its
// delete, which the compaction kept.
func TestFinalizersEmptiedByUpdate(t *testing.T) {
	send := adminSender(t)
	run := fmt.Sprintf("emptied-%d", time.Now().UnixNano())
	cms := "/api/v1/namespaces/" + testNS + "/configmaps"
	create := func(name, finalizers string) {
		send(request{method: "POST", path: cms, body: `{"apiVersion":"v1","kind":"ConfigMap","metadata":{"name":"` + name + `","finalizers":[` + finalizers + `]},"data":{"k":"v"}}`}, 201)
	}
	foreground := func(name string) {
		send(request{method: "DELETE", path: cms + "/" + name, body: `{"propagationPolicy":"Foreground"}`}, 200)
	}
	jsonPatch := func(name, patch string) request {
		return request{method: "PATCH", path: cms + "/" + name + "?fieldManager=kubectl-patch", contentType: "application/json-patch+json", body: patch}
	}
	for _, tc := range []struct {
		name, finalizers string
		patches          []request // the last empties the finalizers
		compacted        bool      // etcd compacted before the patches
	}{
		{name: "-json", patches: []request{jsonPatch(run+"-json", `[{"op":"remove","path":"/metadata/finalizers"}]`)}},
		{name: "-index", patches: []request{jsonPatch(run+"-index", `[{"op":"remove","path":"/metadata/finalizers/0"}]`)}},
		{name: "-merge", patches: []request{{method: "PATCH", path: cms + "/" + run + "-merge", contentType: "application/merge-patch+json", body: `{"metadata":{"finalizers":null}}`}}},
		// Two finalizers: the first patch is stored, the second empties.
		{name: "-two", finalizers: `"e2e.kproxy.test/hold"`, patches: []request{
			jsonPatch(run+"-two", `[{"op":"remove","path":"/metadata/finalizers/0"}]`),
			jsonPatch(run+"-two", `[{"op":"remove","path":"/metadata/finalizers"}]`)}},
		{name: "-compacted", compacted: true, patches: []request{{method: "PATCH", path: cms + "/" + run + "-compacted", contentType: "application/merge-patch+json", body: `{"metadata":{"finalizers":null}}`}}},
	} {
		name := run + tc.name
		create(name, tc.finalizers)
		foreground(name)
		if tc.compacted {
			create(name+"-later", "") // a later revision to compact at
			compactEtcd(t)
		}
		for i, q := range tc.patches {
			rec := send(q, 200)
			st := stageNamed(rec, record.StageStorage).Explanation
			switch {
			case rec.Predicted.Status != 200 || rec.Predicted.Stage != "":
				t.Errorf("%s, patch %d (%s): predicted %d at %s (%s), the apiserver answered 200; storage: %s", name, i, q.body, rec.Predicted.Status, rec.Predicted.Stage, rec.Predicted.Message, st)
			case i == len(tc.patches)-1 && !strings.Contains(st, "the request removed the last finalizers of the object being deleted"):
				t.Errorf("%s, patch %d: storage says %q, want it to say the request emptied the finalizers", name, i, st)
			}
		}
		// Deleted: the get is answered 404 (send fails the test otherwise).
		send(request{method: "GET", path: cms + "/" + name}, 404)
	}
}
