// Package brokertest is an in-memory trigger.Broker for tests of a
// trigger.Consumer and of code built on it. It records what happens to
// each delivery, for the test to assert on:
//
//	b := brokertest.New()
//	id := b.Publish([]byte(`{"namespace": "ns", "name": "a"}`))
//	c, err := trigger.NewConsumer(trigger.ConsumerConfig[*Widget]{Broker: b, Trigger: t})
//	// ... run c, then:
//	evs := b.Events(id) // [{ID: 1, Op: "Ack", Delivery: 1}]
//
// It is a trigger.Lag; its messages are trigger.Progresser, Replier and
// DeadLetterer, and a second Ack, Nack or Term of one fails. A delayed Nack redelivers with time.AfterFunc, which
// follows testing/synctest's clock. It is safe for concurrent use.
package brokertest

import (
	"context"
	"errors"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"github.com/opkit/opkit/trigger"
)

// Event is one thing that happened to a delivery of message ID: its
// settlement (Op "Ack", "Nack" with its Delay, or "Term"), or a call of
// its InProgress or Reply (with its Data). Reason is set on the events
// that dead-lettered the message: a Term's reason, or "MaxDeliveries" on
// a Nack past MaxDeliver.
type Event struct {
	ID       uint64
	Op       string
	Delivery int
	Delay    time.Duration
	Data     []byte
	Reason   string
}

// errSettled is a second Ack, Nack or Term's error.
var errSettled = errors.New("brokertest: delivery already settled")

type state uint8

const (
	ready state = iota
	delayed
	inFlight
	done
)

type entry struct {
	id         uint64
	data       []byte
	deliveries int
	state      state
}

// Broker is an in-memory broker with at-least-once delivery; New makes
// one. Before use, set MaxDeliver to dead-letter a message on a Nack of
// its MaxDeliver-th delivery, and AckWait to redeliver one whose
// settlement failed after that long rather than 30s.
type Broker struct {
	MaxDeliver int
	AckWait    time.Duration

	mu        sync.Mutex
	wake      chan struct{} // closed and replaced when a message becomes ready
	entries   []*entry      // every message published; ids are 1, 2, ...
	queue     []*entry      // ready entries, oldest first
	events    []Event
	recvErr   error
	settleErr error
	lagErr    error
}

var (
	_ trigger.Broker     = (*Broker)(nil)
	_ trigger.Lag        = (*Broker)(nil)
	_ trigger.Progresser = (*message)(nil)
	_ trigger.Replier    = (*message)(nil)
)

// New returns an empty broker.
func New() *Broker {
	return &Broker{wake: make(chan struct{})}
}

// Publish adds a message and returns its id (1, 2, ...).
func (b *Broker) Publish(data []byte) uint64 {
	b.mu.Lock()
	defer b.mu.Unlock()
	e := &entry{id: uint64(len(b.entries) + 1), data: slices.Clone(data)}
	b.entries = append(b.entries, e)
	b.makeReady(e)
	return e.id
}

// makeReady queues e for delivery and wakes up the receivers.
func (b *Broker) makeReady(e *entry) {
	e.state = ready
	b.queue = append(b.queue, e)
	b.wakeUp()
}

func (b *Broker) wakeUp() {
	close(b.wake)
	b.wake = make(chan struct{})
}

// redeliverAfter makes e, in flight, ready again after d (at once if d is
// not positive). Nothing else touches a delayed entry.
func (b *Broker) redeliverAfter(e *entry, d time.Duration) {
	if d <= 0 {
		b.makeReady(e)
		return
	}
	e.state = delayed
	time.AfterFunc(d, func() {
		b.mu.Lock()
		defer b.mu.Unlock()
		b.makeReady(e)
	})
}

// count returns how many entries are in one of the states.
func (b *Broker) count(states ...state) int {
	b.mu.Lock()
	defer b.mu.Unlock()
	n := 0
	for _, e := range b.entries {
		if slices.Contains(states, e.state) {
			n++
		}
	}
	return n
}

// Receive returns the oldest ready message, when there is one.
func (b *Broker) Receive(ctx context.Context) (trigger.Message, error) {
	for {
		b.mu.Lock()
		if b.recvErr != nil {
			err := b.recvErr
			b.mu.Unlock()
			return nil, err
		}
		if len(b.queue) > 0 {
			e := b.queue[0]
			b.queue = b.queue[1:]
			e.state = inFlight
			e.deliveries++
			m := &message{b: b, e: e, delivery: e.deliveries}
			b.mu.Unlock()
			return m, nil
		}
		wake := b.wake
		b.mu.Unlock()
		select {
		case <-ctx.Done():
			return nil, ctx.Err()
		case <-wake:
		}
	}
}

