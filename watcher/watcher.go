package watcher

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"maps"
	"math/rand/v2"
	"slices"
	"strings"
	"sync"
	"time"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
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
//
// What it tracks (the live objects and the ledger of unsettled deletes)
// survives across Runs, so that a new Run can detect objects deleted
// while no Run was active, and deliver the deletes a previous Run's queue
// lost.
type Watcher[T opkit.Object] struct {
	cfg  Config[T]
	log  *slog.Logger
	res  dynamic.ResourceInterface
	name string // the resource as logs and errors show it: "widgets.example.com/v1"

	// Owned by Run's goroutine.
	failures   int               // consecutive failed calls, for the backoff; reset by Run
	epoch      uint32            // number of the latest (re)list
	namespaces map[string]string // interned namespaces, shared by the keys (see intern)
	nsKept     int               // namespaces in use at the last prune

	// mu guards the fields below. Only Run's goroutine adds and changes
	// them, except Settle, which removes deletes from the ledger; the
	// controller's workers read them from other goroutines.
	mu      sync.RWMutex
	active  bool  // a Run is active
	synced  bool  // the Run's first list is done
	lastErr error // the latest list or watch call's failure, nil once one succeeds
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
	gvr := cfg.Resource.GroupVersionResource
	w := &Watcher[T]{
		cfg:        cfg,
		res:        cfg.Client.Resource(gvr),
		name:       gvr.GroupResource().String() + "/" + gvr.Version,
		namespaces: make(map[string]string),
		entries:    make(map[opkit.Key]entry),
		ledger:     make(map[opkit.Key][]record[T]),
	}
	if cfg.Namespace != "" {
		w.res = cfg.Client.Resource(gvr).Namespace(cfg.Namespace)
	}
	w.log = cfg.Logger.With("resource", w.name, "namespace", cfg.Namespace)
	return w, nil
}

// Synced reports whether the current Run has finished its first list.
func (w *Watcher[T]) Synced() bool {
	w.mu.RLock()
	defer w.mu.RUnlock()
	return w.active && w.synced
}

// Check is a health check: nil while a Run is active, its first list is
// done and the latest list or watch call succeeded (a watch the server
// closed before it stayed open for [Backoff.Reset] counts as failed until
// the next one opens). Otherwise it says why:
// ErrNotRunning, ErrNotSynced and/or ErrDisconnected wrapping the API error
// (so errors.Is and apierrors.IsForbidden work on the result).
func (w *Watcher[T]) Check() error {
	w.mu.RLock()
	defer w.mu.RUnlock()
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

	// List, then watch from the list's resourceVersion. A 410 Gone (from
	// the list's continue token or the watch's resourceVersion) relists at
	// once; other failures wait for the backoff before the call is retried.
	w.failures = 0
	var rv string
	relist := true
	for ctx.Err() == nil {
		var err error
		call := "list"
		if relist {
			rv, err = w.list(ctx)
			relist = err != nil
		} else {
			call = "watch"
			err = w.watch(ctx, &rv)
		}
		if err == nil || ctx.Err() != nil {
			continue
		}
		if w.failure(call, err) == ReasonExpired {
			relist = true
		} else {
			w.wait(ctx, err)
		}
	}
	return nil
}

