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
