package e2e

import (
	"context"
	"fmt"
	"io"
	"net"
	"net/http"
	"strings"
	"testing"
	"time"

	"k8s.io/apimachinery/pkg/util/wait"

	"github.com/kproxy/kproxy/internal/localcluster"
	"github.com/kproxy/kproxy/internal/record"
)

// TestEtcdAnswersLater: kproxy started while its etcd could not be
// reached (an etcd restarting) reads through the apiserver, and once etcd
// answers, reads etcd directly, without a restart (found by a probe: it
// read through the apiserver, with the unknowns that brings, until
// restarted). A forwarder kproxy is pointed at stands in for the etcd
// that comes back: closed at kproxy's start, then forwarding to the
// cluster's etcd.
func TestEtcdAnswersLater(t *testing.T) {
	ports, err := localcluster.FreePorts(1)
	if err != nil {
		t.Fatal(err)
	}
	addr := "127.0.0.1:" + itoa(int64(ports[0]))
	stream := record.NewStream()
	recs, _, cancel := stream.Subscribe(64)
	defer cancel()
	k := startKproxy(t, kproxyOptions{stream: stream, etcdServers: "http://" + addr})
	r := reverseH2Route(k)
	c := r.client(nil)
	// A write's replay reads the object it writes: from etcd, or through
	// the apiserver, and its storage stage says which.
	name := fmt.Sprintf("etcd-later-%d", time.Now().UnixNano())
	if got := do(t, c, r.base, request{method: "POST", path: "/api/v1/namespaces/" + testNS + "/configmaps", user: "admin",
		body: `{"apiVersion":"v1","kind":"ConfigMap","metadata":{"name":"` + name + `"}}`}); got.status != http.StatusCreated {
		t.Fatalf("create: %d %s", got.status, got.body)
	}
	nextRecord(t, recs)
	storage := func() string {
		t.Helper()
		if got := do(t, c, r.base, request{method: "PATCH", path: "/api/v1/namespaces/" + testNS + "/configmaps/" + name, user: "admin",
			contentType: "application/merge-patch+json", body: `{"data":{"at":"` + time.Now().String() + `"}}`}); got.status != http.StatusOK {
			t.Fatalf("patch: %d %s", got.status, got.body)
		}
		rec := nextRecord(t, recs)
		for _, s := range rec.Stages {
			if s.Name == record.StageStorage {
				return s.Explanation
			}
		}
		return ""
	}
	if got := storage(); strings.Contains(got, "etcd /registry/") {
		t.Errorf("with etcd out of reach, the storage stage says %q", got)
	} else {
		t.Logf("with etcd out of reach: %s", got)
	}

	// etcd comes back.
	up := strings.TrimPrefix(cluster.EtcdURL, "http://")
	ln, err := net.Listen("tcp", addr)
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	go forward(ln, up)
	var last string
	err = wait.PollUntilContextTimeout(context.Background(), 2*time.Second, 2*time.Minute, true, func(context.Context) (bool, error) {
		last = storage()
		return strings.Contains(last, "etcd /registry/configmaps/"+testNS+"/"+name), nil
	})
	if err != nil {
		t.Fatalf("etcd answers, and the storage stage still says %q", last)
	}
	t.Logf("once etcd answers: %s", last)
}

// forward relays every connection ln accepts to the address to.
func forward(ln net.Listener, to string) {
	for {
		c, err := ln.Accept()
		if err != nil {
			return
		}
		go func() {
			defer c.Close()
			u, err := net.Dial("tcp", to)
			if err != nil {
				return
			}
			defer u.Close()
			go func() { _, _ = io.Copy(u, c) }()
			_, _ = io.Copy(c, u)
		}()
	}
}
