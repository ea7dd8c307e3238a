package trigger

// The intake: where a trigger that names an object (the HTTP handler's,
// the consumer's) is decided, in one place.

import (
	"cmp"
	"context"
	"fmt"
	"log/slog"
	"strings"
	"sync"
	"time"

	"k8s.io/client-go/util/flowcontrol"

	"github.com/opkit/opkit"
	"github.com/opkit/opkit/internal/typed"
	"github.com/opkit/opkit/queue"
)

// Router says where the work on an object is done: reconcile.Controller's
// Trigger has one. The objects are split into Shards() shards by the hash
// of their UID (opkit.ShardOf); each shard is worked on by one replica at
// a time.
type Router[T opkit.Object] interface {
	// Shards is the number of shards, at least 1.
	Shards() int
	// Place says where shard i (0 <= i < Shards()) is worked on now.
	Place(shard int) Place[T]
}

// Place is where one shard is worked on: Queue when it is this replica
// (its intake open), else nil, with the replica that works on it as its
// Lease names it: Holder (its identity) and Endpoint (the base URL of its
// trigger endpoint), each "" when not known.
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
// never the object itself (see the package documentation).
type Pointer struct {
	// Key names the object.
	Key opkit.Key
	// Type is the type of the trigger, as for [Trigger.Enqueue]; zero
	// means Modified.
	Type opkit.Type
	// Reason and Delay are as in [Request].
	Reason string
	Delay  time.Duration
}

// Tracking says whether [Trigger.Intake] tracks the trigger.
type Tracking uint8

const (
	// NotTracked: no ticket.
	NotTracked Tracking = iota
	// Tracked: the ticket's outcome is that of the first reconcile turn
	// that serves the trigger (an HTTP caller waiting for it).
	Tracked
	// FinalOnly: the ticket's outcome is the first final one (Succeeded,
	// Requeued, Terminal or Skipped; or Unknown when the term ends): a
	// failed reconcile's retries serve it too (a broker acknowledging
	// only what was reconciled).
	FinalOnly
)

// IntakeOptions are the caller's part of [Trigger.Intake].
type IntakeOptions struct {
	// Authorize, if set, is called with the validated key before
	// anything is read; its error is returned as is. It names the caller
	// (the HTTP handler: the authenticated user, or the client's address
	// without authentication), whose share of the trigger budget a read
	// spends: one caller, however fast, takes at most half of the budget,
	// so that it cannot lock the others out. "" means no share.
	Authorize func(ctx context.Context, key opkit.Key) (caller string, err error)
	// Track asks for a Ticket on which the outcome of the reconcile that
	// serves a scheduled trigger arrives.
	Track Tracking
	// NoForward: a trigger for an object another replica works on is
	// dropped, not answered with the replica's Endpoint (a request that
	// was forwarded once, a consumer that cannot forward).
	NoForward bool

	paid bool // the consumer took a token of the budget (waitForBudget)
}

// Decision is what [Trigger.Intake] decided for a trigger that passed its
// checks: scheduled here (Outcome Queued or Merged, with a Ticket when
// tracked), to be forwarded to the replica that works on the object
// (Endpoint), or dropped (Outcome DroppedSuspended or DroppedShutDown:
// no replica can take it now).
type Decision[T opkit.Object] struct {
	// Object is the object read; nil when none was (the trigger joined an
	// entry waiting for its key, or goes elsewhere unread).
	Object T
	// Outcome is the queue's; zero when forwarded.
	Outcome queue.Outcome
	Ticket  *Ticket
	// Endpoint is where to forward the trigger; Holder names the replica
	// that works on the object, when known (also for a drop).
	Endpoint, Holder string
}

// Intake is the one path of an external trigger that names an object (the
// HTTP handler and the consumer take it), in this order: it validates p
// (errors wrap ErrInvalid); calls opts.Authorize, if set, and returns its
// error as is; checks that the key is in the controller's scope
// (ErrOutOfScope); finds the shard of the object (with one shard without
// a read; else it reads the object to learn its UID) and where that is
// worked on. When it is another replica, the answer is that replica's
// Endpoint, or a drop. Here, the trigger joins the entry already waiting
// for the key, if one is due, for free; otherwise it takes a token of the
// trigger budget (ErrBusy when there is none, see
// Config.Rate), and one of the caller's share of it, reads the object
// through Config.Get (ErrNotFound when it does not exist; an API error is
// returned wrapped, so that apierrors.IsTimeout and friends work), checks
// its labels against Config.Selector (ErrOutOfScope) and adds it with
// source Operator. The object read travels with the key, so the
// controller reconciles it without reading it again when it is still the
// latest state its watch has seen.
func (t *Trigger[T]) Intake(ctx context.Context, p Pointer, opts IntakeOptions) (Decision[T], error) {
	var none Decision[T]
	p.Type = cmp.Or(p.Type, opkit.Modified)
	if err := t.check(p.Key, p.Type, p.Delay, p.Reason); err != nil {
		return none, t.rejected(ctx, err)
	}
	var caller string
	if opts.Authorize != nil {
		var err error
		if caller, err = opts.Authorize(ctx, p.Key); err != nil {
			return none, err
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
	if obj, err = t.read(ctx, key, caller, opts); err != nil {
		return pl, obj, err
	}
	return t.cfg.Router.Place(t.shardOf(obj)), obj, nil
}

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
	if track != NotTracked {
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
	if err := t.pay(caller, opts); err != nil {
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

// pay takes a token of caller's share of the trigger budget and one of
// the budget (none when the caller paid, or the budget is unlimited), or says which
// is spent (ErrBusy).
func (t *Trigger[T]) pay(caller string, opts IntakeOptions) error {
	if t.budget == nil || opts.paid {
		return nil
	}
	if caller != "" && !t.shares.take(caller) {
		return fmt.Errorf("trigger: %w: this caller's share of the trigger budget (half of it) is spent", ErrBusy)
	}
	if !t.budget.TryAccept() {
		return fmt.Errorf("trigger: %w: the trigger budget (%v a second, %d at once) is spent", ErrBusy, t.budget.QPS(), cmp.Or(t.cfg.Burst, defaultBurst))
	}
	return nil
}

// maxShares bounds the callers whose shares of the trigger budget are
// remembered; beyond it one is forgotten (its next trigger starts with a
// full share).
const maxShares = 1024

// shares holds each caller's share of the trigger budget: a token bucket
// of half its rate and burst.
type shares struct {
	rate  float32
	burst int
	mu    sync.Mutex
	of    map[string]flowcontrol.RateLimiter
}

// take takes a token of caller's share, reporting whether there was one.
func (s *shares) take(caller string) bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	b, ok := s.of[caller]
	if !ok {
		if len(s.of) >= maxShares {
			for c := range s.of {
				delete(s.of, c)
				break
			}
		}
		b = flowcontrol.NewTokenBucketRateLimiter(s.rate, s.burst)
		s.of[caller] = b
	}
	return b.TryAccept()
}

// waitForBudget waits until a token of the trigger budget is free and
// takes it, or ctx ends. The consumer takes one before it receives a
// message (the broker keeps the rest), and passes paid; an HTTP request
// cannot wait so (it would hold its in-flight slot): Intake refuses it
// with ErrBusy.
func (t *Trigger[T]) waitForBudget(ctx context.Context) error {
	if t.budget == nil {
		return ctx.Err()
	}
	return t.budget.Wait(ctx)
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
