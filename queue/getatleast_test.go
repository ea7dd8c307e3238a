package queue_test

import (
	"context"
	"errors"
	"testing"
	"testing/synctest"
	"time"

	"github.com/opkit/opkit/queue"
)

// Semantics 7: GetAtLeast, the reserved lane.

const urgent = 100 // the priority the reserved Gets in these tests take

type got struct {
	it  queue.Item[string, int]
	err error
}

// getter starts a Get (min == nil) or a GetAtLeast(min) in a goroutine of
// the bubble, waits until it has blocked or returned, and returns the
// channel its result arrives on.
func getter(ctx context.Context, q *queue.Queue[string, int], min *int) chan got {
	ch := make(chan got, 1)
	go func() {
		var g got
		if min == nil {
			g.it, g.err = q.Get(ctx)
		} else {
			g.it, g.err = q.GetAtLeast(ctx, *min)
		}
		ch <- g
	}()
	synctest.Wait()
	return ch
}

func ptr(v int) *int { return &v }

// received returns the result of a getter if it has one (call after
// synctest.Wait).
func received(ch chan got) (got, bool) {
	select {
	case g := <-ch:
		return g, true
	default:
		return got{}, false
	}
}

func wantKey(t *testing.T, who string, ch chan got, key string) {
	t.Helper()
	g, ok := received(ch)
	switch {
	case !ok:
		t.Fatalf("%s is still blocked, want it to have taken %q", who, key)
	case g.err != nil || g.it.Key != key:
		t.Fatalf("%s = %q, %v; want %q", who, g.it.Key, g.err, key)
	}
}

func wantBlocked(t *testing.T, who string, ch chan got) {
	t.Helper()
	if g, ok := received(ch); ok {
		t.Fatalf("%s returned %q, %v; want it still blocked", who, g.it.Key, g.err)
	}
}

func tryGetAtLeast(t *testing.T, q *queue.Queue[string, int], min int) (queue.Item[string, int], bool) {
	t.Helper()
	it, err := q.GetAtLeast(cancelled(), min)
	if err != nil {
		if !errors.Is(err, context.Canceled) && !errors.Is(err, queue.ErrShutDown) {
			t.Fatalf("GetAtLeast: unexpected error %v", err)
		}
		return it, false
	}
	return it, true
}

func TestGetAtLeastTakesOnlyEntriesAtOrAboveItsPriorityInOrder(t *testing.T) {
	q := newQ(t, queue.Config[int]{})
	mustAdd(t, q, "low", 0, queue.AddOptions{Priority: 0}, queue.Queued)
	mustAdd(t, q, "t1", 0, queue.AddOptions{Priority: urgent}, queue.Queued)
	mustAdd(t, q, "t2", 0, queue.AddOptions{Priority: urgent}, queue.Queued)
	mustAdd(t, q, "higher", 0, queue.AddOptions{Priority: urgent + 1}, queue.Queued)
	mustAdd(t, q, "later", 0, queue.AddOptions{Priority: urgent, Delay: time.Hour}, queue.Queued)
	for _, want := range []string{"higher", "t1", "t2"} {
		it, ok := tryGetAtLeast(t, q, urgent)
		if !ok || it.Key != want {
			t.Fatalf("GetAtLeast = %q (%v), want %q", it.Key, ok, want)
		}
	}
	if it, ok := tryGetAtLeast(t, q, urgent); ok {
		t.Fatalf("GetAtLeast = %q; only a lower and a delayed entry are left", it.Key)
	}
	if it := mustGet(t, q); it.Key != "low" {
		t.Fatalf("Get = %q, want low", it.Key)
	}
	// Exclusive per key: an in-flight key is not handed out again, its add
	// is parked and qualifies at Done.
	mustAdd(t, q, "t1", 1, queue.AddOptions{Priority: urgent}, queue.Merged)
	if it, ok := tryGetAtLeast(t, q, urgent); ok {
		t.Fatalf("GetAtLeast = %q while t1 is in flight", it.Key)
	}
	q.Done("t1")
	if it, ok := tryGetAtLeast(t, q, urgent); !ok || it.Key != "t1" || it.Value != 1 {
		t.Fatalf("GetAtLeast = %+v (%v), want t1=1", it, ok)
	}
	// Priorities are clamped: the extremes behave like the int32 bounds.
	mustAdd(t, q, "max", 0, queue.AddOptions{Priority: 1 << 40}, queue.Queued)
	if it, ok := tryGetAtLeast(t, q, 1<<41); !ok || it.Key != "max" {
		t.Fatalf("GetAtLeast(huge) = %+v (%v), want max", it, ok)
	}
}

