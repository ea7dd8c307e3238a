package reconcile

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/opkit/opkit"
)

// Reconciler drives one object towards its desired state: the only thing
// an operator author must write. Calls for different keys run
// concurrently, never two for one key; the context ends at the timeout, at
// shutdown or with the leadership term.
//
// A request names a key and carries the state to act on, not the events
// that led there. A worker's turn for a key calls Reconcile for each of its
// unsettled deletes, oldest first (Deleted, the final state or a
// tombstone), then for the object that has the name now, if any (Added or
// Modified; Deleted for a teardown). Each outcome:
//
//	returned                        controller does
//	------------------------------  -----------------------------------------------
//	Done(), nil                     nothing more; a delete is settled
//	RequeueAfter(d), nil            takes the key again after d
//	any result, err                 takes it again after the backoff for its failed
//	                                turns (at least d); see Config.MaxRetries
//	any result, TerminalError(err)  no retry; a delete is settled; Warning Event
//	panic                           an error, with its stack logged
//
// A failure does not hold up the rest of the turn; the retry takes the
// whole key again. A change is taken at once but does not reset the
// backoff: only a turn without failures does.
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
	// Object is the object's state: the latest known for Added and
	// Modified; the final state for Deleted (a tombstone with
	// FinalStateUnknown: namespace, name, UID, resourceVersion only). A
	// delete can come after a newer object of the name: clean up only
	// what Object's UID owns.
	Key               opkit.Key
	Object            T
	Type              opkit.Type
	FinalStateUnknown bool
	// Sources and Reasons say who asked for the turn (on every request of
	// it): APIServer, Operator (triggers, with their reasons), or neither
	// (a retry or requeue with nothing new). Related names the related
	// resources (Config.Owns, Config.Watches) whose objects changed, as
	// "configmaps" or "deployments.apps".
	Sources opkit.Sources
	Reasons []string
	Related []string
	// Retries counts the key's failed turns before this one.
	Retries int
	// Term is the leadership term (see package leader), 0 without one.
	Term int32
}

// Result says when, if ever, to reconcile the key again without a new
// event: [Done] (the zero value) or [RequeueAfter].
type Result struct {
	after   time.Duration
	requeue bool
}

// Done is the result "nothing more to do until the next event".
func Done() Result { return Result{} }

// RequeueAfter is the result "reconcile this key again after d" (polling
// something that sends no event). A d of zero or less requeues at once,
// without backoff (in controller-runtime it means no requeue); return an
// error to be retried with backoff.
func RequeueAfter(d time.Duration) Result {
	return Result{after: max(d, 0), requeue: true}
}

// Requeue reports whether the result asks for another reconcile, and when.
func (r Result) Requeue() (time.Duration, bool) { return r.after, r.requeue }

// String returns "Done" or "RequeueAfter(d)".
func (r Result) String() string {
	if !r.requeue {
		return "Done"
	}
	return fmt.Sprintf("RequeueAfter(%v)", r.after)
}

// TerminalError marks err as not worth retrying (see [Reconciler]); nil
// for a nil err. The result wraps err, and [IsTerminal] and ErrTerminal
// recognise it wrapped further.
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
