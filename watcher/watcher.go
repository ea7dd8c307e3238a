package watcher

import (
	"cmp"
	"context"
	"errors"
	"log/slog"
	"maps"
	"math"
	"slices"
	"strings"
	"sync"

	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"

	"github.com/opkit/opkit"
	"github.com/opkit/opkit/internal/typed"
	"github.com/opkit/opkit/queue"
)

// Errors reported by Run and Check.
var (
	// ErrAlreadyRunning is returned by Run while another Run of the same
	// Watcher is active.
	ErrAlreadyRunning = errors.New("watcher: already running")
	// ErrNotRunning is returned by Check when no Run is active.
	ErrNotRunning = errors.New("watcher: not running")
	// ErrNotSynced is returned by Check until the Run's first list is done.
	ErrNotSynced = errors.New("watcher: not synced")
	// ErrDisconnected is returned by Check while the latest list or watch
	// call failed; the call's error is wrapped alongside it, so
	// apierrors.IsForbidden and friends work on Check's result.
	ErrDisconnected = errors.New("watcher: not connected")
)

// Watcher lists and watches one resource and feeds a queue. Build it with
// [New]; run it with [Watcher.Run].
//
// What it tracks (the live objects and the ledger of unsettled deletes)
// survives across Runs, so that a new Run can detect objects deleted
// while no Run was active, and deliver the deletes a previous Run's queue
// lost.
type Watcher[T opkit.Object] struct {
	cfg  Config[T]
	log  *slog.Logger
	loop *loop

	// Owned by Run's goroutine.
	epoch    uint32    // number of the latest (re)list
	list     SyncEvent // the (re)list in progress
	interned interner  // the keys' strings

	// mu guards the fields below. Only Run's goroutine adds and changes
	// them, except Settle, which removes deletes from the ledger; the
	// controller's workers read them from other goroutines.
	mu      sync.RWMutex
	entries map[opkit.Key]entry
	// ledger holds, per key, the unsettled deletes in resourceVersion
	// order (see Watcher.Deletes).
	ledger           map[opkit.Key][]record[T]
	nRecords, nFinal int // records in the ledger, and those that keep a final state
}

// New validates cfg and returns a Watcher. It starts nothing.
func New[T opkit.Object](cfg Config[T]) (*Watcher[T], error) {
	cfg, err := cfg.withDefaults()
	if err != nil {
		return nil, err
	}
	lc := cfg.loopConfig()
	w := &Watcher[T]{
		cfg:     cfg,
		log:     lc.log,
		loop:    newLoop(lc),
		entries: make(map[opkit.Key]entry),
		ledger:  make(map[opkit.Key][]record[T]),
	}
	return w, nil
}

// Run lists the resource, emits an entry per object, then watches and emits
// an entry per change, until ctx is cancelled. It returns nil after ctx is
// cancelled, once every watch it opened is closed and every goroutine it
// started has ended; it returns ErrAlreadyRunning if another Run is active.
// A Watcher may be Run again after Run returns: each Run starts with a full
// list (see the package documentation).
func (w *Watcher[T]) Run(ctx context.Context) error { return w.loop.run(ctx, w) }

// Synced reports whether the current Run has finished its first list.
func (w *Watcher[T]) Synced() bool { return w.loop.isSynced() }

// WaitSynced blocks until the current Run, or the next one when none is
// active, has finished its first list (every object it found is in the
// queue), or until ctx ends (then it returns ctx's error). A controller's
// workers wait for it, so that a term hands out what needs work first
// rather than whatever the list delivered first.
func (w *Watcher[T]) WaitSynced(ctx context.Context) error { return w.loop.waitSynced(ctx) }

// Check is a health check: nil while a Run is active, its first list is
// done and the latest list or watch call succeeded (a watch the server
// closed before it delivered anything or stayed open for [Backoff.Reset]
// counts as failed until the next one opens). Otherwise it says why:
// ErrNotRunning, ErrNotSynced and/or ErrDisconnected wrapping the API error
// (so errors.Is and apierrors.IsForbidden work on the result).
func (w *Watcher[T]) Check() error { return w.loop.check() }

