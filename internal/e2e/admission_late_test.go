package e2e

import (
	"context"
	"fmt"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	schedulingv1 "k8s.io/api/scheduling/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/kproxy/kproxy/internal/record"
)

// TestServiceAccountChangedAfterRequest: pod creates replayed late, behind
// 40 queued writes, after the pod's ServiceAccount changed. A pod sent
// before its ServiceAccount (kubectl apply -f on a directory, pod.yaml
// before serviceaccount.yaml) is refused by the apiserver's ServiceAccount
// admission (403, "error looking up service account"), and the replay,
// finding the ServiceAccount created right after, had predicted 201. A pod
// admitted just before its ServiceAccount is deleted had been predicted
// 403. Both say unknown now, naming the ServiceAccount.
func TestServiceAccountChangedAfterRequest(t *testing.T) {
	ctx := context.Background()
	cs := adminClient()
	recs, r, c := oneReplayWorker(t)
	pod := func(ns, name, sa string) request {
		return request{method: "POST", path: "/api/v1/namespaces/" + ns + "/pods?dryRun=All", user: "admin",
			body: fmt.Sprintf(`{"apiVersion":"v1","kind":"Pod","metadata":{"name":%q},"spec":{"serviceAccountName":%q,"automountServiceAccountToken":false,"containers":[{"name":"c","image":"registry.k8s.io/pause:3.10"}]}}`, name, sa)}
	}
	serviceAccount := func(ns, name string) {
		t.Helper()
		if _, err := cs.CoreV1().ServiceAccounts(ns).Create(ctx, &corev1.ServiceAccount{ObjectMeta: metav1.ObjectMeta{Name: name}}, createOpts); err != nil {
			t.Fatal(err)
		}
	}
	// attempt sends both pods behind queued writes and changes their
	// ServiceAccounts right after the answers; it counts the records that
	// said unknown for the change. A replay that still ran before the
	// change must predict the answer.
	attempt := func() (late int) {
		ns := lateNamespace(t, "sa-late")
		serviceAccount(ns, "leaving")
		// kproxy's replay has synced: the pod of "leaving" is admitted,
		// the pod of "arriving" (not there yet) refused.
		waitPredicted(t, recs, r, c, pod(ns, "probe", "leaving"))
		waitPredicted(t, recs, r, c, pod(ns, "probe", "arriving"))

		queueWrites(t, r, c, 40)
		if got := do(t, c, r.base, pod(ns, "early", "arriving")); got.status != 403 || !strings.Contains(string(got.body), "error looking up service account") {
			t.Fatalf("a pod before its ServiceAccount: %d %s", got.status, got.body)
		}
		if got := do(t, c, r.base, pod(ns, "last", "leaving")); got.status != 201 {
			t.Fatalf("a pod of an existing ServiceAccount: %d %s", got.status, got.body)
		}
		serviceAccount(ns, "arriving")
		if err := cs.CoreV1().ServiceAccounts(ns).Delete(ctx, "leaving", metav1.DeleteOptions{}); err != nil {
			t.Fatal(err)
		}
		lateRecs, seen := tallyLate(t, recs, 42, inNamespace(ns), "ServiceAccount", "a ServiceAccount change")
		late = len(lateRecs)
		for _, rec := range lateRecs {
			// The ServiceAccount plugin looks it up in its Admit, for
			// either pod (the refused one had said decode).
			saysAt(t, rec, "ServiceAccount", record.StageMutatingAdmission)
		}
		if seen != 2 {
			t.Errorf("%d records of the two pods", seen)
		}
		return late
	}
	late := 0
	for i := 0; i < 5 && late < 2; i++ {
		late += attempt()
	}
	if late < 2 {
		t.Errorf("%d of the pods replayed after their ServiceAccount changed in 5 attempts, want 2: the path under test was not taken", late)
	}
}

