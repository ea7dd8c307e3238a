package natsbroker

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
)

// An asynchronous permission error explains the timeouts that follow it,
// until a delivery shows the consumer works again.
func TestAnOldAsyncErrorStopsExplainingTimeoutsAfterADelivery(t *testing.T) {
	s, err := StartEmbedded(EmbeddedConfig{})
	if err != nil {
		t.Fatal(err)
	}
	defer s.Shutdown()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	b, err := Open(ctx, Config{URL: s.URL()})
	if err != nil {
		t.Fatal(err)
	}
	defer b.Close()

	b.asyncMu.Lock()
	b.lastAsync = errors.New(`nats: permissions violation for subscription to "demo.reconcile"`)
	b.asyncMu.Unlock()
	if got := b.classify(nats.ErrTimeout); got != "Permission" {
		t.Fatalf("timeout after a permission violation classified %v, want Permission", got)
	}
	if _, err := Publish(ctx, b.Conn(), "", Pointer{Namespace: "ns", Name: "a"}); err != nil {
		t.Fatal(err)
	}
	m, err := b.Receive(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if err := m.Ack(ctx); err != nil {
		t.Fatal(err)
	}
	if got := b.classify(nats.ErrTimeout); got == "Permission" {
		t.Fatalf("timeout after a delivery still classified Permission")
	}
}
