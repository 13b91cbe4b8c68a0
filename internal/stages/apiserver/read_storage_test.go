package apiserver

import (
	"errors"
	"strings"
	"testing"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apiserver/pkg/storage"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

// TestSettleRead: which storage answers are the apiserver's too (the
// read's outcome, predicted) and which make the run unknown. An object the
// store cannot decode is the apiserver's answer only where the apiserver
// reads etcd as well: a get of the latest; a get at a resourceVersion and
// a list are answered from its watch cache, which decoded the object when
// it was stored.
func TestSettleRead(t *testing.T) {
	corrupt := storage.NewCorruptObjError("/gizmos/ns/a", errors.New("object not decodable revision=7: conversion webhook for g/v1, Kind=Gizmo failed: down"))
	storeRead := &apierrors.StatusError{ErrStatus: metav1.Status{Code: 500, Reason: metav1.StatusReasonStoreReadError, Message: "failed to read one or more gizmos.g from the storage"}}
	for _, tc := range []struct {
		name          string
		read          StorageRead
		err           error
		refused, fail bool
		why           string
	}{
		{"found", StorageRead{Options: rvOption("", "")}, nil, false, false, ""},
		{"not found", StorageRead{Options: rvOption("", "")}, storage.NewKeyNotFoundError("/gizmos/ns/a", 0), true, false, ""},
		{"corrupt, get of the latest", StorageRead{Options: rvOption("", "")}, corrupt, true, false, ""},
		{"corrupt, get at resourceVersion=0", StorageRead{Options: rvOption("0", "")}, corrupt, false, true, "answers a get at a resourceVersion from its watch cache"},
		{"corrupt, list", StorageRead{List: true, Options: rvOption("", "")}, corrupt, false, true, "answers lists from its watch cache"},
		{"a list's corrupt objects", StorageRead{List: true, Options: rvOption("", "")}, storeRead, false, true, "answers lists from its watch cache"},
		{"internal error", StorageRead{Options: rvOption("", "")}, apierrors.NewInternalError(errors.New("no key")), false, true, "no key"},
		{"other status", StorageRead{Options: rvOption("", "")}, apierrors.NewResourceExpired("too old"), true, false, ""},
	} {
		t.Run(tc.name, func(t *testing.T) {
			read := tc.read
			if got := settleRead(&read, tc.err, &corev1.ConfigMap{}); !errors.Is(got, tc.err) && got != tc.err {
				t.Errorf("settleRead returned %v, want the store's error %v", got, tc.err)
			}
			if (read.Refused != nil) != tc.refused || (read.Err != nil) != tc.fail {
				t.Fatalf("refused %v, failed %v; want refused %v, failed %v", read.Refused, read.Err, tc.refused, tc.fail)
			}
			if tc.why != "" && !containsErr(read.Err, tc.why) {
				t.Errorf("unknown says %q, want it to say %q", read.Err, tc.why)
			}
			if tc.err == nil && !read.Found {
				t.Error("a read that found its object is not marked found")
			}
		})
	}
}

func containsErr(err error, s string) bool {
	return err != nil && strings.Contains(err.Error(), s)
}
