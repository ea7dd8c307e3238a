package natsbroker

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/opkit/opkit/trigger"
)

// Pointer is the body of a trigger message: which object to reconcile and,
// optionally, why. It carries no object state; the operator re-fetches the
// object from the API server.
type Pointer struct {
	Namespace string `json:"namespace,omitempty"`
	Name      string `json:"name"`
	Reason    string `json:"reason,omitempty"`
}

// Publish sends one trigger to subject (DefaultSubject when empty) through
// JetStream and waits for the stream to confirm it stored the message, so a
// nil error means the trigger will be delivered. It returns the stream
// sequence number.
func Publish(ctx context.Context, nc *nats.Conn, subject string, p Pointer) (uint64, error) {
	if p.Name == "" {
		return 0, errors.New("natsbroker: publish: the pointer has no name")
	}
	if subject == "" {
		subject = DefaultSubject
	}
	js, err := jetstream.New(nc)
	if err != nil {
		return 0, err
	}
	body, err := json.Marshal(p)
	if err != nil {
		return 0, err
	}
	ack, err := js.Publish(ctx, subject, body)
	if err != nil {
		return 0, &trigger.BrokerError{Kind: Classify(err), Op: "publish", Err: fmt.Errorf("publish to %s: %w", subject, err)}
	}
	return ack.Sequence, nil
}
