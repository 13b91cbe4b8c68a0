package e2e

import (
	"context"
	"fmt"
	"strings"
	"testing"
	"time"

	flowcontrolv1 "k8s.io/api/flowcontrol/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"

	"github.com/kproxy/kproxy/internal/localcluster"
	"github.com/kproxy/kproxy/internal/record"
)

// TestFlowSchemaChangedDuringRequest: a request held a few seconds (a
// list waiting for a resourceVersion the apiserver has not reached: 504
// after 3 s) is replayed after its answer, against the FlowSchemas as
// they are then. One whose FlowSchema stopped matching first while it
// was held had been predicted under the FlowSchema that matches since
// (found by a probe, every time); the classification is not predicted
// now, and the flowcontrol stage names the apiserver's.
func TestFlowSchemaChangedDuringRequest(t *testing.T) {
	ctx := context.Background()
	cs := adminClient()
	ns := lateNamespace(t, "fs-late")
	if err := localcluster.Apply(ctx, cs, &rbacv1.Role{
		ObjectMeta: metav1.ObjectMeta{Name: "lister", Namespace: ns},
		Rules:      []rbacv1.PolicyRule{{APIGroups: []string{""}, Resources: []string{"configmaps"}, Verbs: []string{"list"}}},
	}); err != nil {
		t.Fatal(err)
	}
	if err := localcluster.Apply(ctx, cs, &rbacv1.RoleBinding{
		ObjectMeta: metav1.ObjectMeta{Name: "alice-lister", Namespace: ns},
		RoleRef:    rbacv1.RoleRef{APIGroup: rbacv1.GroupName, Kind: "Role", Name: "lister"},
		Subjects:   []rbacv1.Subject{userSubject("alice")},
	}); err != nil {
		t.Fatal(err)
	}
	first, second := ns+"-first", ns+"-second"
	for _, fs := range []struct {
		name       string
		precedence int32
	}{{first, 10}, {second, 50}} {
		if _, err := cs.FlowcontrolV1().FlowSchemas().Create(ctx, &flowcontrolv1.FlowSchema{
			ObjectMeta: metav1.ObjectMeta{Name: fs.name},
			Spec: flowcontrolv1.FlowSchemaSpec{
				PriorityLevelConfiguration: flowcontrolv1.PriorityLevelConfigurationReference{Name: "workload-low"},
				MatchingPrecedence:         fs.precedence,
				Rules: []flowcontrolv1.PolicyRulesWithSubjects{{
					Subjects: []flowcontrolv1.Subject{{Kind: flowcontrolv1.SubjectKindUser, User: &flowcontrolv1.UserSubject{Name: "alice"}}},
					ResourceRules: []flowcontrolv1.ResourcePolicyRule{{Verbs: []string{"list"}, APIGroups: []string{""}, Resources: []string{"configmaps"},
						Namespaces: []string{ns}}},
				}},
			},
		}, createOpts); err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() {
			_ = cs.FlowcontrolV1().FlowSchemas().Delete(context.Background(), fs.name, metav1.DeleteOptions{})
		})
	}
	r, recs := recordedKproxy(t)
	c := r.client(nil)
	list := request{method: "GET", path: "/api/v1/namespaces/" + ns + "/configmaps", user: "alice"}
	// Both kproxy and the apiserver have loaded both FlowSchemas once
	// alice's list is classified under the first.
	deadline := time.Now().Add(30 * time.Second)
	for {
		do(t, c, r.base, list)
		rec := nextRecord(t, recs)
		if rec.Actual.FlowSchema == first && rec.Predicted.FlowSchema == first && rec.Actual.Status == 200 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("alice's list is not classified under %s: answered %q, predicted %q", first, rec.Actual.FlowSchema, rec.Predicted.FlowSchema)
		}
		time.Sleep(200 * time.Millisecond)
	}
	held := list
	held.path += "?resourceVersion=999999999&resourceVersionMatch=NotOlderThan"
	done := make(chan exchange, 1)
	go func() { done <- do(t, c, r.base, held) }()
	time.Sleep(time.Second)
	if _, err := cs.FlowcontrolV1().FlowSchemas().Patch(ctx, first, types.MergePatchType, []byte(`{"spec":{"matchingPrecedence":60}}`), metav1.PatchOptions{}); err != nil {
		t.Fatal(err)
	}
	got := <-done
	rec := nextRecord(t, recs)
	if rec.Actual.FlowSchema != first {
		t.Fatalf("the held list (%d): the apiserver classified it under %q, want %s, as on its arrival", got.status, rec.Actual.FlowSchema, first)
	}
	p := rec.Predicted
	if p.FlowSchema != "" && p.FlowSchema != first {
		t.Errorf("the held list, replayed after its FlowSchema stopped matching first: predicted FlowSchema %q, the apiserver's %q", p.FlowSchema, first)
	}
	if e := stageNamed(rec, record.StageFlowControl).Explanation; !strings.Contains(e, fmt.Sprintf("the apiserver classified the request under FlowSchema %q", first)) {
		t.Errorf("the held list's flowcontrol stage: %s", e)
	}
	t.Logf("the held list: %d after %v", got.status, rec.Latency.TotalNs)
}
