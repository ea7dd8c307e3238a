package queue_test

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"sync/atomic"
	"testing"
	"testing/synctest"
	"time"

	"github.com/opkit/opkit/queue"
)

// helpers

func newQ(t *testing.T, cfg queue.Config[int]) *queue.Queue[string, int] {
	t.Helper()
	return queue.New[string, int](cfg)
}

// cancelled is a context that is already done: Get with it returns a due
// entry if there is one and never blocks.
func cancelled() context.Context {
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	return ctx
}

// tryGet returns a due entry without blocking.
func tryGet[K comparable, V any](t *testing.T, q *queue.Queue[K, V]) (queue.Item[K, V], bool) {
	t.Helper()
	it, err := q.Get(cancelled())
	if err != nil {
		if !errors.Is(err, context.Canceled) && !errors.Is(err, queue.ErrShutDown) {
			t.Fatalf("Get: unexpected error %v", err)
		}
		return it, false
	}
	return it, true
}

func mustGet[K comparable, V any](t *testing.T, q *queue.Queue[K, V]) queue.Item[K, V] {
	t.Helper()
	it, ok := tryGet(t, q)
	if !ok {
		t.Fatal("Get: nothing due, want an entry")
	}
	return it
}

func mustAdd[K comparable, V any](t *testing.T, q *queue.Queue[K, V], k K, v V, o queue.AddOptions, want queue.Outcome) {
	t.Helper()
	if got := q.Add(k, v, o); got != want {
		t.Fatalf("Add(%v, %v, %+v) = %v, want %v", k, v, o, got, want)
	}
}

// Semantics 1: keyed and deduplicated.

// union joins payloads that are sets of bits; maxOf joins numbers.
func union(held *int, incoming int) { *held |= incoming }
func maxOf(held *int, incoming int) { *held = max(*held, incoming) }

func TestAddOfPendingKeyMergesIntoOneEntry(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		q := newQ(t, queue.Config[int]{Merge: union})
		start := time.Now()
		mustAdd(t, q, "a", 1, queue.AddOptions{Delay: 10 * time.Second, Priority: 1}, queue.Queued)
		mustAdd(t, q, "a", 2, queue.AddOptions{Delay: 3 * time.Second, Priority: 0}, queue.Merged)
		mustAdd(t, q, "a", 4, queue.AddOptions{Delay: 20 * time.Second, Priority: -5}, queue.Merged)
		if got := q.Len(); got != 1 {
			t.Fatalf("Len = %d, want 1", got)
		}
		if _, ok := tryGet(t, q); ok {
			t.Fatal("entry handed out before due")
		}
		it, err := q.Get(context.Background())
		if err != nil {
			t.Fatal(err)
		}
		// earliest due (3s), highest priority (1), every payload joined.
		if got := time.Since(start); got != 3*time.Second {
			t.Errorf("handed out after %v, want 3s (earliest due wins)", got)
		}
		if it.Value != 7 || it.Priority != 1 {
			t.Errorf("got value %d prio %d, want 7 (1|2|4), 1", it.Value, it.Priority)
		}
		q.Done("a")
		if _, ok := tryGet(t, q); ok {
			t.Fatal("merged adds were delivered more than once")
		}
	})
}

// The merge is order-free: the same adds of one key, in every order, are
// handed out as the same entry (payload, priority, due time), pending and
// parked behind an entry in flight alike.
func TestTheSameAddsInEveryOrderGiveTheSameHandOut(t *testing.T) {
	type add struct {
		v    int
		opts queue.AddOptions
	}
	adds := []add{
		{1, queue.AddOptions{Delay: 5 * time.Second}},
		{2, queue.AddOptions{Priority: -1, Delay: 2 * time.Second}},
		{4, queue.AddOptions{Priority: 3, Delay: 9 * time.Second}},
		{8, queue.AddOptions{}},
		{8, queue.AddOptions{Priority: 1, Delay: time.Second}}, // a repeat: idempotent
	}
	type handOut struct {
		v, prio int
		after   time.Duration
	}
	run := func(order []int, parked bool) (got handOut) {
		synctest.Test(t, func(t *testing.T) {
			q := newQ(t, queue.Config[int]{Merge: union})
			if parked {
				mustAdd(t, q, "a", 0, queue.AddOptions{}, queue.Queued)
				mustGet(t, q) // in flight: the adds below park
			}
			start := time.Now()
			for _, i := range order {
				q.Add("a", adds[i].v, adds[i].opts)
			}
			if parked {
				q.Done("a")
			}
			it, err := q.Get(context.Background())
			if err != nil {
				t.Fatal(err)
			}
			got = handOut{it.Value, it.Priority, time.Since(start)}
			q.Done("a")
			if q.Len() != 0 {
				t.Fatalf("order %v: %d entries left after one hand-out", order, q.Len())
			}
		})
		return got
	}
	want := handOut{15, 3, 0}
	var permute func(order []int, rest []int)
	permute = func(order, rest []int) {
		if len(rest) == 0 {
			for _, parked := range []bool{false, true} {
				if got := run(order, parked); got != want {
					t.Errorf("order %v (parked %v): handed out %+v, want %+v", order, parked, got, want)
				}
			}
			return
		}
		for i := range rest {
			next := append(append([]int(nil), rest[:i]...), rest[i+1:]...)
			permute(append(order, rest[i]), next)
		}
	}
	permute(nil, []int{0, 1, 2, 3, 4})
}