// TestNamespaceCreatedAfterRequest: a create in a namespace that does not
// exist yet, replayed late, behind 40 queued writes, after the namespace
// is created (kubectl apply -f on a directory sends deployment.yaml before
// namespace.yaml): the apiserver refused it 404 (namespaces "..." not
// found), and the replay, whose NamespaceLifecycle finds the namespace,
// had predicted 201. It says unknown now, naming the namespace. Replayed
// in time, the same create is predicted 404.
func TestNamespaceCreatedAfterRequest(t *testing.T) {
	ctx := context.Background()
	cs := adminClient()
	recs, r, c := oneReplayWorker(t)
	create := func(ns string) request {
		return request{method: "POST", path: "/api/v1/namespaces/" + ns + "/configmaps", user: "admin",
			body: `{"apiVersion":"v1","kind":"ConfigMap","metadata":{"name":"early"}}`}
	}
	// In time: predicted 404.
	waitPredicted(t, recs, r, c, create(fmt.Sprintf("never-%d", time.Now().UnixNano()%1e6)))
	late := 0
	for i := 0; i < 5 && late == 0; i++ {
		ns := fmt.Sprintf("ns-late-%d", time.Now().UnixNano()%1e6)
		queueWrites(t, r, c, 40)
		if got := do(t, c, r.base, create(ns)); got.status != 404 {
			t.Fatalf("a create before its namespace: %d %s", got.status, got.body)
		}
		if _, err := cs.CoreV1().Namespaces().Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: ns}}, createOpts); err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { _ = cs.CoreV1().Namespaces().Delete(context.Background(), ns, metav1.DeleteOptions{}) })
		const phrase = "its namespace does not exist (404), and the replay's NamespaceLifecycle found the namespace"
		lateRecs, _ := tallyLate(t, recs, 41, inNamespace(ns), phrase, "the namespace's create")
		for _, rec := range lateRecs {
			// NamespaceLifecycle refuses in its Admit (it had said decode).
			saysAt(t, rec, phrase, record.StageMutatingAdmission)
		}
		late += len(lateRecs)
	}
	if late == 0 {
		t.Errorf("no create replayed after its namespace was created in 5 attempts: the path under test was not taken")
	}
}