// Lag returns how many messages wait for a delivery.
func (b *Broker) Lag(context.Context) (int64, error) {
	b.mu.Lock()
	err := b.lagErr
	b.mu.Unlock()
	if err != nil {
		return 0, err
	}
	return int64(b.count(ready, delayed)), nil
}

// Fail makes the calls of one kind return err until Fail(call, nil):
// "receive" (a blocked Receive too), "settle" (Ack, Nack and Term: the
// delivery is redelivered after AckWait) or "lag".
func (b *Broker) Fail(call string, err error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	p := map[string]*error{"receive": &b.recvErr, "settle": &b.settleErr, "lag": &b.lagErr}[call]
	if p == nil {
		panic("brokertest: Fail of unknown call " + call)
	}
	*p = err
	b.wakeUp()
}

// Events returns what happened so far, in order: to every message, or to
// those whose ids are given.
func (b *Broker) Events(ids ...uint64) []Event {
	b.mu.Lock()
	defer b.mu.Unlock()
	if len(ids) == 0 {
		return slices.Clone(b.events)
	}
	var evs []Event
	for _, ev := range b.events {
		if slices.Contains(ids, ev.ID) {
			evs = append(evs, ev)
		}
	}
	return evs
}

// Outstanding returns how many messages are neither acknowledged nor
// dead-lettered.
func (b *Broker) Outstanding() int { return b.count(ready, delayed, inFlight) }

// InFlight returns how many deliveries are received but not settled.
func (b *Broker) InFlight() int { return b.count(inFlight) }

type message struct {
	b        *Broker
	e        *entry
	delivery int
	settled  bool        // guarded by b.mu
	dead     atomic.Bool // its Nack dead-lettered it
}

func (m *message) Data() []byte { return slices.Clone(m.e.data) }

// InProgress records the call as an event; it keeps nothing alive, as the
// broker redelivers an unsettled delivery only after a failed settle.
func (m *message) InProgress(ctx context.Context) error {
	m.record(Event{Op: "InProgress"})
	return ctx.Err()
}

// Reply records data as an event: every message has a reply address.
func (m *message) Reply(ctx context.Context, data []byte) error {
	m.record(Event{Op: "Reply", Data: slices.Clone(data)})
	return ctx.Err()
}

// record appends ev, of this delivery, to the events.
func (m *message) record(ev Event) {
	m.b.mu.Lock()
	defer m.b.mu.Unlock()
	ev.ID, ev.Delivery = m.e.id, m.delivery
	m.b.events = append(m.b.events, ev)
}

// DeadLettered reports whether Nack dead-lettered the message (MaxDeliver).
func (m *message) DeadLettered() bool { return m.dead.Load() }
func (m *message) Deliveries() int    { return m.delivery }

// settle runs f on ev, the delivery's settlement, under the lock and
// records it, if the delivery is still open.
func (m *message) settle(ctx context.Context, ev Event, f func(*Event)) error {
	if err := ctx.Err(); err != nil {
		return err
	}
	b := m.b
	b.mu.Lock()
	defer b.mu.Unlock()
	if m.settled {
		return errSettled
	}
	m.settled = true
	if b.settleErr != nil {
		wait := b.AckWait
		if wait <= 0 {
			wait = 30 * time.Second
		}
		b.redeliverAfter(m.e, wait)
		return b.settleErr
	}
	ev.ID, ev.Delivery = m.e.id, m.delivery
	f(&ev)
	b.events = append(b.events, ev)
	return nil
}

func (m *message) Ack(ctx context.Context) error {
	return m.settle(ctx, Event{Op: "Ack"}, func(*Event) { m.e.state = done })
}

func (m *message) Nack(ctx context.Context, delay time.Duration) error {
	return m.settle(ctx, Event{Op: "Nack", Delay: delay}, func(ev *Event) {
		if m.b.MaxDeliver > 0 && m.e.deliveries >= m.b.MaxDeliver {
			m.dead.Store(true)
			m.e.state, ev.Reason = done, "MaxDeliveries"
			return
		}
		m.b.redeliverAfter(m.e, delay)
	})
}

func (m *message) Term(ctx context.Context, reason string) error {
	return m.settle(ctx, Event{Op: "Term", Reason: reason}, func(*Event) { m.e.state = done })
}
