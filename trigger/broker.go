package trigger

import (
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

// BrokerErrorKind classifies broker failures, so that the ones someone
// must act on are reported by name: Disconnected (unreachable, or the
// connection dropped), Permission (the credentials may not consume or
// acknowledge), Quota (a limit was hit), NotFound (no such stream, queue
// or consumer), or Unknown (not classified).
type BrokerErrorKind uint8

const (
	BrokerUnknown BrokerErrorKind = iota
	BrokerDisconnected
	BrokerPermission
	BrokerQuota
	BrokerNotFound
)

var brokerErrorKinds = [...]string{"Unknown", "Disconnected", "Permission", "Quota", "NotFound"}

// String returns the kind's name ("Disconnected"), as logs, metrics and
// Check name it.
func (k BrokerErrorKind) String() string {
	if int(k) < len(brokerErrorKinds) {
		return brokerErrorKinds[k]
	}
	return "BrokerErrorKind(?)"
}

// BrokerError is a broker failure as an adapter returns it: its Kind, the
// operation that failed ("receive", "ack", ...) and the adapter's error.
type BrokerError struct {
	Kind BrokerErrorKind
	Op   string
	Err  error
}

// Error returns "broker <op>: <Kind>: <err>".
func (e *BrokerError) Error() string {
	msg := "broker"
	if e.Op != "" {
		msg += " " + e.Op
	}
	msg += ": " + e.Kind.String()
	if e.Err != nil {
		msg += ": " + e.Err.Error()
	}
	return msg
}

// Unwrap returns the underlying error.
func (e *BrokerError) Unwrap() error { return e.Err }

// kindOf returns the kind of the first *BrokerError in err's chain, or
// BrokerUnknown when there is none.
func kindOf(err error) BrokerErrorKind {
	if be, ok := errors.AsType[*BrokerError](err); ok {
		return be.Kind
	}
	return BrokerUnknown
}
