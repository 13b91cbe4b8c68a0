package record

import "testing"

// TestSameMessage: messages equal up to the order of their error list
// (as kube-apiserver answers a custom resource's schema errors) are the
// same; any other difference is not.
func TestSameMessage(t *testing.T) {
	const (
		// Two answers of kube-apiserver v1.37.2 to the same create.
		first  = `Gadget.probe.example.com "g2" is invalid: [spec.mode: Unsupported value: "weird": supported values: "open", "locked", "auto", spec.note: Too long: may not be more than 20 bytes, spec.port: Invalid value: "number": spec.port in body must be of type integer,string: "number", spec.replicas: Invalid value: 11: spec.replicas in body should be less than or equal to 10, spec.items[1]: Duplicate value: {"name":"a"}, <nil>: Invalid value: null: some validation rules were not checked because the object was invalid; correct the existing errors to complete validation]`
		second = `Gadget.probe.example.com "g2" is invalid: [spec.note: Too long: may not be more than 20 bytes, spec.port: Invalid value: "number": spec.port in body must be of type integer,string: "number", spec.replicas: Invalid value: 11: spec.replicas in body should be less than or equal to 10, spec.mode: Unsupported value: "weird": supported values: "open", "locked", "auto", spec.items[1]: Duplicate value: {"name":"a"}, <nil>: Invalid value: null: some validation rules were not checked because the object was invalid; correct the existing errors to complete validation]`
	)
	for _, tc := range []struct {
		name string
		a, b string
		want bool
	}{
		{"identical", first, first, true},
		{"the same errors in another order", first, second, true},
		{"both empty", "", "", true},
		{"another value in one error", first, `Gadget.probe.example.com "g2" is invalid: [spec.mode: Unsupported value: "woird": supported values: "open", "locked", "auto", spec.note: Too long: may not be more than 20 bytes, spec.port: Invalid value: "number": spec.port in body must be of type integer,string: "number", spec.replicas: Invalid value: 11: spec.replicas in body should be less than or equal to 10, spec.items[1]: Duplicate value: {"name":"a"}, <nil>: Invalid value: null: some validation rules were not checked because the object was invalid; correct the existing errors to complete validation]`, false},
		{"another object", `ConfigMap "a" is invalid: [data.x: Invalid value: "x", data.y: Invalid value: "y"]`, `ConfigMap "b" is invalid: [data.y: Invalid value: "y", data.x: Invalid value: "x"]`, false},
		{"two errors swapped", `ConfigMap "a" is invalid: [data.x: Invalid value: "x", data.y: Invalid value: "y"]`, `ConfigMap "a" is invalid: [data.y: Invalid value: "y", data.x: Invalid value: "x"]`, true},
		{"the enum's values in another order are another message", `X "a" is invalid: spec.mode: Unsupported value: "w": supported values: "a", "b"`, `X "a" is invalid: spec.mode: Unsupported value: "w": supported values: "b", "a"`, false},
		{"no list", `configmaps "a" not found`, `configmaps "b" not found`, false},
		// As kube-apiserver v1.37.2 words identical creates past three quotas (it named qa, then qc).
		{"another exceeded quota", `configmaps "c1" is forbidden: exceeded quota: qa, requested: configmaps=1, used: configmaps=1, limited: configmaps=1`,
			`configmaps "c1" is forbidden: exceeded quota: qc, requested: configmaps=1, used: configmaps=1, limited: configmaps=1`, true},
		{"an exceeded quota for another object", `configmaps "c1" is forbidden: exceeded quota: qa, requested: configmaps=1, used: configmaps=1, limited: configmaps=1`,
			`configmaps "c2" is forbidden: exceeded quota: qa, requested: configmaps=1, used: configmaps=1, limited: configmaps=1`, false},
		// Two answers of kube-apiserver v1.37.2 to the same create, before and after a reload of its policies.
		{"another denying policy", `configmaps "z6" is forbidden: ValidatingAdmissionPolicy 'deny-a' with binding 'deny-a' denied request: deny-a says no`,
			`configmaps "z6" is forbidden: ValidatingAdmissionPolicy 'deny-b' with binding 'deny-b' denied request: deny-b says no`, true},
		// kube-apiserver v1.37.2's answer and the replay's to one create whose webhook answers with another uid.
		{"another AdmissionReview uid", `Internal error occurred: failed calling webhook "uid.wh.kproxy.test": received invalid webhook response: expected response.uid="f3a519cf-62a7-4104-a04d-e767d0339397", got "wrong"`,
			`Internal error occurred: failed calling webhook "uid.wh.kproxy.test": received invalid webhook response: expected response.uid="7ae5668c-28fc-4920-888d-8fb2dedb9b7c", got "wrong"`, true},
		{"another AdmissionReview uid, another webhook", `Internal error occurred: failed calling webhook "uid.wh.kproxy.test": received invalid webhook response: expected response.uid="f3a519cf-62a7-4104-a04d-e767d0339397", got "wrong"`,
			`Internal error occurred: failed calling webhook "other.wh.kproxy.test": received invalid webhook response: expected response.uid="7ae5668c-28fc-4920-888d-8fb2dedb9b7c", got "wrong"`, false},
		// Two answers of kube-apiserver v1.37.2 to the same create, before and after a reload of its policies.
		{"another failing mutating policy", `policy 'mp-b' with binding 'mp-b' denied request: expression 'x' resulted in error: no such key: labels`,
			`policy 'mp-c' with binding 'mp-c' denied request: expression 'y' resulted in error: no such key: labels`, true},
		{"a failing mutating policy and a webhook's denial", `policy 'mp-b' with binding 'mp-b' denied request: expression 'x' resulted in error: no such key: labels`,
			`admission webhook "a.two.test" denied the request: A`, false},
		// Answers of kube-apiserver v1.37.2 through kproxy demo, 2026-12-06.
		{"LimitRanger's errors in another order", `pods "p4" is forbidden: [maximum memory usage per Container is 128Mi, but limit is 256Mi, maximum cpu usage per Container is 500m, but limit is 1]`,
			`pods "p4" is forbidden: [maximum cpu usage per Container is 500m, but limit is 1, maximum memory usage per Container is 128Mi, but limit is 256Mi]`, true},
		{"LimitRanger's errors with their limits swapped", `pods "p4" is forbidden: [maximum memory usage per Container is 128Mi, but limit is 1, maximum cpu usage per Container is 500m, but limit is 256Mi]`,
			`pods "p4" is forbidden: [maximum cpu usage per Container is 500m, but limit is 1, maximum memory usage per Container is 128Mi, but limit is 256Mi]`, false},
		{"LimitRanger's ratio and minimum in another order", `pods "p" is forbidden: [cpu max limit to request ratio per Container is 2, but provided ratio is 4.000000, minimum memory usage per Container is 64Mi, but request is 32Mi]`,
			`pods "p" is forbidden: [minimum memory usage per Container is 64Mi, but request is 32Mi, cpu max limit to request ratio per Container is 2, but provided ratio is 4.000000]`, true},
		{"RBAC's missing roles in another order", `secrets is forbidden: User "alice" cannot list resource "secrets" in API group "" in the namespace "wp1": rbac: RBAC: [clusterrole.rbac.authorization.k8s.io "missing1" not found, clusterrole.rbac.authorization.k8s.io "missing2" not found, role.rbac.authorization.k8s.io "missing3" not found]`,
			`secrets is forbidden: User "alice" cannot list resource "secrets" in API group "" in the namespace "wp1": rbac: RBAC: [clusterrole.rbac.authorization.k8s.io "missing2" not found, clusterrole.rbac.authorization.k8s.io "missing1" not found, role.rbac.authorization.k8s.io "missing3" not found]`, true},
		{"RBAC's missing roles, another role", `secrets is forbidden: User "alice" cannot list resource "secrets" in API group "" in the namespace "wp1": rbac: RBAC: [clusterrole.rbac.authorization.k8s.io "missing1" not found, clusterrole.rbac.authorization.k8s.io "missing2" not found]`,
			`secrets is forbidden: User "alice" cannot list resource "secrets" in API group "" in the namespace "wp1": rbac: RBAC: [clusterrole.rbac.authorization.k8s.io "missing2" not found, clusterrole.rbac.authorization.k8s.io "missing4" not found]`, false},
		{"another unsatisfied quota", `pods "p" is forbidden: failed quota: qc: must specify limits.cpu for: p`, `pods "p" is forbidden: failed quota: qm: must specify limits.memory for: p`, true},
		{"another conflicting RuntimeClass key", `pods "r" is forbidden: conflict: runtimeClass.scheduling.nodeSelector[a] = 1; pod.spec.nodeSelector[a] = 2`,
			`pods "r" is forbidden: conflict: runtimeClass.scheduling.nodeSelector[c] = 1; pod.spec.nodeSelector[c] = 2`, true},
		{"another extra refused, RBAC's list in another order", `userextras.authentication.k8s.io "z1" is forbidden: User "alice" cannot impersonate resource "userextras/zone" in API group "authentication.k8s.io" at the cluster scope: rbac: RBAC: [clusterrole.rbac.authorization.k8s.io "missing2" not found, clusterrole.rbac.authorization.k8s.io "missing1" not found]`,
			`userextras.authentication.k8s.io "s1" is forbidden: User "alice" cannot impersonate resource "userextras/scopes" in API group "authentication.k8s.io" at the cluster scope: rbac: RBAC: [clusterrole.rbac.authorization.k8s.io "missing1" not found, clusterrole.rbac.authorization.k8s.io "missing2" not found]`, true},
		{"an extra refused to another caller", `userextras.authentication.k8s.io "z1" is forbidden: User "alice" cannot impersonate resource "userextras/zone" in API group "authentication.k8s.io" at the cluster scope`,
			`userextras.authentication.k8s.io "s1" is forbidden: User "bob" cannot impersonate resource "userextras/scopes" in API group "authentication.k8s.io" at the cluster scope`, false},
		{"another generated name", `ConfigMap "g-82qrt" is invalid: data[bad key]: Invalid value: "bad key": a valid config key must consist of alphanumeric characters, '-', '_' or '.' (e.g. 'key.name',  or 'KEY_NAME',  or 'key-name', regex used for validation is '[-._a-zA-Z0-9]+')`,
			`ConfigMap "g-zmkst" is invalid: data[bad key]: Invalid value: "bad key": a valid config key must consist of alphanumeric characters, '-', '_' or '.' (e.g. 'key.name',  or 'KEY_NAME',  or 'key-name', regex used for validation is '[-._a-zA-Z0-9]+')`, true},
		{"another generated name, LimitRanger", `pods "web-zmhdh" is forbidden: maximum cpu usage per Container is 500m, but limit is 1`, `pods "web-wbcs9" is forbidden: maximum cpu usage per Container is 500m, but limit is 1`, true},
		{"another generated name and another error", `pods "web-zmhdh" is forbidden: maximum cpu usage per Container is 500m, but limit is 1`, `pods "web-wbcs9" is forbidden: maximum cpu usage per Container is 500m, but limit is 2`, false},
		{"names that are not drawn (a vowel)", `configmaps "cm-abcde" not found`, `configmaps "cm-bcdfg" not found`, false},
		{"a whole name of five", `configmaps "bcdfg" not found`, `configmaps "bcdfh" not found`, false},
		{"another generated name, errors in another order", `ConfigMap "g-82qrt" is invalid: [data.x: Invalid value: "x", data.y: Invalid value: "y"]`, `ConfigMap "g-zmkst" is invalid: [data.y: Invalid value: "y", data.x: Invalid value: "x"]`, true},
		{"a policy's denial and another refusal", `configmaps "z6" is forbidden: ValidatingAdmissionPolicy 'deny-a' with binding 'deny-a' denied request: deny-a says no`,
			`configmaps "z6" is forbidden: exceeded quota: qa, requested: configmaps=1, used: configmaps=1, limited: configmaps=1`, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if got := SameMessage(tc.a, tc.b); got != tc.want {
				t.Errorf("SameMessage = %v, want %v\n a: %s\n b: %s", got, tc.want, tc.a, tc.b)
			}
		})
	}
}

