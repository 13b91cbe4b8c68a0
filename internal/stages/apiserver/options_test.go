package apiserver

import (
	"strings"
	"testing"
)

// TestCompleteAuthentication: without any authentication flag kproxy
// starts, and the replay's authentication says it was not given them
// (kube-apiserver itself requires --service-account-issuer, which
// kproxy only needs to replay service-account tokens); with some, kube-apiserver's
// own validation runs, and its refusal names the way out.
func TestCompleteAuthentication(t *testing.T) {
	for _, tc := range []struct {
		name    string
		args    []string
		wantErr []string
	}{
		{"no flags", nil, nil},
		{"authorization only", []string{"--authorization-mode=Node,RBAC"}, nil},
		{"a client CA without the service-account flags", []string{"--client-ca-file=/etc/kubernetes/pki/ca.crt"},
			[]string{"service-account-issuer is a required flag", "--apiserver-manifest"}},
		{"the service-account flags", []string{"--service-account-issuer=https://kubernetes.default.svc", "--service-account-key-file=/etc/kubernetes/pki/sa.pub"}, nil},
	} {
		t.Run(tc.name, func(t *testing.T) {
			o, _, err := OptionsFromArgs(tc.args)
			if err != nil {
				t.Fatal(err)
			}
			err = o.Complete()
			if tc.wantErr == nil {
				if err != nil {
					t.Errorf("Complete: %v", err)
				}
				return
			}
			for _, w := range tc.wantErr {
				if err == nil || !strings.Contains(err.Error(), w) {
					t.Errorf("Complete: %v, want an error containing %q", err, w)
				}
			}
		})
	}
}
