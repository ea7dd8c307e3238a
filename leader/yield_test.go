package leader_test

import (
	"context"
	"errors"
	"sync/atomic"
	"testing"
	"testing/synctest"
	"time"

	"github.com/opkit/opkit/leader"
)

// While Admit says no, a replica follows a free Lease without writing it;
// once it says yes, the replica acquires within a RetryPeriod.
func TestAReplicaNotAdmittedOnlyFollows(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		e := newEnv(t)
		var admit atomic.Bool
		asked := atomic.Int32{}
		a := e.start("a", func(c *leader.Config) {
			c.Admit = func() bool { asked.Add(1); return admit.Load() }
		}, nil)
		sleep(3 * leaseDuration)
		synctest.Wait()
		if n := countVerb(e.api.callsOf("a"), "create") + countVerb(e.api.callsOf("a"), "update"); n != 0 || a.elector.IsLeader() {
			t.Fatalf("not admitted: %d writes, IsLeader %v; want none, false", n, a.elector.IsLeader())
		}
		if asked.Load() == 0 {
			t.Fatal("Admit was never asked")
		}
		admit.Store(true)
		sleep(retryPeriod)
		synctest.Wait()
		if !a.elector.IsLeader() || holder(e.api.lease()) != "a" {
			t.Fatalf("admitted: IsLeader %v, holder %q; want a leading", a.elector.IsLeader(), holder(e.api.lease()))
		}
		a.stop()
	})
}

// Yield ends the term as a shutdown does (intake suspended, the work's
// context ends with ErrYielded, the Lease released only after the work
// returned) and Run campaigns again: a follower takes the Lease at once,
// and the yielding replica, not admitted meanwhile, does not take it back.
func TestYieldHandsTheLeaseToAFollower(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		e := newEnv(t)
		var admitA atomic.Bool
		admitA.Store(true)
		cause := make(chan error, 1)
		a := e.start("a", func(c *leader.Config) { c.Admit = admitA.Load }, func(ctx context.Context) error {
			<-ctx.Done()
			cause <- context.Cause(ctx)
			time.Sleep(time.Second) // finishing what is in flight
			return nil
		})
		synctest.Wait()
		b := e.start("b", nil, nil)
		synctest.Wait()
		if !a.elector.IsLeader() || b.elector.IsLeader() {
			t.Fatalf("before: a leads %v, b leads %v", a.elector.IsLeader(), b.elector.IsLeader())
		}
		if (&leader.Elector{}).Yield() {
			t.Fatal("Yield of an elector that does not lead reported a term")
		}

		admitA.Store(false)
		yielded := time.Now()
		if !a.elector.Yield() {
			t.Fatal("Yield of the leader reported no term")
		}
		if err := <-cause; !errors.Is(err, leader.ErrYielded) {
			t.Fatalf("the work's context ended with %v, want ErrYielded", err)
		}
		sleep(2 * time.Second) // the work winds down
		synctest.Wait()
		returned, _ := e.j.first("a", "work-return", yielded)
		resumed, ok := e.j.first("b", "resume", yielded)
		if !ok || resumed.at.Before(returned.at) {
			t.Fatalf("b resumed %v (%v), a's work returned %v: want b after a's work; journal\n%s", resumed.at, ok, returned.at, e.j)
		}
		if resumed.at.Sub(returned.at) != 0 {
			t.Errorf("b took over %v after a's work returned; a released Lease is taken at once", resumed.at.Sub(returned.at))
		}
		sleep(3 * leaseDuration)
		synctest.Wait()
		if a.elector.IsLeader() || !b.elector.IsLeader() || a.elector.Leader() != "b" {
			t.Fatalf("after: a leads %v (sees %q), b leads %v", a.elector.IsLeader(), a.elector.Leader(), b.elector.IsLeader())
		}
		select {
		case err := <-a.done:
			t.Fatalf("a's Run returned %v after a yield, want it to go on following", err)
		default:
		}
		b.stop()
		a.stop()
	})
}
