package watcher

import (
	"context"
	"fmt"
	"log/slog"
	"math/rand/v2"
	"sync"
	"time"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	utilnet "k8s.io/apimachinery/pkg/util/net"
	"k8s.io/apimachinery/pkg/watch"
	"k8s.io/client-go/dynamic"

	"github.com/opkit/opkit"
	"github.com/opkit/opkit/queue"
)

// sink is what a loop hands what it lists and watches to: a Watcher, or
// a Related. Its methods are called from the loop's Run goroutine only.
type sink interface {
	// begin is called before each (re)list; initial says it is the Run's
	// first, reason why it lists.
	begin(initial bool, reason Reason)
	// object is called for every object a list returns (listed) and for
	// every Added or Modified event.
	object(u *unstructured.Unstructured, listed bool)
	// deleted is called for every Deleted event.
	deleted(u *unstructured.Unstructured)
	// end is called once a list is complete, with its resourceVersion:
	// what the list did not return is gone.
	end(initial bool, resourceVersion string)
}

// loopConfig is what a loop needs of a Config or a RelatedConfig, with
// the defaults applied.
type loopConfig struct {
	res                          dynamic.ResourceInterface
	name                         string // the resource as logs and errors show it: "widgets.example.com/v1"
	labelSelector, fieldSelector string
	shards                       opkit.Shards
	pageSize                     int64
	idleTimeout                  time.Duration
	backoff                      Backoff
	metrics                      Metrics
	log                          *slog.Logger
}

// loop is the list-and-watch loop over one resource: it lists page by
// page from one snapshot, watches from the list's resourceVersion with
// bookmarks, resumes a watch that ends, relists after a 410 Gone, and
// waits for the backoff after a failure (see [Backoff]). It hands what it
// sees to a sink and keeps only its own health.
type loop struct {
	cfg loopConfig

	// Owned by run's goroutine.
	failures int // consecutive failed calls, for the backoff
	refusals int // consecutive 401/403 answers among them
	// foreign counts the objects of other shards the loop dropped since
	// the list began; warned says the log told of them already.
	foreign int
	warned  bool

	// mu guards the health below.
	mu     sync.RWMutex
	active bool // a Run is active
	synced bool // the Run's first list is done
	// firstList is closed when the current Run's first list is done; a
	// new one is made when a Run ends, for the next Run (waitSynced).
	firstList chan struct{}
	lastErr   error     // the latest list or watch call's failure, nil once one succeeds
	downSince time.Time // when the current run of failures began; zero while connected
	stalled   bool      // the current outage outlasted Backoff.Stalled and was logged
}

func newLoop(cfg loopConfig) *loop {
	return &loop{cfg: cfg, firstList: make(chan struct{})}
}

// isSynced reports whether the current Run has finished its first list.
func (l *loop) isSynced() bool {
	l.mu.RLock()
	defer l.mu.RUnlock()
	return l.active && l.synced
}

// waitSynced blocks until the current Run, or the next one when none is
// active, has finished its first list, or until ctx ends.
func (l *loop) waitSynced(ctx context.Context) error {
	l.mu.RLock()
	first := l.firstList
	l.mu.RUnlock()
	select {
	case <-first:
		return nil
	case <-ctx.Done():
		return ctx.Err()
	}
}

// check is the health check of Watcher.Check and Related.Check.
func (l *loop) check() error {
	l.mu.RLock()
	defer l.mu.RUnlock()
	switch {
	case !l.active:
		return ErrNotRunning
	case l.lastErr == nil && !l.synced:
		return ErrNotSynced
	case l.lastErr == nil:
		return nil
	case !l.synced:
		return fmt.Errorf("%w, %w for %v: %w", ErrNotSynced, ErrDisconnected, time.Since(l.downSince).Round(time.Second), l.lastErr)
	}
	return fmt.Errorf("%w for %v: %w", ErrDisconnected, time.Since(l.downSince).Round(time.Second), l.lastErr)
}

// setErr records the latest call's failure, or with nil that the loop is
// connected again. An outage that outlasts Backoff.Stalled is logged
// once, at error level, with its last error; its end is logged too.
func (l *loop) setErr(err error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.lastErr = err
	switch {
	case err == nil && l.stalled:
		l.cfg.log.Info("list and watch resumed after an outage", "after", time.Since(l.downSince).Round(time.Millisecond))
		fallthrough
	case err == nil:
		l.downSince, l.stalled = time.Time{}, false
	case l.downSince.IsZero():
		l.downSince = time.Now()
	case !l.stalled && time.Since(l.downSince) >= l.cfg.backoff.Stalled:
		l.stalled = true
		l.cfg.log.Error("list and watch have not resumed: the controller sees no change meanwhile", "for", time.Since(l.downSince).Round(time.Second), "err", err)
	}
}

