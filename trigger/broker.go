package trigger

import (
	"context"
	"errors"
	"time"
)

// Broker is what the Consumer needs of a message broker. An adapter (for
// example the NATS JetStream one in the reference operator) wraps a durable
// subscription with explicit acknowledgement.
//
// Receive is called from one goroutine at a time; the Message methods may be
// called from the Consumer's handler goroutines concurrently for different
// messages, and exactly one of Ack, Nack or Term is called per message.
type Broker interface {
	// Receive blocks until a message is available, ctx ends (then it
	// returns ctx's error) or the broker fails. Failures should be returned
	// as, or wrap, a *BrokerError so the Consumer can report their kind;
	// the Consumer then retries Receive with backoff, so adapters should
	// reconnect on the next call rather than give up. It returns a message
	// or an error, never both and never neither; a broker that polls loops
	// inside Receive.
	Receive(ctx context.Context) (Message, error)
}

// Message is one delivery of a message.
type Message interface {
	// Data is the message body.
	Data() []byte
	// Deliveries is how many times this message has been delivered,
	// counting this delivery (1 on the first).
	Deliveries() int
	// Ack acknowledges the message: the broker forgets it.
	Ack(ctx context.Context) error
	// Nack hands the message back for redelivery after delay (a broker
	// with a delivery limit may dead-letter it instead: see DeadLetterer).
	Nack(ctx context.Context, delay time.Duration) error
	// Term dead-letters the message: it is never redelivered. reason says
	// why (a Term reason of the package documentation's consumer table).
	Term(ctx context.Context, reason string) error
}

// Progresser is optionally implemented by a Message whose broker
// redelivers what is not acknowledged within a deadline (JetStream's
// AckWait): InProgress pushes that deadline back. The Consumer calls it
// while it waits for a reconcile (ConsumerConfig.AckAfterReconcile).
type Progresser interface {
	InProgress(ctx context.Context) error
}

// Replier is optionally implemented by a Message that may carry a reply
// address (a NATS request's reply subject): Reply publishes data there,
// and does nothing when the message has none. The Consumer replies with
// the reconcile's Outcome as JSON (ConsumerConfig.AckAfterReconcile).
type Replier interface {
	Reply(ctx context.Context, data []byte) error
}

// DeadLetterer is optionally implemented by a Message whose broker
// enforces a delivery limit in Nack: on the last allowed delivery its Nack
// dead-letters the message instead of handing it back. After a Nack that
// returned nil, DeadLettered reports whether it did; the Consumer then
// counts the message as terminated (MaxDeliveries), not nacked, so
// that a trigger that dies this way shows in the metrics. Dead letters a
// broker makes outside a Nack (say, while handing back prefetched
// messages) are the broker's to report.
type DeadLetterer interface {
	DeadLettered() bool
}

// Lag is optionally implemented by a Broker that can report its backlog
// (messages not yet delivered to or acknowledged by this consumer group).
type Lag interface {
	Lag(ctx context.Context) (int64, error)
}

// Releaser is optionally implemented by a Broker that buffers messages
// ahead of Receive (a prefetching pull subscription). The Consumer calls
// Release from its receive goroutine, never while a Receive runs, when it
// pauses (see
// ConsumerConfig.Paused), so that buffered messages go back to the broker
// for a replica that can schedule them at once, instead of waiting out
// their acknowledgement deadline in a paused replica.
type Releaser interface {
	// Release hands every message buffered for Receive back to the broker
	// for redelivery without delay and stops fetching until the next
	// Receive. The messages never reached the Consumer: they are not
	// counted as received or nacked.
	Release(ctx context.Context) error
}

// BrokerErrorKind classifies broker failures, so that permission and quota
// problems are reported by name rather than swallowed.
type BrokerErrorKind uint8

const (
	// BrokerUnknown: not classified by the adapter.
	BrokerUnknown BrokerErrorKind = iota
	// BrokerDisconnected: the broker is unreachable or the connection
	// dropped; the Consumer reconnects with backoff.
	BrokerDisconnected
	// BrokerPermission: the credentials may not consume from (or ack on)
	// the subject/queue.
	BrokerPermission
	// BrokerQuota: a quota or limit of the broker was hit.
	BrokerQuota
	// BrokerNotFound: the stream, queue or consumer does not exist.
	BrokerNotFound
)

var brokerErrorKinds = [...]string{"Unknown", "Disconnected", "Permission", "Quota", "NotFound"}

// String returns the kind's name, as used in logs, metrics and Check.
func (k BrokerErrorKind) String() string {
	if int(k) < len(brokerErrorKinds) {
		return brokerErrorKinds[k]
	}
	return "BrokerErrorKind(?)"
}

// BrokerError is a classified broker failure. Adapters return it (or wrap
// it); the Consumer finds it with errors.As.
type BrokerError struct {
	// Kind classifies the failure.
	Kind BrokerErrorKind
	// Op is the operation that failed ("receive", "ack", "nack", "term", "lag").
	Op string
	// Err is the adapter's underlying error.
	Err error
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
