package trigger

// The intake: where a trigger that names an object (the HTTP handler's,
// the consumer's) is decided, in one place.

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"strings"
	"time"

	"github.com/opkit/opkit"
	"github.com/opkit/opkit/internal/typed"
	"github.com/opkit/opkit/queue"
)

// Router says where shard i of Shards() (at least one; by UID,
// opkit.ShardOf) is worked on now: reconcile.Controller implements it.
type Router[T opkit.Object] interface {
	Shards() int
	Place(shard int) Place[T]
}

// Place is where a shard is worked on: Queue if here (its intake open),
// else the Holder and its trigger Endpoint's URL, when known.
type Place[T opkit.Object] struct {
	Queue            queue.Adder[opkit.Key, opkit.Cause[T]]
	Holder, Endpoint string
}

// alone is the Router of a Trigger on one queue (Config.Queue): the
// queue's own Add tells a drop.
type alone[T opkit.Object] struct {
	q queue.Adder[opkit.Key, opkit.Cause[T]]
}

func (a alone[T]) Shards() int          { return 1 }
func (a alone[T]) Place(int) Place[T]   { return Place[T]{Queue: a.q} }
func (t *Trigger[T]) shardOf(obj T) int { return opkit.ShardOf(obj.GetUID(), t.cfg.Router.Shards()) }

// Pointer is what an external trigger carries: which object and why,
// never the object itself. A zero Type means Modified; the others are as
// for [Trigger.Submit].
type Pointer struct {
	Key    opkit.Key
	Type   opkit.Type
	Reason string
	Delay  time.Duration
}

// Tracking says whether [Trigger.Intake] gives a [Ticket] (not when
// zero), with the first reconcile's outcome, or FinalOnly the first final
// one (not Failed). At most 10,000 tickets wait, 64 per key (ErrBusy).
type Tracking uint8

const (
	notTracked Tracking = iota
	Tracked
	FinalOnly
)

// IntakeOptions are the caller's part of [Trigger.Intake]: Authorize (if
// set) authorizes the key before any read and names the caller, for its
// share of the budget ("" for none); Track asks for a Ticket; NoForward
// drops what another replica would take (a forwarded request, a consumer).
type IntakeOptions struct {
	Authorize func(ctx context.Context, key opkit.Key) (caller string, err error)
	Track     Tracking
	NoForward bool

	wait bool // the consumer's: wait for a token of the budget; route by a recent read
}

// Decision is what [Trigger.Intake] decided: scheduled (Queued or Merged;
// a Ticket if tracked), forward to Endpoint, or dropped; with the Object
// read and the Holder of the object's shard, if known.
type Decision[T opkit.Object] struct {
	Object           T
	Outcome          queue.Outcome
	Ticket           *Ticket
	Endpoint, Holder string
}

// Intake is the one path of an external trigger (the handler's, the
// consumer's): it checks p, calls opts.Authorize, checks the namespace,
// and finds where the object is worked on (with shards, by reading it):
// elsewhere, the trigger is for that Endpoint, or dropped. Here, it joins
// the entry waiting for the key, if due, for free; or it takes a token of
// the budget, reads the object (the API's errors wrapped), checks its
// labels, and queues it.
func (t *Trigger[T]) Intake(ctx context.Context, p Pointer, opts IntakeOptions) (Decision[T], error) {
	var none Decision[T]
	p.Type = cmp.Or(p.Type, opkit.Modified)
	if err := t.check(p); err != nil {
		return none, t.rejected(ctx, err)
	}
	var caller string
	if opts.Authorize != nil {
		var err error
		if caller, err = opts.Authorize(ctx, p.Key); err != nil {
			return t.uncheckedElsewhere(ctx, p.Key, opts, err)
		}
	}
	pl, obj, err := t.locate(ctx, p.Key, caller, opts)
	switch {
	case err != nil:
		return none, err
	case pl.Queue == nil:
		d := t.elsewhere(ctx, p.Key, pl, opts)
		d.Object = obj
		return d, nil
	case isNil(obj):
		// A key that waits already, and is due, gets this trigger's
		// reason and marks for free: its reconcile reads the object anyway.
		d, err := t.schedule(ctx, pl.Queue, p.Key, t.cause(obj, p.Type, p.Reason, 0), p.Delay, true, opts.Track)
		if err != nil || d.Outcome != queue.NotHeld {
			return d, err
		}
		if obj, err = t.read(ctx, p.Key, caller, opts); err != nil {
			return none, err
		}
	}
	if err := t.checkRead(ctx, obj, p); err != nil {
		return none, err
	}
	d, err := t.schedule(ctx, pl.Queue, p.Key, t.cause(obj, p.Type, p.Reason, 0), p.Delay, false, opts.Track)
	d.Object = obj
	return d, err
}