// TestAdmissionStateChangedAfterRequest: pods replayed late, behind 40
// queued writes, after the state admission read for them changed, as
// kubectl apply -f on a directory sends pod.yaml before limitrange.yaml
// and priorityclass.yaml. A pod asking for more CPU than a LimitRange
// created right after it allows was admitted (201), and the replay's
// LimitRanger had refused it (403); a pod naming a PriorityClass created
// right after it was refused (403, "no PriorityClass with name ... was
// found"), and the replay's Priority plugin had admitted it (201); a pod
// breaking both was refused for its PriorityClass, and the replay had
// refused it for its CPU (the status right, the reason wrong). All say
// unknown now, naming what kproxy saw change.
func TestAdmissionStateChangedAfterRequest(t *testing.T) {
	ctx := context.Background()
	cs := adminClient()
	recs, r, c := oneReplayWorker(t)
	// A pod of 200m of CPU breaks the LimitRange, one of 50m does not.
	pod := func(ns, name, class, cpu string) request {
		spec := ""
		if class != "" {
			spec = fmt.Sprintf(`"priorityClassName":%q,`, class)
		}
		return request{method: "POST", path: "/api/v1/namespaces/" + ns + "/pods?dryRun=All", user: "admin",
			body: fmt.Sprintf(`{"apiVersion":"v1","kind":"Pod","metadata":{"name":%q},"spec":{"serviceAccountName":"robot","automountServiceAccountToken":false,%s"containers":[{"name":"c","image":"registry.k8s.io/pause:3.10","resources":{"limits":{"cpu":%q}}}]}}`, name, spec, cpu)}
	}
	lateLimits, lateClass, lateBoth, lateQuota := 0, 0, 0, 0
	// attempt sends the three pods behind queued writes, and a fourth in
	// another namespace, creates the LimitRange, the PriorityClass and the
	// other namespace's ResourceQuota right after the answers, and counts
	// the records that said unknown for the change. A replay that still
	// ran before the change must predict the answer, reason included.
	attempt := func() {
		ns, quotaNS := lateNamespace(t, "adm-late"), lateNamespace(t, "quota-late")
		for _, in := range []string{ns, quotaNS} {
			if _, err := cs.CoreV1().ServiceAccounts(in).Create(ctx, &corev1.ServiceAccount{ObjectMeta: metav1.ObjectMeta{Name: "robot"}}, createOpts); err != nil {
				t.Fatal(err)
			}
		}
		class := ns + "-high"
		waitPredicted(t, recs, r, c, pod(ns, "probe", "", "200m"))
		waitPredicted(t, recs, r, c, pod(ns, "probe", class, "50m"))
		waitPredicted(t, recs, r, c, pod(quotaNS, "probe", "", "50m"))

		queueWrites(t, r, c, 40)
		if got := do(t, c, r.base, pod(ns, "before-limits", "", "200m")); got.status != 201 {
			t.Fatalf("a pod before its LimitRange: %d %s", got.status, got.body)
		}
		if got := do(t, c, r.base, pod(ns, "before-class", class, "50m")); got.status != 403 {
			t.Fatalf("a pod before its PriorityClass: %d %s", got.status, got.body)
		}
		// Refused for its PriorityClass; once both exist, for its CPU.
		if got := do(t, c, r.base, pod(ns, "before-both", class, "200m")); got.status != 403 {
			t.Fatalf("a pod before its PriorityClass and LimitRange: %d %s", got.status, got.body)
		}
		// Admitted before its namespace's quota on memory limits; once the
		// quota is there, a pod that sets none is refused ("must specify").
		if got := do(t, c, r.base, pod(quotaNS, "before-quota", "", "50m")); got.status != 201 {
			t.Fatalf("a pod before its namespace's ResourceQuota: %d %s", got.status, got.body)
		}
		createQuota(t, quotaNS, corev1.ResourceList{corev1.ResourceLimitsMemory: resource.MustParse("1Gi")})
		if _, err := cs.CoreV1().LimitRanges(ns).Create(ctx, &corev1.LimitRange{ObjectMeta: metav1.ObjectMeta{Name: "small"},
			Spec: corev1.LimitRangeSpec{Limits: []corev1.LimitRangeItem{{Type: corev1.LimitTypeContainer,
				Max: corev1.ResourceList{corev1.ResourceCPU: resource.MustParse("100m")}}}}}, createOpts); err != nil {
			t.Fatal(err)
		}
		if _, err := cs.SchedulingV1().PriorityClasses().Create(ctx, &schedulingv1.PriorityClass{ObjectMeta: metav1.ObjectMeta{Name: class}, Value: 1000}, createOpts); err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() {
			_ = cs.SchedulingV1().PriorityClasses().Delete(context.Background(), class, metav1.DeleteOptions{})
		})
		// One replay worker: the records come in the order sent.
		var got []*record.Record
		for range 44 {
			if rec := nextRecord(t, recs); rec.Request.Namespace == ns || rec.Request.Namespace == quotaNS {
				got = append(got, rec)
			}
		}
		if len(got) != 4 {
			t.Fatalf("%d records of the four pods", len(got))
		}
		for i, c := range []struct {
			what, late string
			count      *int
		}{
			{"a pod before its LimitRange (admitted)", "the replay's LimitRanger refuses it: kproxy saw LimitRanges", &lateLimits},
			{"a pod before its PriorityClass (refused)", "and the replay's admits it: kproxy saw LimitRanges, PriorityClasses", &lateClass},
			{"a pod before both (refused for its PriorityClass)", "refuses it for another reason: kproxy saw LimitRanges, PriorityClasses", &lateBoth},
			{"a pod before its namespace's ResourceQuota (admitted)", "the replay's ResourceQuota refuses it: kproxy saw ResourceQuotas", &lateQuota},
		} {
			rec := got[i]
			switch {
			case rec.Predicted.Stage == record.StageUnknown && strings.Contains(rec.Predicted.Message, c.late):
				*c.count++
			case rec.Predicted.Stage != record.StageUnknown && rec.Predicted.Status == rec.Actual.Status && rec.Predicted.Message == rec.Actual.Message:
				// replayed before the change
			default:
				t.Errorf("%s, answered %d %q, replayed around the change: predicted %+v, want the answer or unknown naming the change",
					c.what, rec.Actual.Status, rec.Actual.Message, rec.Predicted)
			}
		}
	}
	for i := 0; i < 5 && lateLimits*lateClass*lateBoth*lateQuota == 0; i++ {
		attempt()
	}
	if lateLimits*lateClass*lateBoth*lateQuota == 0 {
		t.Errorf("in 5 attempts, %d pods before their LimitRange, %d before their PriorityClass, %d before both and %d before their quota replayed after the change, want each: the path under test was not taken",
			lateLimits, lateClass, lateBoth, lateQuota)
	}
}

