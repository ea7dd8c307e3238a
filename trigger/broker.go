package trigger

import (
	"cmp"
	"context"
	"errors"
	"time"
)

// Broker is what the Consumer needs of a message broker: a durable
// subscription with explicit acknowledgement (the reference operator's
// adapter is NATS JetStream's). Receive blocks until a message comes, ctx
// ends (it returns ctx's error) or the broker fails (it returns a
// *BrokerError, or wraps one, and is called again after a backoff: it
// should reconnect then). It is called from one goroutine at a time.
type Broker interface {
	Receive(ctx context.Context) (Message, error)
}

// Message is one delivery of a message: its body, and how many times it
// was delivered (1 the first time). The Consumer calls exactly one of Ack
// (the broker forgets it), Nack (redeliver it after delay) or Term
// (dead-letter it, for a reason of the package documentation's consumer
// table), from any goroutine.
type Message interface {
	Data() []byte
	Deliveries() int
	Ack(ctx context.Context) error
	Nack(ctx context.Context, delay time.Duration) error
	Term(ctx context.Context, reason string) error
}

// Progresser is a Message whose broker redelivers what is not
// acknowledged within a deadline (JetStream's AckWait): InProgress pushes
// it back, while the Consumer waits for a reconcile (AckAfterReconcile).
type Progresser interface {
	InProgress(ctx context.Context) error
}

// Replier is a Message that may carry a reply address (a NATS request's):
// Reply publishes data there, or does nothing without one. The Consumer
// replies the reconcile's Outcome as JSON (AckAfterReconcile).
type Replier interface {
	Reply(ctx context.Context, data []byte) error
}

// DeadLetterer is a Message whose broker dead-letters it on a Nack of its
// last allowed delivery: DeadLettered, after a Nack that returned nil,
// reports whether it did, for the Consumer to count it as terminated.
type DeadLetterer interface {
	DeadLettered() bool
}

// Lag is a Broker that can report its backlog: the messages not yet
// delivered to or acknowledged by this consumer group.
type Lag interface {
	Lag(ctx context.Context) (int64, error)
}

// Releaser is a Broker that buffers messages ahead of Receive (a
// prefetching pull subscription). When the Consumer pauses, it calls
// Release (never during a Receive), which hands every buffered message
// back for redelivery at once, uncounted, and fetches no more until the
// next Receive.
type Releaser interface {
	Release(ctx context.Context) error
}

// BrokerError is a broker failure as an adapter returns it (or wraps):
// the operation that failed ("receive", "ack", ...), the adapter's error,
// and its Kind, so that the failures someone must act on are reported by
// name: "Disconnected" (unreachable, or the connection dropped),
// "Permission" (the credentials may not consume or acknowledge), "Quota"
// (a limit was hit), "NotFound" (no such stream, queue or consumer), or
// "" (not classified, reported as "Unknown").
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
