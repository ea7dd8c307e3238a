package queue

import (
	"math/rand/v2"
	"slices"
	"testing"
)

// The delay heap: every element comes out in due order, filtering keeps
// exactly the chosen ones, and memory is given back as it shrinks.
func TestDelayHeap(t *testing.T) {
	r := rand.New(rand.NewPCG(1, 2))
	for _, n := range []int{0, 1, 1023, 1024, 1025, 3*1024 + 5} {
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
		// drop the odd indices, as pushDelayed drops stale elements
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
			if c := cap(h.e); c > 1024 && c > 8*h.len() {
				t.Fatalf("n=%d: room for %d elements held for %d", n, c, h.len())
			}
		}
		if !slices.Equal(got, kept) {
			t.Fatalf("n=%d: popped %d elements out of due order or lost some (want %d)", n, len(got), len(kept))
		}
	}
}

// A heap reset after a burst gives its memory back, and works again after it.
func TestDelayHeapReset(t *testing.T) {
	var h delayHeap
	for i := range 2*1024 + 1 {
		h.push(mkDelem(int64(2*1024-i), int32(i)))
	}
	h.reset()
	if h.len() != 0 || cap(h.e) > 1024 {
		t.Fatalf("after reset: len %d, room for %d; want 0 and at most 1,024", h.len(), cap(h.e))
	}
	for i := range 1024 + 2 {
		h.push(mkDelem(int64(1024+2-i), int32(i)))
	}
	for want := int64(1); h.len() > 0; want++ {
		if e := h.pop(); e.due() != want {
			t.Fatalf("popped due %d, want %d", e.due(), want)
		}
	}
}
