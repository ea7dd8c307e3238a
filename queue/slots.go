// The slab of slots that holds the entries: states, allocation, release.

package queue

import "math"

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
		if q.metrics != nil {
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
