package reconcile

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/opkit/opkit"
)

// Reconciler drives one object towards its desired state. It is the only
// thing an operator author must write.
//
// The controller calls Reconcile from its worker goroutines: calls for
// different keys run concurrently, never two calls for the same key. The
// context ends at the per-reconcile timeout, at shutdown, or when this
// replica loses leadership; a reconciler must return promptly then.
//
// Reconciles are level-based: a request names a key and carries the state
// to act on, not the history of events that led there. When a worker
// takes a key (a turn), the controller calls Reconcile for each of the
// key's unsettled deletes, oldest first (Type Deleted, with the final
// state the watch delivered, or a tombstone), then for the object that
// has the name now, if any (Added or Modified; Deleted for a teardown,
// see trigger.Trigger.Enqueue). What it does with each outcome:
//
//	returned                        controller does
//	------------------------------  -----------------------------------------------
//	Done(), nil                     nothing more (a delete is settled: forgotten)
//	RequeueAfter(d), nil            takes the key again after d
//	any result, err                 takes the key again after the backoff delay for its
//	                                consecutive failed turns, at least the result's d;
//	                                once the key has failed MaxRetries turns: logs,
//	                                counts, records a Warning Event, and gives up
//	any result, TerminalError(err)  no retry: logs, counts, records a Warning Event
//	panic                           turned into an error (stack logged)
//
// A delete is settled when its reconcile returns Done, a terminal error,
// or is given up on; until then every turn of the key reconciles it
// again. A failure of one request of a turn does not hold up the others:
// the turn goes on, and the key is taken again for what is unfinished (a
// turn reconciles the live object whatever it is taken for: a reconcile
// of an object in its desired state should write nothing). A change that
// arrives meanwhile is taken at once, and does not reset the backoff: only
// a turn without failures does.
type Reconciler[T opkit.Object] interface {
	Reconcile(ctx context.Context, req Request[T]) (Result, error)
}

// Func adapts a plain function to the [Reconciler] interface.
type Func[T opkit.Object] func(ctx context.Context, req Request[T]) (Result, error)

// Reconcile calls f(ctx, req).
func (f Func[T]) Reconcile(ctx context.Context, req Request[T]) (Result, error) {
	return f(ctx, req)
}

var _ Reconciler[opkit.Object] = Func[opkit.Object](nil)

// Request is one reconcile: which object, in which state, and why.
type Request[T opkit.Object] struct {
	// Key is the object's namespace and name.
	Key opkit.Key
	// Object is the object's state: for Added and Modified the latest the
	// controller's watch has seen (or read from the API server when the
	// watch has not seen it yet); for Deleted the final state (see
	// FinalStateUnknown). A Deleted request can come after a newer
	// object of the same name was reconciled (its retry): a reconciler
	// that cleans up on Deleted acts on what Object's UID owns.
	Object T
	// Type is Added (the object appeared), Modified, or Deleted (it is
	// gone, or a trigger asked for a teardown).
	Type opkit.Type
	// FinalStateUnknown is true for a Deleted request whose Object is a
	// tombstone carrying only namespace, name, UID and resourceVersion:
	// the watch never delivered the object's final state (a relist found
	// it gone).
	FinalStateUnknown bool
	// Sources says who asked for the turn, since the key's last one:
	// APIServer (the watch), Operator (triggers), both, or neither (a
	// retry or a requeue with nothing new). Every request of a turn
	// carries the same Sources and Reasons.
	Sources opkit.Sources
	// Reasons are the distinct reasons the triggers gave (at most
	// opkit.MaxReasons), sorted.
	Reasons []string
	// Retries counts the key's consecutive failed turns before this one
	// (0 when it last succeeded).
	Retries int
	// Term is the leadership term the reconcile runs in (see package
	// leader); 0 without leader election.
	Term int32
}

// Result says when, if ever, to reconcile the key again without a new
// event. It is built only by [Done] and [RequeueAfter]; the zero value is
// Done().
type Result struct {
	after   time.Duration
	requeue bool
}

// Done is the result "nothing more to do until the next event".
func Done() Result { return Result{} }

// RequeueAfter is the result "reconcile this key again after d" (polling an
// external system, waiting for something that sends no event). A d of zero
// or less requeues at once, behind the entries already due, with no
// backoff: a reconciler that computes d from a deadline (time.Until) must
// stop requeueing once it has passed, or it loops as fast as it runs.
// To be retried with backoff, return an error instead. (In
// controller-runtime a RequeueAfter of zero means no requeue at all.)
func RequeueAfter(d time.Duration) Result {
	return Result{after: max(d, 0), requeue: true}
}

// Requeue reports whether the result asks for another reconcile, and after
// which delay.
func (r Result) Requeue() (time.Duration, bool) { return r.after, r.requeue }

// String returns "Done" or "RequeueAfter(d)".
func (r Result) String() string {
	if !r.requeue {
		return "Done"
	}
	return fmt.Sprintf("RequeueAfter(%v)", r.after)
}

// TerminalError marks err as not worth retrying: the controller logs it,
// counts it, records a Warning Event on the object and drops the key (until
// the next event). It returns nil for a nil err. The result wraps err:
// errors.Is and errors.As see through it, and [IsTerminal] recognises it
// even when wrapped further.
func TerminalError(err error) error {
	if err == nil {
		return nil
	}
	return &terminalError{err: err}
}

// ErrTerminal matches every error built by [TerminalError] with errors.Is.
var ErrTerminal = errors.New("terminal error")

type terminalError struct{ err error }

func (e *terminalError) Error() string { return "terminal: " + e.err.Error() }
func (e *terminalError) Unwrap() error { return e.err }

// Is makes errors.Is(err, ErrTerminal) true for every terminal error.
func (e *terminalError) Is(target error) bool { return target == ErrTerminal }

// IsTerminal reports whether err, or an error it wraps, was built by
// [TerminalError].
func IsTerminal(err error) bool { return errors.Is(err, ErrTerminal) }
