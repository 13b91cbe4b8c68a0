package apiserver

import (
	"strings"
	"testing"
)

// TestDryRunRevision: a dry run the apiserver admitted is read at the
// resourceVersion it answered with when the object has changed since,
// and as it is otherwise.
func TestDryRunRevision(t *testing.T) {
	for _, tc := range []struct {
		name         string
		found        bool
		rv, answered string
		want         string
	}{
		{"changed since: read at the answer's", true, "489", "488", "488"},
		{"unchanged: the latest", true, "488", "488", ""},
		{"a create's answer names none", true, "489", "", ""},
		{"deleted since: read at the answer's", false, "", "488", "488"},
		{"older than the answer: the latest", true, "480", "488", ""},
		{"not a revision", true, "489", "x", ""},
	} {
		if got := dryRunRevision(tc.found, tc.rv, tc.answered); got != tc.want {
			t.Errorf("%s: dryRunRevision(%v, %q, %q) = %q, want %q", tc.name, tc.found, tc.rv, tc.answered, got, tc.want)
		}
	}
}

// TestStoredKeys: a storage error's key named as etcd's, under the
// prefix, once.
func TestStoredKeys(t *testing.T) {
	const msg = `Operation cannot be fulfilled on configmaps "cfg1": StorageError: invalid object, Code: 4, Key: /configmaps/team1/cfg1, ResourceVersion: 0, AdditionalErrorMsg: Precondition failed: UID in precondition: a, UID in object meta: b`
	for _, tc := range []struct{ prefix, msg, want string }{
		{"/registry", msg, strings.Replace(msg, "Key: /configmaps", "Key: /registry/configmaps", 1)},
		{"registry/", msg, strings.Replace(msg, "Key: /configmaps", "Key: /registry/configmaps", 1)},
		{"/registry", strings.Replace(msg, "Key: /configmaps", "Key: /registry/configmaps", 1), strings.Replace(msg, "Key: /configmaps", "Key: /registry/configmaps", 1)},
		{"/registry", `configmaps "x" not found`, `configmaps "x" not found`},
		// A corrupt object's names the key as the replay's store does,
		// the apiserver's too (TestUndecryptableSecret).
		{"/registry", `StorageError: corrupt object, Code: 7, Key: /secrets/ns/s, ResourceVersion: 0`, `StorageError: corrupt object, Code: 7, Key: /secrets/ns/s, ResourceVersion: 0`},
	} {
		if got := storedKeys(tc.msg, tc.prefix); got != tc.want {
			t.Errorf("storedKeys(%q, %q) = %q, want %q", tc.msg, tc.prefix, got, tc.want)
		}
	}
}
