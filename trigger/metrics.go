package trigger

import (
	"time"

	"github.com/opkit/opkit/queue"
)

// Metrics receives a Trigger's counts. Implementations must be safe for
// concurrent use and must not block. A nil Metrics in a Config means none.
type Metrics interface {
	// Enqueued is called once per trigger that reached the queue, with the
	// queue's outcome (Queued, Merged, DroppedSuspended, DroppedShutDown).
	Enqueued(outcome queue.Outcome)
	// Rejected is called once per trigger refused for bad input or an
	// ended context (nothing reached the queue).
	Rejected()
}

// HandlerMetrics receives the HTTP handler's counts. Implementations must be
// safe for concurrent use and must not block. nil means none.
type HandlerMetrics interface {
	// Request is called once per request with the status code written,
	// the machine-readable reason of the answer ("Accepted" for 202) and
	// how long the handler took.
	Request(code int, reason string, took time.Duration)
}

// ConsumerMetrics receives a Consumer's counts. Implementations must be
// safe for concurrent use and must not block. nil means none.
type ConsumerMetrics interface {
	// Received: one message came from the broker.
	Received()
	// Acked: a message was acknowledged (scheduled, or its object is gone).
	Acked(reason AckReason)
	// Nacked: a message was handed back for redelivery.
	Nacked(reason NackReason)
	// Terminated: a message was dead-lettered.
	Terminated(reason TermReason)
	// Processed: the time from receipt to ack/nack/term of one message.
	Processed(took time.Duration)
	// Lag: the broker's backlog as last reported (only for brokers that
	// implement [Lag]).
	Lag(n int64)
	// BrokerError: a broker call failed, classified by kind.
	BrokerError(kind BrokerErrorKind)
}

// nopMetrics discards every count: it stands in for a nil Metrics,
// HandlerMetrics or ConsumerMetrics.
type nopMetrics struct{}

func (nopMetrics) Enqueued(queue.Outcome)             {}
func (nopMetrics) Rejected()                          {}
func (nopMetrics) Request(int, string, time.Duration) {}
func (nopMetrics) Received()                          {}
func (nopMetrics) Acked(AckReason)                    {}
func (nopMetrics) Nacked(NackReason)                  {}
func (nopMetrics) Terminated(TermReason)              {}
func (nopMetrics) Processed(time.Duration)            {}
func (nopMetrics) Lag(int64)                          {}
func (nopMetrics) BrokerError(BrokerErrorKind)        {}
