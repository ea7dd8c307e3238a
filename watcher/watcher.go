package watcher

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"math/rand/v2"
	"reflect"
	"sync"
	"time"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/watch"
	"k8s.io/client-go/dynamic"

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
type Watcher[T opkit.Object] struct {
	cfg Config[T]
	log *slog.Logger
	res dynamic.ResourceInterface
	// name is the resource as logs and errors show it: "widgets.example.com/v1".
	name string

	mu      sync.Mutex // guards active, synced, lastErr
	active  bool // a Run is active
	synced  bool
	lastErr error

	// Owned by the goroutine running Run (see tracker).
	track *tracker[T]
}

// New validates cfg and returns a Watcher. It starts nothing.
func New[T opkit.Object](cfg Config[T]) (*Watcher[T], error) {
	cfg, err := cfg.withDefaults()
	if err != nil {
		return nil, err
	}
	gvr := cfg.Resource.GroupVersionResource
	name := gvr.GroupResource().String() + "/" + gvr.Version
	w := &Watcher[T]{name: name, cfg: cfg, track: newTracker[T](), log: cfg.Logger.With("resource", name, "namespace", cfg.Namespace)}
	w.res = cfg.Client.Resource(gvr)
	if cfg.Resource.Namespaced && cfg.Namespace != "" {
		w.res = cfg.Client.Resource(gvr).Namespace(cfg.Namespace)
	}
	return w, nil
}

func checkPointerToStruct[T any]() error {
	t := reflect.TypeFor[T]()
	if t.Kind() != reflect.Pointer || t.Elem().Kind() != reflect.Struct {
		return fmt.Errorf("type parameter %v is not a pointer to a struct", t)
	}
	return nil
}

// ResourceVersion returns the resourceVersion of the latest state of key
// the watcher has seen (from a list or a watch event, status-only changes
// included), and false if it tracks no such object. Any later state reaches
// the queue as a watch event. It is safe to call while Run runs: the
// controller uses it to decide whether an object read elsewhere is the
// latest the watch knows.
func (w *Watcher[T]) ResourceVersion(key opkit.Key) (string, bool) {
	e, ok := w.track.get(key)
	if !ok {
		return "", false
	}
	return e.rv, true
}

// Synced reports whether the current Run has finished its first list.
func (w *Watcher[T]) Synced() bool {
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.active && w.synced
}

// Check is a health check: nil while a Run is active, its first list is
// done and the latest list or watch call succeeded (a watch the server
// closed before it stayed open for [Backoff.Reset] counts as failed until
// the next one opens). Otherwise it says why:
// ErrNotRunning, ErrNotSynced and/or ErrDisconnected wrapping the API error
// (so errors.Is and apierrors.IsForbidden work on the result).
func (w *Watcher[T]) Check() error {
	w.mu.Lock()
	defer w.mu.Unlock()
	switch {
	case !w.active:
		return ErrNotRunning
	case w.lastErr == nil && !w.synced:
		return ErrNotSynced
	case w.lastErr == nil:
		return nil
	case !w.synced:
		return fmt.Errorf("%w, %w: %w", ErrNotSynced, ErrDisconnected, w.lastErr)
	}
	return fmt.Errorf("%w: %w", ErrDisconnected, w.lastErr)
}

func (w *Watcher[T]) setErr(err error) {
	w.mu.Lock()
	w.lastErr = err
	w.mu.Unlock()
}

func (w *Watcher[T]) setSynced() {
	w.mu.Lock()
	w.synced = true
	w.mu.Unlock()
}

// Run lists the resource, emits an entry per object, then watches and emits
// an entry per change, until ctx is cancelled. It returns nil after ctx is
// cancelled, once every watch it opened is closed and every goroutine it
// started has ended; it returns ErrAlreadyRunning if another Run is active.
// A Watcher may be Run again after Run returns: each Run starts with a full
// list (see the package documentation).
func (w *Watcher[T]) Run(ctx context.Context) error {
	w.mu.Lock()
	if w.active {
		w.mu.Unlock()
		return ErrAlreadyRunning
	}
	w.active, w.synced, w.lastErr = true, false, nil
	w.mu.Unlock()
	defer func() {
		w.mu.Lock()
		w.active, w.synced = false, false
		w.mu.Unlock()
	}()

	r := &run[T]{w: w}
	r.loop(ctx)
	return nil
}

