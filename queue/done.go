// Done, and the eviction of finished keys it triggers.

package queue

import (
	"fmt"
	"time"
)

// Done marks the in-flight entry of key as finished. If adds for the key
// were parked meanwhile, their entry becomes pending. Done panics if key
// is not in flight (a missing or repeated Done is a programming error).
func (q *Queue[K, V]) Done(key K) {
	q.mu.Lock()
	// Find the entry and its place in q.inflight. With few entries in
	// flight (about one per worker), comparing their keys is cheaper than
	// hashing the key.
	var i int32 = none
	pos := -1
	if len(q.inflight) <= 8 {
		for j := range q.inflight {
			if f := &q.inflight[j]; f.key == key {
				i, pos = f.idx, j
				break
			}
		}
	} else if x, _ := q.find(key, hashOf(q.ix.seed, key)); x != none && q.sl(x).state() == stInFlight {
		i = x
		for j := range q.inflight {
			if q.inflight[j].idx == x {
				pos = j
				break
			}
		}
	}
	if pos < 0 {
		q.mu.Unlock()
		panic(fmt.Sprintf("queue: Done(%v) of a key that is not in flight", key))
	}
	s := q.sl(i)
	var now int64
	var worked time.Duration
	m := q.metrics
	if m != nil {
		now = q.clock()
		worked = time.Duration(now - s.due)
	}
	// remove from the in-flight list
	last := len(q.inflight) - 1
	q.inflight[pos] = q.inflight[last]
	q.inflight[last] = flight[K]{} // hold no key past its Done
	q.inflight = q.inflight[:last]

	next := s.next
	if next == none {
		// Keep the key mapped to its slot: the next add of a key seen
		// before costs no map write and no allocation.
		var zv V
		s.val = zv
		s.setState(stIdle)
		q.nIdle++
		if q.nIdle > minIdle && q.nIdle > int(q.nslots)-q.nIdle-len(q.free) {
			q.evictIdle()
		}
	} else {
		_, p := q.find(key, hashOf(q.ix.seed, key))
		q.setAt(p, next)
		q.release(i)
		q.nParked--
		if m == nil {
			// A parked entry due before the last clock reading needs no
			// new one, unless delayed entries may have fallen due since
			// (they are promoted first, below).
			if now = q.lastNow; q.sl(next).due > now || q.nDelayed > 0 {
				now = q.clock()
			}
		}
		// The parked entry goes behind what fell due before it.
		if q.nDelayed > 0 && q.promote(now) {
			q.passOn()
		}
		q.schedule(next, q.sl(next), now)
	}
	if q.shutdown && len(q.inflight) == 0 && q.drained != nil {
		close(q.drained)
		q.drained = nil
	}
	q.mu.Unlock()
	if m != nil {
		m.Worked(worked)
	}
}

// minIdle is how many finished keys the queue always may keep mapped; beyond
// it, it keeps at most as many as it holds live entries.
const minIdle = 1024

// evictIdle forgets every finished key. It runs when the finished keys
// outnumber both minIdle and the live entries, so its cost (a pass over
// the key map) is paid for by as many Dones, and the memory held for keys
// no longer in use stays bounded.
func (q *Queue[K, V]) evictIdle() {
	for _, w := range q.ix.tbl {
		if i := int32(uint32(w)) - 1; w != 0 && q.sl(i).state() == stIdle {
			q.release(i)
		}
	}
	q.rebuildIndex()
	q.nIdle = 0
}
