package trigger

import (
	"time"

	"github.com/opkit/opkit/queue"
)

// Metrics receives the counts of a Trigger (Enqueued, Rejected), its
// handler (Request, with the Status reason, or "Accepted") and its
// consumers (the others; the reasons are the consumer table's). Each
// config calls only its own; they must be safe for concurrent use.
type Metrics interface {
	Enqueued(outcome queue.Outcome)
	Rejected()
	Request(code int, reason string, took time.Duration)
	Received()
	Acked(reason string)
	Nacked(reason string)
	Terminated(reason string)
	Processed(took time.Duration)
	Lag(n int64)
	BrokerError(kind string)
}

// nopMetrics discards every count: it stands in for a nil Metrics.
type nopMetrics struct{}

func (nopMetrics) Enqueued(queue.Outcome)             {}
func (nopMetrics) Rejected()                          {}
func (nopMetrics) Request(int, string, time.Duration) {}
func (nopMetrics) Received()                          {}
func (nopMetrics) Acked(string)                       {}
func (nopMetrics) Nacked(string)                      {}
func (nopMetrics) Terminated(string)                  {}
func (nopMetrics) Processed(time.Duration)            {}
func (nopMetrics) Lag(int64)                          {}
func (nopMetrics) BrokerError(string)                 {}
