// The intake and the queue's life: Suspend, Resume, Clear and ShutDown.

package queue

import (
	"context"
	"fmt"
)

// Suspend closes the intake: until Resume, every Add returns
// DroppedSuspended and stores nothing. Entries already held stay (use
// Clear to drop them); Get and Done work as usual.
func (q *Queue[K, V]) Suspend() {
	q.mu.Lock()
	q.suspended = true
	q.mu.Unlock()
}

// Resume reopens the intake closed by Suspend.
func (q *Queue[K, V]) Resume() {
	q.mu.Lock()
	q.suspended = false
	q.mu.Unlock()
}

// Suspended reports whether the intake is suspended.
func (q *Queue[K, V]) Suspended() bool {
	q.mu.Lock()
	defer q.mu.Unlock()
	return q.suspended
}

// ShuttingDown reports whether ShutDown or ShutDownWithDrain was called:
// from then on every Add returns DroppedShutDown.
func (q *Queue[K, V]) ShuttingDown() bool {
	q.mu.Lock()
	defer q.mu.Unlock()
	return q.shutdown
}

// Clear removes every pending and parked entry and returns how many it
// removed. In-flight entries are not touched (their Done is still
// expected), but adds parked behind them are removed.
func (q *Queue[K, V]) Clear() int {
	q.mu.Lock()
	defer q.mu.Unlock()
	n := 0
	m := q.metrics
	for _, w := range q.ix.tbl {
		if w == 0 {
			continue
		}
		i := int32(uint32(w)) - 1
		switch s := q.sl(i); s.state() {
		case stIdle:
			continue
		case stInFlight:
			i, s.next = s.next, none // its parked entry goes
			if i == none {
				continue
			}
		}
		if s := q.sl(i); m != nil && s.state() != stParked {
			m.Depth(int(s.prio), -1)
		}
		q.release(i)
		n++
	}
	q.rebuildIndex() // drops the keys whose entries were freed
	for _, l := range q.levels {
		l.ring.reset()
	}
	q.delay.reset()
	q.nReady, q.nDelayed, q.nParked, q.readyStale, q.delayStale = 0, 0, 0, 0, 0
	return n
}

// ShutDown shuts the queue down: every later Add returns DroppedShutDown,
// blocked Gets wake up, and Get hands out the entries already due, then
// returns ErrShutDown without blocking. Entries not yet due at ShutDown
// are never handed out, however long Get is called (a parked entry that
// Done makes pending counts as due if it was due at ShutDown). ShutDown is
// idempotent; the queue owns no goroutine, so none is left behind.
func (q *Queue[K, V]) ShutDown() {
	q.mu.Lock()
	defer q.mu.Unlock()
	if q.shutdown {
		return
	}
	q.shutdown, q.shutAt = true, q.clock()
	for len(q.waiters) > 0 {
		q.wakeAt(0)
	}
}

// ShutDownWithDrain shuts the queue down like ShutDown, then waits until
// every in-flight entry is Done, or ctx ends, in which case it returns an
// error wrapping ctx.Err() (the queue stays shut down). It waits for the
// entries in flight only: due entries still queued (including one parked
// behind an in-flight entry, which its Done makes pending) stay for Get,
// as with ShutDown; a caller that wants them processed keeps calling Get
// until it returns ErrShutDown.
func (q *Queue[K, V]) ShutDownWithDrain(ctx context.Context) error {
	q.ShutDown()
	q.mu.Lock()
	if len(q.inflight) == 0 {
		q.mu.Unlock()
		return nil
	}
	if q.drained == nil {
		q.drained = make(chan struct{})
	}
	ch := q.drained
	q.mu.Unlock()
	select {
	case <-ch:
		return nil
	case <-ctx.Done():
		return fmt.Errorf("queue: drain: %w", ctx.Err())
	}
}
