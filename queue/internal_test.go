package queue

import (
	"context"
	"testing"
)

// Semantics 7: no per-key state that grows without bound. Finished keys
// stay mapped for reuse, but never more than max(minIdle, live entries).
func TestFinishedKeysAreForgottenBeyondBound(t *testing.T) {
	q := New[int, int](Config[int]{})
	ctx := context.Background()
	for k := range 50_000 {
		q.Add(k, k, AddOptions{})
		it, err := q.Get(ctx)
		if err != nil {
			t.Fatal(err)
		}
		q.Done(it.Key)
		if n := q.ix.n; n > minIdle+1 {
			t.Fatalf("after %d distinct keys the queue maps %d keys, want at most %d", k+1, n, minIdle+1)
		}
	}
	if n := int(q.nslots); n > 2*minIdle+2+pageSize {
		t.Fatalf("slab grew to %d slots for at most one live entry", n)
	}
	// a finished key is reused: Queued again, and handed out again
	if out := q.Add(49_999, 1, AddOptions{}); out != Queued {
		t.Fatalf("Add of a finished key = %v, want Queued", out)
	}
	if it, _ := q.Get(ctx); it.Key != 49_999 || it.Value != 1 {
		t.Fatalf("got %+v", it)
	}
}
