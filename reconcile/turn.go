package reconcile

// A turn: what a worker does with a key it took, from the reconcile
// calls to what the key needs next.

import (
	"context"
	"fmt"
	"log/slog"
	"runtime/debug"
	"strings"
	"time"

	"github.com/opkit/opkit"
	"github.com/opkit/opkit/internal/typed"
	"github.com/opkit/opkit/leader"
	"github.com/opkit/opkit/queue"
	"github.com/opkit/opkit/trigger"
	"k8s.io/apimachinery/pkg/labels"
)

// turn is one hand-out of a key: the reconciles of its unsettled deletes,
// then of its live object, and what the key needs next.
type turn[T opkit.Object] struct {
	log *slog.Logger
	// What the outcomes leave to do.
	failed      bool          // a request failed and is retried
	floor       time.Duration // the longest RequeueAfter of a failed request
	requeue     bool          // a request asked to be run again after
	after       time.Duration // the shortest such delay
	interrupted bool          // the term or the drain ended
	again       opkit.Cause[T]
	// What the turn's triggers learn (trigger.Outcome): the worst state
	// of its requests (Skipped when none ran), the error of the one that
	// set it.
	state trigger.State
	err   string
}

// severity orders the states a turn reports: the worst wins.
var severity = map[trigger.State]int{trigger.Skipped: 1, trigger.Succeeded: 2, trigger.Requeued: 3, trigger.Terminal: 4, trigger.Failed: 5}

// note records a request's state in the turn's outcome.
func (t *turn[T]) note(s trigger.State, err error) {
	if severity[s] > severity[t.state] {
		t.state, t.err = s, ""
		if err != nil {
			t.err = err.Error()
		}
	}
}

func (c *shard[T]) runTurn(ctx context.Context, item queue.Item[opkit.Key, opkit.Cause[T]], log *slog.Logger) {
	key, cause := item.Key, item.Value
	term, _ := leader.TermFrom(ctx)
	base := Request[T]{Key: key, Sources: cause.Sources, Reasons: cause.Reasons, Related: cause.Related, Retries: c.retries.count(key, cause.Retries), Term: term.Number}
	t := &turn[T]{log: log.With("key", key.String()), state: trigger.Skipped}
	began := time.Now()
	ctx = context.WithValue(ctx, turnWritesKey{}, &turnWrites{key: key, into: &c.written})
	deletes := c.watch.Deletes(key)
	for _, d := range deletes {
		req := base
		req.Object, req.Type, req.FinalStateUnknown = d.Object, opkit.Deleted, d.FinalStateUnknown
		if c.run(ctx, t, req) {
			c.watch.Settle(key, d.Object.GetUID(), d.Object.GetResourceVersion())
		}
		if t.interrupted {
			return
		}
	}
	c.live(ctx, t, base, cause, len(deletes) > 0)
	if t.interrupted {
		// The next term (or process) starts with a full list, and the
		// ledger brings back what was not settled.
		return
	}
	c.trig.Report(key, cause.Ticket, c.scope, trigger.Outcome{State: t.state, Error: t.err, Attempts: base.Retries + 1,
		Duration: time.Since(began).Round(time.Microsecond).String(), Replica: c.identity(), Term: term.Number})
	if t.failed {
		delay := max(c.retries.when(key), t.floor)
		t.log.Warn("turn failed: retrying", "after", delay, "failures", base.Retries+1)
		t.again.Ticket = cause.Ticket // tickets waiting for a final outcome follow the retry
		c.add(key, t.again, queue.AddOptions{Delay: delay, Priority: item.Priority}, t.log)
	} else {
		c.retries.forget(key)
	}
	if t.requeue {
		c.add(key, t.again, queue.AddOptions{Delay: t.after, Priority: c.cfg.Watch.Priority}, t.log)
	}
}

