// The blocked Gets: their registration, wake-ups and the one delay timer.

package queue

import (
	"math"
	"slices"
	"time"
)

// waiter is a blocked Get. ch receives at most one wake-up per
// registration; timer is armed only while the waiter owns the delay timer.
// min is the lowest priority the Get takes (anyPriority for Get).
type waiter struct {
	ch    chan struct{}
	timer *time.Timer
	min   int32
}

// anyPriority is the min of a plain Get: every entry qualifies.
const anyPriority int32 = math.MinInt32

// wakeFor wakes the oldest blocked Get that takes entries of priority
// prio, if any. Gets that would not take such an entry are left alone, so
// that a GetAtLeast never consumes a wake-up a plain Get needs.
func (q *Queue[K, V]) wakeFor(prio int32) {
	for i, w := range q.waiters {
		if w.min <= prio {
			q.wakeAt(i)
			return
		}
	}
}

// wakeAt removes waiter i from the blocked Gets and wakes it.
func (q *Queue[K, V]) wakeAt(i int) {
	w := q.waiters[i]
	q.waiters = slices.Delete(q.waiters, i, i+1)
	select {
	case w.ch <- struct{}{}:
	default:
	}
}

// passOn wakes the oldest blocked Get that takes the first ready entry, if
// both exist. It is called when a Get leaves entries ready behind it: after
// taking one, after promoting delayed entries it does not take itself, or
// when it gives up a wake-up. A Get that takes the first ready entry takes
// any other too, so no entry is left ready while a Get that would take it
// is blocked without a wake-up on its way.
func (q *Queue[K, V]) passOn() {
	if len(q.waiters) == 0 {
		return
	}
	if l := q.first(); l != nil {
		q.wakeFor(l.prio)
	}
}

// rearm makes sure that, while some Get is blocked and an entry is
// delayed, one blocked Get (the owner) has its timer armed for the
// earliest due time. There is no other timer and no goroutine: the owner
// wakes at the due time and takes the entry itself.
func (q *Queue[K, V]) rearm(now int64) {
	if len(q.waiters) == 0 || q.nDelayed == 0 {
		return
	}
	due, ok := q.earliest()
	if !ok {
		return
	}
	if q.owner == nil {
		q.owner = q.waiters[0]
	} else if due >= q.ownerDue {
		return
	}
	q.ownerDue = due
	q.owner.timer.Reset(time.Duration(due - now))
}

// leave unregisters w after it woke up, for whatever reason. It reports
// whether w had been sent a wake-up.
func (q *Queue[K, V]) leave(w *waiter) (signalled bool) {
	if i := slices.Index(q.waiters, w); i >= 0 {
		q.waiters = slices.Delete(q.waiters, i, i+1)
	}
	if q.owner == w {
		q.owner = nil
		w.timer.Stop()
	}
	select {
	case <-w.ch:
		return true
	default:
		return false
	}
}

func (q *Queue[K, V]) newWaiter(min int32) *waiter {
	if n := len(q.spare); n > 0 {
		w := q.spare[n-1]
		q.spare = q.spare[:n-1]
		w.min = min
		return w
	}
	t := time.NewTimer(time.Hour)
	t.Stop()
	return &waiter{ch: make(chan struct{}, 1), timer: t, min: min}
}