// TestSameMessageAt: another validating webhook's denial is the same
// verdict at validating-admission (the webhooks race), another at any
// other stage (mutating webhooks run in a fixed order).
func TestSameMessageAt(t *testing.T) {
	// Two answers of kube-apiserver v1.37.2 to the same create, two
	// validating webhooks denying it.
	a, b := `admission webhook "a.two.test" denied the request: A`, `admission webhook "b.two.test" denied the request: B`
	failed := `Internal error occurred: failed calling webhook "b.two.test": failed to call webhook: Post "https://127.0.0.1:9444/allow?timeout=5s": dial tcp 127.0.0.1:9444: connect: connection refused`
	for _, tc := range []struct {
		name, stage, a, b string
		want              bool
	}{
		{"another denying validating webhook", StageValidatingAdmission, a, b, true},
		{"another denying mutating webhook", StageMutatingAdmission, a, b, false},
		{"a denial and a failed call", StageValidatingAdmission, a, failed, false},
		{"a denial and a policy's", StageValidatingAdmission, a, `configmaps "z6" is forbidden: ValidatingAdmissionPolicy 'deny-a' with binding 'deny-a' denied request: deny-a says no`, false},
		{"what SameMessage forgives", StageStorage, `ConfigMap "a" is invalid: [data.x: Invalid value: "x", data.y: Invalid value: "y"]`, `ConfigMap "a" is invalid: [data.y: Invalid value: "y", data.x: Invalid value: "x"]`, true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if got := SameMessageAt(tc.stage, tc.a, tc.b); got != tc.want {
				t.Errorf("SameMessageAt(%s) = %v, want %v\n a: %s\n b: %s", tc.stage, got, tc.want, tc.a, tc.b)
			}
		})
	}
}

