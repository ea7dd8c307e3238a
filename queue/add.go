// Add and its helpers: the intake, the MergeOnly rule, parking and merging.

package queue

import "time"

// Add stores value for key, due after opts.Delay, with opts.Priority. It
// never blocks. If the key already has a pending entry, the add is merged
// into it (see the package documentation); if the key is in flight, the
// add is parked until Done, merged into the add parked before, if any. It
// returns Queued for a new key, Merged for a known one, and
// DroppedSuspended, DroppedShutDown or (with MergeOnly) NotHeld when
// nothing was stored.
func (q *Queue[K, V]) Add(key K, value V, opts AddOptions) Outcome {
	h := hashOf(q.ix.seed, key) // the seed never changes: hash outside the lock
	// A delayed add needs the time; reading it before the lock keeps the
	// clock (about a fifth of such an add) out of the critical section.
	var early int64
	if opts.Delay > 0 {
		early = q.now()
	}
	q.mu.Lock()
	if q.shutdown || q.suspended {
		return q.refuse()
	}
	// The clock is read only when needed: a merge into a due entry, the
	// common case of a burst of events for one object, needs no time, and
	// without Metrics neither does a new entry due now (see addTime).
	var r reading
	if opts.Delay > 0 {
		// Another goroutine may have read a later time meanwhile: the
		// queue's clock never goes back.
		r = reading{now: max(early, q.lastNow), read: true}
		q.lastNow = r.now
	}
	prio := clamp32(opts.Priority)

	head, pos := q.find(key, h)
	hs, at := q.held(head)
	if opts.MergeOnly && !q.mergeOnlyFits(at, opts.Delay, &r) {
		q.mu.Unlock()
		return NotHeld
	}
	if q.nDelayed > 0 && q.touchesReady(at, hs, opts.Delay, prio) {
		q.catchUp(&r)
	}
	out := Merged
	switch {
	case at != none:
		q.mergeInto(at, value, opts.Delay, prio, &r, opts.MergeOnly)
	case hs != nil && hs.state() == stInFlight:
		q.park(hs, key, value, opts.Delay, prio, q.addTime(&r))
	default:
		out = Queued
		now := q.addTime(&r)
		var s *slot[K, V]
		i := head
		if hs != nil {
			// A finished key's slot still holds the key (equal to this one:
			// find compared them): rewriting it would only cost write
			// barriers for a key that holds pointers.
			q.nIdle--
			s = hs
		} else {
			i = q.alloc()
			s = q.sl(i)
			s.key, s.next = key, none
		}
		s.val, s.due, s.prio = value, dueAt(now, opts.Delay), prio
		if q.metrics != nil {
			*q.enq(i) = now
		}
		q.schedule(i, s, now)
		if hs == nil {
			q.insertAt(pos, h, i) // after schedule: a rebuild keeps only slots in use
		}
	}
	q.mu.Unlock()
	if m := q.metrics; m != nil {
		m.Added(int(prio), out != Queued)
	}
	return out
}

// refuse answers an add while the intake is closed, with DroppedShutDown
// or DroppedSuspended. The caller holds q.mu, which refuse releases.
func (q *Queue[K, V]) refuse() Outcome {
	out := DroppedSuspended
	if q.shutdown {
		out = DroppedShutDown
	}
	q.mu.Unlock()
	if m := q.metrics; m != nil {
		m.Dropped(out)
	}
	return out
}

// held returns, for a key whose head slot is head (none if the key is
// unknown), that slot (nil if none) and the held entry an add for the key
// merges into: the pending entry, or the one parked behind the entry in
// flight; none when the add makes a new entry.
func (q *Queue[K, V]) held(head int32) (hs *slot[K, V], at int32) {
	if head == none {
		return nil, none
	}
	switch hs = q.sl(head); hs.state() {
	case stIdle:
		return hs, none
	case stInFlight:
		return hs, hs.next
	}
	return hs, head
}