// run is the state of one Run; it lives on Run's goroutine.
type run[T opkit.Object] struct {
	w        *Watcher[T]
	failures int  // consecutive failed calls, for backoff
	listed   bool // a list of this Run has completed: later ones are relists
}

// outcome is how a watch (or a list) ended.
type outcome struct {
	reason Reason
	err    error // the failure, for error reasons
}

func (r *run[T]) loop(ctx context.Context) {
	w := r.w
	var (
		rv         string
		needList   = true
		listReason = ReasonInitial
	)
	for ctx.Err() == nil {
		if needList {
			// The Run's first list is the initial one until a list has
			// completed: what follows is a relist.
			if r.listed && listReason == ReasonInitial {
				listReason = ReasonExpired
			}
			w.cfg.Metrics.Relist(listReason)
			newRV, ok, out := r.list(ctx, !r.listed, listReason)
			if !ok {
				if ctx.Err() != nil {
					return
				}
				if out.reason == ReasonExpired {
					// A continue token expired: list again from a fresh
					// snapshot, no wait.
					continue
				}
				if !r.wait(ctx, out) {
					return
				}
				continue
			}
			rv, needList = newRV, false
		}

		started := time.Now()
		wi, err := w.res.Watch(ctx, r.watchOptions(rv))
		if err != nil {
			if ctx.Err() != nil {
				return
			}
			out := r.failure("watch", err)
			if out.reason == ReasonExpired {
				needList, listReason = true, ReasonExpired
				continue
			}
			if !r.wait(ctx, out) {
				return
			}
			continue
		}
		w.setErr(nil)
		out := r.consume(ctx, wi, &rv)
		if ctx.Err() != nil {
			return
		}
		w.cfg.Metrics.WatchRestart(out.reason)
		short := r.afterWatch(started)
		switch out.reason {
		case ReasonExpired:
			w.log.Info("watch expired; relisting", "resourceVersion", rv)
			needList, listReason = true, ReasonExpired
		case ReasonIdle:
			w.log.Warn("watch idle; restarting", "idleTimeout", w.cfg.IdleTimeout, "resourceVersion", rv)
		case ReasonClosed:
			w.log.Debug("watch closed; resuming", "resourceVersion", rv)
			// A server that keeps closing watches at once is not hammered.
			if short {
				r.closedEarly(started)
				if !r.wait(ctx, out) {
					return
				}
			}
		default:
			// An error event; failure() counted it.
			if !r.wait(ctx, out) {
				return
			}
		}
	}
}

// afterWatch forgets past failures once a watch stayed open for Reset. It
// reports whether the watch was short-lived.
func (r *run[T]) afterWatch(started time.Time) (short bool) {
	if time.Since(started) >= r.w.cfg.Backoff.Reset {
		r.failures = 0
		return false
	}
	return true
}

// closedEarly records a watch the server closed before it stayed open for
// Backoff.Reset: a failure for the backoff, and for Check until the next
// watch opens, so that a watch that keeps closing at once (and may deliver
// nothing) does not look healthy.
func (r *run[T]) closedEarly(started time.Time) {
	r.failures++
	r.w.setErr(fmt.Errorf("watch %s: closed after %v", r.w.name, time.Since(started)))
}

func (r *run[T]) watchOptions(rv string) metav1.ListOptions {
	// Ask the server to end the watch after 5 to 10 minutes, so that
	// connections are rebalanced across API servers; the watch is then
	// resumed from rv without a relist.
	timeout := int64(300 + rand.IntN(300))
	return metav1.ListOptions{
		LabelSelector:       r.w.cfg.LabelSelector,
		FieldSelector:       r.w.cfg.FieldSelector,
		ResourceVersion:     rv,
		AllowWatchBookmarks: true,
		TimeoutSeconds:      &timeout,
	}
}