// TestPodSecurityLabelsChangedAfterRequest: a privileged pod admitted just
// before its namespace is labelled to enforce the baseline Pod Security
// level, replayed late, behind 40 queued writes: the replay's PodSecurity
// reads the namespace's labels after the change and had refused it (403).
// It says unknown now, naming the namespace.
func TestPodSecurityLabelsChangedAfterRequest(t *testing.T) {
	ctx := context.Background()
	cs := adminClient()
	recs, r, c := oneReplayWorker(t)
	late := 0
	for i := 0; i < 5 && late == 0; i++ {
		ns := lateNamespace(t, "psa-late")
		if _, err := cs.CoreV1().ServiceAccounts(ns).Create(ctx, &corev1.ServiceAccount{ObjectMeta: metav1.ObjectMeta{Name: "robot"}}, createOpts); err != nil {
			t.Fatal(err)
		}
		privileged := request{method: "POST", path: "/api/v1/namespaces/" + ns + "/pods?dryRun=All", user: "admin",
			body: `{"apiVersion":"v1","kind":"Pod","metadata":{"name":"privileged"},"spec":{"serviceAccountName":"robot","automountServiceAccountToken":false,"containers":[{"name":"c","image":"registry.k8s.io/pause:3.10","securityContext":{"privileged":true}}]}}`}
		waitPredicted(t, recs, r, c, privileged)
		queueWrites(t, r, c, 40)
		if got := do(t, c, r.base, privileged); got.status != 201 {
			t.Fatalf("a privileged pod in an unlabelled namespace: %d %s", got.status, got.body)
		}
		n, err := cs.CoreV1().Namespaces().Get(ctx, ns, metav1.GetOptions{})
		if err != nil {
			t.Fatal(err)
		}
		if n.Labels == nil {
			n.Labels = map[string]string{}
		}
		n.Labels["pod-security.kubernetes.io/enforce"] = "baseline"
		if _, err := cs.CoreV1().Namespaces().Update(ctx, n, metav1.UpdateOptions{}); err != nil {
			t.Fatal(err)
		}
		lateRecs, _ := tallyLate(t, recs, 41, inNamespace(ns), "the replay's PodSecurity refuses it: kproxy saw the namespace (its labels, its phase)", "the namespace's labelling")
		late += len(lateRecs)
	}
	if late == 0 {
		t.Errorf("no privileged pod replayed after its namespace was labelled in 5 attempts: the path under test was not taken")
	}
}

