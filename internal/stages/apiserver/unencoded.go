package apiserver

import (
	"io"
	"sync"

	"k8s.io/apimachinery/pkg/runtime"
)

// A read's replay predicts the apiserver's status and says why; the
// object it answers with is dropped. Encoding it (converting it to its
// version and writing JSON or protobuf) was about a sixth of a GET's
// replay, for bytes nobody reads. So the object a read replay's storage
// returns is held here for the length of its run, and the encoders of the
// built-in API groups write a placeholder in its place. Everything else
// the handler does runs as in the apiserver: content negotiation (a 406
// still comes before the encoder), the status, the headers, and any
// object it transforms on the way (a Table, partial metadata) is a new
// object, encoded for real. A write's answer is always encoded: the
// storage stage sizes it.
type unencoded struct{ m sync.Map }

// unencodedPlaceholder is what the handler writes for an object it does
// not encode: an empty JSON object, which nothing reads (Run keeps only
// a refusal's body and a write's answer).
var unencodedPlaceholder = []byte("{} ")

// hold marks obj, read by run, as not to be encoded until release(run).
// Only a read's objects are held.
func (u *unencoded) hold(run *Run, obj runtime.Object) {
	if u == nil || run == nil || !run.Read || obj == nil {
		return
	}
	u.m.Store(obj, struct{}{})
	run.mu.Lock()
	run.unencoded = append(run.unencoded, obj)
	run.mu.Unlock()
}

// release forgets run's objects, encoded or not: the map never outlives
// the runs.
func (u *unencoded) release(run *Run) {
	if u == nil {
		return
	}
	run.mu.Lock()
	held := run.unencoded
	run.unencoded = nil
	run.mu.Unlock()
	for _, obj := range held {
		u.m.Delete(obj)
	}
}

func (u *unencoded) skips(obj runtime.Object) bool {
	_, ok := u.m.Load(obj)
	return ok
}

// wrap is ns with encoders that skip the held objects.
func (u *unencoded) wrap(ns runtime.NegotiatedSerializer) runtime.NegotiatedSerializer {
	if u == nil || ns == nil {
		return ns
	}
	return skippingSerializer{NegotiatedSerializer: ns, u: u}
}

type skippingSerializer struct {
	runtime.NegotiatedSerializer
	u *unencoded
}

func (s skippingSerializer) EncoderForVersion(e runtime.Encoder, gv runtime.GroupVersioner) runtime.Encoder {
	return skippingEncoder{Encoder: s.NegotiatedSerializer.EncoderForVersion(e, gv), u: s.u}
}

type skippingEncoder struct {
	runtime.Encoder
	u *unencoded
}

func (e skippingEncoder) Encode(obj runtime.Object, w io.Writer) error {
	if e.u.skips(obj) {
		_, err := w.Write(unencodedPlaceholder)
		return err
	}
	return e.Encoder.Encode(obj, w)
}

// EncodeWithAllocator keeps the apiserver's pooled buffers for what is
// encoded (SerializeObject uses them when the encoder takes them).
func (e skippingEncoder) EncodeWithAllocator(obj runtime.Object, w io.Writer, a runtime.MemoryAllocator) error {
	if e.u.skips(obj) {
		_, err := w.Write(unencodedPlaceholder)
		return err
	}
	if ea, ok := e.Encoder.(runtime.EncoderWithAllocator); ok {
		return ea.EncodeWithAllocator(obj, w, a)
	}
	return e.Encoder.Encode(obj, w)
}
