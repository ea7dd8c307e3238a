package brokertest_test

import (
	"context"
	"errors"
	"testing"
	"testing/synctest"
	"time"

	"github.com/opkit/opkit/trigger"
	"github.com/opkit/opkit/trigger/brokertest"
)

func receive(t *testing.T, b *brokertest.Broker) trigger.Message {
	t.Helper()
	m, err := b.Receive(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	return m
}

func TestDeliveryOrderAckAndDoubleSettle(t *testing.T) {
	b := brokertest.New()
	b.Publish([]byte("one"))
	b.Publish([]byte("two"))
	m1, m2 := receive(t, b), receive(t, b)
	if string(m1.Data()) != "one" || string(m2.Data()) != "two" || m1.Deliveries() != 1 {
		t.Fatalf("got %q %q deliveries %d", m1.Data(), m2.Data(), m1.Deliveries())
	}
	if b.InFlight() != 2 {
		t.Errorf("in flight = %d", b.InFlight())
	}
	ctx := context.Background()
	if err := m1.Ack(ctx); err != nil {
		t.Fatal(err)
	}
	if err := m1.Nack(ctx, 0); !errors.Is(err, brokertest.ErrSettled) {
		t.Errorf("second settle = %v, want ErrSettled", err)
	}
	if err := m2.Term(ctx, "Malformed"); err != nil {
		t.Fatal(err)
	}
	if b.Outstanding() != 0 {
		t.Errorf("outstanding = %d", b.Outstanding())
	}
	evs := b.Events()
	if len(evs) != 2 || evs[0].Op != "Ack" || evs[0].ID != 1 || evs[0].Reason != "" || evs[1].Op != "Term" || evs[1].ID != 2 || evs[1].Reason != "Malformed" {
		t.Errorf("events = %+v, want message 1 acked, and 2 (two) dead-lettered as Malformed", evs)
	}
}

func TestNackRedeliversAfterTheDelay(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		b := brokertest.New()
		b.Publish([]byte("x"))
		m := receive(t, b)
		if err := m.Nack(context.Background(), 5*time.Second); err != nil {
			t.Fatal(err)
		}
		if n, _ := b.Lag(context.Background()); n != 1 {
			t.Errorf("lag = %d, want 1 (delayed)", n)
		}
		start := time.Now()
		m = receive(t, b)
		if d := time.Since(start); d != 5*time.Second || m.Deliveries() != 2 {
			t.Errorf("redelivered after %v with deliveries %d, want 5s and 2", d, m.Deliveries())
		}
	})
}

func TestMaxDeliverDeadLetters(t *testing.T) {
	b := brokertest.New()
	b.MaxDeliver = 2
	b.Publish([]byte("x"))
	ctx := context.Background()
	_ = receive(t, b).Nack(ctx, 0)
	_ = receive(t, b).Nack(ctx, 0)
	if evs := b.Events(); len(evs) != 2 || evs[0].Reason != "" || evs[1].Op != "Nack" || evs[1].Reason != "MaxDeliveries" || b.Outstanding() != 0 {
		t.Errorf("events %+v outstanding %d, want the second Nack to dead-letter the message", evs, b.Outstanding())
	}
}

func TestFailuresAreInjectable(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		b := brokertest.New()
		errc := make(chan error)
		go func() {
			_, err := b.Receive(context.Background())
			errc <- err
		}()
		synctest.Wait() // blocked: nothing published
		boom := &trigger.BrokerError{Kind: "Quota"}
		b.Fail("receive", boom)
		if err := <-errc; !errors.Is(err, boom) {
			t.Fatalf("blocked Receive returned %v, want the injected error", err)
		}
		b.Fail("receive", nil)
		b.Publish([]byte("x"))
		m := receive(t, b)
		b.Fail("settle", boom)
		if err := m.Ack(context.Background()); !errors.Is(err, boom) {
			t.Fatalf("Ack = %v", err)
		}
		b.Fail("settle", nil)
		b.Fail("lag", boom)
		if _, err := b.Lag(context.Background()); !errors.Is(err, boom) {
			t.Errorf("Lag = %v", err)
		}
		start := time.Now()
		m = receive(t, b) // redelivered after the default AckWait
		if time.Since(start) != 30*time.Second || m.Deliveries() != 2 || len(b.Events()) != 0 {
			t.Errorf("redelivery after %v, deliveries %d, events %v", time.Since(start), m.Deliveries(), b.Events())
		}
		ctx, cancel := context.WithCancel(context.Background())
		cancel()
		if _, err := b.Receive(ctx); !errors.Is(err, context.Canceled) {
			t.Errorf("Receive on a done ctx = %v", err)
		}
	})
}
