package reconcile

import "time"

// Outcome classifies how one reconcile ended, for [Metrics] and logs.
type Outcome uint8

const (
	// OutcomeDone: no error, no requeue.
	OutcomeDone Outcome = iota + 1
	// OutcomeRequeue: no error, requeued after the result's delay.
	OutcomeRequeue
	// OutcomeRetry: an error (or a panic); requeued with backoff.
	OutcomeRetry
	// OutcomeTerminal: a terminal error; dropped without retry.
	OutcomeTerminal
	// OutcomeGaveUp: an error on the last allowed attempt (MaxRetries); dropped.
	OutcomeGaveUp
	// OutcomeInterrupted: an error after the controller cancelled the
	// reconcile (end of the leadership term, or of the shutdown drain); not
	// retried, no Event.
	OutcomeInterrupted
)

// String returns the outcome's lowercase name, fit for a metric label.
func (o Outcome) String() string {
	switch o {
	case OutcomeDone:
		return "done"
	case OutcomeRequeue:
		return "requeue"
	case OutcomeRetry:
		return "retry"
	case OutcomeTerminal:
		return "terminal"
	case OutcomeGaveUp:
		return "gave_up"
	case OutcomeInterrupted:
		return "interrupted"
	}
	return "unknown"
}

// SkipReason says why a request was not passed to the reconciler.
type SkipReason string

const (
	// SkipGone: the re-fetch found that the object no longer exists (its
	// Deleted event follows, or has already been reconciled).
	SkipGone SkipReason = "gone"
	// SkipOutOfScope: the object, as read for its reconcile (a trigger's,
	// a requeue's or a retry's), does not match the watch's label selector.
	// Deleted requests are never skipped.
	SkipOutOfScope SkipReason = "outOfScope"
)

// Metrics receives the controller's measurements. A nil Metrics in
// [Config] means none. Methods are called from worker goroutines,
// concurrently: they must be quick, safe for concurrent use, and must not
// block. The queue's own measurements (depth, latency, retries) come from
// Config.QueueMetrics.
type Metrics interface {
	// Reconciled observes one call of the reconciler: how it ended and how
	// long it took.
	Reconciled(o Outcome, took time.Duration)
	// Panicked counts a reconcile that panicked (also observed by
	// Reconciled as OutcomeRetry, OutcomeGaveUp).
	Panicked()
	// Skipped counts a request not passed to the reconciler.
	Skipped(reason SkipReason)
	// Refetched counts a re-fetch of an Added/Modified object before its
	// reconcile.
	Refetched()
}

type noMetrics struct{}

func (noMetrics) Reconciled(Outcome, time.Duration) {}
func (noMetrics) Panicked()                         {}
func (noMetrics) Skipped(SkipReason)                {}
func (noMetrics) Refetched()                        {}
