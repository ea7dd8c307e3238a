package queue

import (
	"math/rand/v2"
	"slices"
	"testing"
)

// TestRehashInPlaceKeepsEveryWordFindable removes random words from linear
// probing tables (clusters that wrap around the end included) and checks
// that after rehashInPlace every remaining word, and no other, is found by
// probing from its hash. (Starting the walk from a hole the removals left,
// rather than from a word empty before them, fails it.)
func TestRehashInPlaceKeepsEveryWordFindable(t *testing.T) {
	r := rand.New(rand.NewPCG(1, 2))
	for round := range 2_000 {
		size := 1 << (2 + r.IntN(8)) // 4 .. 512 words
		tbl := make([]uint64, size)
		for i := range size * 4 / 5 {
			h := uint32(r.IntN(size))
			if r.IntN(3) == 0 {
				h = uint32(size - 1 - r.IntN(2)) // crowd the end: clusters wrap
			}
			w := uint64(h)<<32 | uint64(i+1)
			place(tbl, w)
		}
		e := slices.Index(tbl, 0) // empty before the removals
		var kept []uint64
		for p, w := range tbl {
			if w != 0 && r.IntN(2) == 0 {
				tbl[p] = 0
			} else if w != 0 {
				kept = append(kept, w)
			}
		}
		rehashInPlace(tbl, e)
		var got []uint64
		for _, w := range tbl {
			if w != 0 {
				got = append(got, w)
			}
		}
		slices.Sort(got)
		slices.Sort(kept)
		if !slices.Equal(got, kept) {
			t.Fatalf("round %d: the table holds %d words after the rehash, want the %d kept", round, len(got), len(kept))
		}
		mask := size - 1
		for _, w := range kept {
			p := int(uint32(w>>32)) & mask
			for tbl[p] != w {
				if tbl[p] == 0 {
					t.Fatalf("round %d: word %#x (hash %d) not found: an empty word at %d on its probe path", round, w, w>>32, p)
				}
				p = (p + 1) & mask
			}
		}
	}
}

// TestClearShrinksTheIndexToWhatItKeeps: Clear keeps finished keys (they
// are evicted later), and the index keeps room for them and for a round of
// finished keys beside the live entries left, counting each once.
func TestClearShrinksTheIndexToWhatItKeeps(t *testing.T) {
	q := New[int, int](Config[int]{})
	for k := range 100_000 {
		q.Add(k, k, AddOptions{})
	}
	for range 40_000 { // finished, fewer than the live entries: not evicted
		it, err := q.Get(t.Context())
		if err != nil {
			t.Fatal(err)
		}
		q.Done(it.Key)
	}
	if len(q.ix.tbl) != 131_072 {
		t.Fatalf("index of %d words before Clear, want 131,072", len(q.ix.tbl))
	}
	if n := q.Clear(); n != 60_000 {
		t.Fatalf("Clear = %d, want 60,000", n)
	}
	// 40,000 finished keys and room for 1,024 more, at a load of at most
	// 4/5: 65,536 words.
	if len(q.ix.tbl) != 65_536 {
		t.Errorf("index of %d words after Clear, want 65,536", len(q.ix.tbl))
	}
	if out := q.Add(39_999, 0, AddOptions{}); out != Queued {
		t.Errorf("Add of a finished key after Clear = %v, want Queued", out)
	}
}
