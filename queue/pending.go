// The pending entries: the ready rings by priority, the delay heap, promotion.

package queue

// schedule makes entry i pending: ready if due, delayed otherwise. After
// shutdown, "due" means due at ShutDown.
func (q *Queue[K, V]) schedule(i int32, s *slot[K, V], now int64) {
	if q.shutdown {
		now = min(now, q.shutAt)
	}
	if m := q.metrics; m != nil {
		m.Depth(int(s.prio), 1)
	}
	if s.due <= now {
		q.nReady++
		q.pushReady(i, s)
		q.wakeFor(s.prio)
		return
	}
	q.nDelayed++
	q.pushDelayed(i, s)
	q.rearm(now)
}

// pushReady makes entry i (slot s) ready, at the end of its priority's ring.
func (q *Queue[K, V]) pushReady(i int32, s *slot[K, V]) {
	s.setState(stReady)
	q.levelFor(s.prio).ring.push(elem{idx: i, meta: s.meta})
	if q.readyStale > 64 && q.readyStale > q.nReady {
		q.compactReady()
	}
}

// pushDelayed makes entry i (slot s) delayed, in the heap at its due time.
func (q *Queue[K, V]) pushDelayed(i int32, s *slot[K, V]) {
	s.setState(stDelayed)
	q.delay.push(mkDelem(s.due, i))
	// Stale elements are dropped once they outnumber the valid ones.
	if q.delayStale > 64 && q.delayStale > q.nDelayed {
		q.delay.filter(q.validDelayed)
		q.delayStale = 0
	}
}

// levelFor returns the ready level of priority p, creating it if needed.
func (q *Queue[K, V]) levelFor(p int32) *level {
	i := 0
	for ; i < len(q.levels); i++ {
		l := q.levels[i]
		if l.prio == p {
			return l
		}
		if l.prio < p {
			break
		}
	}
	if len(q.levels) >= max(q.levelCap, minLevelCap) {
		// Drop empty levels, and let the list grow to twice what is left
		// before trying again, so that many priorities in use at once do
		// not make every new level pay for a pass.
		q.pruneLevels()
		q.levelCap = 2 * len(q.levels)
		return q.levelFor(p) // p is not there: this call inserts it
	}
	l := &level{prio: p}
	q.levels = append(q.levels, nil)
	copy(q.levels[i+1:], q.levels[i:])
	q.levels[i] = l
	return l
}

// minLevelCap is the number of priority levels (empty ones included) the
// queue keeps before it drops empty ones.
const minLevelCap = 32

func (q *Queue[K, V]) pruneLevels() {
	kept := q.levels[:0]
	for _, l := range q.levels {
		if l.ring.n > 0 {
			kept = append(kept, l)
		}
	}
	clear(q.levels[len(kept):])
	q.levels = kept
}

// valid reports whether a ring or heap element still refers to its slot
// as inserted.
func (q *Queue[K, V]) valid(idx int32, meta uint32) bool { return q.sl(idx).meta == meta }

// validDelayed reports whether a delay heap element still stands for its
// slot.
func (q *Queue[K, V]) validDelayed(e delem) bool {
	s := q.sl(e.idx)
	return s.state() == stDelayed && s.due == e.due()
}

func (q *Queue[K, V]) compactReady() {
	for _, l := range q.levels {
		r := &l.ring
		n := r.n
		for range n {
			e := r.pop()
			if q.valid(e.idx, e.meta) {
				r.push(e)
			}
		}
	}
	q.readyStale = 0
}

// promote moves the delayed entries due at now (at the shutdown time,
// after ShutDown) to the ready rings, in due order, and reports whether it
// moved any.
func (q *Queue[K, V]) promote(now int64) (promoted bool) {
	if q.shutdown {
		now = min(now, q.shutAt)
	}
	for q.delay.len() > 0 && q.delay.top().due() <= now {
		e := q.delay.pop()
		if !q.validDelayed(e) {
			q.delayStale--
			continue
		}
		q.nDelayed--
		q.nReady++
		q.pushReady(e.idx, q.sl(e.idx))
		promoted = true
	}
	return promoted
}

// earliest returns the due time of the earliest delayed entry, dropping
// stale heap tops on the way.
func (q *Queue[K, V]) earliest() (int64, bool) {
	for q.delay.len() > 0 {
		e := q.delay.top()
		if q.validDelayed(e) {
			return e.due(), true
		}
		q.delay.pop()
		q.delayStale--
	}
	return 0, false
}

// first returns the level whose ring starts with the first ready entry
// (the highest priority's), dropping stale ring heads on the way; nil if
// no entry is ready.
func (q *Queue[K, V]) first() *level {
	if q.nReady == 0 {
		return nil
	}
	for _, l := range q.levels {
		for l.ring.n > 0 {
			e := l.ring.buf[l.ring.head]
			if q.valid(e.idx, e.meta) {
				return l
			}
			l.ring.pop()
			q.readyStale--
		}
	}
	return nil
}
