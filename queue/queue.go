package queue

import (
	"context"
	"fmt"
	"math"
	"sync"
	"time"
)

// Config configures a [Queue]. The zero value is valid and means defaults:
// the payload of a key's first add stays, no metrics.
type Config[V any] struct {
	// Merge joins the payload of an add into the payload held for its key
	// (pending, or parked behind an in-flight entry), in place. It must be
	// a join: commutative, associative and idempotent, so that the payload
	// handed out does not depend on the order in which the adds arrived
	// (earliest, highest, union, or: never "newest"). The queue itself
	// merges due times (earliest) and priorities (highest) the same way.
	// nil keeps the held payload: for payloads that carry nothing a
	// merge could lose (struct{}, say). It is called with the queue's
	// lock held: it must be quick and must not call the queue.
	Merge func(held *V, incoming V)

	// Metrics receives the queue's measurements. nil means none, at no cost
	// on the hot path: no call, and no clock read for them.
	Metrics Metrics
}

// entry states.
const (
	stFree uint8 = iota
	stReady
	stDelayed
	stInFlight
	stParked
	stIdle // finished; the key stays mapped to the slot so the next add reuses it
)

// none marks the absence of a slot index.
const none int32 = -1

// slot is one entry of the queue, stored by value in the pages of a slab
// and referred to by its index, so that the structures pointing at it (the
// key map, the ready rings, the delay heap) hold no pointers, and slots
// are reused without allocating.
type slot[K comparable, V any] struct {
	key K
	val V
	// due is when the entry is (or was) due, in nanoseconds since the
	// queue's epoch. While the entry is in flight it holds the hand-out
	// time instead (only when metrics are on).
	due  int64
	prio int32
	// meta is the state (low 3 bits) and a generation bumped by every
	// state change (see setState). Ring elements record the meta of their
	// insertion; once it changes they are stale. (The generation wraps
	// after 2^29 changes; a stale element that survived that long and
	// matched again could only serve a due entry from a lower priority
	// ring once, never twice: taking an entry changes its state.)
	meta uint32
	// next is, for an entry in flight, the parked entry that takes its
	// place at Done (none if no add came meanwhile). A key holds at most
	// one pending entry, or one in flight and one parked.
	next int32
}

func (s *slot[K, V]) state() uint8 { return uint8(s.meta & 7) }

// setState changes the state and the generation, leaving every ring or
// heap element that refers to the slot stale.
func (s *slot[K, V]) setState(st uint8) { s.meta = (s.meta>>3+1)<<3 | uint32(st) }

// pageBits sets the slab's page size: slots are allocated 1,024 at a time
// and never move, so growing the slab copies nothing. A page of slots that
// hold pointers is a large object to the runtime (above 32 KiB), sized in
// whole 8 KiB pages with no per-object header; a page of 256 slots of 40
// bytes would get an 8-byte header and be rounded up to the next size
// class, wasting 6 % of the slab.
const (
	pageBits = 10
	pageSize = 1 << pageBits
)

// Queue is a keyed, deduplicating priority/delay work queue with a
// suspendable intake. Create one with [New]; all methods are safe for
// concurrent use. See the package documentation for its guarantees.
type Queue[K comparable, V any] struct {
	mu      sync.Mutex
	merge   func(held *V, incoming V)
	metrics Metrics
	stamps  bool // with Metrics: adds read the clock, for the queue latency
	epoch   time.Time

	ix     keyIndex // key -> its entry (the one in flight, if any)
	pages  [][]slot[K, V]
	enqs   [][]int64 // add times, parallel to pages, only with Metrics
	nslots int32     // slots handed out by alloc so far (free ones included)
	free   []int32

	levels     []*level // ready entries, highest priority first
	levelCap   int      // prune empty levels when there are this many
	nReady     int
	readyStale int // stale elements left in the rings
	delay      delayHeap
	delayStale int // stale elements left in the delay heap
	nDelayed   int
	nParked    int
	inflight   []flight[K]
	nIdle      int   // slots in state stIdle
	lastNow    int64 // the last clock reading: the current time is no earlier

	waiters  []*waiter // Gets blocked, oldest first
	spare    []*waiter
	owner    *waiter // the waiter whose timer is armed for the earliest due time
	ownerDue int64

	suspended bool
	shutdown  bool
	shutAt    int64         // the clock at ShutDown: entries due later are never handed out
	drained   chan struct{} // closed when the last in-flight entry is Done after shutdown
}