// run lists, then watches, handing everything to s, until ctx ends; it
// returns nil then, or ErrAlreadyRunning while another run is active.
func (l *loop) run(ctx context.Context, s sink) error {
	l.mu.Lock()
	if l.active {
		l.mu.Unlock()
		return ErrAlreadyRunning
	}
	l.active, l.synced, l.lastErr = true, false, nil
	l.mu.Unlock()
	defer func() {
		l.mu.Lock()
		l.active, l.synced, l.firstList = false, false, make(chan struct{})
		l.mu.Unlock()
	}()

	// List, then watch from the list's resourceVersion. A 410 Gone (from
	// the list's continue token or the watch's resourceVersion) relists at
	// once; other failures wait for the backoff before the call is retried.
	l.failures, l.refusals = 0, 0
	var rv string
	relist := true
	for ctx.Err() == nil {
		var err error
		call := "list"
		if relist {
			rv, err = l.list(ctx, s)
			relist = err != nil
		} else {
			call = "watch"
			err = l.watch(ctx, s, &rv)
		}
		if err == nil || ctx.Err() != nil {
			continue
		}
		if delay, expired := l.failure(call, err); expired {
			relist = true
		} else {
			sleep(ctx, delay)
		}
	}
	return nil
}

// list lists the resource page by page from one snapshot, hands every
// object to s, and returns the resourceVersion to watch from.
func (l *loop) list(ctx context.Context, s sink) (string, error) {
	initial := !l.isSynced()
	reason := ReasonExpired
	if initial {
		reason = ReasonInitial
	}
	l.cfg.metrics.Relist(reason)
	s.begin(initial, reason)
	opts := metav1.ListOptions{LabelSelector: l.cfg.labelSelector, FieldSelector: l.cfg.fieldSelector, Limit: l.cfg.pageSize,
		ShardSelector: l.cfg.shards.Selector()}
	l.foreign = 0
	for {
		page, err := l.cfg.res.List(ctx, opts)
		if err != nil {
			return "", err
		}
		for i := range page.Items {
			if l.mine(&page.Items[i]) {
				s.object(&page.Items[i], true)
			}
		}
		if opts.Continue = page.GetContinue(); opts.Continue == "" {
			if sm, ok := l.cfg.metrics.(ShardingMetrics); ok && opts.ShardSelector != "" {
				sm.Sharding(l.foreign == 0)
			}
			// Synced and healthy before end, which calls OnSync (whose
			// callback may ask Check); WaitSynced returns after it, once
			// every entry of the list was handed on.
			l.setErr(nil)
			l.mu.Lock()
			first := !l.synced
			l.synced = true
			l.mu.Unlock()
			s.end(initial, page.GetResourceVersion())
			if first {
				l.mu.RLock()
				close(l.firstList)
				l.mu.RUnlock()
			}
			l.failures, l.refusals = 0, 0
			return page.GetResourceVersion(), nil
		}
	}
}

// mine reports whether u is of the held shards. Every object is checked
// (one hash), whatever the API server says it applied: behind a load
// balancer, one API server may apply the selector and the next not. The
// first object of another shard means a server ignored the selector: the
// log says so, once.
func (l *loop) mine(u *unstructured.Unstructured) bool {
	if l.cfg.shards.Contains(u.GetUID()) {
		return true
	}
	l.foreign++
	if !l.warned {
		l.warned = true
		l.cfg.log.Warn("the API server ignored the shard selector (is the ShardedListAndWatch feature gate on?); filtering on the client, which receives every object",
			"shards", l.cfg.shards.Count, "held", l.cfg.shards.Held)
	}
	return false
}

// failure logs and counts a failed call, and returns how long to wait
// before the next one, or expired for a 410 Gone, which only calls for a
// relist. Anything else is a failure for the backoff and for Check.
func (l *loop) failure(call string, err error) (delay time.Duration, expired bool) {
	reason := classify(err)
	l.cfg.metrics.Error(reason)
	if reason == ReasonExpired {
		l.cfg.log.Info(call+" expired; relisting", "err", err)
		return 0, true
	}
	l.failures++
	if reason == ReasonForbidden {
		l.refusals++
	} else {
		l.refusals = 0
	}
	l.setErr(fmt.Errorf("%s %s: %w", call, l.cfg.name, err))
	delay = l.delay(reason, err)
	switch {
	case reason == ReasonForbidden && l.refusals <= queue.TransientRefusals:
		l.cfg.log.Warn(call+" refused; retrying, as a just-started API server refuses until its authorizer has synced",
			"refusals", l.refusals, "after", delay, "err", err)
	case reason == ReasonForbidden:
		l.cfg.log.Error("permission denied: the identity needs list and watch on the resource; retrying slowly", "call", call, "after", delay, "err", err)
	case reason == ReasonNotFound:
		l.cfg.log.Error("resource not found: is it installed (CRD) and served in this version? retrying slowly", "call", call, "after", delay, "err", err)
	default:
		l.cfg.log.Warn(call+" failed; backing off", "reason", reason, "failures", l.failures, "after", delay, "err", err)
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
	case utilnet.IsConnectionRefused(err):
		return ReasonUnreachable
	}
	return ReasonError
}

