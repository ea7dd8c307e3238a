package natsbroker

import (
	"bytes"
	"cmp"
	"context"
	"encoding/json"
	"errors"
	"fmt"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/opkit/opkit"
	"github.com/opkit/opkit/trigger"
)

// Pointer is the body of a trigger message: which object to reconcile and,
// optionally, why. It carries no object state; the operator re-fetches the
// object from the API server.
type Pointer struct {
	// Namespace is the object's namespace; empty for a cluster-scoped one.
	Namespace string `json:"namespace,omitempty"`
	// Name is the object's name (required).
	Name string `json:"name"`
	// Reason is why the reconcile is asked for (optional; logs, Events).
	Reason string `json:"reason,omitempty"`
}

// ErrInvalidPointer wraps Publish's errors for a pointer the trigger
// consumer would refuse (dead-letter) rather than deliver.
var ErrInvalidPointer = errors.New("natsbroker: invalid trigger pointer")

// Publish sends one trigger to subject (DefaultSubject when empty) through
// JetStream and waits for the stream to confirm it stored the message, so a
// nil error means the trigger will be delivered. It returns the stream
// sequence number. A pointer the consumer would refuse (see
// trigger.Pointer.Check) is not sent: the error wraps ErrInvalidPointer. Any other
// pointer fits in the consumer's default message limit (8 KiB,
// trigger.ConsumerConfig.MaxMessageBytes).
func Publish(ctx context.Context, nc *nats.Conn, subject string, p Pointer) (uint64, error) {
	return publish(ctx, nc, subject, p, "")
}

// Request publishes a trigger as Publish does, asking for the outcome of
// the reconcile it causes (HeaderReplyTo names a new inbox), and waits
// for the answer until ctx ends. The consumer answers once the reconcile
// ran when it acknowledges after the reconcile
// (trigger.ConsumerConfig.AckAfterReconcile); otherwise no answer comes
// and Request returns ctx's error. A trigger that is redelivered (the
// operator was changing leaders, say) is answered by the delivery that
// ran the reconcile.
func Request(ctx context.Context, nc *nats.Conn, subject string, p Pointer) (trigger.Outcome, error) {
	inbox := nc.NewInbox()
	sub, err := nc.SubscribeSync(inbox)
	if err != nil {
		return trigger.Outcome{}, &trigger.BrokerError{Kind: Classify(err), Op: "subscribe", Err: err}
	}
	defer func() { _ = sub.Unsubscribe() }()
	if _, err := publish(ctx, nc, subject, p, inbox); err != nil {
		return trigger.Outcome{}, err
	}
	msg, err := sub.NextMsgWithContext(ctx)
	if err != nil {
		return trigger.Outcome{}, fmt.Errorf("waiting for the outcome of the trigger of %s/%s: %w", p.Namespace, p.Name, err)
	}
	var out trigger.Outcome
	if err := json.Unmarshal(msg.Data, &out); err != nil {
		return trigger.Outcome{}, fmt.Errorf("the outcome of the trigger of %s/%s: %w", p.Namespace, p.Name, err)
	}
	return out, nil
}

// publish checks and encodes p and publishes it to subject
// (DefaultSubject when empty) through JetStream, with HeaderReplyTo set
// to replyTo unless it is empty.
func publish(ctx context.Context, nc *nats.Conn, subject string, p Pointer, replyTo string) (uint64, error) {
	body, err := encodePointer(p)
	if err != nil {
		return 0, err
	}
	subject = cmp.Or(subject, DefaultSubject)
	js, err := jetstream.New(nc)
	if err != nil {
		return 0, err
	}
	msg := &nats.Msg{Subject: subject, Data: body}
	if replyTo != "" {
		msg.Header = nats.Header{HeaderReplyTo: []string{replyTo}}
	}
	ack, err := js.PublishMsg(ctx, msg)
	if err != nil {
		return 0, &trigger.BrokerError{Kind: Classify(err), Op: "publish", Err: fmt.Errorf("publish to %s: %w", subject, err)}
	}
	return ack.Sequence, nil
}

// encodePointer checks p as the trigger consumer will and returns its JSON
// body, without HTML escaping (which would blow "<" up to six bytes).
func encodePointer(p Pointer) ([]byte, error) {
	if err := (trigger.Pointer{Key: opkit.Key{Namespace: p.Namespace, Name: p.Name}, Reason: p.Reason}).Check(); err != nil {
		return nil, fmt.Errorf("%w: %w", ErrInvalidPointer, err)
	}
	var buf bytes.Buffer
	enc := json.NewEncoder(&buf)
	enc.SetEscapeHTML(false)
	if err := enc.Encode(p); err != nil {
		return nil, err
	}
	return bytes.TrimSuffix(buf.Bytes(), []byte("\n")), nil
}