// failure classifies a failed call, records it and returns how to go on.
func (r *run[T]) failure(call string, err error) outcome {
	w := r.w
	reason := classify(err)
	if reason == ReasonExpired {
		w.cfg.Metrics.Error(reason)
		w.log.Info(call+" expired; relisting", "err", err)
		return outcome{reason: reason, err: err}
	}
	r.failures++
	wrapped := fmt.Errorf("%s %s: %w", call, w.name, err)
	w.setErr(wrapped)
	w.cfg.Metrics.Error(reason)
	switch reason {
	case ReasonForbidden:
		w.log.Error("permission denied: the identity needs list and watch on the resource; retrying slowly", "call", call, "err", err)
	case ReasonNotFound:
		w.log.Error("resource not found: is it installed (CRD) and served in this version? retrying slowly", "call", call, "err", err)
	default:
		w.log.Warn(call+" failed; backing off", "reason", reason, "failures", r.failures, "err", err)
	}
	return outcome{reason: reason, err: err}
}

func classify(err error) Reason {
	switch {
	case apierrors.IsResourceExpired(err), apierrors.IsGone(err):
		return ReasonExpired
	case apierrors.IsForbidden(err), apierrors.IsUnauthorized(err):
		return ReasonForbidden
	case apierrors.IsNotFound(err), apierrors.IsMethodNotSupported(err):
		return ReasonNotFound
	case apierrors.IsTooManyRequests(err):
		return ReasonThrottled
	}
	return ReasonError
}

// wait sleeps before the next attempt after a failure; false if ctx ended.
func (r *run[T]) wait(ctx context.Context, out outcome) bool {
	b := r.w.cfg.Backoff
	d := b.delay(r.failures)
	switch out.reason {
	case ReasonForbidden, ReasonNotFound:
		d = max(d, b.slow())
	case ReasonThrottled:
		if secs, ok := apierrors.SuggestsClientDelay(out.err); ok {
			d = max(d, time.Duration(secs)*time.Second)
		}
	}
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-ctx.Done():
		return false
	case <-t.C:
		return true
	}
}

// listing is the state of one (re)list in progress.
type listing struct {
	initial bool
	reason  Reason
	ev      SyncEvent
}

// finishList records the delete of every object the list did not see
// and reports the end of the list. A Run's first list also adds every key
// with unsettled deletes that it did not add itself: the queue of an
// earlier Run may have lost them (cleared at the end of a leader's term).
func (r *run[T]) finishList(l *listing, rv string) {
	w := r.w
	r.listed = true
	for _, v := range w.track.vanished() {
		w.gone(v.key, v.uid, v.rv, *new(T), *w.cfg.ListPriority)
		l.ev.Deleted++
	}
	if l.initial {
		for _, k := range w.track.ledgerKeys() {
			w.emit(k, opkit.Cause[T]{Sources: opkit.Sources(opkit.APIServer)}, opkit.Deleted, *w.cfg.ListPriority)
		}
	}
	w.cfg.Metrics.Tracked(w.track.count())
	w.track.pruneNamespaces()
	w.setErr(nil)
	w.setSynced()
	l.ev.Phase, l.ev.ResourceVersion = SyncFinished, rv
	w.log.Info("list done", "initial", l.initial, "reason", l.reason,
		"added", l.ev.Added, "modified", l.ev.Modified, "deleted", l.ev.Deleted,
		"unchanged", l.ev.Unchanged, "resourceVersion", rv)
	if f := w.cfg.OnSync; f != nil {
		f(l.ev)
	}
}

// list lists the resource page by page from one snapshot.
func (r *run[T]) list(ctx context.Context, initial bool, reason Reason) (string, bool, outcome) {
	w := r.w
	w.track.epoch++
	l := &listing{initial: initial, reason: reason, ev: SyncEvent{Initial: initial, Reason: reason}}
	if f := w.cfg.OnSync; f != nil {
		ev := l.ev
		ev.Phase = SyncStarted
		f(ev)
	}
	opts := metav1.ListOptions{
		LabelSelector: w.cfg.LabelSelector,
		FieldSelector: w.cfg.FieldSelector,
		Limit:         w.cfg.PageSize,
	}
	for {
		page, err := w.res.List(ctx, opts)
		if err != nil {
			if ctx.Err() != nil {
				return "", false, outcome{}
			}
			return "", false, r.failure("list", err)
		}
		for i := range page.Items {
			w.observe(&page.Items[i], l)
		}
		if page.GetContinue() == "" {
			rv := page.GetResourceVersion()
			r.finishList(l, rv)
			return rv, true, outcome{}
		}
		opts.Continue = page.GetContinue()
	}
}

