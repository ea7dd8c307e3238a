package queue

import "hash/maphash"

// keyIndex maps each key the queue holds to the first slot of its chain.
// It is an open-addressing table with linear probing whose words hold a
// 32-bit hash of the key (high half) and the slot index + 1 (low half;
// 0 marks an empty word). The key itself lives only in the slot, so an
// entry costs the queue 8 bytes here at a load factor of at most 4/5
// (a Go map would cost about three times that). Keys are never removed one
// at a time; Clear and the eviction of finished keys rebuild the table.
type keyIndex struct {
	tbl  []uint64 // len is a power of two
	n    int
	seed maphash.Seed
}

const minIndex = 16

func newKeyIndex() keyIndex {
	return keyIndex{tbl: make([]uint64, minIndex), seed: maphash.MakeSeed()}
}

func hashOf[K comparable](seed maphash.Seed, key K) uint32 {
	return uint32(maphash.Comparable(seed, key))
}

// find returns the slot mapped to key (hash h) and the position of its
// word, or none and the position of the empty word where it would go.
func (q *Queue[K, V]) find(key K, h uint32) (int32, int) {
	t := q.ix.tbl
	mask := len(t) - 1
	for p := int(h) & mask; ; p = (p + 1) & mask {
		w := t[p]
		if w == 0 {
			return none, p
		}
		if uint32(w>>32) == h {
			if i := int32(uint32(w)) - 1; q.sl(i).key == key {
				return i, p
			}
		}
	}
}

// insertAt maps the key of hash h to slot i, at the empty position p that
// find returned.
func (q *Queue[K, V]) insertAt(p int, h uint32, i int32) {
	q.ix.tbl[p] = uint64(h)<<32 | uint64(uint32(i+1))
	q.ix.n++
	if q.ix.n*5 > len(q.ix.tbl)*4 {
		q.ix.resize(2 * len(q.ix.tbl))
	}
}

// resize moves every word to a new table of the given size (a power of
// two, with room for them all): insertAt doubles the table, rebuildIndex
// shrinks it. Every word maps a slot in use (Done remaps a key before it
// frees a slot; evictions and Clear drop the words of the slots they
// free first), so resizing is a pass over the words alone: it reads no
// slot and hashes no key.
func (ix *keyIndex) resize(size int) {
	t := make([]uint64, size)
	for _, w := range ix.tbl {
		if w != 0 {
			place(t, w)
		}
	}
	ix.tbl = t
}

// place puts word w into table t (a power of two in length, with room) at
// the first empty position from its hash.
func place(t []uint64, w uint64) {
	mask := len(t) - 1
	p := int(uint32(w>>32)) & mask
	for t[p] != 0 {
		p = (p + 1) & mask
	}
	t[p] = w
}

// setAt remaps the word at position p (found by find) to slot i.
func (q *Queue[K, V]) setAt(p int, i int32) {
	q.ix.tbl[p] = q.ix.tbl[p]&^0xffffffff | uint64(uint32(i+1))
}

// rebuildIndex drops the words of freed slots and re-places the others,
// into a table of the same size or smaller. The table keeps room for as
// many finished keys as the queue may keep before its next eviction
// (max(minIdle, live entries) beside the keys it keeps): shrinking below
// that would only grow it back, an allocation at each doubling, before
// the next eviction. (It never needs to grow: it held these keys before.)
// At an unchanged size the table is rebuilt in place, without allocating.
func (q *Queue[K, V]) rebuildIndex() {
	t := q.ix.tbl
	size := len(t)
	n, idle, e := 0, 0, -1
	for p, w := range t {
		if w == 0 {
			if e < 0 {
				e = p
			}
			continue
		}
		switch q.sl(int32(uint32(w)) - 1).state() {
		case stFree:
			t[p] = 0
		case stIdle: // kept by Clear
			n++
			idle++
		default:
			n++
		}
	}
	need := n + max(minIdle, n-idle) // the keys kept, and a round of finished ones
	for size > minIndex && need*5 <= size/2*4 {
		size /= 2
	}
	if size == len(t) && e >= 0 {
		rehashInPlace(t, e)
	} else {
		q.ix.resize(size)
	}
	q.ix.n = n
}

// rehashInPlace re-places every word of t after some were removed, so that
// a probe from each word's hash finds it again without crossing an empty
// word. e is a position that was empty before the removals (the load is at
// most 4/5, so there is one): no word's probe path crosses it. Walking the
// table once in probe order from there, each word moves to the first empty
// position from its hash, which is never past where it was, and behind it
// lie only words already walked, whose probe paths stay free of holes.
func rehashInPlace(t []uint64, e int) {
	mask := len(t) - 1
	for k := 1; k < len(t); k++ {
		p := (e + k) & mask
		if w := t[p]; w != 0 {
			t[p] = 0
			place(t, w)
		}
	}
}
