package reconcile

import "time"

// Metrics receives the controller's measurements from the workers (be
// quick): how each reconcile ended, and took ("done", "requeue", "retry",
// "terminal", "gave_up", or "interrupted": by the end of the term or of
// the drain, not retried); each panic (a failure too); each trigger's
// object not reconciled, as "gone" or "outOfScope" of the watch's
// selector (deletes are never skipped); and each read of an object for
// its turn.
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