func TestEntriesDueNowKeepAddOrderAndADelayedOneWaits(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		q := newQ(t, queue.Config[int]{})
		start := time.Now()
		mustAdd(t, q, "a", 1, queue.AddOptions{}, queue.Queued)
		mustAdd(t, q, "b", 2, queue.AddOptions{Delay: 2 * time.Second}, queue.Queued)
		time.Sleep(time.Second)
		mustAdd(t, q, "c", 3, queue.AddOptions{}, queue.Queued)
		for _, want := range []string{"a", "c"} {
			if it := mustGet(t, q); it.Key != want {
				t.Fatalf("got %+v, want key %s", it, want)
			}
		}
		if _, ok := tryGet(t, q); ok {
			t.Fatal("delayed entry handed out before due")
		}
		it, err := q.Get(context.Background())
		if err != nil || it.Key != "b" || time.Since(start) != 2*time.Second {
			t.Fatalf("got %+v, %v after %v, want b after 2s", it, err, time.Since(start))
		}
	})
}

func TestWithoutMergeTheFirstPayloadStays(t *testing.T) {
	q := newQ(t, queue.Config[int]{})
	mustAdd(t, q, "a", 1, queue.AddOptions{}, queue.Queued)
	mustAdd(t, q, "a", 2, queue.AddOptions{Priority: 4}, queue.Merged)
	if it := mustGet(t, q); it.Value != 1 || it.Priority != 4 {
		t.Fatalf("got %+v, want value 1 at priority 4", it)
	}
	q.Done("a")
}

// Semantics 2: exclusive while in flight.

func TestKeyInFlightIsNotHandedOutAgainUntilDone(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		q := newQ(t, queue.Config[int]{Merge: maxOf})
		q.Add("a", 1, queue.AddOptions{})
		it := mustGet(t, q)
		if it.Value != 1 {
			t.Fatalf("got %d", it.Value)
		}
		// adds while in flight are parked and merged among themselves
		mustAdd(t, q, "a", 2, queue.AddOptions{Priority: 3}, queue.Merged)
		mustAdd(t, q, "a", 3, queue.AddOptions{}, queue.Merged)
		if q.Len() != 1 {
			t.Fatalf("Len = %d, want 1 parked", q.Len())
		}
		got := make(chan queue.Item[string, int], 1)
		go func() {
			it, err := q.Get(context.Background())
			if err != nil {
				t.Error(err)
			}
			got <- it
		}()
		synctest.Wait()
		select {
		case it := <-got:
			t.Fatalf("Get returned %+v while the key was in flight", it)
		default:
		}
		q.Done("a")
		it = <-got
		if it.Value != 3 || it.Priority != 3 {
			t.Fatalf("after Done got %+v, want value 3 prio 3", it)
		}
		q.Done("a")
	})
}

// MergeOnly joins an add into what already waits for the key and never
// makes another hand-out.
func TestMergeOnlyJoinsWhatWaitsAndNeverMakesAHandOut(t *testing.T) {
	q := newQ(t, queue.Config[int]{Merge: union})
	only := queue.AddOptions{MergeOnly: true, Priority: 5}
	mustAdd(t, q, "a", 1, only, queue.NotHeld) // unknown key
	if q.Len() != 0 {
		t.Fatalf("Len = %d after a MergeOnly add of an unknown key, want 0", q.Len())
	}
	mustAdd(t, q, "a", 1, queue.AddOptions{}, queue.Queued)
	mustAdd(t, q, "a", 2, only, queue.Merged) // pending: joined, priority raised
	it := mustGet(t, q)
	if it.Value != 3 || it.Priority != 5 {
		t.Fatalf("got %+v, want value 3 (1|2) at priority 5", it)
	}
	mustAdd(t, q, "a", 4, only, queue.NotHeld) // in flight, nothing parked: it would be another hand-out
	mustAdd(t, q, "a", 8, queue.AddOptions{}, queue.Merged)
	mustAdd(t, q, "a", 16, only, queue.Merged) // joins the parked entry
	q.Done("a")
	if it := mustGet(t, q); it.Value != 24 {
		t.Fatalf("after Done got %+v, want value 24 (8|16): the NotHeld add stored nothing", it)
	}
	q.Done("a")
	mustAdd(t, q, "a", 1, only, queue.NotHeld) // finished key
	q.Suspend()
	mustAdd(t, q, "a", 1, only, queue.DroppedSuspended) // the intake's answer comes first
	if q.Len() != 0 {
		t.Fatalf("Len = %d at the end, want 0", q.Len())
	}
}

