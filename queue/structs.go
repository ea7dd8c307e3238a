package queue

import "slices"

// The containers behind the queue: a FIFO ring per priority level for due
// entries, and a binary min-heap keyed by due time for delayed ones. Both
// hold small pointer-free elements (a slot index and the slot's meta word
// when inserted); an element whose meta no longer matches its slot is stale
// and skipped, which lets a merge move an entry without searching for it.

// elem refers to a slot of the queue as it was when inserted.
type elem struct {
	idx  int32
	meta uint32
}

// level is the FIFO of due entries of one priority.
type level struct {
	prio int32
	ring ring
}

// ring is a growable circular FIFO of elems.
type ring struct {
	buf  []elem // len is a power of two (or zero)
	head int
	n    int
}

func (r *ring) push(e elem) {
	if r.n == len(r.buf) {
		r.grow()
	}
	r.buf[(r.head+r.n)&(len(r.buf)-1)] = e
	r.n++
}

func (r *ring) pop() elem {
	e := r.buf[r.head]
	r.head = (r.head + 1) & (len(r.buf) - 1)
	r.n--
	return e
}

func (r *ring) grow() {
	size := 2 * len(r.buf)
	if size == 0 {
		size = 16
	}
	buf := make([]elem, size)
	for i := range r.n {
		buf[i] = r.buf[(r.head+i)&(len(r.buf)-1)]
	}
	r.buf, r.head = buf, 0
}

func (r *ring) reset() { r.head, r.n = 0, 0 }

// delem is an element of the delay heap: a due time (split in two words
// so that the element takes 12 bytes, not 16) and a slot index. It is
// valid while its slot is delayed with that due time; an element equal to
// the valid one is harmless, as they are interchangeable.
type delem struct {
	hi, lo uint32
	idx    int32
}

func mkDelem(due int64, idx int32) delem {
	return delem{hi: uint32(uint64(due) >> 32), lo: uint32(due), idx: idx}
}

func (e delem) due() int64 { return int64(uint64(e.hi)<<32 | uint64(e.lo)) }

// delayHeap is a binary min-heap of delems by due time. It gives memory
// back as it shrinks: below a quarter of its capacity, past 1,024 elements,
// it moves to a slice half the size.
type delayHeap struct{ e []delem }

func (h *delayHeap) len() int { return len(h.e) }

// top returns the earliest element; the heap must not be empty.
func (h *delayHeap) top() delem { return h.e[0] }

func (h *delayHeap) push(e delem) {
	h.e = append(h.e, e)
	h.up(len(h.e) - 1)
}

func (h *delayHeap) pop() delem {
	e, n := h.e[0], len(h.e)-1
	h.e[0] = h.e[n]
	h.e = h.e[:n]
	if n > 0 {
		h.down(0)
	}
	if c := cap(h.e); c > 1024 && n < c/4 {
		h.e = append(make([]delem, 0, c/2), h.e...)
	}
	return e
}

// reset empties the heap, keeping its memory if it is small.
func (h *delayHeap) reset() {
	if cap(h.e) > 1024 {
		h.e = nil
	}
	h.e = h.e[:0]
}

// filter keeps the elements for which keep returns true and restores the
// heap order.
func (h *delayHeap) filter(keep func(delem) bool) {
	h.e = slices.DeleteFunc(h.e, func(e delem) bool { return !keep(e) })
	for i := len(h.e)/2 - 1; i >= 0; i-- {
		h.down(i)
	}
}

func (h *delayHeap) up(i int) {
	e := h.e[i]
	for i > 0 {
		p := (i - 1) / 2
		if h.e[p].due() <= e.due() {
			break
		}
		h.e[i] = h.e[p]
		i = p
	}
	h.e[i] = e
}

func (h *delayHeap) down(i int) {
	n, e := len(h.e), h.e[i]
	for {
		c := 2*i + 1
		if c >= n {
			break
		}
		if r := c + 1; r < n && h.e[r].due() < h.e[c].due() {
			c = r
		}
		if e.due() <= h.e[c].due() {
			break
		}
		h.e[i] = h.e[c]
		i = c
	}
	h.e[i] = e
}

// bytes returns the memory held by the heap.
func (h *delayHeap) bytes() int { return cap(h.e) * 12 }
