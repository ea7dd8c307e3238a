// Get and GetAtLeast: handing out due entries, blocking until one is due.

package queue

import (
	"context"
	"time"
)

// Get blocks until an entry is due and returns it, highest priority first
// and first come first served within a priority. The caller must pass the
// item's key to [Queue.Done] when it has finished with it; until then no
// other Get returns that key.
//
// Get returns ctx.Err() if ctx ends first (an entry that is due may still
// be returned when ctx is already done), and [ErrShutDown] once the queue
// is shut down and no entry is due; after shutdown Get never blocks.
func (q *Queue[K, V]) Get(ctx context.Context) (it Item[K, V], err error) {
	q.mu.Lock()
	if q.nReady > 0 && q.nDelayed == 0 {
		// The common case, spelled out here rather than through get: an
		// entry is ready and none is delayed, so there is nothing to
		// promote, no timer to rearm, and no clock to read without metrics.
		// take fills the result in place (an Item is ten words).
		var now int64
		if q.metrics != nil {
			now = q.clock()
		}
		q.take(now, &it)
		if q.nReady > 0 && len(q.waiters) > 0 {
			q.passOn()
		}
		q.mu.Unlock()
		return it, nil
	}
	return q.get(ctx, anyPriority)
}

// GetAtLeast is [Queue.Get] restricted to entries of priority minPriority
// or higher: it blocks until such an entry is due and returns it, and
// leaves entries of lower priority to other Gets. It gives the same
// guarantees as Get (one holder per key until Done, nothing before its due
// time, highest priority first and first come first served within a
// priority, ctx and shutdown handling) and costs the same, plus one step
// per priority level skipped. minPriority is clamped to the int32 range
// like [AddOptions.Priority].
//
// It serves a reserved lane: a consumer that only calls GetAtLeast with the
// priority of urgent entries is free for them whatever the backlog below
// keeps the other consumers busy with. A blocked GetAtLeast is woken only
// for entries it takes, so it never holds up a plain Get.
func (q *Queue[K, V]) GetAtLeast(ctx context.Context, minPriority int) (Item[K, V], error) {
	q.mu.Lock()
	return q.get(ctx, clamp32(minPriority))
}

// get is Get and GetAtLeast; the caller holds q.mu, which get releases.
func (q *Queue[K, V]) get(ctx context.Context, min int32) (Item[K, V], error) {
	var w *waiter
	for {
		var now int64
		haveNow := q.nDelayed > 0 || q.metrics != nil
		if haveNow {
			now = q.clock()
			if q.nDelayed > 0 {
				q.promote(now)
			}
		}
		if q.nReady > 0 {
			// A plain Get takes whatever is first (every priority is at
			// least anyPriority); a GetAtLeast only an entry at min or above.
			if q.first().prio >= min {
				var it Item[K, V]
				q.take(now, &it)
				if w != nil {
					q.spare = append(q.spare, w)
				}
				if q.nReady > 0 {
					q.passOn()
				}
				q.rearm(now)
				q.mu.Unlock()
				return it, nil
			}
			// Only entries below min are ready, maybe promoted just now:
			// they are for other Gets.
			q.passOn()
		}
		if q.shutdown {
			if w != nil {
				q.spare = append(q.spare, w)
			}
			q.mu.Unlock()
			return Item[K, V]{}, ErrShutDown
		}
		if w == nil {
			w = q.newWaiter(min)
		}
		q.waiters = append(q.waiters, w)
		if q.nDelayed > 0 {
			if !haveNow {
				now = q.clock()
			}
			q.rearm(now)
		}
		q.mu.Unlock()

		select {
		case <-w.ch:
		case <-w.timer.C:
		case <-ctx.Done():
			q.mu.Lock()
			if q.leave(w) && q.nReady > 0 {
				q.passOn() // pass on the wake-up meant for us
			}
			if q.nDelayed > 0 {
				q.rearm(q.clock())
			}
			q.spare = append(q.spare, w)
			q.mu.Unlock()
			return Item[K, V]{}, ctx.Err()
		}
		q.mu.Lock()
		q.leave(w)
	}
}

// take hands out the first ready entry of the highest priority. The caller
// made sure nReady > 0.
func (q *Queue[K, V]) take(now int64, it *Item[K, V]) {
	e := q.first().ring.pop()
	s := q.sl(e.idx)
	it.Key, it.Value, it.Priority = s.key, s.val, int(s.prio)
	q.nReady--
	s.setState(stInFlight)
	q.inflight = append(q.inflight, flight[K]{s.key, e.idx})
	if m := q.metrics; m != nil {
		m.Depth(int(s.prio), -1)
		m.Waited(int(s.prio), time.Duration(now-*q.enq(e.idx)))
		s.due = now
	}
}