// TestDenyingPolicy: the policy (and binding) a policy plugin's refusal
// names, in each of its wordings.
func TestDenyingPolicy(t *testing.T) {
	for _, tc := range []struct {
		msg, policy, binding string
		ok                   bool
	}{
		{`configmaps "z6" is forbidden: ValidatingAdmissionPolicy 'deny-a' with binding 'deny-a-2' denied request: no`, "deny-a", "deny-a-2", true},
		{`configmaps "z6" is forbidden: ValidatingAdmissionPolicy 'deny-a' denied request: no`, "deny-a", "", true},
		{`policy 'mp-b' with binding 'mp-b' denied request: failed to configure binding: no params found for policy binding with ` + "`Deny`" + ` parameterNotFoundAction`, "mp-b", "mp-b", true},
		{`policy "mp-b" denied request: no`, "mp-b", "", true},
		{`configmaps "z6" is forbidden: the policy 'x' with binding 'y' denied request: no`, "", "", false},
		{`admission webhook "a.two.test" denied the request: A`, "", "", false},
	} {
		p, b, ok := DenyingPolicy(tc.msg)
		if p != tc.policy || b != tc.binding || ok != tc.ok {
			t.Errorf("DenyingPolicy(%q) = %q, %q, %v; want %q, %q, %v", tc.msg, p, b, ok, tc.policy, tc.binding, tc.ok)
		}
	}
}