// unchecked reports whether err, an authorization's, says only that this
// replica could not ask its API server (it did not answer, or refused
// the review itself): the caller was not judged, and the replica that
// works on the object, which checks every caller, may still be asked.
func unchecked(err error) bool {
	switch {
	case err == nil, errors.Is(err, ErrUnauthenticated), errors.Is(err, ErrForbidden), errors.Is(err, ErrBusy), errors.Is(err, ErrInvalid):
		return false
	}
	return typed.Class(err) != typed.Failed
}

// uncheckedElsewhere is the decision for a trigger whose caller this
// replica could not check (authErr: its API server did not answer, or
// refused the review): with one shard, forwarded when another replica
// works on the object, since that replica checks every caller itself;
// else authErr (with shards, where the object is worked on takes a read,
// which would fail too: the caller retries, and another replica may take
// it).
func (t *Trigger[T]) uncheckedElsewhere(ctx context.Context, key opkit.Key, opts IntakeOptions, authErr error) (Decision[T], error) {
	if !unchecked(authErr) || opts.NoForward || t.cfg.Router.Shards() != 1 || t.checkNamespace(key) != nil {
		return Decision[T]{}, authErr
	}
	if pl := t.cfg.Router.Place(0); pl.Queue == nil && pl.Endpoint != "" {
		t.log.Log(ctx, slog.LevelWarn, "unchecked", "trigger: this replica could not check the caller; forwarding to the replica that works on the object, which checks it",
			slog.String("key", key.String()), slog.Any("error", authErr))
		return Decision[T]{Endpoint: pl.Endpoint, Holder: pl.Holder}, nil
	}
	return Decision[T]{}, authErr
}

// locate finds where key's object is worked on: with one shard without a
// read (obj is nil), else by reading the object (for a token, see read).
func (t *Trigger[T]) locate(ctx context.Context, key opkit.Key, caller string, opts IntakeOptions) (pl Place[T], obj T, err error) {
	if err := t.checkNamespace(key); err != nil {
		return pl, obj, t.rejected(ctx, err)
	}
	if t.cfg.Get == nil {
		return pl, obj, errNoGetter
	}
	if t.cfg.Router.Shards() == 1 {
		return t.cfg.Router.Place(0), obj, nil
	}
	if uid, ok := t.uids.get(key.String()); ok && opts.wait {
		// The consumer hands back, without a read or a token, a message
		// for an object read lately whose shard another replica holds
		// (an object recreated since is routed by its old UID until
		// recentFor has passed: handed back, redelivered, never lost).
		if pl = t.cfg.Router.Place(opkit.ShardOf(uid, t.cfg.Router.Shards())); pl.Queue == nil {
			return pl, obj, nil
		}
	}
	if obj, err = t.read(ctx, key, caller, opts); err != nil {
		return pl, obj, err
	}
	t.uids.put(key.String(), obj.GetUID(), time.Now().Add(recentFor))
	return t.cfg.Router.Place(t.shardOf(obj)), obj, nil
}

// recentFor is how long the UID of an object read stays known for the
// consumer's routing.
const recentFor = 30 * time.Second

// checkRead checks the object Intake read: its labels against the
// watch's selector, and what Submit checks.
func (t *Trigger[T]) checkRead(ctx context.Context, obj T, p Pointer) error {
	if err := t.checkLabels(obj); err != nil {
		return t.rejected(ctx, err)
	}
	if err := t.validate(Request[T]{Object: obj, Type: p.Type, Source: opkit.Operator, Delay: p.Delay, Reason: p.Reason}); err != nil {
		// p was checked: the API server returned an object the trigger
		// refuses (another kind), not the caller's fault.
		t.rejected(ctx, err)
		return fmt.Errorf("trigger: the API server returned an object the trigger refuses: %v", err)
	}
	return nil
}