// TestAdmissionPolicyChangedAroundRequest: kubectl apply -f of a directory
// holding an admission policy, its binding and the objects it governs
// sends them moments apart. The apiserver loads policies once a second,
// and so does the replay: a write that arrives just after a binding is
// created meets no policy in the apiserver (admitted), and the replay,
// run later, meets it (a ValidatingAdmissionPolicy's denial; a
// MutatingAdmissionPolicy's label that validation refuses). Just after a
// binding is deleted, the other way round. These were confidently wrong
// both ways (found by a probe, 5 of 12 and 6 of 24 tries); the changes
// were before the arrival, which the clocks did not count. Each write is
// replayed 2.5s after its answer (a held replay worker): the prediction
// must be the answer, or unknown naming the policies.
func TestAdmissionPolicyChangedAroundRequest(t *testing.T) {
	recs, r, c := oneReplayWorker(t)
	hold := startReplayHold(t, r, c, recs)
	direct := directRoute()
	dc := direct.client(nil)
	const rules = `"matchConstraints":{"resourceRules":[{"apiGroups":[""],"apiVersions":["v1"],"operations":["CREATE"],"resources":["configmaps"]}]}`
	for _, kind := range []struct {
		name, policy, binding, plural, bindings string
		names                                   string // in the unknown's reason
	}{
		{"ValidatingAdmissionPolicy",
			`{"apiVersion":"admissionregistration.k8s.io/v1","kind":"ValidatingAdmissionPolicy","metadata":{"name":"%s"},"spec":{"failurePolicy":"Fail",` + rules + `,"validations":[{"expression":"false","message":"no configmaps here"}]}}`,
			`{"apiVersion":"admissionregistration.k8s.io/v1","kind":"ValidatingAdmissionPolicyBinding","metadata":{"name":"%s"},"spec":{"policyName":"%s","validationActions":["Deny"],"matchResources":{"namespaceSelector":{"matchLabels":{"kubernetes.io/metadata.name":"%s"}}}}}`,
			"validatingadmissionpolicies", "validatingadmissionpolicybindings", "ValidatingAdmissionPolic"},
		{"MutatingAdmissionPolicy",
			`{"apiVersion":"admissionregistration.k8s.io/v1","kind":"MutatingAdmissionPolicy","metadata":{"name":"%s"},"spec":{"failurePolicy":"Fail","reinvocationPolicy":"Never",` + rules + `,"mutations":[{"patchType":"ApplyConfiguration","applyConfiguration":{"expression":"Object{metadata: Object.metadata{labels: {\"bad label!\": \"x\"}}}"}}]}}`,
			`{"apiVersion":"admissionregistration.k8s.io/v1","kind":"MutatingAdmissionPolicyBinding","metadata":{"name":"%s"},"spec":{"policyName":"%s","matchResources":{"namespaceSelector":{"matchLabels":{"kubernetes.io/metadata.name":"%s"}}}}}`,
			"mutatingadmissionpolicies", "mutatingadmissionpolicybindings", "MutatingAdmissionPolic"},
	} {
		t.Run(kind.name, func(t *testing.T) {
			api := "/apis/admissionregistration.k8s.io/v1/"
			// send creates a ConfigMap through kproxy right after change,
			// its replay held 2.5s, and judges its record: true when it
			// was unknown for the policies.
			send := func(ns, name string, change func()) bool {
				hold.hold(t)
				change()
				got := do(t, c, r.base, request{method: "POST", path: "/api/v1/namespaces/" + ns + "/configmaps", user: "admin",
					body: fmt.Sprintf(`{"apiVersion":"v1","kind":"ConfigMap","metadata":{"name":%q}}`, name)})
				time.Sleep(2500 * time.Millisecond)
				hold.release()
				nextRecord(t, recs) // the hold's own
				rec := nextRecord(t, recs)
				switch {
				case rec.Predicted.Stage == record.StageUnknown && strings.Contains(rec.Predicted.Message, kind.names) &&
					strings.Contains(rec.Predicted.Message, "in the 2s before it arrived"):
					// The stage that says so is admission's, not decode's
					// (a probe found decode, the stages after it "not
					// replayed", for a write the replay admitted).
					for _, st := range rec.Stages {
						if st.Name == record.StageDecode && strings.Contains(st.Explanation, "change after this request arrived") {
							t.Errorf("%s: unknown at decode, want the admission stage: %s", name, st.Explanation)
						}
					}
					return true
				case rec.Predicted.Stage != record.StageUnknown && rec.Predicted.Status == got.status && rec.Predicted.Message == rec.Actual.Message:
				default:
					t.Errorf("%s, answered %d %q, replayed after the policy was loaded: predicted %+v, want the answer or unknown naming the policies",
						name, got.status, rec.Actual.Message, rec.Predicted)
				}
				return false
			}
			created, deleted := 0, 0
			for i := 0; i < 6 && created*deleted == 0; i++ {
				ns := lateNamespace(t, "policy-late")
				name := ns + "-p"
				create := func(path, body string) {
					if got := do(t, dc, direct.base, request{method: "POST", path: api + path, user: "admin", body: body}); got.status != 201 {
						hold.release()
						t.Fatalf("create %s: %d %s", path, got.status, got.body)
					}
				}
				t.Cleanup(func() {
					do(t, dc, direct.base, request{method: "DELETE", path: api + kind.plural + "/" + name, user: "admin"})
				})
				if send(ns, "after-binding", func() {
					create(kind.plural, fmt.Sprintf(kind.policy, name))
					create(kind.bindings, fmt.Sprintf(kind.binding, name, name, ns))
				}) {
					created++
				}
				if send(ns, "after-unbinding", func() {
					if got := do(t, dc, direct.base, request{method: "DELETE", path: api + kind.bindings + "/" + name, user: "admin"}); got.status != 200 {
						hold.release()
						t.Fatalf("delete the binding: %d %s", got.status, got.body)
					}
				}) {
					deleted++
				}
			}
			if created*deleted == 0 {
				t.Errorf("in 6 attempts, %d writes right after a binding and %d right after its deletion met another policy set in the apiserver than in the replay: the path under test was not taken",
					created, deleted)
			}
		})
	}
}
