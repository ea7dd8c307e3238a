package watcher

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"math/rand/v2"
	"reflect"
	"sync"
	"sync/atomic"
	"time"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/watch"
	"k8s.io/client-go/dynamic"
	"k8s.io/client-go/util/watchlist"

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
	s   settings
	log *slog.Logger
	res dynamic.ResourceInterface
	// name is the resource as logs and errors show it: "widgets.example.com/v1".
	name string

	running atomic.Bool

	mu      sync.Mutex // guards active, synced, lastErr
	active  bool
	synced  bool
	lastErr error

	// Owned by the goroutine running Run (see tracker).
	track *tracker[T]
}

// New validates cfg and returns a Watcher. It starts nothing.
func New[T opkit.Object](cfg Config[T]) (*Watcher[T], error) {
	s, err := cfg.validate()
	if err != nil {
		return nil, err
	}
	gvr := cfg.Resource.GroupVersionResource
	name := gvr.Resource
	if gvr.Group != "" {
		name += "." + gvr.Group
	}
	name += "/" + gvr.Version
	w := &Watcher[T]{
		name:  name,
		cfg:   cfg,
		s:     s,
		track: newTracker[T](),
		log: s.logger.With("resource", name,
			"namespace", cfg.Namespace),
	}
	r := cfg.Client.Resource(cfg.Resource.GroupVersionResource)
	if cfg.Resource.Namespaced && cfg.Namespace != "" {
		w.res = r.Namespace(cfg.Namespace)
	} else {
		w.res = r
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
	case !w.synced && w.lastErr == nil:
		return ErrNotSynced
	case w.lastErr != nil:
		return &healthError{synced: w.synced, cause: w.lastErr}
	}
	return nil
}

// healthError is Check's answer while the latest call failed: it is
// ErrDisconnected (and ErrNotSynced before the first list) and unwraps to
// the call's error.
type healthError struct {
	synced bool
	cause  error
}

func (e *healthError) Error() string {
	if e.synced {
		return "watcher: not connected: " + e.cause.Error()
	}
	return "watcher: not synced, not connected: " + e.cause.Error()
}

func (e *healthError) Is(target error) bool {
	return target == ErrDisconnected || (!e.synced && target == ErrNotSynced)
}

func (e *healthError) Unwrap() error { return e.cause }

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
	if !w.running.CompareAndSwap(false, true) {
		return ErrAlreadyRunning
	}
	defer w.running.Store(false)
	w.mu.Lock()
	w.active, w.synced, w.lastErr = true, false, nil
	w.mu.Unlock()
	defer func() {
		w.mu.Lock()
		w.active, w.synced = false, false
		w.mu.Unlock()
	}()

	r := &run[T]{
		w:         w,
		watchList: w.cfg.WatchList == WatchListAuto && !watchlist.DoesClientNotSupportWatchListSemantics(w.cfg.Client),
	}
	r.loop(ctx)
	return nil
}

// run is the state of one Run; it lives on Run's goroutine.
type run[T opkit.Object] struct {
	w         *Watcher[T]
	watchList bool // try WatchList for the next (re)list
	failures  int  // consecutive failed calls, for backoff
	listed    bool // a list of this Run has completed (finishList): later ones are relists
	// unfinished counts the WatchList streams in a row that ended before
	// their end marker; at maxUnfinished the Run lists by pages instead.
	unfinished int
}

