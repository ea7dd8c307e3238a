package trigger

import (
	"cmp"
	"context"
	"errors"
	"time"
)

// Broker is a durable subscription with explicit acknowledgement (the
// example operator has NATS JetStream's). Receive, called from one
// goroutine at a time, blocks until a message comes, ctx ends or the
// broker fails (a *BrokerError: it is called again after a backoff).
type Broker interface {
	Receive(ctx context.Context) (Message, error)
}

// Message is one delivery of a message: its body, how many times it was
// delivered (1 the first time). The Consumer calls one of Ack, Nack
// (redeliver after delay) or Term (dead-letter, for a reason of the
// consumer table), from any goroutine.
type Message interface {
	Data() []byte
	Deliveries() int
	Ack(ctx context.Context) error
	Nack(ctx context.Context, delay time.Duration) error
	Term(ctx context.Context, reason string) error
}

// Progresser is a Message whose acknowledgement deadline InProgress
// pushes back (JetStream's AckWait), while AckAfterReconcile waits.
type Progresser interface {
	InProgress(ctx context.Context) error
}

// Replier is a Message that may carry a reply address (a NATS request's)
// for AckAfterReconcile's Outcome, as JSON; without one, Reply does nothing.
type Replier interface {
	Reply(ctx context.Context, data []byte) error
}

// DeadLetterer is a Message that a Nack may dead-letter (its last allowed
// delivery): after the Nack, DeadLettered reports whether it did.
type DeadLetterer interface {
	DeadLettered() bool
}

// Lag is a Broker that reports its backlog (messages not yet delivered or
// acknowledged).
type Lag interface {
	Lag(ctx context.Context) (int64, error)
}

// Releaser is a Broker that buffers messages ahead of Receive: when the
// Consumer pauses, Release (never during a Receive) hands them back for
// redelivery at once, and fetches no more until the next Receive.
type Releaser interface {
	Release(ctx context.Context) error
}

// BrokerError is a broker failure as an adapter returns it: the Op that
// failed ("receive", "ack", ...), the adapter's Err, and its Kind, so that
// logs, metrics and Check name what to act on: "Disconnected", "Permission"
// (to consume or acknowledge), "Quota", "NotFound" (no such stream, queue
// or consumer), or "" (not classified: "Unknown").
type BrokerError struct {
	Kind, Op string
	Err      error
}

// Error returns "broker <op>: <Kind>: <err>".
func (e *BrokerError) Error() string {
	msg := "broker"
	if e.Op != "" {
		msg += " " + e.Op
	}
	msg += ": " + cmp.Or(e.Kind, "Unknown")
	if e.Err != nil {
		msg += ": " + e.Err.Error()
	}
	return msg
}

// Unwrap returns the underlying error.
func (e *BrokerError) Unwrap() error { return e.Err }

// kindOf returns the kind of the first *BrokerError in err's chain, or
// "Unknown" when there is none or it is not classified.
func kindOf(err error) string {
	if be, ok := errors.AsType[*BrokerError](err); ok && be.Kind != "" {
		return be.Kind
	}
	return "Unknown"
}