// flight is an entry in flight: its slot, and its key, which Done compares
// without a trip to the slab.
type flight[K comparable] struct {
	key K
	idx int32
}

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

// New returns an empty queue configured by cfg. It starts no goroutine.
func New[K comparable, V any](cfg Config[V]) *Queue[K, V] {
	return &Queue[K, V]{
		merge:   cfg.Merge,
		metrics: cfg.Metrics,
		stamps:  cfg.Metrics != nil,
		epoch:   time.Now(),
		ix:      newKeyIndex(),
	}
}

var (
	_ Adder[string, int]  = (*Queue[string, int])(nil)
	_ Getter[string, int] = (*Queue[string, int])(nil)
	_ Gate                = (*Queue[string, int])(nil)
)

// now returns the queue's clock: monotonic nanoseconds since New.
func (q *Queue[K, V]) now() int64 { return int64(time.Since(q.epoch)) }

// clock returns now and remembers it as a lower bound of the current time;
// the caller holds q.mu.
func (q *Queue[K, V]) clock() int64 {
	n := q.now()
	q.lastNow = n
	return n
}

// dueAt returns now+delay, saturating; delay <= 0 means now.
func dueAt(now int64, delay time.Duration) int64 {
	if delay <= 0 {
		return now
	}
	if due := now + int64(delay); due >= now {
		return due
	}
	return math.MaxInt64
}

// addTime is the add time of an entry due now: the clock with Metrics,
// else the last clock reading, which is no later than now (so the entry
// is due) and keeps due times in order; it is never reported.
func (q *Queue[K, V]) addTime() int64 {
	if q.stamps {
		return q.clock()
	}
	return q.lastNow
}