// maxUnfinished is how many WatchList streams in a row may end before
// their end marker (closed, expired or failed, for whatever reason: a
// proxy that cuts long streams, a server that cannot finish them) before
// the Run gives up on WatchList and lists by pages, as it does at once when
// the server refuses WatchList.
const maxUnfinished = 3

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
			// completed, also one that completed inside a WatchList stream
			// that expired afterwards: what follows is a relist.
			initial := !r.listed
			if !initial && listReason == ReasonInitial {
				listReason = ReasonExpired
			}
			w.s.metrics.Relist(listReason)
			var (
				newRV string
				out   outcome
				ok    bool
			)
			if r.watchList {
				newRV, ok, out = r.streamList(ctx, initial, listReason)
			} else {
				newRV, ok, out = r.pagedList(ctx, initial, listReason)
			}
			if !ok {
				if ctx.Err() != nil {
					return
				}
				if out.reason == ReasonExpired {
					// A continue token or the stream's snapshot expired:
					// list again from a fresh snapshot, no wait.
					continue
				}
				if !r.wait(ctx, out) {
					return
				}
				continue
			}
			rv, needList = newRV, false
			if r.watchList {
				// The stream continued as a watch after its end bookmark and
				// has ended since; resume from where it stopped.
				continue
			}
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
		out := r.consume(ctx, wi, &rv, nil)
		if ctx.Err() != nil {
			return
		}
		w.s.metrics.WatchRestart(out.reason)
		short := r.afterWatch(started)
		switch out.reason {
		case ReasonExpired:
			w.log.Info("watch expired; relisting", "resourceVersion", rv)
			needList, listReason = true, ReasonExpired
		case ReasonIdle:
			w.log.Warn("watch idle; restarting", "idleTimeout", w.s.idle, "resourceVersion", rv)
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
	if time.Since(started) >= r.w.s.backoff.Reset {
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
		w.s.metrics.Error(reason)
		w.log.Info(call+" expired; relisting", "err", err)
		return outcome{reason: reason, err: err}
	}
	r.failures++
	wrapped := fmt.Errorf("%s %s: %w", call, w.name, err)
	w.setErr(wrapped)
	w.s.metrics.Error(reason)
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
	b := r.w.s.backoff
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
	stream  bool
	ev      SyncEvent
}

func (r *run[T]) beginList(initial bool, reason Reason, stream bool) *listing {
	t := r.w.track
	t.epoch++
	l := &listing{initial: initial, reason: reason, stream: stream}
	l.ev = SyncEvent{Initial: initial, Reason: reason, Streaming: stream}
	if f := r.w.cfg.OnSync; f != nil {
		ev := l.ev
		ev.Phase = SyncStarted
		f(ev)
	}
	return l
}

// finishList records the delete of every object the list did not see
// and reports the end of the list. A Run's first list also adds every key
// with unsettled deletes that it did not add itself: the queue of an
// earlier Run may have lost them (cleared at the end of a leader's term).
func (r *run[T]) finishList(l *listing, rv string) {
	w := r.w
	r.listed = true
	for _, v := range w.track.vanished() {
		w.gone(v.key, v.uid, v.rv, *new(T), w.s.listPriority)
		l.ev.Deleted++
	}
	if l.initial {
		for _, k := range w.track.ledgerKeys() {
			w.emit(k, opkit.Cause[T]{Sources: opkit.Sources(opkit.APIServer)}, opkit.Deleted, w.s.listPriority)
		}
	}
	w.s.metrics.Tracked(w.track.count())
	w.track.pruneNamespaces()
	w.setErr(nil)
	w.setSynced()
	l.ev.Phase, l.ev.ResourceVersion = SyncFinished, rv
	w.log.Info("list done", "initial", l.initial, "reason", l.reason, "streaming", l.stream,
		"added", l.ev.Added, "modified", l.ev.Modified, "deleted", l.ev.Deleted,
		"unchanged", l.ev.Unchanged, "resourceVersion", rv)
	if f := w.cfg.OnSync; f != nil {
		f(l.ev)
	}
}

