package watcher

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"maps"
	"math"
	"math/rand/v2"
	"slices"
	"strings"
	"sync"
	"time"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	utilnet "k8s.io/apimachinery/pkg/util/net"
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
	failures   int               // consecutive failed calls, for the backoff
	refusals   int               // consecutive 401/403 answers among them
	epoch      uint32            // number of the latest (re)list
	namespaces map[string]string // interned namespaces, shared by the keys (see intern)
	nsKept     int               // namespaces in use at the last prune

	// mu guards the fields below. Only Run's goroutine adds and changes
	// them, except Settle, which removes deletes from the ledger; the
	// controller's workers read them from other goroutines.
	mu     sync.RWMutex
	active bool // a Run is active
	synced bool // the Run's first list is done
	// firstList is closed when the current Run's first list is done; a
	// new one is made when a Run ends, for the next Run (WaitSynced).
	firstList chan struct{}
	lastErr   error // the latest list or watch call's failure, nil once one succeeds
	entries   map[opkit.Key]entry
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
		firstList:  make(chan struct{}),
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

// WaitSynced blocks until the current Run, or the next one when none is
// active, has finished its first list (every object it found is in the
// queue), or until ctx ends (then it returns ctx's error). A controller's
// workers wait for it, so that a term hands out what needs work first
// rather than whatever the list delivered first.
func (w *Watcher[T]) WaitSynced(ctx context.Context) error {
	w.mu.RLock()
	first := w.firstList
	w.mu.RUnlock()
	select {
	case <-first:
		return nil
	case <-ctx.Done():
		return ctx.Err()
	}
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
		w.active, w.synced, w.firstList = false, false, make(chan struct{})
		w.mu.Unlock()
	}()

	// List, then watch from the list's resourceVersion. A 410 Gone (from
	// the list's continue token or the watch's resourceVersion) relists at
	// once; other failures wait for the backoff before the call is retried.
	w.failures, w.refusals = 0, 0
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
		if delay, expired := w.failure(call, err); expired {
			relist = true
		} else {
			sleep(ctx, delay)
		}
	}
	return nil
}

// failure logs and counts a failed call, and returns how long to wait
// before the next one, or expired for a 410 Gone, which only calls for a
// relist. Anything else is a failure for the backoff and for Check.
func (w *Watcher[T]) failure(call string, err error) (delay time.Duration, expired bool) {
	reason := classify(err)
	w.cfg.Metrics.Error(reason)
	if reason == ReasonExpired {
		w.log.Info(call+" expired; relisting", "err", err)
		return 0, true
	}
	w.failures++
	if reason == ReasonForbidden {
		w.refusals++
	} else {
		w.refusals = 0
	}
	w.setErr(fmt.Errorf("%s %s: %w", call, w.name, err))
	delay = w.delay(reason, err)
	switch {
	case reason == ReasonForbidden && w.refusals <= queue.TransientRefusals:
		w.log.Warn(call+" refused; retrying, as a just-started API server refuses until its authorizer has synced",
			"refusals", w.refusals, "after", delay, "err", err)
	case reason == ReasonForbidden:
		w.log.Error("permission denied: the identity needs list and watch on the resource; retrying slowly", "call", call, "after", delay, "err", err)
	case reason == ReasonNotFound:
		w.log.Error("resource not found: is it installed (CRD) and served in this version? retrying slowly", "call", call, "after", delay, "err", err)
	default:
		w.log.Warn(call+" failed; backing off", "reason", reason, "failures", w.failures, "after", delay, "err", err)
	}
	return delay, false
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
	case utilnet.IsConnectionRefused(err), utilnet.IsConnectionReset(err), utilnet.IsProbableEOF(err):
		return ReasonUnreachable
	}
	return ReasonError
}