// failure logs and counts a failed call and returns its reason. Apart from
// a 410 Gone, which only calls for a relist, it is a failure for the
// backoff and for Check.
func (w *Watcher[T]) failure(call string, err error) Reason {
	reason := classify(err)
	w.cfg.Metrics.Error(reason)
	if reason == ReasonExpired {
		w.log.Info(call+" expired; relisting", "err", err)
		return reason
	}
	w.failures++
	w.setErr(fmt.Errorf("%s %s: %w", call, w.name, err))
	switch reason {
	case ReasonForbidden:
		w.log.Error("permission denied: the identity needs list and watch on the resource; retrying slowly", "call", call, "err", err)
	case ReasonNotFound:
		w.log.Error("resource not found: is it installed (CRD) and served in this version? retrying slowly", "call", call, "err", err)
	default:
		w.log.Warn(call+" failed; backing off", "reason", reason, "failures", w.failures, "err", err)
	}
	return reason
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

// wait sleeps before the next attempt after a failure (err, nil for a
// watch closed early), or until ctx is cancelled: see [Backoff].
func (w *Watcher[T]) wait(ctx context.Context, err error) {
	b := w.cfg.Backoff
	d := queue.Backoff{Base: b.Base, Cap: b.Cap, Jitter: 0.5}.Delay(max(w.failures, 1))
	switch classify(err) {
	case ReasonForbidden, ReasonNotFound:
		d = max(d, queue.Backoff{Base: b.Slow, Cap: b.Slow, Jitter: 0.5}.Delay(1))
	case ReasonThrottled:
		if secs, ok := apierrors.SuggestsClientDelay(err); ok {
			d = max(d, time.Duration(secs)*time.Second)
		}
	}
	select {
	case <-ctx.Done():
	case <-time.After(d):
	}
}

// list lists the resource page by page from one snapshot and records what
// it finds, and returns the resourceVersion to watch from. A Run's first
// list adds every object as Added; later ones (relists) only what changed.
func (w *Watcher[T]) list(ctx context.Context) (string, error) {
	ev := SyncEvent{Phase: SyncStarted, Initial: !w.Synced(), Reason: ReasonExpired}
	if ev.Initial {
		ev.Reason = ReasonInitial
	}
	w.cfg.Metrics.Relist(ev.Reason)
	w.cfg.OnSync(ev)
	w.epoch++
	opts := metav1.ListOptions{LabelSelector: w.cfg.LabelSelector, FieldSelector: w.cfg.FieldSelector, Limit: w.cfg.PageSize}
	for {
		page, err := w.res.List(ctx, opts)
		if err != nil {
			return "", err
		}
		for i := range page.Items {
			w.observe(&page.Items[i], &ev)
		}
		if opts.Continue = page.GetContinue(); opts.Continue == "" {
			ev.ResourceVersion = page.GetResourceVersion()
			break
		}
	}

	// What the objects listed do not tell: keys with unsettled deletes and
	// no live object, whose adds the queue of an earlier Run may have lost
	// (it is cleared at the end of a leader's term), added again by a Run's
	// first list; and the live objects the list did not see: gone since.
	var lost []opkit.Key
	vanished := make(map[opkit.Key]entry)
	w.mu.RLock()
	for k := range w.ledger {
		if _, live := w.entries[k]; ev.Initial && !live {
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
		w.emit(k, opkit.Deleted, *new(T), *w.cfg.ListPriority)
	}
	for _, k := range slices.SortedFunc(maps.Keys(vanished), compareKeys) {
		w.gone(k, vanished[k], *new(T), *w.cfg.ListPriority)
		ev.Deleted++
	}
	w.tracked()
	w.pruneNamespaces()
	w.mu.Lock()
	w.synced, w.lastErr = true, nil
	w.mu.Unlock()
	ev.Phase = SyncFinished
	w.log.Info("list done", "initial", ev.Initial, "reason", ev.Reason,
		"added", ev.Added, "modified", ev.Modified, "deleted", ev.Deleted,
		"unchanged", ev.Unchanged, "resourceVersion", ev.ResourceVersion)
	w.cfg.OnSync(ev)
	return ev.ResourceVersion, nil
}

func compareKeys(a, b opkit.Key) int {
	return cmp.Or(strings.Compare(a.Namespace, b.Namespace), strings.Compare(a.Name, b.Name))
}

// watch watches from *rv, advancing it with every event and bookmark, until
// the watch ends, stays idle for IdleTimeout or ctx is cancelled. It
// returns the error that ended it, if any. A watch the server closed
// before it stayed open for Backoff.Reset is a failure: it is reported by
// Check and waited for, so that a server that keeps closing watches at
// once is not hammered.
func (w *Watcher[T]) watch(ctx context.Context, rv *string) error {
	// Ask the server to end the watch after 5 to 10 minutes, so that
	// connections are rebalanced across API servers; the watch is then
	// resumed from rv without a relist.
	timeout := int64(300 + rand.IntN(300))
	started := time.Now()
	wi, err := w.res.Watch(ctx, metav1.ListOptions{
		LabelSelector:       w.cfg.LabelSelector,
		FieldSelector:       w.cfg.FieldSelector,
		ResourceVersion:     *rv,
		AllowWatchBookmarks: true,
		TimeoutSeconds:      &timeout,
	})
	if err != nil {
		return err
	}
	w.setErr(nil)
	end, err := w.consume(ctx, wi, rv)
	wi.Stop()
	if ctx.Err() != nil {
		return nil
	}
	w.cfg.Metrics.WatchRestart(end)
	open := time.Since(started)
	if open >= w.cfg.Backoff.Reset {
		w.failures = 0
	}
	switch {
	case err != nil:
		return err
	case end == ReasonIdle:
		w.log.Warn("watch idle; restarting", "idleTimeout", w.cfg.IdleTimeout, "resourceVersion", *rv)
	case open >= w.cfg.Backoff.Reset:
		w.log.Debug("watch closed; resuming", "resourceVersion", *rv)
	default:
		w.log.Debug("watch closed early; resuming after a backoff", "open", open, "resourceVersion", *rv)
		w.failures++
		w.setErr(fmt.Errorf("watch %s: closed after %v", w.name, open))
		w.wait(ctx, nil)
	}
	return nil
}

// consume reads a watch until it ends (ReasonClosed), the idle timer fires
// (ReasonIdle), ctx is cancelled, or an error event arrives (its reason and
// error). *rv advances with every event and bookmark.
func (w *Watcher[T]) consume(ctx context.Context, wi watch.Interface, rv *string) (Reason, error) {
	idle := time.NewTimer(w.cfg.IdleTimeout)
	defer idle.Stop()
	for {
		select {
		case <-ctx.Done():
			return ReasonClosed, nil
		case <-idle.C:
			return ReasonIdle, nil
		case ev, ok := <-wi.ResultChan():
			if !ok {
				return ReasonClosed, nil
			}
			idle.Reset(w.cfg.IdleTimeout)
			w.cfg.Metrics.Observed(time.Now())
			if ev.Type == watch.Error {
				err := apierrors.FromObject(ev.Object)
				return classify(err), err
			}
			u, ok := ev.Object.(*unstructured.Unstructured)
			if !ok {
				continue
			}
			switch ev.Type {
			case watch.Added, watch.Modified:
				w.observe(u, nil)
				w.tracked()
			case watch.Deleted:
				w.deleted(u)
			}
			*rv = u.GetResourceVersion()
		}
	}
}

// observe records an object seen by a list or an Added/Modified watch event
// and emits the entry it calls for. list is the SyncEvent of the list in
// progress, whose counts it updates; nil for watch events.
func (w *Watcher[T]) observe(u *unstructured.Unstructured, list *SyncEvent) {
	key, e := w.readMeta(u)
	e.epoch = w.epoch
	old, known := w.get(key)
	prio, ev := w.cfg.Priority, list
	if list != nil {
		prio = *w.cfg.ListPriority
	} else {
		ev = new(SyncEvent) // a watch event's counts go nowhere
	}
	typ := opkit.Modified
	switch {
	case known && old.uid != e.uid:
		// Recreated under the same name without the watch showing the
		// delete (a relist found the new object): the old one is gone.
		w.gone(key, old, *new(T), prio)
		ev.Deleted++
		typ = opkit.Added
	case !known, ev.Initial:
		typ = opkit.Added
	case old.rv == e.rv:
		typ = 0 // unchanged (a relist, or a replayed event)
	case w.cfg.SkipStatusOnly && e.generation != 0 && e.generation == old.generation && e.fingerprint == old.fingerprint:
		typ = 0 // a status-only change: tracked, not emitted
	}
	w.store(key, e, old)
	if typ == 0 {
		ev.Unchanged++
		return
	}
	obj, err := typed.FromUnstructured[T](u)
	if err != nil {
		w.cfg.Metrics.Error(ReasonDecode)
		w.log.Error("cannot decode object into the user's type; no entry emitted", "key", key.String(), "err", err)
		return
	}
	w.emit(key, typ, obj, prio)
	if typ == opkit.Added {
		ev.Added++
	} else {
		ev.Modified++
	}
}

// deleted handles a Deleted watch event.
func (w *Watcher[T]) deleted(u *unstructured.Unstructured) {
	key, e := w.readMeta(u)
	if old, ok := w.get(key); ok && old.uid != e.uid {
		// The object tracked under the name went without an event.
		w.gone(key, old, *new(T), w.cfg.Priority)
	}
	obj, err := typed.FromUnstructured[T](u)
	if err != nil {
		w.cfg.Metrics.Error(ReasonDecode)
		w.log.Error("cannot decode deleted object; recording a tombstone", "key", key.String(), "err", err)
	}
	w.gone(key, e, obj, w.cfg.Priority)
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