// consume reads a watch until it ends, the idle timer fires or ctx is
// cancelled; it stops the watch before returning. rv advances with every
// event and bookmark.
func (r *run[T]) consume(ctx context.Context, wi watch.Interface, rv *string) outcome {
	w := r.w
	defer wi.Stop()
	idle := time.NewTimer(w.cfg.IdleTimeout)
	defer idle.Stop()
	for {
		select {
		case <-ctx.Done():
			return outcome{reason: ReasonClosed}
		case <-idle.C:
			return outcome{reason: ReasonIdle}
		case ev, ok := <-wi.ResultChan():
			if !ok {
				return outcome{reason: ReasonClosed}
			}
			idle.Reset(w.cfg.IdleTimeout)
			w.cfg.Metrics.Observed(time.Now())
			if ev.Type == watch.Error {
				err := apierrors.FromObject(ev.Object)
				if classify(err) == ReasonExpired {
					w.cfg.Metrics.Error(ReasonExpired)
					return outcome{reason: ReasonExpired, err: err}
				}
				return r.failure("watch", err)
			}
			u, isU := ev.Object.(*unstructured.Unstructured)
			if !isU {
				continue
			}
			switch ev.Type {
			case watch.Added, watch.Modified:
				w.observe(u, nil)
				w.cfg.Metrics.Tracked(w.track.count())
			case watch.Deleted:
				w.deleted(u)
			}
			*rv = u.GetResourceVersion()
		}
	}
}

// observe records an object seen by a list or an Added/Modified watch event
// and emits the entry it calls for. l is the list in progress, nil for
// watch events.
func (w *Watcher[T]) observe(u *unstructured.Unstructured, l *listing) {
	t := w.track
	m := readMeta(u, w.cfg.WatchLabels, w.cfg.WatchAnnotations)
	old, known := t.get(m.key)
	prio := w.cfg.Priority
	if l != nil {
		prio = *w.cfg.ListPriority
	}
	t.back(m.key, m.uid)
	var typ opkit.Type
	switch {
	case known && old.uid != m.uid:
		// Recreated under the same name without the watch showing the
		// delete (a relist found the new object): the old one is gone.
		w.gone(m.key, old.uid, old.rv, *new(T), prio)
		if l != nil {
			l.ev.Deleted++
		}
		typ = opkit.Added
	case !known, l != nil && l.initial:
		typ = opkit.Added
	case old.rv == m.rv:
		// Unchanged (a relist, or a replayed event).
	case w.cfg.SkipStatusOnly && m.generation != 0 && m.generation == old.generation && m.fingerprint == old.fingerprint:
		// Status-only change: track it, emit nothing.
	default:
		typ = opkit.Modified
	}
	t.store(m, l != nil, old, known)
	if typ == 0 {
		if l != nil {
			l.ev.Unchanged++
		}
		return
	}
	obj, err := typed.FromUnstructured[T](u)
	if err != nil {
		w.cfg.Metrics.Error(ReasonDecode)
		w.log.Error("cannot decode object into the user's type; no entry emitted", "key", m.key.String(), "err", err)
		return
	}
	w.emit(m.key, opkit.Cause[T]{Object: obj, Sources: opkit.Sources(opkit.APIServer), Added: typ == opkit.Added}, typ, prio)
	if l != nil {
		if typ == opkit.Added {
			l.ev.Added++
		} else {
			l.ev.Modified++
		}
	}
}

// deleted handles a Deleted watch event.
func (w *Watcher[T]) deleted(u *unstructured.Unstructured) {
	key := opkit.Key{Namespace: u.GetNamespace(), Name: u.GetName()}
	uid, rv := string(u.GetUID()), u.GetResourceVersion()
	if e, ok := w.track.get(key); ok && e.uid != uid {
		// The object tracked under the name went without an event.
		w.gone(key, e.uid, e.rv, *new(T), w.cfg.Priority)
	}
	obj, err := typed.FromUnstructured[T](u)
	if err != nil {
		w.cfg.Metrics.Error(ReasonDecode)
		w.log.Error("cannot decode deleted object; recording a tombstone", "key", key.String(), "err", err)
	}
	w.gone(key, uid, rv, obj, w.cfg.Priority)
	w.cfg.Metrics.Tracked(w.track.count())
}