// mergeOnlyCase is a MergeOnly add, of value 2, after what came before for
// its key, and the hand-out that follows.
type mergeOnlyCase struct {
	name     string
	inFlight bool              // the key is handed out first: held parks behind it
	held     *queue.AddOptions // the add of value 1 before, if any
	wait     time.Duration     // time passed before the MergeOnly add
	add      queue.AddOptions  // the MergeOnly add (MergeOnly is set for it)
	want     queue.Outcome
	got      *handOut // the hand-out that follows, if any
}

// handOut is what Get returned and when, since the start.
type handOut struct {
	value, prio int
	at          time.Duration
}

// A MergeOnly add merges only into an entry due no later than the add
// itself (now+Delay), one it would not make earlier: a ready entry, or a
// delayed or parked one due by then. Otherwise it stores nothing
// (NotHeld) and the entry held for the key, if any, keeps its due time,
// payload and priority. A merge joins the payload and may raise the
// priority, but moves no due time.
func TestMergeOnlyMergesOnlyIntoAnEntryDueNoLaterThanItself(t *testing.T) {
	cases := []mergeOnlyCase{
		{name: "no entry", add: queue.AddOptions{Priority: 5}, want: queue.NotHeld},
		{name: "ready entry", held: &queue.AddOptions{Priority: 1}, add: queue.AddOptions{Priority: 5},
			want: queue.Merged, got: &handOut{3, 5, 0}},
		{name: "ready entry, delayed add", held: &queue.AddOptions{Priority: 1}, add: queue.AddOptions{Delay: time.Hour},
			want: queue.Merged, got: &handOut{3, 1, 0}},
		{name: "delayed entry due later", held: &queue.AddOptions{Delay: time.Hour, Priority: 1}, add: queue.AddOptions{Priority: 5},
			want: queue.NotHeld, got: &handOut{1, 1, time.Hour}},
		{name: "delayed entry due later than the delayed add", held: &queue.AddOptions{Delay: time.Hour, Priority: 1},
			add: queue.AddOptions{Delay: time.Minute, Priority: 5}, want: queue.NotHeld, got: &handOut{1, 1, time.Hour}},
		{name: "delayed entry due earlier", held: &queue.AddOptions{Delay: time.Minute, Priority: 1},
			add: queue.AddOptions{Delay: time.Hour, Priority: 5}, want: queue.Merged, got: &handOut{3, 5, time.Minute}},
		{name: "delayed entry due with the add", held: &queue.AddOptions{Delay: time.Minute, Priority: 1},
			add: queue.AddOptions{Delay: time.Minute, Priority: 5}, want: queue.Merged, got: &handOut{3, 5, time.Minute}},
		{name: "delayed entry fallen due", held: &queue.AddOptions{Delay: time.Minute, Priority: 1}, wait: time.Minute,
			add: queue.AddOptions{Priority: 5}, want: queue.Merged, got: &handOut{3, 5, time.Minute}},
		{name: "in flight, nothing parked", inFlight: true, add: queue.AddOptions{Priority: 5}, want: queue.NotHeld},
		{name: "parked entry due now", inFlight: true, held: &queue.AddOptions{Priority: 1}, add: queue.AddOptions{Priority: 5},
			want: queue.Merged, got: &handOut{3, 5, 0}},
		{name: "parked entry due later", inFlight: true, held: &queue.AddOptions{Delay: time.Hour, Priority: 1},
			add: queue.AddOptions{Priority: 5}, want: queue.NotHeld, got: &handOut{1, 1, time.Hour}},
		{name: "parked entry due earlier", inFlight: true, held: &queue.AddOptions{Delay: time.Minute, Priority: 1},
			add: queue.AddOptions{Delay: time.Hour, Priority: 5}, want: queue.Merged, got: &handOut{3, 5, time.Minute}},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			synctest.Test(t, func(t *testing.T) { checkMergeOnly(t, tc) })
		})
	}
}

