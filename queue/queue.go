// The Queue type, its configuration, New, and the queue's clock.

package queue

import (
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

// Queue is a keyed, deduplicating priority/delay work queue with a
// suspendable intake. Create one with [New]; all methods are safe for
// concurrent use. See the package documentation for its guarantees.
type Queue[K comparable, V any] struct {
	mu      sync.Mutex
	merge   func(held *V, incoming V)
	metrics Metrics
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

// New returns an empty queue configured by cfg. It starts no goroutine.
func New[K comparable, V any](cfg Config[V]) *Queue[K, V] {
	return &Queue[K, V]{
		merge:   cfg.Merge,
		metrics: cfg.Metrics,
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

// reading is the clock as an add has read it, if it has (read): an add
// reads the clock at most once, and only when it needs the time.
type reading struct {
	now  int64
	read bool
}

// at returns r's time, reading the clock if r has not been read yet.
func (q *Queue[K, V]) at(r *reading) int64 {
	if !r.read {
		r.now, r.read = q.clock(), true
	}
	return r.now
}

// addTime is the add time of a new entry: r's time if it was read, else
// the clock with Metrics, else the last clock reading, which is no later
// than now (so an entry due now is due) and keeps due times in order; it
// is never reported.
func (q *Queue[K, V]) addTime(r *reading) int64 {
	if r.read || q.metrics != nil {
		return q.at(r)
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