func clamp32(v int) int32 {
	if v > math.MaxInt32 {
		return math.MaxInt32
	}
	if v < math.MinInt32 {
		return math.MinInt32
	}
	return int32(v)
}

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
	var now int64
	haveNow := false
	if opts.Delay > 0 {
		// Another goroutine may have read a later time meanwhile: the
		// queue's clock never goes back.
		now, haveNow = max(early, q.lastNow), true
		q.lastNow = now
	}
	prio := clamp32(opts.Priority)

	head, pos := q.find(key, h)
	hs, at := q.held(head)
	if opts.MergeOnly {
		var fits bool
		if now, haveNow, fits = q.mergeOnlyFits(at, opts.Delay, now, haveNow); !fits {
			q.mu.Unlock()
			return NotHeld
		}
	}
	if q.nDelayed > 0 && q.touchesReady(at, hs, opts.Delay, prio) {
		now, haveNow = q.catchUp(now, haveNow), true
	}
	out := Merged
	switch {
	case at != none:
		q.mergeInto(at, value, opts.Delay, prio, now, haveNow, opts.MergeOnly)
	case hs != nil && hs.state() == stInFlight:
		q.park(hs, key, value, opts.Delay, prio, now, haveNow)
	default:
		out = Queued
		if !haveNow {
			now = q.addTime()
		}
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
		if q.stamps {
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
// clock; otherwise it is read, and returned with haveNow like Add keeps
// them.
func (q *Queue[K, V]) mergeOnlyFits(at int32, delay time.Duration, now int64, haveNow bool) (int64, bool, bool) {
	if at == none {
		return now, haveNow, false
	}
	if s := q.sl(at); s.state() != stReady && s.due > q.lastNow {
		if !haveNow {
			now, haveNow = q.clock(), true
		}
		if s.due > dueAt(now, delay) {
			return now, haveNow, false
		}
	}
	return now, haveNow, true
}

// catchUp makes the delayed entries that fell due since the last Get
// ready, before an add changes the ready entries: first come first served
// counts from when an entry fell due, not from when a Get noticed. It
// returns the clock: now if haveNow, else a new reading.
func (q *Queue[K, V]) catchUp(now int64, haveNow bool) int64 {
	if !haveNow {
		now = q.clock()
	}
	if q.promote(now) {
		q.passOn()
	}
	return now
}

// park stores the first add for a key while it is in flight (its head
// slot is hs): a parked entry behind it, which becomes pending at Done.
// now is the clock if haveNow.
func (q *Queue[K, V]) park(hs *slot[K, V], key K, value V, delay time.Duration, prio int32, now int64, haveNow bool) {
	if !haveNow {
		now = q.addTime()
	}
	i := q.alloc() // slots never move: hs stays valid
	s := q.sl(i)
	s.key, s.val, s.due, s.prio, s.next = key, value, dueAt(now, delay), prio, none
	if q.stamps {
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
// later than itself) leaves its due time alone. now is the clock if
// haveNow, else it is read only when the merge needs it.
func (q *Queue[K, V]) mergeInto(t int32, value V, delay time.Duration, prio int32, now int64, haveNow, keepDue bool) {
	s := q.sl(t)
	if q.merge != nil {
		q.merge(&s.val, value)
	}
	// The incoming due time is now+delay. It matters only if it may be
	// earlier than the held one, which an entry already due never is.
	var due int64
	if !keepDue && s.state() != stReady && (delay > 0 || s.due > q.lastNow) {
		if !haveNow {
			now = q.clock()
		}
		due = dueAt(now, delay)
	} else {
		due = s.due
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
			if due <= now {
				q.nDelayed--
				q.nReady++
				q.pushReady(t, s)
				q.wakeFor(s.prio)
			} else {
				q.pushDelayed(t, s)
				q.rearm(now)
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

// sl returns slot i.
func (q *Queue[K, V]) sl(i int32) *slot[K, V] { return &q.pages[i>>pageBits][i&(pageSize-1)] }

// enq returns the add time of slot i: when the earliest add merged into
// its entry was accepted. It exists only with Metrics.
func (q *Queue[K, V]) enq(i int32) *int64 { return &q.enqs[i>>pageBits][i&(pageSize-1)] }

// alloc returns a free slot index, growing the slab by a page if needed.
func (q *Queue[K, V]) alloc() int32 {
	if n := len(q.free); n > 0 {
		i := q.free[n-1]
		q.free = q.free[:n-1]
		return i
	}
	if q.nslots >= math.MaxInt32-pageSize {
		panic("queue: too many entries")
	}
	if int(q.nslots) == len(q.pages)*pageSize {
		q.pages = append(q.pages, make([]slot[K, V], pageSize))
		if q.stamps {
			q.enqs = append(q.enqs, make([]int64, pageSize))
		}
	}
	q.nslots++
	return q.nslots - 1
}

// release returns slot i to the free list, dropping its key and payload so
// the garbage collector can reclaim what they point to.
func (q *Queue[K, V]) release(i int32) {
	s := q.sl(i)
	var zk K
	var zv V
	s.key, s.val, s.next = zk, zv, none
	s.setState(stFree)
	q.free = append(q.free, i)
}

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
	if q.delayStale > 64 && q.delayStale > q.nDelayed {
		q.compactDelay()
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

func (q *Queue[K, V]) compactDelay() {
	q.delay.filter(q.validDelayed)
	q.delayStale = 0
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

// take hands out the first ready entry of the highest priority. The caller
// made sure nReady > 0.
func (q *Queue[K, V]) take(now int64, it *Item[K, V]) {
	for _, l := range q.levels {
		for l.ring.n > 0 {
			e := l.ring.pop()
			s := q.sl(e.idx)
			if s.meta != e.meta { // stale
				q.readyStale--
				continue
			}
			it.Key, it.Value, it.Priority = s.key, s.val, int(s.prio)
			q.nReady--
			s.setState(stInFlight)
			q.inflight = append(q.inflight, flight[K]{s.key, e.idx})
			if m := q.metrics; m != nil {
				m.Depth(int(s.prio), -1)
				m.Waited(int(s.prio), time.Duration(now-*q.enq(e.idx)))
				s.due = now
			}
			return
		}
	}
	panic("queue: internal error: no ready entry")
}

// topReady returns the priority of the first ready entry, dropping stale
// ring heads on the way; ok is false if no entry is ready.
func (q *Queue[K, V]) topReady() (prio int32, ok bool) {
	if q.nReady == 0 {
		return 0, false
	}
	for _, l := range q.levels {
		for l.ring.n > 0 {
			e := l.ring.buf[l.ring.head]
			if q.valid(e.idx, e.meta) {
				return l.prio, true
			}
			l.ring.pop()
			q.readyStale--
		}
	}
	return 0, false
}

// readyAtLeast reports whether the first ready entry has priority min or
// higher.
func (q *Queue[K, V]) readyAtLeast(min int32) bool {
	top, ok := q.topReady()
	return ok && top >= min
}

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
	copy(q.waiters[i:], q.waiters[i+1:])
	q.waiters[len(q.waiters)-1] = nil
	q.waiters = q.waiters[:len(q.waiters)-1]
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
	if p, ok := q.topReady(); ok {
		q.wakeFor(p)
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
	for i, x := range q.waiters {
		if x == w {
			copy(q.waiters[i:], q.waiters[i+1:])
			q.waiters[len(q.waiters)-1] = nil
			q.waiters = q.waiters[:len(q.waiters)-1]
			break
		}
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
			// A plain Get takes whatever is first; a GetAtLeast looks at
			// the first entry's priority before.
			if min == anyPriority || q.readyAtLeast(min) {
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
	q.rebuildIndex(len(q.ix.tbl))
	q.nIdle = 0
}

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
	q.rebuildIndex(len(q.ix.tbl)) // drops the keys whose entries were freed
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

// Stats is a snapshot of the queue, for gauges sampled by an exporter
// (unfinished work and longest running are not pushed to Metrics, so that
// no goroutine is needed to update them).
type Stats struct {
	// Ready, Delayed and Parked count held entries: due, not yet due, and
	// waiting behind an entry of the same key. InFlight counts entries
	// handed out and not yet Done.
	Ready, Delayed, Parked, InFlight int
	// LongestRunning is how long the oldest in-flight entry has been in
	// flight; UnfinishedWork is the sum over all in-flight entries. Hand-out
	// times are recorded only when Config.Metrics is set; without it both
	// are zero.
	LongestRunning, UnfinishedWork time.Duration
	// Suspended and ShutDown report the state of the intake.
	Suspended, ShutDown bool
}

// Stats returns a snapshot of the queue. It costs O(entries in flight).
func (q *Queue[K, V]) Stats() Stats {
	q.mu.Lock()
	defer q.mu.Unlock()
	st := Stats{
		Ready: q.nReady, Delayed: q.nDelayed, Parked: q.nParked, InFlight: len(q.inflight),
		Suspended: q.suspended, ShutDown: q.shutdown,
	}
	if q.metrics != nil && len(q.inflight) > 0 {
		now := q.clock()
		for _, f := range q.inflight {
			d := time.Duration(now - q.sl(f.idx).due)
			st.UnfinishedWork += d
			st.LongestRunning = max(st.LongestRunning, d)
		}
	}
	return st
}

// Len returns the number of entries held and not in flight: pending (due
// or delayed) and parked.
func (q *Queue[K, V]) Len() int {
	q.mu.Lock()
	defer q.mu.Unlock()
	return q.nReady + q.nDelayed + q.nParked
}
