package queue

import (
	"math/rand/v2"
	"slices"
	"testing"
)

// The delay heap across page boundaries: every element comes out in due
// order, filtering keeps exactly the chosen ones, and pages are given back
// as it shrinks.
func TestDelayHeapAcrossPages(t *testing.T) {
	r := rand.New(rand.NewPCG(1, 2))
	for _, n := range []int{0, 1, heapPage - 1, heapPage, heapPage + 1, 3*heapPage + 5} {
		var h delayHeap
		want := make([]int64, 0, n)
		for i := range n {
			due := r.Int64N(1 << 40)
			want = append(want, due)
			h.push(mkDelem(due, int32(i)))
		}
		if h.len() != n {
			t.Fatalf("n=%d: len %d after pushes", n, h.len())
		}
		// drop the odd indices, as compactDelay drops stale elements
		h.filter(func(e delem) bool { return e.idx%2 == 0 })
		kept := want[:0:0]
		for i, d := range want {
			if i%2 == 0 {
				kept = append(kept, d)
			}
		}
		slices.Sort(kept)
		var got []int64
		for h.len() > 0 {
			e := h.pop()
			if e.idx%2 != 0 {
				t.Fatalf("n=%d: filtered element %d came out", n, e.idx)
			}
			got = append(got, e.due())
			if pages := len(h.pages); pages > max(2, (h.len()-1)>>heapPageBits+2) {
				t.Fatalf("n=%d: %d pages held for %d elements", n, pages, h.len())
			}
		}
		if !slices.Equal(got, kept) {
			t.Fatalf("n=%d: popped %d elements out of due order or lost some (want %d)", n, len(got), len(kept))
		}
	}
}

// A heap reset after a burst keeps one page, and works again after it.
func TestDelayHeapReset(t *testing.T) {
	var h delayHeap
	for i := range 2*heapPage + 1 {
		h.push(mkDelem(int64(2*heapPage-i), int32(i)))
	}
	h.reset()
	if h.len() != 0 || len(h.pages) != 1 {
		t.Fatalf("after reset: len %d, %d pages; want 0 and 1", h.len(), len(h.pages))
	}
	for i := range heapPage + 2 {
		h.push(mkDelem(int64(heapPage+2-i), int32(i)))
	}
	for want := int64(1); h.len() > 0; want++ {
		if e := h.pop(); e.due() != want {
			t.Fatalf("popped due %d, want %d", e.due(), want)
		}
	}
}
