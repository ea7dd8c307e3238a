// Package brokertest is an in-memory message broker implementing
// trigger.Broker and trigger.Lag (its messages trigger.DeadLetterer), for
// tests of trigger.Consumer and of code built on it. It records every ack,
// nack and term so that tests can assert what happened to each message.
//
// A Broker owns no goroutines of its own; a delayed Nack schedules the
// redelivery with time.AfterFunc (so it follows testing/synctest's fake
// clock inside a bubble). All methods are safe for concurrent use.
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

// Op is what happened to a delivery.
type Op string

const (
	// OpAck: the delivery was acknowledged.
	OpAck Op = "Ack"
	// OpNack: the delivery was handed back for redelivery.
	OpNack Op = "Nack"
	// OpTerm: the message was dead-lettered.
	OpTerm Op = "Term"
)

// Event records the settlement of one delivery.
type Event struct {
	// ID is the message's id (from Publish).
	ID uint64
	// Op is Ack, Nack or Term.
	Op Op
	// Delivery is the delivery count of the settled delivery.
	Delivery int
	// Delay is the Nack delay.
	Delay time.Duration
	// Reason is the Term reason.
	Reason string
}

// DeadLetter is a terminated message.
type DeadLetter struct {
	// ID is the message's id, as Publish returned it.
	ID uint64
	// Data is the message body.
	Data []byte
	// Reason is the reason given to Term, or "MaxDeliveries" for
	// a Nack past MaxDeliver.
	Reason string
}

// ErrSettled is returned by a second Ack, Nack or Term of one delivery.
var ErrSettled = errors.New("brokertest: delivery already settled")

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
	request    bool     // published with PublishRequest: it takes replies
	replies    [][]byte // what Reply sent
	progress   int      // InProgress calls
}

// Broker is an in-memory broker with at-least-once delivery. The zero value
// is not usable; call New.
type Broker struct {
	// MaxDeliver, when positive, dead-letters a message (reason
	// "MaxDeliveries") when a Nack would exceed this many
	// deliveries, and its Message reports it (trigger.DeadLetterer). Set it
	// before use.
	MaxDeliver int
	// AckWait is how long a delivery whose Ack, Nack or Term failed (see
	// FailSettle) stays in flight before it is redelivered, as a real
	// broker's ack deadline would; zero means 30s. Set it before use.
	AckWait time.Duration

	mu        sync.Mutex
	wake      chan struct{} // closed and replaced when a message becomes ready
	entries   []*entry      // every message published; ids are 1, 2, ...
	queue     []*entry      // ready entries, oldest first
	events    []Event
	dead      []DeadLetter
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

// PublishRequest is Publish of a message with a reply address: its
// deliveries' Reply is recorded (Replies).
func (b *Broker) PublishRequest(data []byte) uint64 {
	id := b.Publish(data)
	b.mu.Lock()
	b.entries[id-1].request = true
	b.mu.Unlock()
	return id
}

// Replies returns what the deliveries of message id replied, in order.
func (b *Broker) Replies(id uint64) [][]byte {
	b.mu.Lock()
	defer b.mu.Unlock()
	return slices.Clone(b.entries[id-1].replies)
}

// Progress returns how often the deliveries of message id called
// InProgress.
func (b *Broker) Progress(id uint64) int {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.entries[id-1].progress
}

// Receive returns the oldest ready message, blocking until there is one or
// ctx ends. While FailReceive holds an error, it returns that error.
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

// Lag returns how many messages wait for delivery (ready or delayed).
func (b *Broker) Lag(context.Context) (int64, error) {
	b.mu.Lock()
	err := b.lagErr
	b.mu.Unlock()
	if err != nil {
		return 0, err
	}
	return int64(b.count(ready, delayed)), nil
}

// FailReceive makes every Receive return err until FailReceive(nil). A
// receiver blocked in Receive is woken up to see the error.
func (b *Broker) FailReceive(err error) { b.fail(&b.recvErr, err) }

// FailSettle makes every Ack, Nack and Term return err until
// FailSettle(nil); the delivery is redelivered after AckWait, as a broker
// would after its ack deadline.
func (b *Broker) FailSettle(err error) { b.fail(&b.settleErr, err) }

// FailLag makes Lag return err until FailLag(nil).
func (b *Broker) FailLag(err error) { b.fail(&b.lagErr, err) }

// fail sets one of the injected errors and wakes up blocked receivers.
func (b *Broker) fail(p *error, err error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	*p = err
	b.wakeUp()
}

// Events returns the settlements so far, in order.
func (b *Broker) Events() []Event {
	b.mu.Lock()
	defer b.mu.Unlock()
	return slices.Clone(b.events)
}

// EventsFor returns the settlements of message id, in order.
func (b *Broker) EventsFor(id uint64) []Event {
	return slices.DeleteFunc(b.Events(), func(ev Event) bool { return ev.ID != id })
}

// DeadLetters returns the terminated messages, in order.
func (b *Broker) DeadLetters() []DeadLetter {
	b.mu.Lock()
	defer b.mu.Unlock()
	return slices.Clone(b.dead)
}

// Outstanding returns how many published messages are neither acked nor
// dead-lettered (ready, delayed or in flight).
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

// InProgress counts the call (Progress); it keeps nothing alive, as the
// broker redelivers an unsettled delivery only after a failed settle.
func (m *message) InProgress(ctx context.Context) error {
	m.b.mu.Lock()
	defer m.b.mu.Unlock()
	m.e.progress++
	return ctx.Err()
}

// Reply records data for a message published with PublishRequest, and
// does nothing for one without a reply address.
func (m *message) Reply(ctx context.Context, data []byte) error {
	m.b.mu.Lock()
	defer m.b.mu.Unlock()
	if m.e.request {
		m.e.replies = append(m.e.replies, slices.Clone(data))
	}
	return ctx.Err()
}

// DeadLettered reports whether Nack dead-lettered the message (MaxDeliver).
func (m *message) DeadLettered() bool { return m.dead.Load() }
func (m *message) Deliveries() int    { return m.delivery }

// settle records ev (the delivery's settlement) and runs f under the lock
// if the delivery is still open.
func (m *message) settle(ctx context.Context, ev Event, f func()) error {
	if err := ctx.Err(); err != nil {
		return err
	}
	b := m.b
	b.mu.Lock()
	defer b.mu.Unlock()
	if m.settled {
		return ErrSettled
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
	b.events = append(b.events, ev)
	f()
	return nil
}

func (m *message) Ack(ctx context.Context) error {
	return m.settle(ctx, Event{Op: OpAck}, func() { m.e.state = done })
}

func (m *message) Nack(ctx context.Context, delay time.Duration) error {
	return m.settle(ctx, Event{Op: OpNack, Delay: delay}, func() {
		if m.b.MaxDeliver > 0 && m.e.deliveries >= m.b.MaxDeliver {
			m.dead.Store(true)
			m.deadLetter("MaxDeliveries")
			return
		}
		m.b.redeliverAfter(m.e, delay)
	})
}

func (m *message) Term(ctx context.Context, reason string) error {
	return m.settle(ctx, Event{Op: OpTerm, Reason: reason}, func() { m.deadLetter(reason) })
}

// deadLetter moves the message to the dead letters; b.mu is held.
func (m *message) deadLetter(reason string) {
	m.e.state = done
	m.b.dead = append(m.b.dead, DeadLetter{ID: m.e.id, Data: slices.Clone(m.e.data), Reason: reason})
}