func checkMergeOnly(t *testing.T, tc mergeOnlyCase) {
	q := newQ(t, queue.Config[int]{Merge: union})
	start := time.Now()
	if tc.inFlight {
		mustAdd(t, q, "a", 0, queue.AddOptions{}, queue.Queued)
		mustGet(t, q)
	}
	if tc.held != nil {
		want := queue.Queued
		if tc.inFlight {
			want = queue.Merged
		}
		mustAdd(t, q, "a", 1, *tc.held, want)
	}
	time.Sleep(tc.wait)
	before := q.Len()
	add := tc.add
	add.MergeOnly = true
	mustAdd(t, q, "a", 2, add, tc.want)
	if q.Len() != before {
		t.Fatalf("Len = %d after the MergeOnly add, want %d: a merge or nothing", q.Len(), before)
	}
	if tc.inFlight {
		q.Done("a")
	}
	if tc.got == nil {
		if it, ok := tryGet(t, q); ok || q.Len() != 0 {
			t.Fatalf("got %+v (Len %d), want nothing held", it, q.Len())
		}
		return
	}
	it, err := q.Get(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	if got := (handOut{it.Value, it.Priority, time.Since(start)}); got != *tc.got {
		t.Fatalf("handed out %+v, want %+v", got, *tc.got)
	}
	q.Done("a")
}

func TestDonePanicsForKeyNotInFlight(t *testing.T) {
	q := newQ(t, queue.Config[int]{})
	q.Add("a", 1, queue.AddOptions{})
	for _, key := range []string{"a", "b"} {
		func() {
			defer func() {
				if recover() == nil {
					t.Errorf("Done(%q) did not panic", key)
				}
			}()
			q.Done(key)
		}()
	}
}

// Semantics 3: delay, no polling tick.

func TestDelayedEntryIsHandedOutAtItsDueTimeToAWaitingGet(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		q := newQ(t, queue.Config[int]{})
		start := time.Now()
		q.Add("late", 1, queue.AddOptions{Delay: 10 * time.Second})
		type res struct {
			key string
			at  time.Duration
		}
		got := make(chan res, 3)
		go func() {
			for range 3 {
				it, err := q.Get(context.Background())
				if err != nil {
					t.Error(err)
					return
				}
				got <- res{it.Key, time.Since(start)}
				q.Done(it.Key)
			}
		}()
		synctest.Wait() // the Get is blocked, its timer armed for 10s
		// an earlier entry added while Get waits re-arms the timer
		q.Add("early", 2, queue.AddOptions{Delay: 1500 * time.Millisecond})
		time.Sleep(5 * time.Second)
		q.Add("now", 3, queue.AddOptions{})
		want := []res{{"early", 1500 * time.Millisecond}, {"now", 5 * time.Second}, {"late", 10 * time.Second}}
		for _, w := range want {
			if r := <-got; r != w {
				t.Errorf("got %+v, want %+v", r, w)
			}
		}
	})
}

func TestDueEntriesAreServedByPriorityThenFIFO(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		q := newQ(t, queue.Config[int]{})
		q.Add("d-low", 0, queue.AddOptions{Delay: time.Second, Priority: -1})
		q.Add("d-high", 0, queue.AddOptions{Delay: 2 * time.Second, Priority: 10})
		q.Add("a", 0, queue.AddOptions{})
		q.Add("b", 0, queue.AddOptions{Priority: 5})
		q.Add("c", 0, queue.AddOptions{})
		q.Add("e", 0, queue.AddOptions{Priority: 5})
		time.Sleep(3 * time.Second)
		if order := takeAll(t, q); fmt.Sprint(order) != "[d-high b e a c d-low]" {
			t.Fatalf("order %v, want [d-high b e a c d-low]", order)
		}
	})
}

// takeAll takes every entry due now, without Done, and returns their keys
// in the order Get handed them out.
func takeAll(t *testing.T, q *queue.Queue[string, int]) []string {
	t.Helper()
	var order []string
	for {
		it, ok := tryGet(t, q)
		if !ok {
			return order
		}
		order = append(order, it.Key)
	}
}

// First come first served counts from the moment an entry fell due, also
// when no Get was waiting then: a delayed entry that fell due while every
// consumer was busy goes before entries added after that moment, whether
// they came as new adds or as a parked entry made pending by Done.
func TestADelayedEntryThatFellDueGoesBeforeLaterOnes(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		q := newQ(t, queue.Config[int]{})
		q.Add("busy", 0, queue.AddOptions{})
		mustGet(t, q)                                             // a consumer is busy with it
		q.Add("busy", 1, queue.AddOptions{})                      // parked behind it
		q.Add("delayed", 0, queue.AddOptions{Delay: time.Second}) // falls due at 1s
		time.Sleep(2 * time.Second)
		q.Add("later", 0, queue.AddOptions{})
		q.Done("busy") // its parked successor becomes pending now
		if order := takeAll(t, q); fmt.Sprint(order) != "[delayed later busy]" {
			t.Fatalf("order %v, want [delayed later busy]", order)
		}
	})
}

