package queue

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

// delayHeap is a binary min-heap of delems by due time, stored in pages of
// heapPage elements, so that growing it never copies, wastes at most one
// page, and gives pages back as it shrinks. Pages are arrays, so indexing
// within one needs no bounds check.
type delayHeap struct {
	pages []*[heapPage]delem
	n     int
}

const (
	heapPageBits = 10
	heapPage     = 1 << heapPageBits // 12 KiB of 12-byte elements: a size class of its own
)

func (h *delayHeap) len() int { return h.n }

// at returns element i < h.n.
func (h *delayHeap) at(i int) *delem { return &h.pages[i>>heapPageBits][i&(heapPage-1)] }

// top returns the earliest element. The heap must not be empty (callers
// check len first): an emptied heap keeps its first page, so top would
// return a stale element rather than panic.
func (h *delayHeap) top() delem { return h.pages[0][0] }

func (h *delayHeap) push(e delem) {
	if h.n>>heapPageBits == len(h.pages) {
		h.pages = append(h.pages, new([heapPage]delem))
	}
	*h.at(h.n) = e
	h.n++
	h.up(h.n - 1)
}

func (h *delayHeap) pop() delem {
	e := h.top()
	h.n--
	if h.n > 0 {
		*h.at(0) = *h.at(h.n)
		h.down(0)
	}
	h.trim()
	return e
}

// trim frees the pages beyond the one after the last page in use, so
// that a heap that grew in a burst shrinks back, without thrashing when it
// hovers at a page boundary.
func (h *delayHeap) trim() {
	keep := 2
	if h.n > heapPage {
		keep = (h.n-1)>>heapPageBits + 2
	}
	if len(h.pages) > keep {
		clear(h.pages[keep:])
		h.pages = h.pages[:keep]
	}
}

// reset empties the heap, keeping only its first page.
func (h *delayHeap) reset() {
	h.n = 0
	if len(h.pages) > 1 {
		clear(h.pages[1:])
		h.pages = h.pages[:1]
	}
}

// filter keeps the elements for which keep returns true and restores the
// heap order.
func (h *delayHeap) filter(keep func(delem) bool) {
	j := 0
	for i := range h.n {
		if e := *h.at(i); keep(e) {
			*h.at(j) = e
			j++
		}
	}
	h.n = j
	for i := h.n/2 - 1; i >= 0; i-- {
		h.down(i)
	}
	h.trim()
}

func (h *delayHeap) up(i int) {
	e := *h.at(i)
	for i > 0 {
		p := (i - 1) / 2
		pe := h.at(p)
		if pe.due() <= e.due() {
			break
		}
		*h.at(i) = *pe
		i = p
	}
	*h.at(i) = e
}

func (h *delayHeap) down(i int) {
	n := h.n
	e := *h.at(i)
	for {
		c := 2*i + 1
		if c >= n {
			break
		}
		ce := h.at(c)
		if r := c + 1; r < n {
			if re := h.at(r); re.due() < ce.due() {
				c, ce = r, re
			}
		}
		if e.due() <= ce.due() {
			break
		}
		*h.at(i) = *ce
		i = c
	}
	*h.at(i) = e
}

// bytes returns the memory held by the heap's pages.
func (h *delayHeap) bytes() int {
	n := 0
	for _, p := range h.pages {
		n += len(p) * 12
	}
	return n
}
