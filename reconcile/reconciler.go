package reconcile

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/opkit/opkit"
)

// Reconciler drives one object towards its desired state: the only thing
// an operator author writes. A turn calls Reconcile for each of its
// requests (see the package documentation), never twice at once for one
// key, with a context that ends at the timeout, at shutdown or with the
// term. Each outcome:
//
//	returned                        controller does
//	Done(), nil                     nothing more; a delete is settled
//	RequeueAfter(d), nil            takes the key again after d
//	any result, err                 takes it again after the backoff for its failed
//	                                turns (at least d); see Config.MaxRetries
//	any result, TerminalError(err)  no retry; a delete is settled; Warning Event
//	panic                           an error, with its stack logged
//
// A failure does not hold up the rest of the turn; the retry takes the
// whole key again, after a backoff that only a turn without failures
// resets.
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

// Request is one reconcile: Object is the latest state, or the final one
// of a Deleted (FinalStateUnknown: a tombstone; it may follow a newer
// object of the name: clean up what its UID owns). Sources and Reasons
// say who asked (neither: a retry), Related which related resources
// changed; Retries counts the failed turns before; Term is the term's.
type Request[T opkit.Object] struct {
	Key               opkit.Key
	Object            T
	Type              opkit.Type
	FinalStateUnknown bool
	Sources           opkit.Sources
	Reasons           []string
	Related           []string
	Retries           int
	Term              int32
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
// something that sends no event); at once when d <= 0 (unlike
// controller-runtime).
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

// TerminalError marks err, if not nil, as not worth retrying ([Reconciler]).
func TerminalError(err error) error {
	if err == nil {
		return nil
	}
	return &terminalError{err: err}
}

// errTerminal matches every error built by TerminalError with errors.Is.
var errTerminal = errors.New("terminal error")

type terminalError struct{ err error }

func (e *terminalError) Error() string { return "terminal: " + e.err.Error() }
func (e *terminalError) Unwrap() error { return e.err }

// Is makes errors.Is(err, errTerminal) true for every terminal error.
func (e *terminalError) Is(target error) bool { return target == errTerminal }

// IsTerminal reports whether err, or one it wraps, is a [TerminalError].
func IsTerminal(err error) bool { return errors.Is(err, errTerminal) }