// begin starts a (re)list: a new epoch, and its SyncEvent.
func (w *Watcher[T]) begin(initial bool, reason Reason) {
	w.list = SyncEvent{Phase: SyncStarted, Initial: initial, Reason: reason}
	w.cfg.OnSync(w.list)
	w.epoch++
}

// object handles a listed object or an Added/Modified event.
func (w *Watcher[T]) object(u *unstructured.Unstructured, listed bool) {
	if listed {
		w.observe(u, &w.list)
		return
	}
	w.observe(u, nil)
	w.tracked()
}

// end finishes a complete (re)list. What the objects listed do not tell:
// keys with unsettled deletes and no live object, whose adds the queue of
// an earlier Run may have lost (it is cleared at the end of a leader's
// term), added again by a Run's first list; and the live objects the list
// did not see: gone since.
func (w *Watcher[T]) end(initial bool, rv string) {
	var lost []opkit.Key
	vanished := make(map[opkit.Key]entry)
	w.mu.RLock()
	for k := range w.ledger {
		if _, live := w.entries[k]; initial && !live {
			lost = append(lost, k)
		}
	}
	for k, e := range w.entries {
		if e.epoch != w.epoch {
			vanished[k] = e
		}
	}
	w.mu.RUnlock()
	for _, k := range lost {
		w.emit(k, opkit.Deleted, *new(T), w.cfg.Priority)
	}
	ev := &w.list
	for _, k := range slices.SortedFunc(maps.Keys(vanished), compareKeys) {
		w.gone(k, vanished[k], *new(T))
		ev.Deleted++
	}
	w.tracked()
	w.pruneNamespaces()
	ev.Phase, ev.ResourceVersion = SyncFinished, rv
	w.log.Info("list done", "initial", ev.Initial, "reason", ev.Reason,
		"added", ev.Added, "modified", ev.Modified, "deleted", ev.Deleted,
		"unchanged", ev.Unchanged, "resourceVersion", ev.ResourceVersion)
	w.cfg.OnSync(*ev)
}

func compareKeys(a, b opkit.Key) int {
	return cmp.Or(strings.Compare(a.Namespace, b.Namespace), strings.Compare(a.Name, b.Name))
}

// observe records an object seen by a list or an Added/Modified watch event
// and emits the entry it calls for. list is the SyncEvent of the list in
// progress, whose counts it updates; nil for watch events.
func (w *Watcher[T]) observe(u *unstructured.Unstructured, list *SyncEvent) {
	key, e := w.readMeta(u)
	e.epoch = w.epoch
	old, known := w.get(key)
	ev := list
	if list == nil {
		ev = new(SyncEvent) // a watch event's counts go nowhere
	}
	typ, refresh := opkit.Modified, false
	switch {
	case known && old.uid != e.uid:
		// Recreated under the same name without the watch showing the
		// delete (a relist found the new object): the old one is gone.
		w.gone(key, old, *new(T))
		ev.Deleted++
		typ = opkit.Added
	case !known, ev.Initial:
		typ = opkit.Added
	case old.rv == e.rv:
		typ = 0 // unchanged (a relist, or a replayed event)
	case w.cfg.SkipStatusOnly && e.generation != 0 && e.generation == old.generation &&
		e.fingerprint == old.fingerprint && (old.ownMissing || !e.ownMissing):
		// A status-only change, or the operator's own finalizer added:
		// tracked, not emitted, but its state refreshes a due entry.
		typ, refresh = 0, true
	}
	w.store(key, e, old)
	if typ == 0 && !refresh {
		ev.Unchanged++
		return
	}
	obj, err := typed.FromUnstructured[T](u)
	if err != nil {
		w.cfg.Metrics.Error(ReasonDecode)
		w.log.Error("cannot decode object into the user's type; no entry emitted", "key", key.String(), "err", err)
		return
	}
	if refresh {
		// The newest state joins an entry for the key that is already
		// due (its reconcile then needs no read), without a hand-out or
		// a raised priority of its own; a delayed entry is left alone.
		w.cfg.Queue.Add(key, opkit.Cause[T]{Object: obj}, queue.AddOptions{Priority: math.MinInt32, MergeOnly: true})
		ev.Unchanged++
		return
	}
	rank := w.rank(u, obj)
	prio := w.cfg.Priority + max(rank-1, 0)
	if list != nil && rank == 0 {
		prio = *w.cfg.ListPriority
	}
	if at, ok := w.requested(u); ok {
		// A durable trigger, through the API server.
		c := opkit.Cause[T]{Object: obj, Sources: opkit.Sources(opkit.APIServer) | opkit.Sources(opkit.Operator),
			Reasons: opkit.ReasonsOf("requestedAt " + at), Added: typ == opkit.Added}
		out := w.cfg.Queue.Add(key, c, queue.AddOptions{Priority: max(prio, w.cfg.TriggerPriority)})
		w.cfg.Metrics.Event(typ, out)
	} else {
		w.emit(key, typ, obj, prio)
	}
	if typ == opkit.Added {
		ev.Added++
	} else {
		ev.Modified++
	}
}

