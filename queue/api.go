package queue

import (
	"context"
	"errors"
	"time"
)

// This file is the queue's contract with the rest of opkit: the small
// interfaces the watcher, the leader elector and the triggers depend on.
// The implementation starts in queue.go (the Queue type), with a file per
// concern: add.go, get.go, done.go, lifecycle.go, stats.go and the
// internals (slots.go, pending.go, waiters.go, index.go, structs.go).

// ErrShutDown is returned by Get once the queue has shut down and holds
// nothing more to hand out.
var ErrShutDown = errors.New("queue: shut down")

// Outcome is the result of an add. Callers that only need "scheduled or
// dropped" use [Outcome.Accepted]; the others tell the reason without
// parsing strings.
type Outcome uint8

const (
	// Queued: a new entry was created for the key.
	Queued Outcome = iota + 1
	// Merged: the key was already pending (or in flight) and the add was
	// merged into its entry.
	Merged
	// DroppedSuspended: the intake is suspended (see [Queue.Suspend]); nothing was stored.
	DroppedSuspended
	// DroppedShutDown: the queue is shut down; nothing was stored.
	DroppedShutDown
	// NotHeld: an add with [AddOptions.MergeOnly] found no entry it could
	// merge into: none waiting for the key, or one due later than the add
	// (which the merge would have made earlier); nothing was stored.
	NotHeld
)

// Accepted reports whether the add was stored (Queued or Merged).
func (o Outcome) Accepted() bool { return o == Queued || o == Merged }

// String returns the outcome's name.
func (o Outcome) String() string {
	switch o {
	case Queued:
		return "Queued"
	case Merged:
		return "Merged"
	case DroppedSuspended:
		return "DroppedSuspended"
	case DroppedShutDown:
		return "DroppedShutDown"
	case NotHeld:
		return "NotHeld"
	}
	return "Outcome(?)"
}

// AddOptions are the per-add scheduling parameters. The zero value means
// "now, priority 0".
type AddOptions struct {
	// Delay before the entry is due; zero or negative means due now.
	Delay time.Duration
	// Priority: among due entries, higher is served first. It is clamped
	// to the int32 range.
	Priority int
	// MergeOnly stores the add only if it merges into an entry waiting
	// for the key (pending, or parked behind the one in flight) that is
	// due no later than the add would be (now + Delay): a ready entry, or
	// a delayed or parked one due by then. Such a merge moves no due time
	// and makes no hand-out, nor an earlier one: it joins the payload and
	// may raise the priority. Otherwise (nothing waits for the key, or
	// what waits is due later, e.g. a delayed retry or requeue that the
	// add would make earlier) Add stores nothing and returns NotHeld.
	MergeOnly bool
}

// Adder is the intake side of the queue: what producers (the watcher, the
// triggers, the workers' retries) need. Add never blocks.
type Adder[K comparable, V any] interface {
	Add(key K, value V, opts AddOptions) Outcome
}

// Gate controls the intake: what the leader elector needs. Suspend makes
// every Add return DroppedSuspended until Resume; Clear removes pending and
// parked entries (not in-flight ones) and returns how many it removed.
type Gate interface {
	Suspend()
	Resume()
	Clear() int
}

// Getter is the consumer side: what workers need. Every Item obtained from
// Get must be passed to Done exactly once.
type Getter[K comparable, V any] interface {
	Get(ctx context.Context) (Item[K, V], error)
	Done(key K)
}

// Item is an entry handed out by Get.
type Item[K comparable, V any] struct {
	// Key is the entry's key; pass it to Done.
	Key K
	// Value is the join of the payloads of every add merged into the
	// entry (see [Config.Merge]).
	Value V
	// Priority is the highest priority merged into the entry.
	Priority int
}