// mergeOnlyFits reports whether a MergeOnly add may merge into the held
// entry at (none: nothing held): only if at is due no later than the add
// itself (now+delay), as a merge that would make an entry earlier stores
// nothing. A ready entry, or one due by the last clock reading, needs no
// clock reading.
func (q *Queue[K, V]) mergeOnlyFits(at int32, delay time.Duration, r *reading) bool {
	if at == none {
		return false
	}
	s := q.sl(at)
	return s.state() == stReady || s.due <= q.lastNow || s.due <= dueAt(q.at(r), delay)
}

// catchUp makes the delayed entries that fell due since the last Get
// ready, before an add changes the ready entries: first come first served
// counts from when an entry fell due, not from when a Get noticed.
func (q *Queue[K, V]) catchUp(r *reading) {
	if q.promote(q.at(r)) {
		q.passOn()
	}
}

// park stores the first add for a key while it is in flight (its head
// slot is hs), added at now: a parked entry behind it, which becomes
// pending at Done.
func (q *Queue[K, V]) park(hs *slot[K, V], key K, value V, delay time.Duration, prio int32, now int64) {
	i := q.alloc() // slots never move: hs stays valid
	s := q.sl(i)
	s.key, s.val, s.due, s.prio, s.next = key, value, dueAt(now, delay), prio, none
	if q.metrics != nil {
		*q.enq(i) = now
	}
	s.setState(stParked)
	q.nParked++
	hs.next = i
}

// touchesReady reports whether an add may put an entry among the ready
// ones: a new entry (at is none and the key, whose head slot is hs, is
// not in flight) due now; a merge that raises a ready entry's priority
// (it moves to the new priority's end), or one into a delayed entry (it
// may make it due, or raise one already due). A merge into a parked
// entry, or a park, cannot.
func (q *Queue[K, V]) touchesReady(at int32, hs *slot[K, V], delay time.Duration, prio int32) bool {
	if at == none {
		return delay <= 0 && (hs == nil || hs.state() != stInFlight)
	}
	switch s := q.sl(at); s.state() {
	case stReady:
		return prio > s.prio
	case stDelayed:
		return true
	}
	return false
}

// mergeInto merges an add into the held (pending or parked) entry t;
// keepDue (a MergeOnly add, which Add let through only if t is due no
// later than itself) leaves its due time alone. The clock is read (into
// r) only when the merge needs it.
func (q *Queue[K, V]) mergeInto(t int32, value V, delay time.Duration, prio int32, r *reading, keepDue bool) {
	s := q.sl(t)
	if q.merge != nil {
		q.merge(&s.val, value)
	}
	// The incoming due time is now+delay. It matters only if it may be
	// earlier than the held one, which an entry already due never is;
	// when it is earlier, r has been read.
	due := s.due
	if !keepDue && s.state() != stReady && (delay > 0 || s.due > q.lastNow) {
		due = dueAt(q.at(r), delay)
	}
	// A ready entry keeps its due time.
	if prio <= s.prio && (due >= s.due || s.state() == stReady) {
		return // nothing to merge: the common case of a burst of adds
	}
	oldPrio := s.prio
	if prio > s.prio {
		s.prio = prio
	}
	switch s.state() {
	case stParked:
		if due < s.due {
			s.due = due
		}
	case stReady:
		if s.prio != oldPrio {
			q.readyStale++
			q.pushReady(t, s)
			// A Get that did not qualify for the old priority may for
			// the new one.
			q.wakeFor(s.prio)
		}
	case stDelayed:
		if due < s.due {
			s.due = due
			q.delayStale++
			if due <= r.now {
				q.nDelayed--
				q.nReady++
				q.pushReady(t, s)
				q.wakeFor(s.prio)
			} else {
				q.pushDelayed(t, s)
				q.rearm(r.now)
			}
		}
	}
	if s.prio != oldPrio && (s.state() == stReady || s.state() == stDelayed) {
		if m := q.metrics; m != nil {
			m.Depth(int(oldPrio), -1)
			m.Depth(int(s.prio), 1)
		}
	}
}