// The same holds when an add raises a ready entry's priority: it joins
// the higher priority then, behind the delayed entry of that priority that
// fell due before.
func TestARaisedEntryGoesBehindWhatFellDueBeforeAtItsNewPriority(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		q := newQ(t, queue.Config[int]{})
		q.Add("delayed", 0, queue.AddOptions{Delay: time.Second, Priority: 5})
		q.Add("raised", 0, queue.AddOptions{})
		time.Sleep(2 * time.Second)
		q.Add("raised", 1, queue.AddOptions{Priority: 5})
		first, _ := tryGet(t, q)
		second, _ := tryGet(t, q)
		if first.Key != "delayed" || second.Key != "raised" {
			t.Fatalf("order %s, %s; want delayed, raised", first.Key, second.Key)
		}
	})
}

// After ShutDown, Get hands out what was due at ShutDown and nothing that
// falls due later, however long it keeps being called.
func TestGetAfterShutDownNeverHandsOutWhatWasNotDue(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		q := newQ(t, queue.Config[int]{})
		q.Add("k", 0, queue.AddOptions{})
		mustGet(t, q)
		q.Add("k", 1, queue.AddOptions{Delay: time.Second}) // parked, due at 1s
		q.Add("later", 0, queue.AddOptions{Delay: time.Second})
		q.ShutDown()
		time.Sleep(2 * time.Second)
		q.Done("k")
		if it, err := q.Get(context.Background()); !errors.Is(err, queue.ErrShutDown) {
			t.Fatalf("Get after ShutDown = %v, %v; want ErrShutDown: nothing was due at ShutDown", it.Key, err)
		}
	})
}

func TestManyWaitingGetsEachReceiveOneDelayedEntry(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		q := newQ(t, queue.Config[int]{})
		start := time.Now()
		const n = 8
		var wg sync.WaitGroup
		for range n {
			wg.Go(func() {
				it, err := q.Get(context.Background())
				if err != nil {
					t.Error(err)
					return
				}
				if want := time.Duration(it.Value) * time.Second; time.Since(start) != want {
					t.Errorf("%s handed out after %v, want %v", it.Key, time.Since(start), want)
				}
			})
		}
		synctest.Wait()
		for i := range n {
			q.Add(string(rune('a'+i)), n-i, queue.AddOptions{Delay: time.Duration(n-i) * time.Second})
		}
		wg.Wait()
	})
}

// Semantics 4: priority.

func TestHighPriorityAddJumpsAheadOfLargeBacklog(t *testing.T) {
	q := queue.New[int, int](queue.Config[int]{})
	for i := range 100_000 {
		q.Add(i, i, queue.AddOptions{Priority: -1})
	}
	q.Add(-1, 0, queue.AddOptions{Priority: 100})
	if it := mustGet(t, q); it.Key != -1 {
		t.Fatalf("next Get = %d, want the high-priority entry", it.Key)
	}
}

func TestMergeRaisingPriorityMovesEntryAhead(t *testing.T) {
	q := newQ(t, queue.Config[int]{})
	q.Add("a", 0, queue.AddOptions{})
	q.Add("b", 0, queue.AddOptions{})
	q.Add("b", 0, queue.AddOptions{Priority: 1})
	if it := mustGet(t, q); it.Key != "b" {
		t.Fatalf("got %s, want b", it.Key)
	}
	if it := mustGet(t, q); it.Key != "a" {
		t.Fatalf("got %s, want a", it.Key)
	}
	if _, ok := tryGet(t, q); ok {
		t.Fatal("stale entry handed out")
	}
}

// Semantics 5: suspendable intake.

func TestSuspendDropsAddsUntilResumeAndClearRemovesHeldEntries(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		m := newRecorder()
		q := newQ(t, queue.Config[int]{Metrics: m})
		q.Add("inflight", 0, queue.AddOptions{})
		mustGet(t, q)
		q.Add("inflight", 1, queue.AddOptions{})              // parked
		q.Add("due", 0, queue.AddOptions{})                   // ready
		q.Add("later", 0, queue.AddOptions{Delay: time.Hour}) // delayed

		q.Suspend()
		if !q.Suspended() {
			t.Fatal("Suspended() = false after Suspend")
		}
		mustAdd(t, q, "x", 0, queue.AddOptions{}, queue.DroppedSuspended)
		mustAdd(t, q, "due", 0, queue.AddOptions{}, queue.DroppedSuspended)
		if got := q.Clear(); got != 3 {
			t.Fatalf("Clear = %d, want 3 (parked, due, delayed)", got)
		}
		if q.Len() != 0 {
			t.Fatalf("Len = %d after Clear", q.Len())
		}
		// the in-flight entry is untouched: Done is still expected and works
		q.Done("inflight")
		q.Resume()
		if q.Suspended() {
			t.Fatal("Suspended() = true after Resume")
		}
		mustAdd(t, q, "x", 0, queue.AddOptions{}, queue.Queued)
		time.Sleep(2 * time.Hour)
		if it := mustGet(t, q); it.Key != "x" {
			t.Fatalf("got %s, want x (cleared entries must not come back)", it.Key)
		}
		q.Done("x")
		q.ShutDown()
		mustAdd(t, q, "y", 0, queue.AddOptions{}, queue.DroppedShutDown)
		if m.dropped[queue.DroppedSuspended] != 2 || m.dropped[queue.DroppedShutDown] != 1 {
			t.Fatalf("drops by reason = %v, want 2 suspended, 1 shut down", m.dropped)
		}
		if d := m.depthTotal(); d != 0 {
			t.Fatalf("depth gauge = %d after Clear and drain, want 0", d)
		}
	})
}

