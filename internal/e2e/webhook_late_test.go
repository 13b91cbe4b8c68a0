package e2e

import (
	"net/http"
	"strings"
	"testing"

	"github.com/kproxy/kproxy/internal/record"
)

// TestTokenWebhookCachedByTheApiserver: a webhook token used directly,
// then refused by the webhook, then sent through kproxy: the apiserver
// answers from the webhook's cache (--authentication-token-webhook-cache-ttl,
// 2 minutes here), and kproxy's replay, whose call the webhook refuses,
// had predicted 401 (found by a probe: 11 of 11, and 9 of 9 with the
// webhook down). It says unknown now, naming the cache.
func TestTokenWebhookCachedByTheApiserver(t *testing.T) {
	idp.flipToken.Store(false)
	t.Cleanup(func() { idp.flipToken.Store(false) })
	rec := fromWebhookCache(t, "hook-flip", func() { idp.flipToken.Store(true) })
	if p := rec.Predicted; p.Stage != record.StageUnknown || !strings.Contains(p.Message, "--authentication-token-webhook-cache-ttl") {
		t.Errorf("a token the apiserver authenticated from its webhook cache: predicted %+v, want unknown naming the cache", p)
	}
	saysAt(t, rec, "--authentication-token-webhook-cache-ttl", record.StageAuthentication)
}

// TestTokenWebhookDownCalledOnce: a webhook token the apiserver has
// cached, sent through kproxy while the webhook fails every call: the
// apiserver answers from its cache, and the replay calls the webhook
// once (the apiserver would retry a failing webhook five times over
// seconds), then says unknown, naming the cache (found by a probe: the
// replays of 40 requests called a down webhook about 85 times, 4.4 s
// each, and predicted 401).
func TestTokenWebhookDownCalledOnce(t *testing.T) {
	idp.downToken.Store(false)
	t.Cleanup(func() { idp.downToken.Store(false) })
	rec := fromWebhookCache(t, "hook-down", func() { idp.downToken.Store(true); idp.downCalls.Store(0) })
	if n := idp.downCalls.Load(); n != 1 {
		t.Errorf("the down webhook was called %d times for one request (the replay's), want 1", n)
	}
	if p := rec.Predicted; p.Stage != record.StageUnknown || !strings.Contains(p.Message, "--authentication-token-webhook-cache-ttl") {
		t.Errorf("a token the apiserver authenticated from its webhook cache, the webhook down: predicted %+v, want unknown naming the cache", p)
	}
}

// fromWebhookCache lists configmaps with a webhook's token directly (the
// apiserver caches the webhook's verdict), runs change (the webhook
// refuses it, or fails), then sends the list through a new kproxy: the
// apiserver answers from its cache (200). It returns the record.
func fromWebhookCache(t *testing.T, token string, change func()) *record.Record {
	t.Helper()
	list := request{method: "GET", path: "/api/v1/namespaces/" + testNS + "/configmaps", header: http.Header{"Authorization": {"Bearer " + token}}}
	d := directRoute()
	if got := do(t, d.client(nil), d.base, list); got.status != 200 {
		t.Fatalf("the webhook's token, directly: answered %d, want 200: %s", got.status, got.body)
	}
	change()
	r, recs := recordedKproxy(t)
	got := do(t, r.client(nil), r.base, list)
	rec := nextRecord(t, recs)
	if got.status != 200 {
		t.Fatalf("the token through kproxy: answered %d, want 200 (the apiserver's webhook cache): %s", got.status, got.body)
	}
	return rec
}

// TestAuthzWebhookChangedItsMind: the authorization webhook allows
// hook:flip's list, then denies it before the request's replay (queued
// behind writes) asks it. The apiserver answered 200; the replay's
// webhook denies: unknown, naming the webhook (found by a probe, where
// the apiserver answered from its webhook cache, both ways: predicted 403
// for 200 and 200 for 403). This cluster caches no webhook verdict, so the
// webhook changing its mind stands in for the cache.
func TestAuthzWebhookChangedItsMind(t *testing.T) {
	idp.flipToken.Store(false)
	idp.flipAuthz.Store(false)
	t.Cleanup(func() { idp.flipAuthz.Store(false) })
	recs, r, c := oneReplayWorker(t)
	list := request{method: "GET", path: "/api/v1/namespaces/" + testNS + "/configmaps", header: http.Header{"Authorization": {"Bearer hook-flip"}}}
	byFlip := func(rec *record.Record) bool { return rec.Request.User == "hook:flip" }
	late := false
	for i := 0; i < 5 && !late; i++ {
		idp.flipAuthz.Store(false)
		queueWrites(t, r, c, 40)
		if got := do(t, c, r.base, list); got.status != 200 {
			t.Fatalf("hook:flip's list: answered %d, want 200 (the webhook allows it): %s", got.status, got.body)
		}
		idp.flipAuthz.Store(true)
		lateRecs, seen := tallyLate(t, recs, 41, byFlip, "having asked the webhook authorizer", "the webhook changing its mind")
		if seen != 1 {
			t.Fatalf("%d records of hook:flip's list", seen)
		}
		for _, rec := range lateRecs {
			saysAt(t, rec, "having asked the webhook authorizer", record.StageAuthorization)
		}
		late = len(lateRecs) > 0
	}
	if !late {
		t.Errorf("no replay of 5 lists ran after the webhook changed its mind: the path under test was not taken")
	}
}
