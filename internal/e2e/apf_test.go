package e2e

import (
	"context"
	"fmt"
	"net/http"
	"strings"
	"sync"
	"testing"
	"time"

	flowcontrolv1 "k8s.io/api/flowcontrol/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/kproxy/kproxy/internal/localcluster"
	"github.com/kproxy/kproxy/internal/record"
	"github.com/kproxy/kproxy/internal/serve"
)

// TestAPFRejection loads a tiny priority level until the real apiserver
// answers 429, and checks what kproxy records of it: the classification
// it predicted (the same FlowSchema and PriorityLevel as the apiserver's
// headers), the 429 itself with its Retry-After, and an explanation that
// says admission depends on load, which kproxy does not predict; the
// prediction is unknown (shed for load), not the later stages' 200.
func TestAPFRejection(t *testing.T) {
	ctx := context.Background()
	cs := adminClient()
	zero, one := int32(0), int32(1)
	pl := &flowcontrolv1.PriorityLevelConfiguration{ObjectMeta: metav1.ObjectMeta{Name: "e2e-tiny"},
		Spec: flowcontrolv1.PriorityLevelConfigurationSpec{Type: flowcontrolv1.PriorityLevelEnablementLimited,
			Limited: &flowcontrolv1.LimitedPriorityLevelConfiguration{NominalConcurrencyShares: &one, LendablePercent: &zero,
				LimitResponse: flowcontrolv1.LimitResponse{Type: flowcontrolv1.LimitResponseTypeReject}}}}
	if _, err := cs.FlowcontrolV1().PriorityLevelConfigurations().Create(ctx, pl, createOpts); err != nil && !strings.Contains(err.Error(), "already exists") {
		t.Fatal(err)
	}
	fs := &flowcontrolv1.FlowSchema{ObjectMeta: metav1.ObjectMeta{Name: "e2e-tiny"},
		Spec: flowcontrolv1.FlowSchemaSpec{PriorityLevelConfiguration: flowcontrolv1.PriorityLevelConfigurationReference{Name: "e2e-tiny"},
			MatchingPrecedence: 500,
			Rules: []flowcontrolv1.PolicyRulesWithSubjects{{
				Subjects:      []flowcontrolv1.Subject{{Kind: flowcontrolv1.SubjectKindUser, User: &flowcontrolv1.UserSubject{Name: "loader"}}},
				ResourceRules: []flowcontrolv1.ResourcePolicyRule{{Verbs: []string{"*"}, APIGroups: []string{"*"}, Resources: []string{"*"}, Namespaces: []string{"*"}, ClusterScope: true}},
			}}}}
	if _, err := cs.FlowcontrolV1().FlowSchemas().Create(ctx, fs, createOpts); err != nil && !strings.Contains(err.Error(), "already exists") {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		_ = cs.FlowcontrolV1().FlowSchemas().Delete(ctx, "e2e-tiny", metav1.DeleteOptions{})
		_ = cs.FlowcontrolV1().PriorityLevelConfigurations().Delete(ctx, "e2e-tiny", metav1.DeleteOptions{})
	})
	// loader may list configmaps everywhere: LISTs of many objects hold
	// the tiny level's seats long enough to fill it.
	if err := localcluster.Apply(ctx, cs, &rbacv1.ClusterRole{ObjectMeta: metav1.ObjectMeta{Name: "e2e-loader"},
		Rules: []rbacv1.PolicyRule{{APIGroups: []string{""}, Resources: []string{"configmaps"}, Verbs: []string{"list"}}}}); err != nil {
		t.Fatal(err)
	}
	if err := localcluster.Apply(ctx, cs, &rbacv1.ClusterRoleBinding{ObjectMeta: metav1.ObjectMeta{Name: "e2e-loader"},
		RoleRef:  rbacv1.RoleRef{APIGroup: rbacv1.GroupName, Kind: "ClusterRole", Name: "e2e-loader"},
		Subjects: []rbacv1.Subject{{Kind: rbacv1.UserKind, APIGroup: rbacv1.GroupName, Name: "loader"}}}); err != nil {
		t.Fatal(err)
	}
	ns := "e2e-apf"
	if _, err := cs.CoreV1().Namespaces().Create(ctx, namespace(ns), createOpts); err != nil && !strings.Contains(err.Error(), "already exists") {
		t.Fatal(err)
	}
	for i := 0; i < 300; i++ {
		body := fmt.Sprintf(`{"apiVersion":"v1","kind":"ConfigMap","metadata":{"name":"cm-%d"},"data":{"v":"%s"}}`, i, strings.Repeat("x", 2000))
		do(t, directRoute().client(nil), cluster.URL, request{method: "POST", path: "/api/v1/namespaces/" + ns + "/configmaps", body: body, user: "admin"})
	}

	stream := record.NewStream()
	recs, _, cancel := stream.Subscribe(4096)
	defer cancel()
	// Bursts of 40 LISTs overload the apiserver on purpose: a replay pool
	// that holds a burst keeps the rejected request's replay from being
	// shed (shedding has tests of its own).
	k := startKproxy(t, kproxyOptions{stream: stream, set: func(o *serve.Options) { o.ReplayWorkers, o.ReplayQueue = 2, 128 }})
	r := reverseRoute(k)
	// The replay's APF controller must have digested the new objects.
	time.Sleep(2 * time.Second)

	var mu sync.Mutex
	rejected := ""
	deadline := time.Now().Add(60 * time.Second)
	for rejected == "" && time.Now().Before(deadline) {
		var wg sync.WaitGroup
		for w := 0; w < 40; w++ {
			wg.Add(1)
			go func(w int) {
				defer wg.Done()
				id := fmt.Sprintf("apf-%d-%d", time.Now().UnixNano(), w)
				h := http.Header{"Audit-Id": {id}, "Impersonate-User": {"loader"}}
				ex := do(t, r.client(nil), r.base, request{method: "GET", path: "/api/v1/configmaps", user: "admin", header: h, accept: "application/json"})
				if ex.status == http.StatusTooManyRequests {
					mu.Lock()
					rejected = id
					mu.Unlock()
				}
			}(w)
		}
		wg.Wait()
	}
	if rejected == "" {
		t.Fatal("the apiserver never answered 429 for the tiny priority level")
	}
	rec := waitRecord(t, recs, rejected)
	a, p := rec.Actual, rec.Predicted
	// APF answers with a plain-text body, not a Status.
	if a.Status != 429 || !strings.Contains(a.Message, "Too many requests") || a.RetryAfter == "" {
		t.Errorf("actual %+v: want 429 \"Too many requests\" with Retry-After", a)
	}
	if p.FlowSchema != "e2e-tiny" || p.PriorityLevel != "e2e-tiny" || a.FlowSchema != "e2e-tiny" || a.PriorityLevel != "e2e-tiny" {
		t.Errorf("classification: predicted %s/%s, actual %s/%s, want e2e-tiny", p.FlowSchema, p.PriorityLevel, a.FlowSchema, a.PriorityLevel)
	}
	fc := stageNamed(rec, record.StageFlowControl)
	if !strings.Contains(fc.Explanation, `PriorityLevel "e2e-tiny"`) || !strings.Contains(fc.Explanation, "depends on the apiserver's load") ||
		!strings.Contains(fc.Explanation, "rule 0: subject user loader, verbs [*] on [*]") {
		t.Errorf("flowcontrol explanation: %s", fc.Explanation)
	}
	// kproxy does not predict load: flowcontrol passes, and says why.
	if fc.Outcome != record.Pass {
		t.Errorf("flowcontrol %s, want pass (admission under load is not predicted)", fc.Outcome)
	}
	// The stages after it allow the list; the apiserver shed it for load,
	// which kproxy does not predict: the prediction is unknown, not 200.
	if p.Stage != record.StageUnknown || !strings.Contains(p.Message, `shed the request for load (429 from API Priority and Fairness, priority level "e2e-tiny")`) ||
		!strings.Contains(p.Message, "the stages after flowcontrol allow the request (200)") {
		t.Errorf("prediction %+v: want unknown, shed for load by e2e-tiny, the later stages allowing it", p)
	}
}