func TestSuspendAndClearAreAtomicAgainstConcurrentAdds(t *testing.T) {
	q := queue.New[int, int](queue.Config[int]{})
	// epoch is odd from just after Suspend returns until just before
	// Resume is called: an Add that starts and ends within one odd epoch
	// must be dropped.
	var epoch atomic.Int64
	var violations atomic.Int64
	stop := make(chan struct{})
	var wg sync.WaitGroup
	for p := range 4 {
		wg.Go(func() {
			for i := 0; ; i++ {
				select {
				case <-stop:
					return
				default:
				}
				e1 := epoch.Load()
				out := q.Add(p*1_000_000+i%1000, i, queue.AddOptions{Delay: time.Duration(i%3) * time.Millisecond})
				if e2 := epoch.Load(); e1 == e2 && e1%2 == 1 && out.Accepted() {
					violations.Add(1)
				}
			}
		})
	}
	for range 200 {
		q.Suspend()
		epoch.Add(1)
		q.Clear()
		if n := q.Len(); n != 0 {
			t.Fatalf("Len = %d after Suspend+Clear with producers running", n)
		}
		epoch.Add(1)
		q.Resume()
	}
	close(stop)
	wg.Wait()
	if n := violations.Load(); n != 0 {
		t.Fatalf("%d adds accepted while suspended", n)
	}
}

// Semantics 6: blocking Get, shutdown, drain.

func TestGetReturnsContextErrorWhenContextEnds(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		q := newQ(t, queue.Config[int]{})
		q.Add("a", 0, queue.AddOptions{Delay: time.Hour})
		ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
		defer cancel()
		_, err := q.Get(ctx)
		if !errors.Is(err, context.DeadlineExceeded) {
			t.Fatalf("Get = %v, want DeadlineExceeded", err)
		}
		// the entry is still there and still delayed
		if q.Len() != 1 {
			t.Fatalf("Len = %d, want 1", q.Len())
		}
		it, err := q.Get(context.Background())
		if err != nil || it.Key != "a" {
			t.Fatalf("Get = %v, %v", it, err)
		}
	})
}

func TestCancelledGetPassesItsWakeUpOn(t *testing.T) {
	// A Get whose context ends just as it is woken for a new entry must not
	// swallow the wake-up: either it takes the entry, or another blocked
	// Get does. Whichever happens, "a" is handed out exactly once and no Get
	// stays blocked while it is due.
	for range 20 {
		synctest.Test(t, func(t *testing.T) {
			q := newQ(t, queue.Config[int]{})
			ctx, cancel := context.WithCancel(context.Background())
			type res struct {
				key string
				err error
			}
			first, second := make(chan res, 1), make(chan res, 1)
			go func() { it, err := q.Get(ctx); first <- res{it.Key, err} }()
			synctest.Wait()
			go func() { it, err := q.Get(context.Background()); second <- res{it.Key, err} }()
			synctest.Wait()
			cancel()
			q.Add("a", 0, queue.AddOptions{})
			synctest.Wait()
			r1 := <-first
			switch {
			case r1.err == nil && r1.key == "a":
				q.ShutDown() // release the second Get
				if r2 := <-second; !errors.Is(r2.err, queue.ErrShutDown) {
					t.Fatalf("second Get = %+v, want ErrShutDown", r2)
				}
			case errors.Is(r1.err, context.Canceled):
				select {
				case r2 := <-second:
					if r2.err != nil || r2.key != "a" {
						t.Fatalf("second Get = %+v, want a", r2)
					}
				default:
					t.Fatal("wake-up lost: the entry is due but the second Get is still blocked")
				}
				q.ShutDown()
			default:
				t.Fatalf("first Get = %+v", r1)
			}
		})
	}
}

func TestShutDownWakesBlockedGetsAndIsIdempotent(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		q := newQ(t, queue.Config[int]{})
		q.Add("later", 0, queue.AddOptions{Delay: time.Hour})
		var wg sync.WaitGroup
		for range 3 {
			wg.Go(func() {
				if _, err := q.Get(context.Background()); !errors.Is(err, queue.ErrShutDown) {
					t.Errorf("Get = %v, want ErrShutDown", err)
				}
			})
		}
		synctest.Wait()
		if q.ShuttingDown() {
			t.Fatal("ShuttingDown before ShutDown")
		}
		q.ShutDown()
		q.ShutDown()
		wg.Wait()
		if !q.ShuttingDown() || q.Suspended() {
			t.Errorf("after ShutDown: ShuttingDown %v, Suspended %v; want true, false", q.ShuttingDown(), q.Suspended())
		}
		// synctest.Test returns only once every goroutine of the bubble has
		// exited: the queue leaves none behind.
	})
}

