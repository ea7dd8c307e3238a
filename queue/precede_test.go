package queue_test

import (
	"context"
	"slices"
	"testing"
	"testing/synctest"
	"time"

	"github.com/opkit/opkit/queue"
)

// retryMerge is shaped like reconcile's rule for a delete waiting for its
// retry: an event of another object goes in front of it (MergePrecede);
// events of one object merge (newest wins); a delete is kept.
func retryMerge(pending *event, incoming event) queue.Merge {
	switch {
	case pending.typ == "RetryDelete" && incoming.uid != pending.uid:
		return queue.MergePrecede
	case pending.typ == "RetryDelete":
		return queue.MergeKeep
	case incoming.uid != pending.uid:
		return queue.MergeSequence
	}
	return queue.MergeReplace
}

// An entry that waits (a retry's backoff) does not hold up what goes in
// front of it: the incoming entry is handed out at once, and the waiting
// one follows at its own due time, not earlier.
func TestMergePrecedePutsTheAddInFrontOfAWaitingEntry(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		q := queue.New[string, event](queue.Config[event]{Merge: retryMerge})
		mustAdd(t, q, "ns/x", event{"RetryDelete", "u1", 1}, queue.AddOptions{Delay: time.Hour}, queue.Queued)
		mustAdd(t, q, "ns/x", event{"Added", "u2", 2}, queue.AddOptions{}, queue.Merged)
		if st := q.Stats(); st.Ready != 1 || st.Delayed != 0 || st.Parked != 1 {
			t.Fatalf("stats %+v, want the add pending and the retry parked behind it", st)
		}
		it := mustGet(t, q)
		if it.Value != (event{"Added", "u2", 2}) {
			t.Fatalf("first = %+v, want the new object's event at once", it.Value)
		}
		q.Done("ns/x")
		if it, ok := tryGet(t, q); ok {
			t.Fatalf("Get = %+v before the retry's due time", it.Value)
		}
		time.Sleep(time.Hour)
		if it := mustGet(t, q); it.Value != (event{"RetryDelete", "u1", 1}) {
			t.Fatalf("second = %+v, want the retry at its due time", it.Value)
		}
	})
}

// The queue asks about the entries before the one that answered
// MergePrecede: a second event of the new object merges into the first
// instead of going in front of the retry again.
func TestMergePrecedeMergesWithTheEntryBefore(t *testing.T) {
	q := queue.New[string, event](queue.Config[event]{Merge: retryMerge})
	mustAdd(t, q, "ns/x", event{"RetryDelete", "u1", 1}, queue.AddOptions{Delay: time.Hour}, queue.Queued)
	for n := 2; n < 100; n++ {
		mustAdd(t, q, "ns/x", event{"Modified", "u2", n}, queue.AddOptions{}, queue.Merged)
	}
	if st := q.Stats(); st.Ready != 1 || st.Delayed != 0 || st.Parked != 1 {
		t.Fatalf("stats %+v after 98 events of the new object, want one entry in front of the retry", st)
	}
	if it := mustGet(t, q); it.Value != (event{"Modified", "u2", 99}) {
		t.Fatalf("first = %+v, want the newest event of u2", it.Value)
	}
}

// Behind an entry in flight, a preceding add goes right behind it: in
// front of the waiting entry, never in front of (or with) the one in
// flight.
func TestMergePrecedeBehindAnEntryInFlight(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		q := queue.New[string, event](queue.Config[event]{Merge: retryMerge})
		mustAdd(t, q, "ns/x", event{"Modified", "u2", 1}, queue.AddOptions{}, queue.Queued)
		mustGet(t, q) // u2's event in flight
		mustAdd(t, q, "ns/x", event{"RetryDelete", "u1", 2}, queue.AddOptions{Delay: time.Hour}, queue.Merged)
		mustAdd(t, q, "ns/x", event{"Modified", "u2", 3}, queue.AddOptions{}, queue.Merged)
		if st := q.Stats(); st.InFlight != 1 || st.Parked != 2 {
			t.Fatalf("stats %+v, want one in flight and two parked", st)
		}
		q.Done("ns/x")
		if it := mustGet(t, q); it.Value != (event{"Modified", "u2", 3}) {
			t.Fatalf("after Done: %+v, want u2's new event before the retry", it.Value)
		}
		q.Done("ns/x")
		if _, ok := tryGet(t, q); ok {
			t.Fatal("the retry was handed out before its due time")
		}
		time.Sleep(time.Hour)
		if it := mustGet(t, q); it.Value != (event{"RetryDelete", "u1", 2}) {
			t.Fatalf("last = %+v, want the retry", it.Value)
		}
	})
}