// delay is the wait before the next call after a failure of reason (err
// its error, nil for a watch closed early): see [Backoff].
func (w *Watcher[T]) delay(reason Reason, err error) time.Duration {
	b := w.cfg.Backoff
	d := queue.Backoff{Base: b.Base, Cap: b.Cap, Jitter: 0.5}.Delay(max(w.failures, 1))
	slow := queue.Backoff{Base: b.Slow, Cap: b.Slow, Jitter: 0.5}.Delay(1)
	switch reason {
	case ReasonUnreachable:
		d = min(d, b.Unreachable)
	case ReasonForbidden:
		if w.refusals > queue.TransientRefusals {
			d = max(d, slow)
		}
	case ReasonNotFound:
		d = max(d, slow)
	case ReasonThrottled:
		if secs, ok := apierrors.SuggestsClientDelay(err); ok {
			d = max(d, time.Duration(secs)*time.Second)
		}
	}
	return d
}

// sleep waits for d or until ctx ends.
func sleep(ctx context.Context, d time.Duration) {
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
		w.emit(k, opkit.Deleted, *new(T), w.cfg.Priority)
	}
	for _, k := range slices.SortedFunc(maps.Keys(vanished), compareKeys) {
		w.gone(k, vanished[k], *new(T))
		ev.Deleted++
	}
	w.tracked()
	w.pruneNamespaces()
	w.mu.Lock()
	if !w.synced {
		close(w.firstList)
	}
	w.synced, w.lastErr = true, nil
	w.mu.Unlock()
	w.failures, w.refusals = 0, 0
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
	end, delivered, err := w.consume(ctx, wi, rv)
	wi.Stop()
	if ctx.Err() != nil {
		return nil
	}
	w.cfg.Metrics.WatchRestart(end)
	open := time.Since(started)
	if delivered || open >= w.cfg.Backoff.Reset {
		w.failures, w.refusals = 0, 0 // the watch worked
	}
	switch {
	case err != nil:
		return err
	case end == ReasonIdle:
		w.log.Warn("watch idle; restarting", "idleTimeout", w.cfg.IdleTimeout, "resourceVersion", *rv)
	case delivered || open >= w.cfg.Backoff.Reset:
		w.log.Debug("watch closed; resuming", "resourceVersion", *rv)
	default:
		// Closed before it delivered anything or stayed open for
		// Backoff.Reset: a server that keeps closing watches at once is
		// not hammered.
		w.failures++
		delay := w.delay(ReasonClosed, nil)
		w.log.Debug("watch closed early; resuming after a backoff", "open", open, "after", delay, "resourceVersion", *rv)
		w.setErr(fmt.Errorf("watch %s: closed after %v", w.name, open))
		sleep(ctx, delay)
	}
	return nil
}

// consume reads a watch until it ends (ReasonClosed), the idle timer fires
// (ReasonIdle), ctx is cancelled, or an error event arrives (its reason and
// error). *rv advances with every event and bookmark; delivered reports
// whether there was one.
func (w *Watcher[T]) consume(ctx context.Context, wi watch.Interface, rv *string) (end Reason, delivered bool, err error) {
	idle := time.NewTimer(w.cfg.IdleTimeout)
	defer idle.Stop()
	for {
		select {
		case <-ctx.Done():
			return ReasonClosed, delivered, nil
		case <-idle.C:
			return ReasonIdle, delivered, nil
		case ev, ok := <-wi.ResultChan():
			if !ok {
				return ReasonClosed, delivered, nil
			}
			idle.Reset(w.cfg.IdleTimeout)
			w.cfg.Metrics.Observed(time.Now())
			if ev.Type == watch.Error {
				err := apierrors.FromObject(ev.Object)
				return classify(err), delivered, err
			}
			delivered = true
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
		// tracked, not emitted, but its state refreshes a waiting entry.
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
		// The newest state joins an entry waiting for the key (its
		// reconcile then needs no read), without a hand-out or a raised
		// priority of its own.
		w.cfg.Queue.Add(key, opkit.Cause[T]{Object: obj}, queue.AddOptions{Priority: math.MinInt32, MergeOnly: true})
		ev.Unchanged++
		return
	}
	rank := w.rank(u, obj)
	prio := w.cfg.Priority + max(rank-1, 0)
	if list != nil && rank == 0 {
		prio = *w.cfg.ListPriority
	}
	w.emit(key, typ, obj, prio)
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