func TestGetHandsOutDueEntriesAfterShutDown(t *testing.T) {
	q := newQ(t, queue.Config[int]{})
	q.Add("a", 0, queue.AddOptions{})
	q.Add("b", 0, queue.AddOptions{Delay: time.Hour})
	q.ShutDown()
	if it := mustGet(t, q); it.Key != "a" {
		t.Fatalf("got %s", it.Key)
	}
	if _, err := q.Get(context.Background()); !errors.Is(err, queue.ErrShutDown) {
		t.Fatalf("Get = %v, want ErrShutDown without blocking", err)
	}
	q.Done("a")
}

func TestShutDownWithDrainWaitsForInFlightEntries(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		q := newQ(t, queue.Config[int]{})
		q.Add("a", 0, queue.AddOptions{})
		q.Add("b", 0, queue.AddOptions{})
		mustGet(t, q)
		mustGet(t, q)
		start := time.Now()
		go func() {
			time.Sleep(time.Second)
			q.Done("a")
			time.Sleep(time.Second)
			q.Done("b")
		}()
		if err := q.ShutDownWithDrain(context.Background()); err != nil {
			t.Fatal(err)
		}
		if got := time.Since(start); got != 2*time.Second {
			t.Fatalf("drain returned after %v, want 2s (when the last Done came)", got)
		}
		if err := q.ShutDownWithDrain(context.Background()); err != nil {
			t.Fatalf("second drain: %v", err)
		}
	})
}

func TestShutDownWithDrainIsBoundedByContext(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		q := newQ(t, queue.Config[int]{})
		q.Add("a", 0, queue.AddOptions{})
		mustGet(t, q)
		ctx, cancel := context.WithTimeout(context.Background(), time.Second)
		defer cancel()
		if err := q.ShutDownWithDrain(ctx); !errors.Is(err, context.DeadlineExceeded) {
			t.Fatalf("drain = %v, want DeadlineExceeded", err)
		}
		q.Done("a")
	})
}

// Semantics 7: backoff.

func TestBackoffDelay(t *testing.T) {
	for _, tc := range []struct {
		b       queue.Backoff
		retries int
		want    time.Duration
	}{
		{queue.Backoff{Base: time.Second, Cap: time.Minute, Jitter: -1}, 0, 0},
		{queue.Backoff{Base: time.Second, Cap: time.Minute, Jitter: -1}, 1, time.Second},
		{queue.Backoff{Base: time.Second, Cap: time.Minute, Jitter: -1}, 3, 4 * time.Second},
		{queue.Backoff{Base: time.Second, Cap: time.Minute, Jitter: -1}, 7, time.Minute},
		{queue.Backoff{Base: time.Second, Cap: time.Minute, Jitter: -1}, 1000, time.Minute},
		{queue.Backoff{Jitter: -1}, 1, queue.DefaultBackoffBase},
		{queue.Backoff{Jitter: -1}, 1 << 20, queue.DefaultBackoffCap},
	} {
		if got := tc.b.Delay(tc.retries); got != tc.want {
			t.Errorf("%+v.Delay(%d) = %v, want %v", tc.b, tc.retries, got, tc.want)
		}
	}
	var zero queue.Backoff
	for r := 1; r < 40; r++ {
		full := queue.Backoff{Jitter: -1}.Delay(r)
		got := zero.Delay(r)
		if lo := full - time.Duration(float64(full)*queue.DefaultBackoffJitter); got < lo || got > full {
			t.Errorf("zero Backoff.Delay(%d) = %v, want in [%v, %v]", r, got, lo, full)
		}
	}
	// A Jitter above 1 counts as 1: the delay is shortened at most to zero.
	for range 100 {
		if got := (queue.Backoff{Base: time.Second, Cap: time.Second, Jitter: 5}).Delay(1); got < 0 || got > time.Second {
			t.Fatalf("Backoff with Jitter 5: Delay(1) = %v, want in [0, 1s]", got)
		}
	}
}

// Semantics 8: observability.

type recorder struct {
	mu             sync.Mutex
	added, merged  int
	dropped        map[queue.Outcome]int
	depth          map[int]int
	waited, worked []time.Duration
}

func newRecorder() *recorder {
	return &recorder{dropped: map[queue.Outcome]int{}, depth: map[int]int{}}
}