// Answering MergePrecede lets an add merge into its twin held before the
// last entry: adds that alternate between two kinds, one sequenced behind
// the other and the other preceding it, do not grow the key's chain.
func TestMergePrecedeMergesARepeatedAddIntoItsTwin(t *testing.T) {
	// A "Deleted" trigger keeps its reconcile before a change that follows
	// it (sequenced); a later "Deleted" goes in front of a change, which
	// walks it back to the earlier one; two deletes merge.
	merge := func(pending *event, incoming event) queue.Merge {
		switch {
		case pending.typ == "Deleted" && incoming.typ != "Deleted":
			return queue.MergeSequence
		case pending.typ == "Deleted":
			return queue.MergeKeep
		case incoming.typ == "Deleted":
			return queue.MergePrecede
		}
		return queue.MergeReplace
	}
	q := queue.New[string, event](queue.Config[event]{Merge: merge, Timestamps: true})
	mustAdd(t, q, "ns/x", event{"Modified", "u1", 0}, queue.AddOptions{}, queue.Queued)
	mustGet(t, q) // in flight
	for n := 1; n <= 200; n += 2 {
		mustAdd(t, q, "ns/x", event{"Deleted", "u1", n}, queue.AddOptions{Priority: n}, queue.Merged)
		mustAdd(t, q, "ns/x", event{"Modified", "u1", n + 1}, queue.AddOptions{}, queue.Merged)
	}
	if st := q.Stats(); st.Parked != 2 {
		t.Fatalf("%d entries parked after 100 (Deleted, Modified) pairs, want 2", st.Parked)
	}
	q.Done("ns/x")
	first := mustGet(t, q)
	if first.Value != (event{"Deleted", "u1", 1}) || first.Priority != 199 {
		t.Fatalf("first = %+v (priority %d), want the first delete with the priority of the last merged into it (199)", first.Value, first.Priority)
	}
	q.Done("ns/x")
	if it := mustGet(t, q); it.Value != (event{"Modified", "u1", 200}) {
		t.Fatalf("second = %+v, want the last change", it.Value)
	}
}

// precMerge puts a value starting with 'P' in front of a held one; any
// other value replaces it.
func precMerge(_ *string, incoming string) queue.Merge {
	if incoming[0] == 'P' {
		return queue.MergePrecede
	}
	return queue.MergeReplace
}

// An add never goes in front of an entry that is due: MergePrecede is for
// entries that wait, and an add that keeps coming would hold a due one
// back for ever.
func TestMergePrecedeNeverGoesInFrontOfADueEntry(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		q := queue.New[string, string](queue.Config[string]{Merge: precMerge})
		mustAdd(t, q, "b", "X", queue.AddOptions{}, queue.Queued)
		mustGet(t, q) // X in flight
		mustAdd(t, q, "b", "W", queue.AddOptions{Delay: time.Minute}, queue.Merged)
		mustAdd(t, q, "b", "P1", queue.AddOptions{}, queue.Merged) // W waits: in front of it
		time.Sleep(time.Minute)
		mustAdd(t, q, "b", "P2", queue.AddOptions{}, queue.Merged) // W is due: behind it
		var got []string
		for range 3 {
			q.Done("b")
			got = append(got, mustGet(t, q).Value)
		}
		if want := []string{"P1", "W", "P2"}; !slices.Equal(got, want) {
			t.Fatalf("handed out %q, want %q", got, want)
		}
	})
}

// An add that goes in front of a waiting entry, or merges into the entry
// before it, comes after the delayed entries of other keys that fell due
// before it (first come first served from when each could be handed out).
func TestMergePrecedeComesAfterWhatFellDueBefore(t *testing.T) {
	for _, tc := range []struct {
		name string
		add  queue.AddOptions
		held func(t *testing.T, q *queue.Queue[string, string])
	}{
		{"in front of the waiting head", queue.AddOptions{Priority: 1}, func(t *testing.T, q *queue.Queue[string, string]) {
			mustAdd(t, q, "b", "W", queue.AddOptions{Delay: time.Hour}, queue.Queued)
		}},
		{"merged into the entry before, raising it", queue.AddOptions{Priority: 1}, func(t *testing.T, q *queue.Queue[string, string]) {
			mustAdd(t, q, "b", "W", queue.AddOptions{Delay: time.Hour}, queue.Queued)
			mustAdd(t, q, "b", "P0", queue.AddOptions{}, queue.Merged) // [P0 ready, W parked]
		}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			synctest.Test(t, func(t *testing.T) {
				q := queue.New[string, string](queue.Config[string]{Merge: func(p *string, in string) queue.Merge {
					if (*p)[0] == 'W' {
						return queue.MergePrecede
					}
					return queue.MergeReplace
				}})
				tc.held(t, q)
				mustAdd(t, q, "a", "A", queue.AddOptions{Delay: 100 * time.Millisecond, Priority: 1}, queue.Queued)
				time.Sleep(200 * time.Millisecond) // a falls due at 100ms; no Get notices
				mustAdd(t, q, "b", "P", tc.add, queue.Merged)
				if it := mustGet(t, q); it.Key != "a" {
					t.Fatalf("first = %s/%s, want a (due at 100ms, before the add at 200ms)", it.Key, it.Value)
				}
			})
		})
	}
}

// An add due later than a waiting entry goes behind it: MergePrecede
// never holds a held entry back past its own due time.
func TestMergePrecedeNeverHoldsAnEntryPastItsDueTime(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		q := queue.New[string, event](queue.Config[event]{Merge: retryMerge})
		start := time.Now()
		mustAdd(t, q, "ns/x", event{"RetryDelete", "u1", 1}, queue.AddOptions{Delay: 10 * time.Second}, queue.Queued)
		mustAdd(t, q, "ns/x", event{"Added", "u2", 2}, queue.AddOptions{Delay: time.Hour}, queue.Merged)
		for _, want := range []struct {
			v     event
			after time.Duration
		}{{event{"RetryDelete", "u1", 1}, 10 * time.Second}, {event{"Added", "u2", 2}, time.Hour}} {
			it, err := q.Get(context.Background())
			if err != nil {
				t.Fatal(err)
			}
			if it.Value != want.v || time.Since(start) != want.after {
				t.Fatalf("handed out %+v after %v, want %+v after %v", it.Value, time.Since(start), want.v, want.after)
			}
			q.Done("ns/x")
		}
	})
}