func TestGetAtLeastAfterShutDownHandsOutQualifyingDueEntriesThenStops(t *testing.T) {
	q := newQ(t, queue.Config[int]{})
	q.Add("low", 0, queue.AddOptions{})
	q.Add("t", 0, queue.AddOptions{Priority: urgent})
	q.Add("later", 0, queue.AddOptions{Priority: urgent, Delay: time.Hour})
	q.ShutDown()
	if it, err := q.GetAtLeast(context.Background(), urgent); err != nil || it.Key != "t" {
		t.Fatalf("GetAtLeast = %q, %v; want t", it.Key, err)
	}
	if _, err := q.GetAtLeast(context.Background(), urgent); !errors.Is(err, queue.ErrShutDown) {
		t.Fatalf("GetAtLeast = %v, want ErrShutDown without blocking (low is not for it)", err)
	}
	if it := mustGet(t, q); it.Key != "low" {
		t.Fatalf("Get = %q, want low", it.Key)
	}
}

func TestBlockedGetAtLeastReturnsContextErrorAndShutDown(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		q := newQ(t, queue.Config[int]{})
		q.Add("low", 0, queue.AddOptions{})
		ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
		defer cancel()
		if _, err := q.GetAtLeast(ctx, urgent); !errors.Is(err, context.DeadlineExceeded) {
			t.Fatalf("GetAtLeast = %v, want DeadlineExceeded", err)
		}
		r := getter(context.Background(), q, ptr(urgent))
		wantBlocked(t, "GetAtLeast", r)
		q.ShutDown()
		synctest.Wait()
		if g, ok := received(r); !ok || !errors.Is(g.err, queue.ErrShutDown) {
			t.Fatalf("GetAtLeast = %+v (returned %v), want ErrShutDown", g, ok)
		}
		if q.Len() != 1 {
			t.Fatalf("Len = %d, want low still held", q.Len())
		}
	})
}

func TestBlockedGetAtLeastIsWokenByAQualifyingAddAndNotByALowerOne(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		q := newQ(t, queue.Config[int]{})
		// The GetAtLeast blocks first: it is the oldest waiter.
		r := getter(context.Background(), q, ptr(urgent))
		p := getter(context.Background(), q, nil)
		q.Add("low", 0, queue.AddOptions{})
		synctest.Wait()
		wantBlocked(t, "GetAtLeast", r)
		wantKey(t, "Get", p, "low") // its wake-up was not taken by the older GetAtLeast
		q.Add("t", 0, queue.AddOptions{Priority: urgent})
		synctest.Wait()
		wantKey(t, "GetAtLeast", r, "t")
	})
}

func TestBlockedGetAtLeastIsWokenWhenAMergeRaisesAReadyEntry(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		q := newQ(t, queue.Config[int]{})
		q.Add("a", 0, queue.AddOptions{}) // ready, priority 0: not for it
		r := getter(context.Background(), q, ptr(urgent))
		wantBlocked(t, "GetAtLeast", r)
		mustAdd(t, q, "a", 1, queue.AddOptions{Priority: urgent}, queue.Merged)
		synctest.Wait()
		wantKey(t, "GetAtLeast", r, "a")
	})
}

