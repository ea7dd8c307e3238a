package trigger

import (
	"context"
	"testing"
	"testing/synctest"
	"time"
)

// waitFor starts acquire(key) and returns a channel with its result.
func waitFor(ctx context.Context, s *fairSlots, key string) <-chan bool {
	got := make(chan bool, 1)
	go func() { got <- s.acquire(ctx, key) }()
	synctest.Wait() // it took a slot or joined the line
	return got
}

func pending(ch <-chan bool) bool {
	select {
	case <-ch:
		return false
	default:
		return true
	}
}

func TestASlotGivenBackGoesToTheWaitingCallerThatHoldsTheFewest(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		ctx := t.Context()
		s := newFairSlots(3)
		for range 3 {
			if !s.acquire(ctx, "flood") {
				t.Fatal("a free slot was refused")
			}
		}
		flood := []<-chan bool{waitFor(ctx, s, "flood"), waitFor(ctx, s, "flood")}
		calm := waitFor(ctx, s, "calm") // last in line, but holds none
		s.release("flood")
		synctest.Wait()
		if pending(calm) {
			t.Fatal("the caller holding no slot did not get the one given back")
		}
		if !pending(flood[0]) || !pending(flood[1]) {
			t.Fatal("a flood request got a slot before the calm caller")
		}
		s.release("flood")
		synctest.Wait()
		if pending(flood[0]) || !pending(flood[1]) {
			t.Fatal("among the same caller's requests, the earliest goes first")
		}
	})
}

func TestAFullLineMakesRoomByRefusingTheLatestRequestOfTheBiggestCaller(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		ctx := t.Context()
		s := newFairSlots(2)
		s.acquire(ctx, "flood")
		s.acquire(ctx, "flood")
		first, last := waitFor(ctx, s, "flood"), waitFor(ctx, s, "flood")
		calm := waitFor(ctx, s, "calm")
		if ok := <-last; ok {
			t.Fatal("the flood's latest request was not refused to make room")
		}
		if !pending(first) || !pending(calm) {
			t.Fatal("a request other than the flood's latest left the line")
		}
		// A second flood caller has fewer than the first: it takes the
		// first's place too; the calm caller keeps its place.
		other := waitFor(ctx, s, "other")
		if ok := <-first; ok {
			t.Fatal("the biggest caller's request was not the one refused")
		}
		s.release("flood")
		synctest.Wait()
		if pending(calm) || !pending(other) {
			t.Fatal("of two waiting callers holding none, the earlier did not get the slot")
		}
	})
}

func TestANewcomerNoSmallerThanEveryoneInAFullLineIsRefused(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		ctx := t.Context()
		s := newFairSlots(1)
		s.acquire(ctx, "a")
		b := waitFor(ctx, s, "b")
		if s.acquire(ctx, "a") {
			t.Fatal("a caller holding a slot got a second through a full line")
		}
		if !pending(b) {
			t.Fatal("the waiting request was refused for a bigger caller")
		}
	})
}

func TestAWaitEndsWithTheContextAndLeavesTheSlotsWhole(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		s := newFairSlots(1)
		s.acquire(t.Context(), "a")
		ctx, cancel := context.WithTimeout(t.Context(), time.Second)
		defer cancel()
		if s.acquire(ctx, "b") {
			t.Fatal("a wait whose context ended got a slot")
		}
		s.release("a")
		if !s.acquire(t.Context(), "c") || s.acquire(ctx, "d") {
			t.Fatal("after the wait ended, the one slot is not free exactly once")
		}
	})
}

// Among callers that hold and wait for as many, a newcomer that holds
// none takes the place of the one that came last, never of the request
// that waited longest.
func TestAFullLineOfEqualsRefusesItsLatestNotItsHead(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		ctx := t.Context()
		s := newFairSlots(3)
		for _, k := range []string{"a", "b", "c"} {
			s.acquire(ctx, k)
		}
		d, e, f := waitFor(ctx, s, "d"), waitFor(ctx, s, "e"), waitFor(ctx, s, "f")
		g := waitFor(ctx, s, "g")
		if ok := <-f; ok {
			t.Fatal("the latest of the equals was not the one refused")
		}
		if !pending(d) || !pending(e) || !pending(g) {
			t.Fatal("the head of the line, or the newcomer, left it")
		}
		s.release("a")
		synctest.Wait()
		if pending(d) {
			t.Fatal("the request that waited longest did not get the slot given back")
		}
	})
}
