package queue_test

import (
	"context"
	"testing"
	"testing/synctest"
	"time"

	"github.com/opkit/opkit/queue"
)

// A GetAtLeast that owns the delay timer is cancelled exactly when the
// timer fires: the plain Get blocked beside it still gets the entry it
// takes at its due time.
func TestAGetAtLeastCancelledAsItsTimerFiresLeavesTheGetItsEntry(t *testing.T) {
	for range 50 {
		synctest.Test(t, func(t *testing.T) {
			q := newQ(t, queue.Config[int]{})
			ctx, cancel := context.WithCancel(context.Background())
			r := getter(ctx, q, ptr(urgent)) // owner
			p := getter(context.Background(), q, nil)
			q.Add("low", 0, queue.AddOptions{Delay: time.Second})
			start := time.Now()
			time.AfterFunc(time.Second, cancel)
			time.Sleep(time.Second)
			synctest.Wait()
			g, ok := received(p)
			if !ok || g.it.Key != "low" {
				t.Fatalf("plain Get: %+v %v", g, ok)
			}
			if time.Since(start) != time.Second {
				t.Fatalf("late")
			}
			_ = r
			q.ShutDown()
		})
	}
}

// A plain Get that owns the delay timer is cancelled exactly when the
// timer fires: the GetAtLeast blocked beside it still gets the later
// urgent entry at its due time.
func TestAGetCancelledAsItsTimerFiresLeavesTheGetAtLeastItsLaterEntry(t *testing.T) {
	for range 50 {
		synctest.Test(t, func(t *testing.T) {
			q := newQ(t, queue.Config[int]{})
			ctx, cancel := context.WithCancel(context.Background())
			p := getter(ctx, q, nil) // owner
			r := getter(context.Background(), q, ptr(urgent))
			q.Add("low", 0, queue.AddOptions{Delay: time.Second})
			q.Add("hi", 0, queue.AddOptions{Delay: 2 * time.Second, Priority: urgent})
			time.AfterFunc(time.Second, cancel)
			time.Sleep(time.Second)
			synctest.Wait()
			wantBlocked(t, "GetAtLeast", r)
			time.Sleep(time.Second)
			synctest.Wait()
			wantKey(t, "GetAtLeast", r, "hi")
			_ = p
			q.ShutDown()
		})
	}
}

// A merge that brings a delayed entry's due time before the time the
// owner's timer is armed for rearms it: the entry is handed out on time.
func TestAMergeThatShortensADelayBelowTheArmedTimerIsOnTime(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		q := newQ(t, queue.Config[int]{})
		r := getter(context.Background(), q, ptr(urgent)) // owner
		p := getter(context.Background(), q, nil)
		q.Add("a", 0, queue.AddOptions{Delay: 10 * time.Second})
		q.Add("b", 0, queue.AddOptions{Delay: 10 * time.Second})
		q.Add("b", 0, queue.AddOptions{Delay: time.Second, Priority: urgent})
		time.Sleep(time.Second)
		synctest.Wait()
		wantKey(t, "GetAtLeast", r, "b")
		wantBlocked(t, "Get", p)
		time.Sleep(9 * time.Second)
		synctest.Wait()
		wantKey(t, "Get", p, "a")
	})
}

// Done makes a parked delayed urgent entry pending while both kinds of Get
// are blocked: it is handed out at its due time.
func TestDoneSchedulesAParkedDelayedEntryForTheBlockedGets(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		q := newQ(t, queue.Config[int]{})
		q.Add("a", 0, queue.AddOptions{})
		it := mustGet(t, q)
		r := getter(context.Background(), q, ptr(urgent))
		p := getter(context.Background(), q, nil)
		q.Add("a", 1, queue.AddOptions{Delay: time.Second, Priority: urgent})
		q.Add("z", 1, queue.AddOptions{Delay: 5 * time.Second})
		q.Done(it.Key)
		time.Sleep(time.Second)
		synctest.Wait()
		wantKey(t, "GetAtLeast", r, "a")
		wantBlocked(t, "Get", p)
		time.Sleep(4 * time.Second)
		synctest.Wait()
		wantKey(t, "Get", p, "z")
	})
}