// live reconciles the object that has the key's name now, if any: as the
// watch saw it last when the cause carries that state, else as read from
// the API server. A teardown reconciles it as Deleted; when it is gone,
// the teardown is served by the turn's deletes, if any, or reconciles the
// newest state known.
func (c *shard[T]) live(ctx context.Context, t *turn[T], req Request[T], cause opkit.Cause[T], hadDeletes bool) {
	req.Type = opkit.Modified
	if cause.Added {
		req.Type = opkit.Added
	}
	if cause.Teardown {
		req.Type = opkit.Deleted
	}
	if req.Sources.Has(opkit.Operator) && c.cfg.RecordTriggerEvents {
		// On the object the trigger named (a trigger carries one), before
		// it is read: the trigger is recorded whatever the read finds.
		note := "reconcile requested by an external trigger"
		if len(req.Reasons) > 0 {
			note += ": " + strings.Join(req.Reasons, "; ")
		}
		if err := c.rec.Record(ctx, cause.Object, EventSpec{Type: eventNormal, Reason: "Triggered", Action: "Reconcile", Note: note}); err != nil {
			t.log.Warn("recording the trigger event failed", "err", err)
		}
	}
	wrote := c.written.take(req.Key) // the operator's last write of the object, which the watch may not have delivered
	if ownWrite(cause, wrote) {
		t.log.Debug("the newest state is the operator's own write: nothing to reconcile", "resourceVersion", wrote)
		return
	}
	obj, err := c.liveObject(ctx, req.Key, cause, wrote)
	if err != nil {
		// Not the reconciler's fault, but retried the same way.
		if !c.outcome(ctx, t, req, Done(), fmt.Errorf("re-fetch: %w", typed.Explain(err, c.cfg.Resource, req.Key.Name)), 0) {
			c.retryAs(t, req)
		}
		return
	}
	switch {
	case !isNil(obj) && !c.scope.Contains(obj.GetUID()):
		// Another shard's object (a Watches mapping names keys of every
		// shard): its shard's controller reconciles it.
		t.log.Debug("object of another shard: skipped")
		c.cfg.Metrics.Skipped(skipOutOfScope)
		return
	case !isNil(obj) && !c.sel.Matches(labels.Set(obj.GetLabels())):
		// Not an object the watch sees (a trigger's for another shard, or
		// one that left the selector, whose delete the watch delivers),
		// also for a teardown: this controller does not handle it.
		t.log.Info("object does not match the watch's label selector: skipped", "selector", c.sel.String())
		c.cfg.Metrics.Skipped(skipOutOfScope)
		return
	case !isNil(obj):
	case !cause.Teardown:
		if cause.Sources.Has(opkit.Operator) {
			t.log.Debug("triggered object not found: skipped")
			c.cfg.Metrics.Skipped(skipGone)
		}
		return
	case hadDeletes:
		return // the teardown of an object gone: its delete was reconciled
	case !isNil(cause.Object):
		obj = cause.Object
	default:
		obj, req.FinalStateUnknown = typed.Tombstone[T](req.Key, "", ""), true
	}
	req.Object = obj
	if !c.run(ctx, t, req) {
		c.retryAs(t, req)
	}
}

// retryAs makes the key's next turn reconcile the live object the way
// req did (Added, or a teardown). The turn reads it again: a re-add
// carries no object, and no source or reason (they reached this turn).
func (c *shard[T]) retryAs(t *turn[T], req Request[T]) {
	t.again.Merge(opkit.Cause[T]{Added: req.Type == opkit.Added, Teardown: req.Type == opkit.Deleted})
}

// liveObject returns the object that has key's name now, or a nil T when
// there is none: the one the cause carries when it is the latest state
// the watch has seen (by resourceVersion) and no older than the last
// turn's own write of it (see writes.go); nothing, without a read, when
// the watch sees no object of the name and no trigger asked; else what
// the API server has.
func (c *shard[T]) liveObject(ctx context.Context, key opkit.Key, cause opkit.Cause[T], wrote string) (T, error) {
	var none T
	rv, seen := c.watch.ResourceVersion(key)
	switch {
	case seen && !isNil(cause.Object) && cause.Object.GetResourceVersion() == rv && !opkit.NewerResourceVersion(wrote, rv):
		return cause.Object, nil
	case !seen && !cause.Sources.Has(opkit.Operator) && !cause.Teardown:
		return none, nil
	}
	c.cfg.Metrics.Refetched()
	ctx, cancel := c.withTimeout(ctx)
	defer cancel()
	obj, err := c.client.Get(ctx, key)
	if typed.Gone(err, key.Name) {
		return none, nil
	}
	return obj, err
}

// ownWrite reports whether the only thing a cause says is that the
// object changed to wrote, the operator's own last write of it (a status
// or finalizer through the helpers): no change by anyone else, no
// trigger, no related change; such a turn has nothing to reconcile.
func ownWrite[T opkit.Object](cause opkit.Cause[T], wrote string) bool {
	return wrote != "" && cause.Sources == opkit.Sources(opkit.APIServer) && len(cause.Related) == 0 && !cause.Added && !cause.Teardown &&
		!isNil(cause.Object) && cause.Object.GetResourceVersion() == wrote
}

// run calls the reconciler for req and applies the decision table of
// [Reconciler] to its outcome; it reports whether req is finished (done,
// terminal, or given up on).
func (c *shard[T]) run(ctx context.Context, t *turn[T], req Request[T]) bool {
	start := time.Now()
	res, err := c.call(ctx, req, t.log)
	return c.outcome(ctx, t, req, res, err, time.Since(start))
}