// pagedList lists the resource page by page from one snapshot.
func (r *run[T]) pagedList(ctx context.Context, initial bool, reason Reason) (string, bool, outcome) {
	w := r.w
	l := r.beginList(initial, reason, false)
	opts := metav1.ListOptions{
		LabelSelector: w.cfg.LabelSelector,
		FieldSelector: w.cfg.FieldSelector,
		Limit:         w.s.pageSize,
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

// streamList runs a WatchList: the initial objects arrive as Added events,
// a bookmark marks their end, and the stream then goes on as an ordinary
// watch, which streamList consumes until it ends. ok reports whether the
// initial phase completed; rv is where to resume.
func (r *run[T]) streamList(ctx context.Context, initial bool, reason Reason) (rv string, ok bool, out outcome) {
	w := r.w
	send := true
	opts := r.watchOptions("")
	// The server must not end the stream before its initial phase's own
	// deadline (IdleTimeout, see consume): a stream it ends first is
	// retried as a WatchList, so with an IdleTimeout above the watch
	// timeout a server that never sends the end marker would be streamed
	// from again and again, never falling back.
	if least := int64((w.s.idle + time.Minute) / time.Second); *opts.TimeoutSeconds < least {
		opts.TimeoutSeconds = &least
	}
	opts.SendInitialEvents = &send
	opts.ResourceVersionMatch = metav1.ResourceVersionMatchNotOlderThan
	started := time.Now()
	wi, err := w.res.Watch(ctx, opts)
	if err != nil {
		if ctx.Err() != nil {
			return "", false, outcome{}
		}
		if refusesWatchList(err) {
			w.log.Info("server refused WatchList; using paginated lists", "err", err)
			r.watchList = false
			return r.pagedList(ctx, initial, reason)
		}
		return "", false, r.failure("list (WatchList)", err)
	}
	w.setErr(nil)
	l := r.beginList(initial, reason, true)
	out = r.consume(ctx, wi, &rv, l)
	if ctx.Err() != nil {
		return "", false, outcome{}
	}
	if l.ev.Phase != SyncFinished {
		// The stream ended before the end bookmark.
		if out.reason == ReasonIdle {
			w.log.Warn("WatchList did not finish its initial events; using paginated lists", "idleTimeout", w.s.idle)
			r.watchList = false
			return "", false, outcome{reason: ReasonExpired} // relist at once
		}
		if out.err != nil && refusesWatchList(out.err) {
			w.log.Info("server refused WatchList; using paginated lists", "err", out.err)
			r.watchList = false
			return "", false, outcome{reason: ReasonExpired}
		}
		r.unfinished++
		if r.unfinished >= maxUnfinished {
			w.log.Warn("WatchList streams keep ending before their initial events; using paginated lists", "streams", r.unfinished)
			r.watchList = false
		}
		if out.reason == ReasonClosed || out.reason == ReasonExpired {
			r.failures++
			w.setErr(fmt.Errorf("list (WatchList) %s: the stream ended before its initial events did", w.name))
			return "", false, outcome{reason: ReasonError}
		}
		return "", false, out
	}
	r.unfinished = 0
	// Synced; the stream then ran as a plain watch and has ended.
	w.s.metrics.WatchRestart(out.reason)
	short := r.afterWatch(started)
	switch out.reason {
	case ReasonExpired:
		w.log.Info("watch expired; relisting", "resourceVersion", rv)
		return "", false, outcome{reason: ReasonExpired}
	case ReasonIdle:
		w.log.Warn("watch idle; restarting", "idleTimeout", w.s.idle, "resourceVersion", rv)
	case ReasonClosed:
		if short {
			r.closedEarly(started)
			r.wait(ctx, out)
		}
	default:
		r.wait(ctx, out)
	}
	return rv, true, outcome{}
}

// refusesWatchList reports whether err means the server does not serve
// WatchList requests (as opposed to a transient failure).
func refusesWatchList(err error) bool {
	return apierrors.IsBadRequest(err) || apierrors.IsInvalid(err) ||
		apierrors.IsMethodNotSupported(err) || apierrors.IsNotAcceptable(err) ||
		apierrors.IsUnsupportedMediaType(err)
}

// consume reads a watch until it ends, the idle timer fires or ctx is
// cancelled; it stops the watch before returning. rv advances with every
// event and bookmark. When l is not nil the stream is a WatchList in its
// initial phase: events count for the list until the end bookmark.
func (r *run[T]) consume(ctx context.Context, wi watch.Interface, rv *string, l *listing) outcome {
	w := r.w
	defer wi.Stop()
	idle := time.NewTimer(w.s.idle)
	defer idle.Stop()
	// A WatchList's initial phase as a whole must end within IdleTimeout;
	// events that keep coming do not extend it.
	var initialEnd <-chan time.Time
	if l != nil {
		t := time.NewTimer(w.s.idle)
		defer t.Stop()
		initialEnd = t.C
	}
	for {
		select {
		case <-ctx.Done():
			return outcome{reason: ReasonClosed}
		case <-idle.C:
			return outcome{reason: ReasonIdle}
		case <-initialEnd:
			return outcome{reason: ReasonIdle}
		case ev, ok := <-wi.ResultChan():
			if !ok {
				return outcome{reason: ReasonClosed}
			}
			// During a WatchList's initial phase only objects prove
			// progress: a server that ignores sendInitialEvents sends
			// plain bookmarks and never the end marker.
			if l == nil || ev.Type != watch.Bookmark {
				idle.Reset(w.s.idle)
			}
			w.s.metrics.Observed(time.Now())
			switch ev.Type {
			case watch.Added, watch.Modified:
				u, isU := ev.Object.(*unstructured.Unstructured)
				if !isU {
					continue
				}
				w.observe(u, l)
				*rv = u.GetResourceVersion()
				if l == nil {
					w.s.metrics.Tracked(w.track.count())
				}
			case watch.Deleted:
				u, isU := ev.Object.(*unstructured.Unstructured)
				if !isU {
					continue
				}
				if n := w.deleted(u); l != nil {
					l.ev.Deleted += n
				}
				*rv = u.GetResourceVersion()
			case watch.Bookmark:
				u, isU := ev.Object.(*unstructured.Unstructured)
				if !isU {
					continue
				}
				*rv = u.GetResourceVersion()
				if l != nil && l.ev.Phase != SyncFinished && u.GetAnnotations()[metav1.InitialEventsAnnotationKey] == "true" {
					initialEnd = nil
					// The end marker proves the stream alive (the bookmarks
					// before it did not count): the watch it goes on as
					// gets a full IdleTimeout from here.
					idle.Reset(w.s.idle)
					r.finishList(l, *rv)
					l.ev.Phase = SyncFinished
					l = nil
				}
			case watch.Error:
				err := apierrors.FromObject(ev.Object)
				if classify(err) == ReasonExpired {
					w.s.metrics.Error(ReasonExpired)
					return outcome{reason: ReasonExpired, err: err}
				}
				if l != nil && refusesWatchList(err) {
					// Not a failure (no backoff, no Check error):
					// streamList falls back to a paginated list at once,
					// as when the request itself is refused.
					return outcome{reason: ReasonError, err: err}
				}
				return r.failure("watch", err)
			}
		}
	}
}

// observe records an object seen by a list or an Added/Modified watch event
// and emits the entry it calls for. l is the list in progress, nil for
// watch events.
func (w *Watcher[T]) observe(u *unstructured.Unstructured, l *listing) {
	t := w.track
	m := readMeta(u, w.s.labels, w.s.annotations)
	old, known := t.get(m.key)
	prio := w.cfg.Priority
	if l != nil {
		prio = w.s.listPriority
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
		w.s.metrics.Error(ReasonDecode)
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

// deleted handles a Deleted watch event and returns how many deletes it
// recorded, for a list in progress to count.
func (w *Watcher[T]) deleted(u *unstructured.Unstructured) int {
	key := opkit.Key{Namespace: u.GetNamespace(), Name: u.GetName()}
	uid, rv := string(u.GetUID()), u.GetResourceVersion()
	n := 1
	if e, ok := w.track.get(key); ok && e.uid != uid {
		// The object tracked under the name went without an event.
		w.gone(key, e.uid, e.rv, *new(T), w.cfg.Priority)
		n++
	}
	obj, err := typed.FromUnstructured[T](u)
	if err != nil {
		w.s.metrics.Error(ReasonDecode)
		w.log.Error("cannot decode deleted object; recording a tombstone", "key", key.String(), "err", err)
	}
	w.gone(key, uid, rv, obj, w.cfg.Priority)
	w.s.metrics.Tracked(w.track.count())
	return n
}

// gone records the delete of the object key (uid, last resourceVersion
// rv) in the ledger, with its final state unless final is nil, and adds
// the key to the queue. The record is in place before the queue sees the
// key, so the worker that takes it finds the delete.
func (w *Watcher[T]) gone(key opkit.Key, uid, rv string, final T, prio int) {
	if d := w.track.gone(key, uid, rv, final, w.s.maxFinal, w.s.perKey); d != nil {
		w.s.metrics.Error(ReasonOverflow)
		w.log.Error("too many unsettled deletes of one name: the oldest is dropped and will not be reconciled",
			"key", key.String(), "uid", d.uid, "resourceVersion", d.rv, "maxDeletesPerKey", w.s.perKey)
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
	w.s.metrics.Event(typ, out)
	if !out.Accepted() {
		w.log.Debug("queue did not accept the entry", "key", key.String(), "type", typ, "outcome", out)
	}
	return out
}