func TestBlockedGetAtLeastIsWokenWhenAMergeMakesADelayedEntryDueAndUrgent(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		q := newQ(t, queue.Config[int]{})
		q.Add("a", 0, queue.AddOptions{Delay: time.Hour})
		r := getter(context.Background(), q, ptr(urgent))
		mustAdd(t, q, "a", 1, queue.AddOptions{Priority: urgent}, queue.Merged)
		synctest.Wait()
		wantKey(t, "GetAtLeast", r, "a")
	})
}

func TestBlockedGetAtLeastIsWokenWhenAParkedEntryIsReleasedAtDone(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		q := newQ(t, queue.Config[int]{})
		q.Add("a", 0, queue.AddOptions{Priority: urgent})
		mustGet(t, q)
		mustAdd(t, q, "a", 1, queue.AddOptions{Priority: urgent}, queue.Merged) // parked
		r := getter(context.Background(), q, ptr(urgent))
		wantBlocked(t, "GetAtLeast", r)
		q.Done("a")
		synctest.Wait()
		wantKey(t, "GetAtLeast", r, "a")
	})
}

func TestBlockedGetAtLeastTakesADelayedEntryAtItsDueTime(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		q := newQ(t, queue.Config[int]{})
		start := time.Now()
		q.Add("a", 0, queue.AddOptions{Priority: urgent, Delay: time.Second})
		r := getter(context.Background(), q, ptr(urgent))
		time.Sleep(999 * time.Millisecond)
		synctest.Wait()
		wantBlocked(t, "GetAtLeast", r)
		time.Sleep(time.Millisecond)
		synctest.Wait()
		wantKey(t, "GetAtLeast", r, "a")
		if d := time.Since(start); d != time.Second {
			t.Fatalf("handed out after %v, want exactly 1s", d)
		}
	})
}

func TestGetAtLeastOwningTheTimerPassesALowerDueEntryToAPlainGet(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		q := newQ(t, queue.Config[int]{})
		// The GetAtLeast is the oldest waiter, so it is the one whose timer
		// is armed for the delayed entries.
		r := getter(context.Background(), q, ptr(urgent))
		p := getter(context.Background(), q, nil)
		q.Add("low", 0, queue.AddOptions{Delay: time.Second})
		q.Add("t", 0, queue.AddOptions{Priority: urgent, Delay: 2 * time.Second})
		time.Sleep(time.Second)
		synctest.Wait()
		wantKey(t, "Get", p, "low")
		wantBlocked(t, "GetAtLeast", r)
		time.Sleep(time.Second)
		synctest.Wait()
		wantKey(t, "GetAtLeast", r, "t")
	})
}

func TestPlainGetOwningTheTimerLeavesNoQualifyingEntryBehind(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		q := newQ(t, queue.Config[int]{})
		p := getter(context.Background(), q, nil) // oldest: owns the timer
		r := getter(context.Background(), q, ptr(urgent))
		// Both become due at once: the Get takes the urgent one first (it
		// takes the highest priority), and the other one is its own again
		// once it is back; the GetAtLeast must not stay blocked while an
		// entry it takes is due, whichever the Get took.
		q.Add("t1", 0, queue.AddOptions{Priority: urgent, Delay: time.Second})
		q.Add("t2", 0, queue.AddOptions{Priority: urgent, Delay: time.Second})
		time.Sleep(time.Second)
		synctest.Wait()
		wantKey(t, "Get", p, "t1")
		wantKey(t, "GetAtLeast", r, "t2")
	})
}