func (r *recorder) Added(_ int, merged bool) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.added++
	if merged {
		r.merged++
	}
}
func (r *recorder) Dropped(o queue.Outcome) { r.mu.Lock(); r.dropped[o]++; r.mu.Unlock() }
func (r *recorder) Depth(p, d int)          { r.mu.Lock(); r.depth[p] += d; r.mu.Unlock() }
func (r *recorder) Waited(_ int, d time.Duration) {
	r.mu.Lock()
	r.waited = append(r.waited, d)
	r.mu.Unlock()
}
func (r *recorder) Worked(d time.Duration) {
	r.mu.Lock()
	r.worked = append(r.worked, d)
	r.mu.Unlock()
}
func (r *recorder) depthTotal() int {
	r.mu.Lock()
	defer r.mu.Unlock()
	n := 0
	for _, d := range r.depth {
		n += d
	}
	return n
}

func TestMetricsObserveAddsMergesDepthLatencyAndWork(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		m := newRecorder()
		q := newQ(t, queue.Config[int]{Metrics: m})
		q.Add("a", 0, queue.AddOptions{Delay: time.Second})
		q.Add("a", 0, queue.AddOptions{Priority: 2})
		q.Add("b", 0, queue.AddOptions{Priority: 1})
		m.mu.Lock()
		if m.added != 3 || m.merged != 1 || m.depth[2] != 1 || m.depth[1] != 1 || m.depth[0] != 0 {
			t.Errorf("added %d merged %d depth %v", m.added, m.merged, m.depth)
		}
		m.mu.Unlock()
		time.Sleep(3 * time.Second)
		it := mustGet(t, q)
		time.Sleep(5 * time.Second)
		q.Done(it.Key)
		m.mu.Lock()
		defer m.mu.Unlock()
		if len(m.waited) != 1 || m.waited[0] != 3*time.Second {
			t.Errorf("waited = %v, want [3s]", m.waited)
		}
		if len(m.worked) != 1 || m.worked[0] != 5*time.Second {
			t.Errorf("worked = %v, want [5s]", m.worked)
		}
		if m.depth[2] != 0 || m.depth[1] != 1 {
			t.Errorf("depth = %v, want prio 1: 1", m.depth)
		}
	})
}

func TestAddGetDoneCycleDoesNotAllocateForKnownKeys(t *testing.T) {
	for _, tc := range []struct {
		name string
		m    queue.Metrics
	}{{"nil metrics", nil}, {"metrics", nopMetrics{}}} {
		q := queue.New[int, int](queue.Config[int]{Metrics: tc.m})
		ctx := context.Background()
		for i := range 1000 { // warm up: slots, rings, map
			q.Add(i, i, queue.AddOptions{})
		}
		for range 1000 {
			it, _ := q.Get(ctx)
			q.Done(it.Key)
		}
		i := 0
		allocs := testing.AllocsPerRun(1000, func() {
			q.Add(i%1000, i, queue.AddOptions{})
			it, _ := q.Get(ctx)
			q.Done(it.Key)
			i++
		})
		if allocs != 0 {
			t.Errorf("%s: %v allocs per cycle, want 0", tc.name, allocs)
		}
	}
}

type nopMetrics struct{}

func (nopMetrics) Added(int, bool)           {}
func (nopMetrics) Dropped(queue.Outcome)     {}
func (nopMetrics) Depth(int, int)            {}
func (nopMetrics) Waited(int, time.Duration) {}
func (nopMetrics) Worked(time.Duration)      {}

func TestStatsReportInFlightWork(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		q := newQ(t, queue.Config[int]{Metrics: nopMetrics{}})
		q.Add("a", 0, queue.AddOptions{})
		q.Add("b", 0, queue.AddOptions{})
		q.Add("c", 0, queue.AddOptions{Delay: time.Hour})
		mustGet(t, q)
		q.Add("a", 1, queue.AddOptions{}) // parked
		time.Sleep(2 * time.Second)
		mustGet(t, q)
		time.Sleep(3 * time.Second)
		q.Suspend()
		got := q.Stats()
		want := queue.Stats{Ready: 0, Delayed: 1, Parked: 1, InFlight: 2,
			LongestRunning: 5 * time.Second, UnfinishedWork: 8 * time.Second, Suspended: true}
		if got != want {
			t.Fatalf("Stats = %+v, want %+v", got, want)
		}
	})
}

func TestManyDistinctPrioritiesAreServedInOrder(t *testing.T) {
	q := queue.New[int, int](queue.Config[int]{})
	for round := range 3 {
		// 100 priorities pending at once, added in a scrambled order
		for i := range 100 {
			p := (i*37)%100 - 50
			q.Add(round*1000+i, p, queue.AddOptions{Priority: p})
		}
		last := 1 << 30
		for range 100 {
			it := mustGet(t, q)
			if it.Priority > last {
				t.Fatalf("round %d: priority %d after %d", round, it.Priority, last)
			}
			last = it.Priority
			q.Done(it.Key)
		}
		if _, ok := tryGet(t, q); ok {
			t.Fatal("more entries than added")
		}
	}
}
