package reconcile

import "time"

// Outcome classifies how one reconcile ended, for [Metrics] and logs
// (interrupted: the term or the drain ended; not retried).
type Outcome uint8

// The outcomes.
const (
	OutcomeDone Outcome = iota + 1
	OutcomeRequeue
	OutcomeRetry
	OutcomeTerminal
	OutcomeGaveUp
	OutcomeInterrupted
)

// String returns the outcome's lowercase name, fit for a metric label.
func (o Outcome) String() string {
	if names := [...]string{"unknown", "done", "requeue", "retry", "terminal", "gave_up", "interrupted"}; int(o) < len(names) {
		return names[o]
	}
	return "unknown"
}

// SkipReason says why a trigger's object was not reconciled: it is gone,
// or out of the watch's label selector. Deletes are never skipped.
type SkipReason string

// The skip reasons.
const (
	SkipGone       SkipReason = "gone"
	SkipOutOfScope SkipReason = "outOfScope"
)

// Metrics receives the controller's measurements from the workers (be
// quick): each reconcile, panic (a failure too), object skipped, and read
// of an object for its turn.
type Metrics interface {
	Reconciled(o Outcome, took time.Duration)
	Panicked()
	Skipped(reason SkipReason)
	Refetched()
}

type noMetrics struct{}

func (noMetrics) Reconciled(Outcome, time.Duration) {}
func (noMetrics) Panicked()                         {}
func (noMetrics) Skipped(SkipReason)                {}
func (noMetrics) Refetched()                        {}