func TestCancelledGetAtLeastPassesItsWakeUpOn(t *testing.T) {
	// Like TestCancelledGetPassesItsWakeUpOn, with a GetAtLeast whose
	// context ends as it is woken: the wake-up goes to the other blocked
	// Get that takes the entry, never to one that does not.
	for _, second := range []*int{nil, ptr(urgent)} {
		for range 20 {
			synctest.Test(t, func(t *testing.T) {
				q := newQ(t, queue.Config[int]{})
				ctx, cancel := context.WithCancel(context.Background())
				first := getter(ctx, q, ptr(urgent))
				other := getter(context.Background(), q, ptr(urgent+1)) // never qualifies
				next := getter(context.Background(), q, second)
				cancel()
				q.Add("t", 0, queue.AddOptions{Priority: urgent})
				synctest.Wait()
				r1, _ := received(first)
				switch {
				case r1.err == nil && r1.it.Key == "t":
					wantBlocked(t, "second", next)
				case errors.Is(r1.err, context.Canceled):
					wantKey(t, "second", next, "t")
				default:
					t.Fatalf("first GetAtLeast = %+v", r1)
				}
				wantBlocked(t, "GetAtLeast above the entry", other)
				q.ShutDown()
			})
		}
	}
}

func TestCancelledPlainGetPassesAnUrgentEntryToAGetAtLeast(t *testing.T) {
	for range 20 {
		synctest.Test(t, func(t *testing.T) {
			q := newQ(t, queue.Config[int]{})
			ctx, cancel := context.WithCancel(context.Background())
			first := getter(ctx, q, nil) // oldest: woken first
			r := getter(context.Background(), q, ptr(urgent))
			cancel()
			q.Add("t", 0, queue.AddOptions{Priority: urgent})
			synctest.Wait()
			r1, _ := received(first)
			switch {
			case r1.err == nil && r1.it.Key == "t":
				wantBlocked(t, "GetAtLeast", r)
			case errors.Is(r1.err, context.Canceled):
				wantKey(t, "GetAtLeast", r, "t")
			default:
				t.Fatalf("first Get = %+v", r1)
			}
			q.ShutDown()
		})
	}
}

func TestNoBlockedGetIsLeftWithAnEntryItTakes(t *testing.T) {
	// Adds of both kinds at once, to blocked Gets of both kinds, in every
	// order: afterwards no blocked Get may have a due entry it takes. The
	// plain Gets may take urgent entries (they take anything, highest
	// first); that is the only reason a lower entry may stay ready, and
	// then no plain Get is blocked.
	orders := [][]int{{0, urgent}, {urgent, 0}, {urgent, urgent, 0}, {0, 0, urgent}, {urgent, 0, urgent, 0}}
	for _, order := range orders {
		for _, reservedFirst := range []bool{false, true} {
			synctest.Test(t, func(t *testing.T) {
				q := newQ(t, queue.Config[int]{})
				var ps, rs []chan got
				for range 2 {
					if reservedFirst {
						rs = append(rs, getter(context.Background(), q, ptr(urgent)))
						ps = append(ps, getter(context.Background(), q, nil))
					} else {
						ps = append(ps, getter(context.Background(), q, nil))
						rs = append(rs, getter(context.Background(), q, ptr(urgent)))
					}
				}
				for i, prio := range order {
					q.Add(string(rune('a'+i)), 0, queue.AddOptions{Priority: prio})
				}
				synctest.Wait()
				blocked := func(chs []chan got, lowOK bool) bool {
					any := false
					for _, ch := range chs {
						g, ok := received(ch)
						if !ok {
							any = true
							continue
						}
						if g.err != nil || (!lowOK && g.it.Priority < urgent) {
							t.Errorf("got %+v", g)
						}
					}
					return any
				}
				pBlocked := blocked(ps, true)
				rBlocked := blocked(rs, false)
				if it, ok := tryGetAtLeast(t, q, urgent); ok && rBlocked {
					t.Errorf("a GetAtLeast is blocked while %q (priority %d) is due", it.Key, it.Priority)
				}
				if it, ok := tryGet(t, q); ok && pBlocked {
					t.Errorf("a Get is blocked while %q (priority %d) is due", it.Key, it.Priority)
				}
				q.ShutDown()
			})
		}
	}
}
