package reconcile

import (
	"context"
	"sync"
	"sync/atomic"

	"github.com/opkit/opkit"
)

// The operator's own writes. A turn's reconcile writes its object (the
// Status and Finalizer helpers note each write in the turn's context);
// the key's next turn may start before the watch has delivered that
// write, holding an older state of the object. Reconciled as is, that
// state would make the next status write fail with a 409 on the
// operator's own write; the controller reads the object again instead.

type turnWritesKey struct{}

// turnWrites is what a turn's helpers wrote: whether they wrote its
// object, each write noted at once in its shard's writtenKeys (an event
// of the write may come before the write's answer).
type turnWrites struct {
	key   opkit.Key
	into  *writtenKeys
	wrote atomic.Bool
}

// noteWrite notes, in a turn's context, that obj was written and is now
// at its resourceVersion. Outside a turn it does nothing.
func noteWrite(ctx context.Context, obj opkit.Object) {
	tw, ok := ctx.Value(turnWritesKey{}).(*turnWrites)
	if !ok || isNil(obj) || obj.GetResourceVersion() == "" {
		return
	}
	tw.wrote.Store(true)
	tw.into.set(tw.key, obj.GetResourceVersion())
}

// writesOf reports whether the turn of ctx wrote its object (a status
// or finalizer change) so far.
func writesOf(ctx context.Context) bool {
	tw, ok := ctx.Value(turnWritesKey{}).(*turnWrites)
	return ok && tw.wrote.Load()
}

// maxWritten bounds the keys whose last write the controller remembers;
// beyond it they are forgotten (a turn then may meet a 409, which the
// helpers retry on a fresh read).
const maxWritten = 10_000

// writtenKeys remembers, per key, the resourceVersion of the operator's
// last (newest) write of its object, until the key's next turn.
type writtenKeys struct {
	mu sync.Mutex
	rv map[opkit.Key]string
}

func (w *writtenKeys) set(key opkit.Key, rv string) {
	w.mu.Lock()
	defer w.mu.Unlock()
	if w.rv == nil || len(w.rv) >= maxWritten {
		w.rv = map[opkit.Key]string{}
	}
	if opkit.NewerResourceVersion(rv, w.rv[key]) {
		w.rv[key] = rv
	}
}

// take returns and forgets the last write of key's object.
func (w *writtenKeys) take(key opkit.Key) string {
	w.mu.Lock()
	defer w.mu.Unlock()
	rv := w.rv[key]
	delete(w.rv, key)
	return rv
}

func (w *writtenKeys) reset() {
	w.mu.Lock()
	defer w.mu.Unlock()
	w.rv = nil
}
