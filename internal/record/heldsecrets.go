package record

import (
	"sync"
	"time"
)

// Bounds of HeldSecrets.
const (
	// KeepSecretsFor is how long a refused request's secret values are
	// kept after its record is written: the apiserver exports its spans
	// in batches (every 5 s by default), after it answered.
	KeepSecretsFor = time.Minute
	// MaxKeptSecrets bounds the refused requests whose values are kept
	// (the oldest go first).
	MaxKeptSecrets = 4096
)

// HeldSecrets are the secret values (SecretStrings) of the bodies of the
// requests kproxy is forwarding, and of those refused or warned of, for
// KeepSecretsFor after. The apiserver's own spans of a request, which
// kproxy's OTLP receiver passes on, may quote them in free text (a
// policy's message, in the event "Write to database call failed"), and
// only the proxy holds the body. The receiver cannot always tell which
// request a span is of (the apiserver starts a trace of its own for a
// caller it does not trust with its trace context, and a request's
// spans come before its root), so it scrubs every error text of all of
// them. Safe for concurrent use; nil holds nothing.
type HeldSecrets struct {
	now  func() time.Time
	mu   sync.Mutex
	held map[string]func() []string // by request ID, in flight
	kept []keptSecrets              // settled, oldest first
}

type keptSecrets struct {
	until  time.Time
	values []string
}

// NewHeldSecrets makes an empty HeldSecrets reading time from now.
func NewHeldSecrets(now func() time.Time) *HeldSecrets {
	return &HeldSecrets{now: now, held: map[string]func() []string{}}
}

// Hold registers the request id's secret values, found by of when they
// are first asked for (of must be safe to call more than once and
// concurrently; it is called outside the lock). Each Hold is settled.
func (h *HeldSecrets) Hold(id string, of func() []string) {
	if h == nil {
		return
	}
	h.mu.Lock()
	h.held[id] = of
	h.mu.Unlock()
}

// Settle ends the request id's hold: its record is written. A request
// the apiserver refused or warned of (keep) has its values kept a while
// longer, for the spans still to come; the body is let go.
func (h *HeldSecrets) Settle(id string, keep bool) {
	if h == nil {
		return
	}
	h.mu.Lock()
	of, ok := h.held[id]
	delete(h.held, id)
	h.mu.Unlock()
	if !ok || !keep {
		return
	}
	values := of()
	if len(values) == 0 {
		return
	}
	h.mu.Lock()
	defer h.mu.Unlock()
	h.expireLocked()
	if len(h.kept) >= MaxKeptSecrets {
		h.kept = h.kept[1:]
	}
	h.kept = append(h.kept, keptSecrets{until: h.now().Add(KeepSecretsFor), values: values})
}

// All are the values held and kept now.
func (h *HeldSecrets) All() []string {
	if h == nil {
		return nil
	}
	h.mu.Lock()
	h.expireLocked()
	var out []string
	for _, k := range h.kept {
		out = append(out, k.values...)
	}
	ofs := make([]func() []string, 0, len(h.held))
	for _, of := range h.held {
		ofs = append(ofs, of)
	}
	h.mu.Unlock()
	for _, of := range ofs {
		out = append(out, of()...)
	}
	return out
}

func (h *HeldSecrets) expireLocked() {
	now := h.now()
	i := 0
	for i < len(h.kept) && !now.Before(h.kept[i].until) {
		i++
	}
	if i > 0 {
		h.kept = append(h.kept[:0:0], h.kept[i:]...)
	}
}