func (c *shard[T]) outcome(ctx context.Context, t *turn[T], req Request[T], res Result, err error, took time.Duration) (finished bool) {
	log := t.log.With("type", req.Type.String(), "sources", req.Sources.String(), "retry", req.Retries)
	// Every reconcile at Debug, with why it ran; what is not a plain
	// success without writes at Info, or above for failures.
	log.Debug("reconcile ran", "reasons", req.Reasons, "related", req.Related, "took", took, "err", err)
	after, requeue := res.Requeue()
	switch {
	case err == nil && !requeue:
		c.cfg.Metrics.Reconciled(outcomeDone, took)
		if wrote := writesOf(ctx); wrote || req.Type == opkit.Deleted {
			log.Info("reconciled", "wrote", wrote, "took", took)
		}
		t.note(trigger.Succeeded, nil)
		return true
	case err == nil:
		c.cfg.Metrics.Reconciled(outcomeRequeue, took)
		log.Info("reconciled; requeued", "after", after, "took", took)
		if !t.requeue || after < t.after {
			t.requeue, t.after = true, after
		}
		t.note(trigger.Requeued, nil)
		return false
	case ctx.Err() != nil:
		// The term ended or the drain ran out: not the reconciler's failure,
		// and nothing may be written any more.
		c.cfg.Metrics.Reconciled(outcomeInterrupted, took)
		log.Info("reconcile interrupted by shutdown or the end of the term", "err", err)
		t.interrupted = true
		return false
	case IsTerminal(err):
		c.cfg.Metrics.Reconciled(outcomeTerminal, took)
		log.Error("reconcile failed with a terminal error: not retried", "err", err)
		c.record(ctx, req, "ReconcileTerminalError", err, log)
		t.note(trigger.Terminal, err)
		return true
	case c.cfg.MaxRetries >= 0 && req.Retries >= c.cfg.MaxRetries && req.Sources == 0: // a retry of the controller's own
		c.cfg.Metrics.Reconciled(outcomeGaveUp, took)
		log.Error("reconcile failed on its last retry: given up", "err", err, "maxRetries", c.cfg.MaxRetries)
		c.record(ctx, req, "ReconcileFailed", fmt.Errorf("gave up after %d retries: %w", req.Retries, err), log)
		t.note(trigger.Terminal, fmt.Errorf("gave up after %d retries: %w", req.Retries, err))
		return true
	}
	c.cfg.Metrics.Reconciled(outcomeRetry, took)
	log.Warn("reconcile failed", "err", err)
	t.note(trigger.Failed, err)
	t.failed = true
	if requeue {
		t.floor = max(t.floor, after)
	}
	return false
}

// call runs the reconciler with the per-reconcile timeout and turns a panic
// into an error.
func (c *shard[T]) call(ctx context.Context, req Request[T], log *slog.Logger) (res Result, err error) {
	ctx, cancel := c.withTimeout(ctx)
	defer cancel()
	defer func() {
		if p := recover(); p != nil {
			c.cfg.Metrics.Panicked()
			log.Error("reconcile panicked", "panic", fmt.Sprint(p), "stack", string(debug.Stack()))
			res, err = Done(), fmt.Errorf("%w: %v", errPanic, p)
		}
	}()
	return c.cfg.Reconciler.Reconcile(ctx, req)
}

// withTimeout bounds ctx by the per-reconcile Timeout, unless it is negative.
func (c *shard[T]) withTimeout(ctx context.Context) (context.Context, context.CancelFunc) {
	if c.cfg.Timeout < 0 {
		return context.WithCancel(ctx)
	}
	return context.WithTimeout(ctx, c.cfg.Timeout)
}

func (c *shard[T]) add(key opkit.Key, cause opkit.Cause[T], opts queue.AddOptions, log *slog.Logger) {
	if out := c.queue.Add(key, cause, opts); !out.Accepted() {
		log.Debug("requeue dropped", "outcome", out.String())
	}
}

// record writes a Warning Event about a failure of req (none with NoEvents:
// a nil Recorder records nothing): on its object, or on the key when it has
// none (a read that failed); the recorder's own timeout bounds it even when
// ctx has ended.
func (c *shard[T]) record(ctx context.Context, req Request[T], reason string, err error, log *slog.Logger) {
	obj := req.Object
	if isNil(obj) {
		obj = typed.Tombstone[T](req.Key, "", "")
	}
	if rerr := c.rec.Record(context.WithoutCancel(ctx), obj, EventSpec{Type: eventWarning, Reason: reason, Action: "Reconcile", Note: err.Error()}); rerr != nil {
		log.Warn("recording the failure event failed", "err", rerr)
	}
}
