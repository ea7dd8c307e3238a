package trigger

import (
	"time"

	"github.com/opkit/opkit/queue"
)

// Metrics receives the counts of a Trigger, of its HTTP handler and of its
// consumers: each of Config, HandlerConfig and ConsumerConfig takes one
// (nil: none), and calls only its own methods. Implementations must be
// safe for concurrent use and must not block.
type Metrics interface {
	// Enqueued: a trigger reached the queue, with the queue's outcome.
	Enqueued(outcome queue.Outcome)
	// Rejected: a trigger was refused for bad input or an ended context.
	Rejected()
	// Request: the handler answered a request with code and the
	// machine-readable reason ("Accepted" for 202), after took.
	Request(code int, reason string, took time.Duration)
	// Received: the consumer took a message from the broker.
	Received()
	// Acked, Nacked and Terminated: the consumer settled a message, for
	// one of the reasons of the package documentation's consumer table.
	Acked(reason string)
	Nacked(reason string)
	Terminated(reason string)
	// Processed: the time from a message's receipt to its settlement.
	Processed(took time.Duration)
	// Lag: the backlog a Lag broker reported.
	Lag(n int64)
	// BrokerError: a broker call failed, of a BrokerError kind ("Unknown"
	// when not classified).
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