// rank is Config.Rank of obj (u decoded), within [0, MaxRank].
func (w *Watcher[T]) rank(u *unstructured.Unstructured, obj T) int {
	if w.cfg.Rank != nil {
		return min(max(w.cfg.Rank(obj), 0), MaxRank)
	}
	return DefaultRank(u)
}

// requested returns the value of u's Config.RequestAnnotation when it
// asks for a reconcile: set, and not the status.lastHandledReconcileAt.
func (w *Watcher[T]) requested(u *unstructured.Unstructured) (string, bool) {
	if w.cfg.RequestAnnotation == "" {
		return "", false
	}
	at := u.GetAnnotations()[w.cfg.RequestAnnotation]
	handled, _, _ := unstructured.NestedString(u.Object, "status", "lastHandledReconcileAt")
	return at, at != "" && at != handled
}

// MaxRank bounds an object's rank (see Config.Rank).
const MaxRank = 8

// DefaultRank is the rank the Kubernetes convention gives the object u:
// the number of generations its status.observedGeneration lags behind
// metadata.generation (1 when it has none), at most MaxRank; 0 when it is
// up to date, and for resources that maintain no generation (it is 0), of
// which nothing can be told.
func DefaultRank(u *unstructured.Unstructured) int {
	gen := u.GetGeneration()
	observed, found, err := unstructured.NestedInt64(u.Object, "status", "observedGeneration")
	switch {
	case gen == 0:
		return 0
	case !found || err != nil:
		return 1
	}
	return int(min(max(gen-observed, 0), MaxRank))
}

// deleted handles a Deleted watch event.
func (w *Watcher[T]) deleted(u *unstructured.Unstructured) {
	key, e := w.readMeta(u)
	if old, ok := w.get(key); ok && old.uid != e.uid {
		// The object tracked under the name went without an event.
		w.gone(key, old, *new(T))
	}
	obj, err := typed.FromUnstructured[T](u)
	if err != nil {
		w.cfg.Metrics.Error(ReasonDecode)
		w.log.Error("cannot decode deleted object; recording a tombstone", "key", key.String(), "err", err)
	}
	w.gone(key, e, obj)
	w.tracked()
}

// emit adds key to the queue with a cause of source APIServer carrying obj
// (nil for a delete). A dropped add is counted and logged at debug level;
// tracking goes on regardless (see the package documentation).
func (w *Watcher[T]) emit(key opkit.Key, typ opkit.Type, obj T, prio int) {
	c := opkit.Cause[T]{Object: obj, Sources: opkit.Sources(opkit.APIServer), Added: typ == opkit.Added}
	out := w.cfg.Queue.Add(key, c, queue.AddOptions{Priority: prio})
	w.cfg.Metrics.Event(typ, out)
	if !out.Accepted() {
		w.log.Debug("queue did not accept the entry", "key", key.String(), "type", typ, "outcome", out)
	}
}
