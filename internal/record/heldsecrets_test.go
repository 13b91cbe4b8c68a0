package record

import (
	"slices"
	"testing"
	"time"
)

// TestHeldSecrets: a request's values are held while it is in flight,
// kept a while once it was refused, and let go once it passed.
func TestHeldSecrets(t *testing.T) {
	now := time.Date(2026, 12, 7, 0, 0, 0, 0, time.UTC)
	h := NewHeldSecrets(func() time.Time { return now })
	calls := 0
	of := func(vs ...string) func() []string {
		return func() []string { calls++; return vs }
	}
	h.Hold("passed", of("passed-value"))
	h.Hold("refused", of("refused-value"))
	h.Hold("refused-empty", of())
	if calls != 0 {
		t.Fatalf("Hold found the values (%d calls): they are found only when asked for", calls)
	}
	all := h.All()
	slices.Sort(all)
	if want := []string{"passed-value", "refused-value"}; !slices.Equal(all, want) {
		t.Errorf("in flight: All = %q, want %q", all, want)
	}
	h.Settle("passed", false)
	h.Settle("refused", true)
	h.Settle("refused-empty", true)
	h.Settle("never-held", true)
	if got, want := h.All(), []string{"refused-value"}; !slices.Equal(got, want) {
		t.Errorf("settled: All = %q, want %q", got, want)
	}
	if got := len(h.All()); got != 1 {
		t.Errorf("%d values held, want 1 (the refused request's)", got)
	}
	now = now.Add(KeepSecretsFor)
	if got := h.All(); len(got) != 0 {
		t.Errorf("after %s: All = %q, want nothing", KeepSecretsFor, got)
	}
	// Bounded: the oldest go first.
	for i := range MaxKeptSecrets + 10 {
		id := string(rune('a' + i%26))
		h.Hold(id, of("v"+id))
		h.Settle(id, true)
	}
	if got := len(h.All()); got != MaxKeptSecrets {
		t.Errorf("%d values kept after %d refusals (one each), want the bound %d", got, MaxKeptSecrets+10, MaxKeptSecrets)
	}
	var nilHeld *HeldSecrets
	nilHeld.Hold("x", of("x"))
	nilHeld.Settle("x", true)
	if nilHeld.All() != nil {
		t.Error("a nil HeldSecrets holds something")
	}
}
