package reconcile

import "time"

// Metrics receives the workers' measurements (be quick): how a reconcile
// ended ("done", "requeue", "retry", "terminal", "gave_up", "interrupted"),
// panics, skips ("gone", "outOfScope"), reads of an object for its turn.
type Metrics interface {
	Reconciled(outcome string, took time.Duration)
	Panicked()
	Skipped(reason string)
	Refetched()
}

// The outcomes and skip reasons, as Metrics gets them.
const (
	outcomeDone        = "done"
	outcomeRequeue     = "requeue"
	outcomeRetry       = "retry"
	outcomeTerminal    = "terminal"
	outcomeGaveUp      = "gave_up"
	outcomeInterrupted = "interrupted"

	skipGone       = "gone"
	skipOutOfScope = "outOfScope"
)

type noMetrics struct{}

func (noMetrics) Reconciled(string, time.Duration) {}
func (noMetrics) Panicked()                        {}
func (noMetrics) Skipped(string)                   {}
func (noMetrics) Refetched()                       {}
