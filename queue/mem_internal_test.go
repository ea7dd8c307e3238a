package queue

import (
	"runtime"
	"testing"
	"time"
	"unsafe"
)

type pl struct{ n int }

func TestMemBreakdown(t *testing.T) {
	var before, after runtime.MemStats
	runtime.GC()
	runtime.ReadMemStats(&before)
	q := New[int, *pl](Config[*pl]{})
	p := &pl{}
	for k := range 100_000 {
		q.Add(k, p, AddOptions{Delay: time.Hour + time.Duration(k)})
	}
	runtime.GC()
	runtime.ReadMemStats(&after)
	n := 100_000.0
	t.Logf("total %.1f B/item; slots %d x %d = %.1f; delay cap %d = %.1f; free %d",
		float64(after.HeapAlloc-before.HeapAlloc)/n, len(q.pages)*pageSize, unsafe.Sizeof(q.pages[0][0]),
		float64(len(q.pages)*pageSize)*float64(unsafe.Sizeof(q.pages[0][0]))/n, cap(q.delay), float64(cap(q.delay))*16/n, cap(q.free))
	runtime.KeepAlive(q)
}
