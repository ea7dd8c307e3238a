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
// What the controller does with the outcome:
//
//	returned                          controller does
//	--------------------------------  -----------------------------------------------
//	Done(), nil                       nothing more; the key waits for the next event
//	RequeueAfter(d), nil              reconciles the key again after d; retry count reset to 0
//	Done(), err                       retries after Config.Backoff's delay for the key's
//	                                  consecutive failures (at least Retries+1);
//	                                  after MaxRetries retries: logs, counts, records a
//	                                  Warning Event on the object, and drops the key
//	RequeueAfter(d), err              as above, but waits at least d: the delay is a
//	                                  floor for the backoff delay
//	any result, TerminalError(err)    no retry (the result's delay is ignored): logs,
//	                                  counts, records a Warning Event, drops the key
//	panic                             turned into an error (stack logged) and retried
//	                                  like any other error
//
// A new event for the key (a watch event or a trigger) gets its own
// reconcile, whatever the previous outcome: dropping a key only stops the
// retries of the failed attempt. (It may share that reconcile with other
// events merged into one, and a trigger merges into a delete of its object
// that is waiting: see MergeEvents.) One that arrives while the key is being
// reconciled runs after it with its own retry count, and the retry or
// requeue that reconcile asks for gives way to it (MergeEvents; a delete
// and an objectless requeue keep their own entries, in the order the
// table there gives): the new reconcile decides again. The backoff delay does not start again with
// it: it follows the key's consecutive failures (see Config.Backoff).
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

// Request is one reconcile: which object, what happened to it, who asked.
type Request[T opkit.Object] struct {
	// Key is the object's namespace and name.
	Key opkit.Key
	// Object is the object's state. For Added and Modified it is as fresh as
	// the API server's when the request waited in the queue (the controller
	// re-fetches it, see [Controller]); for Deleted it is the last state
	// known (see FinalStateUnknown).
	Object T
	// Type is Added, Modified or Deleted. A retried Deleted request can
	// come after a newer object with the same key was reconciled: a
	// reconciler that cleans up on Deleted should match Object's UID.
	Type opkit.Type
	// Source is APIServer for the watch stream, Operator for triggers.
	Source opkit.Source
	// Retries counts the failed attempts of this request before this one
	// (0 on the first). A new event for the key starts a new request: see
	// Config.MaxRetries.
	Retries int
	// Reason is the reason an external trigger gave, if any.
	Reason string
	// Requeued is true when this request comes from an earlier reconcile
	// of the key that succeeded and asked to be requeued ([RequeueAfter])
	// rather than from the watch or a trigger; Source and Reason are then
	// those of the request that started the chain.
	Requeued bool
	// FinalStateUnknown is true for a Deleted request whose Object is a
	// tombstone carrying only namespace, name, UID and resourceVersion: the
	// deletion was noticed by a relist, not seen on the watch.
	FinalStateUnknown bool
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