// delay is the wait before the next call after a failure of reason (err
// its error, nil for a watch closed early): see [Backoff].
func (l *loop) delay(reason Reason, err error) time.Duration {
	b := l.cfg.backoff
	d := queue.Backoff{Base: b.Base, Cap: b.Cap, Jitter: 0.5}.Delay(max(l.failures, 1))
	switch {
	case reason == ReasonThrottled:
		if secs, ok := apierrors.SuggestsClientDelay(err); ok {
			d = max(d, time.Duration(secs)*time.Second)
		}
	case reason == ReasonNotFound, reason == ReasonForbidden && l.refusals > queue.TransientRefusals:
		d = max(d, queue.Backoff{Base: b.Slow, Cap: b.Slow, Jitter: 0.5}.Delay(1))
	default:
		// What an API server's restart causes: unreachable, another
		// error, a watch closed early, one of the first refusals.
		d = min(d, b.Transient)
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

// watch watches from *rv, advancing it with every event and bookmark, until
// the watch ends, stays idle for the idle timeout or ctx is cancelled. It
// returns the error that ended it, if any. A watch that the server closed
// before it delivered anything or stayed open for Backoff.Reset is a
// failure: it is reported by check and waited for, so that a server that
// keeps closing watches at once is not hammered.
func (l *loop) watch(ctx context.Context, s sink, rv *string) error {
	// Ask the server to end the watch after 5 to 10 minutes, so that
	// connections are rebalanced across API servers; the watch is then
	// resumed from rv without a relist.
	timeout := int64(300 + rand.IntN(300))
	started := time.Now()
	wi, err := l.cfg.res.Watch(ctx, metav1.ListOptions{
		LabelSelector:       l.cfg.labelSelector,
		FieldSelector:       l.cfg.fieldSelector,
		ShardSelector:       l.cfg.shards.Selector(),
		ResourceVersion:     *rv,
		AllowWatchBookmarks: true,
		TimeoutSeconds:      &timeout,
	})
	if err != nil {
		return err
	}
	l.setErr(nil)
	end, delivered, err := l.consume(ctx, s, wi, rv)
	wi.Stop()
	if ctx.Err() != nil {
		return nil
	}
	l.cfg.metrics.WatchRestart(end)
	open := time.Since(started)
	healthy := delivered || open >= l.cfg.backoff.Reset
	if healthy {
		l.failures, l.refusals = 0, 0
	}
	switch {
	case err != nil:
		return err
	case end == ReasonIdle:
		l.cfg.log.Warn("watch idle; restarting", "idleTimeout", l.cfg.idleTimeout, "resourceVersion", *rv)
	case healthy:
		l.cfg.log.Debug("watch closed; resuming", "resourceVersion", *rv)
	default:
		l.failures++
		delay := l.delay(ReasonClosed, nil)
		l.cfg.log.Debug("watch closed early; resuming after a backoff", "open", open, "after", delay, "resourceVersion", *rv)
		l.setErr(fmt.Errorf("watch %s: closed after %v", l.cfg.name, open))
		sleep(ctx, delay)
	}
	return nil
}

// consume reads a watch until it ends (ReasonClosed), the idle timer fires
// (ReasonIdle), ctx is cancelled, or an error event arrives (its reason and
// error). *rv advances with every event and bookmark; delivered reports
// whether there was one.
func (l *loop) consume(ctx context.Context, s sink, wi watch.Interface, rv *string) (end Reason, delivered bool, err error) {
	idle := time.NewTimer(l.cfg.idleTimeout)
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
			idle.Reset(l.cfg.idleTimeout)
			l.cfg.metrics.Observed(time.Now())
			if ev.Type == watch.Error {
				err := apierrors.FromObject(ev.Object)
				return classify(err), delivered, err
			}
			delivered = true
			u, ok := ev.Object.(*unstructured.Unstructured)
			if !ok {
				continue
			}
			switch {
			case ev.Type == watch.Bookmark:
			case !l.mine(u): // another shard's (a UID never changes)
			case ev.Type == watch.Added, ev.Type == watch.Modified:
				s.object(u, false)
			case ev.Type == watch.Deleted:
				s.deleted(u)
			}
			*rv = u.GetResourceVersion()
		}
	}
}
