// term.go holds Term, the identity of one period of leadership, and TermFrom.

package leader

import (
	"context"
	"time"
)

// Term identifies one period of leadership of one replica.
type Term struct {
	// Number is the Lease's leaseTransitions as written when this term
	// acquired the Lease.
	Number int32
	// Identity is the holder identity of the leading replica.
	Identity string
	// Acquired is when the acquiring request was sent (local clock).
	Acquired time.Time
}

type termKey struct{}

// TermFrom returns the term carried by ctx: the context passed to the work
// function by [Elector.Run], or any context derived from it.
func TermFrom(ctx context.Context) (Term, bool) {
	t, ok := ctx.Value(termKey{}).(Term)
	return t, ok
}