// gone records the delete of the object key (uid, last resourceVersion
// rv) in the ledger, with its final state unless final is nil, and adds
// the key to the queue. The record is in place before the queue sees the
// key, so the worker that takes it finds the delete.
func (w *Watcher[T]) gone(key opkit.Key, uid, rv string, final T, prio int) {
	if d := w.track.gone(key, uid, rv, final, w.cfg.MaxFinalStates, w.cfg.MaxDeletesPerKey); d != nil {
		w.cfg.Metrics.Error(ReasonOverflow)
		w.log.Error("too many unsettled deletes of one name: the oldest is dropped and will not be reconciled",
			"key", key.String(), "uid", d.uid, "resourceVersion", d.rv, "maxDeletesPerKey", w.cfg.MaxDeletesPerKey)
	}
	w.emit(key, opkit.Cause[T]{Sources: opkit.Sources(opkit.APIServer)}, opkit.Deleted, prio)
}

// Deleted is one unsettled delete: an object the watch saw go (deleted,
// or out of the label selector), waiting for the controller to reconcile
// it and call [Watcher.Settle].
type Deleted[T opkit.Object] struct {
	// Object is the final state the watch delivered; for a tombstone it
	// carries only namespace, name, UID and the last resourceVersion seen,
	// and the resource's apiVersion and kind.
	Object T
	// FinalStateUnknown marks a tombstone: a relist found the object gone
	// (its final state was never seen), its final state could not be
	// decoded, or the ledger held Config.MaxFinalStates final states
	// already.
	FinalStateUnknown bool
}

// Deletes returns the unsettled deletes of key, oldest first (in the
// order the watch reported them, which is resourceVersion order). It is
// safe to call from any goroutine.
func (w *Watcher[T]) Deletes(key opkit.Key) []Deleted[T] {
	rs := w.track.records(key)
	if len(rs) == 0 {
		return nil
	}
	out := make([]Deleted[T], len(rs))
	for i, r := range rs {
		if isNil(r.final) {
			out[i] = Deleted[T]{Object: w.tombstone(key, types.UID(r.uid), r.rv), FinalStateUnknown: true}
		} else {
			out[i] = Deleted[T]{Object: r.final}
		}
	}
	return out
}

// Settle reports that the delete of the object key with uid, whose last
// resourceVersion was rv, has been dealt with (reconciled, or given up
// on): the ledger forgets it. Until then every Run's first list adds key
// to the queue again, so a delete lost with a queue (cleared at the end
// of a leader's term) or an interrupted reconcile is delivered again.
// Settle of a delete the ledger does not hold does nothing. It is safe to
// call from any goroutine, while Run runs or not.
func (w *Watcher[T]) Settle(key opkit.Key, uid types.UID, rv string) {
	w.track.settle(key, string(uid), rv)
}

// tombstone returns the object of a delete whose final state is unknown:
// namespace, name, UID, the last resourceVersion seen, and the resource's
// apiVersion and kind.
func (w *Watcher[T]) tombstone(key opkit.Key, uid types.UID, rv string) T {
	obj := typed.Tombstone[T](key, uid, rv)
	obj.GetObjectKind().SetGroupVersionKind(w.cfg.Resource.GroupVersionKind())
	return obj
}

// emit adds key to the queue with c. A dropped add is counted and logged
// at debug level; tracking goes on regardless (see the package
// documentation).
func (w *Watcher[T]) emit(key opkit.Key, c opkit.Cause[T], typ opkit.Type, prio int) queue.Outcome {
	out := w.cfg.Queue.Add(key, c, queue.AddOptions{Priority: prio})
	w.cfg.Metrics.Event(typ, out)
	if !out.Accepted() {
		w.log.Debug("queue did not accept the entry", "key", key.String(), "type", typ, "outcome", out)
	}
	return out
}
