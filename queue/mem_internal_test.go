package queue

import (
	"runtime"
	"testing"
	"time"
	"unsafe"
)

// TestMemoryPerDelayedEntry guards the footprint of a pending delayed
// entry (int key, pointer payload): a 40-byte slot (plus an 8-byte add
// time with timestamps), a 12-byte heap element and an 8-byte index word,
// plus the tables' slack: the slab and the heap grow by whole pages (no
// append slack, no allocation header), the index by doubling (at 100,000
// keys a table of 131,072 words, 10.5 bytes per key). That is about 63
// bytes; the bound has headroom for other Go versions' size classes, and
// the benchmark W3 reports the measured figure.
func TestMemoryPerDelayedEntry(t *testing.T) {
	type payload struct{ n int }
	const n = 100_000
	var before, after runtime.MemStats
	runtime.GC()
	runtime.ReadMemStats(&before)
	q := New[int, *payload](Config[*payload]{})
	p := &payload{}
	for k := range n {
		q.Add(k, p, AddOptions{Delay: time.Hour + time.Duration(k)})
	}
	runtime.GC()
	runtime.ReadMemStats(&after)
	per := float64(int64(after.HeapAlloc)-int64(before.HeapAlloc)) / n
	if size := unsafe.Sizeof(q.pages[0][0]); size != 40 {
		t.Errorf("slot is %d bytes, want 40", size)
	}
	if q.enqs != nil {
		t.Errorf("add times kept without timestamps")
	}
	if per > 72 {
		t.Errorf("%.1f heap bytes per pending delayed entry, want at most 72 (slab %.1f, heap %.1f, index %.1f)",
			per, float64(len(q.pages)*pageSize*40)/n, float64(q.delay.bytes())/n, float64(len(q.ix.tbl)*8)/n)
	}
	runtime.KeepAlive(q)
}

// TestChurnDoesNotAllocate guards the steady state of a queue whose keys
// come and go: a backlog of pending keys stays while new keys are added,
// handed out and finished, so finished keys pile up and are evicted again
// and again. Neither the evictions (which rebuild the key index) nor the
// index's size must cost an allocation once the queue has grown to its
// working size.
func TestChurnDoesNotAllocate(t *testing.T) {
	for _, backlog := range []int{0, 500, 3_000, 6_000} {
		q := New[int, int](Config[int]{})
		for k := range backlog {
			q.Add(k, k, AddOptions{Priority: -1}) // behind every cycle
		}
		next := backlog
		cycle := func() {
			for range 40_000 {
				q.Add(next, next, AddOptions{})
				it, err := q.Get(t.Context())
				if err != nil || it.Key != next {
					t.Fatalf("Get = %v, %v; want key %d", it.Key, err, next)
				}
				q.Done(next)
				next++
			}
		}
		cycle() // grow to the working size
		before := next
		if allocs := testing.AllocsPerRun(5, cycle); allocs != 0 {
			t.Errorf("backlog %d: %.1f allocations per 40,000 cycles of new keys, want 0", backlog, allocs)
		}
		if q.Len() != backlog || next-before < 5*40_000 {
			t.Fatalf("backlog %d: Len = %d after %d cycles", backlog, q.Len(), next-before)
		}
		// Finished keys were evicted: the slab holds the backlog and at
		// most one round of finished keys, not every key ever added.
		if limit := 2*max(backlog, minIdle) + 2*pageSize; int(q.nslots) > limit {
			t.Errorf("backlog %d: %d slots after %d keys, want at most %d", backlog, q.nslots, next, limit)
		}
		// The rebuilt index still finds every pending key.
		for k := range backlog {
			if out := q.Add(k, k, AddOptions{Priority: -1}); out != Merged {
				t.Fatalf("backlog %d: Add of pending key %d = %v, want Merged", backlog, k, out)
			}
		}
	}
}