// elsewhere is the decision for a trigger of an object another replica
// works on (or none): forward to it, or drop.
func (t *Trigger[T]) elsewhere(ctx context.Context, key opkit.Key, pl Place[T], opts IntakeOptions) Decision[T] {
	if pl.Endpoint == "" || opts.NoForward {
		return Decision[T]{Outcome: t.dropped(ctx, key, queue.DroppedSuspended), Holder: pl.Holder}
	}
	return Decision[T]{Endpoint: pl.Endpoint, Holder: pl.Holder}
}

// schedule adds c for key to q at the trigger priority (with mergeOnly,
// only into an entry waiting for it), with a ticket for track, and counts
// and logs the outcome. The ticket is registered before the add, so that
// the turn that takes the entry finds it, and withdrawn when the add
// stored nothing; the tickets' lock is never held across the add.
func (t *Trigger[T]) schedule(ctx context.Context, q queue.Adder[opkit.Key, opkit.Cause[T]], key opkit.Key, c opkit.Cause[T], delay time.Duration, mergeOnly bool, track Tracking) (Decision[T], error) {
	var tk *Ticket
	if track != notTracked {
		var err error
		if tk, err = t.tickets.reserve(key, c.Object, track == FinalOnly); err != nil {
			return Decision[T]{}, err
		}
		c.Ticket = tk.n
	}
	o := q.Add(key, c, queue.AddOptions{Delay: delay, Priority: t.cfg.Priority, MergeOnly: mergeOnly})
	if !o.Accepted() && tk != nil {
		t.tickets.withdraw(tk)
		tk = nil
	}
	switch {
	case o == queue.NotHeld:
	case o.Accepted():
		t.cfg.Metrics.Enqueued(o)
	default:
		t.dropped(ctx, key, o, c.Reasons...)
	}
	return Decision[T]{Outcome: o, Ticket: tk}, nil
}

// dropped counts and logs a dropped trigger, and returns o.
func (t *Trigger[T]) dropped(ctx context.Context, key opkit.Key, o queue.Outcome, reasons ...string) queue.Outcome {
	t.cfg.Metrics.Enqueued(o)
	t.log.Log(ctx, slog.LevelInfo, "dropped", "trigger dropped", slog.String("resource", t.cfg.Resource.GroupVersionResource.String()),
		slog.String("key", key.String()), slog.String("outcome", o.String()), slog.String("reasons", strings.Join(reasons, "; ")))
	return o
}

// read reads the object of key for caller, for a token of the trigger
// budget (see pay): ErrNotFound when it does not exist, an API error
// wrapped.
func (t *Trigger[T]) read(ctx context.Context, key opkit.Key, caller string, opts IntakeOptions) (T, error) {
	var none T
	if err := t.pay(ctx, caller, opts); err != nil {
		return none, err
	}
	obj, err := t.cfg.Get(ctx, key)
	switch {
	case typed.Gone(err, key.Name):
		return none, fmt.Errorf("trigger: %w: %s %q", ErrNotFound, t.cfg.Resource.Resource, key)
	case err != nil:
		return none, fmt.Errorf("trigger: reading %s %q: %w", t.cfg.Resource.Resource, key, typed.Explain(err, t.cfg.Resource, key.Name))
	}
	return obj, nil
}

// pay takes a token of the trigger budget for caller (none when it is
// unlimited), or says it is spent (ErrBusy); the consumer waits for one.
func (t *Trigger[T]) pay(ctx context.Context, caller string, opts IntakeOptions) error {
	switch {
	case t.budget == nil:
		return nil
	case opts.wait:
		if err := t.budget.wait(ctx); err != nil {
			return fmt.Errorf("trigger: %w: waiting for a token of the trigger budget: %v", ErrBusy, err)
		}
		return nil
	case t.budget.take(caller):
		return nil
	}
	return fmt.Errorf("trigger: %w: the trigger budget (%v a second, %v at once) is spent, for this caller: callers asking for less go first", ErrBusy, t.budget.rate, t.budget.burst)
}

// holds reports whether this replica works on any shard now (a
// consumer pauses while it works on none).
func (t *Trigger[T]) holds() bool {
	for i := range t.cfg.Router.Shards() {
		if t.cfg.Router.Place(i).Queue != nil {
			return true
		}
	}
	return false
}
