package reconcile_test

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync/atomic"
	"testing"
	"testing/synctest"
	"time"

	"github.com/opkit/opkit/queue"
	"github.com/opkit/opkit/reconcile"
)

// failing is a reconciler that fails while down is set.
func failing(down *atomic.Bool) *recorder {
	return &recorder{do: func(context.Context, int, reconcile.Request[*Widget]) (reconcile.Result, error) {
		if down.Load() {
			return reconcile.Done(), errors.New("dependency down")
		}
		return reconcile.Done(), nil
	}}
}

// gapsAfter returns the times between consecutive calls from call i on.
func gapsAfter(calls []call, i int) []time.Duration {
	var gaps []time.Duration
	for j := i + 1; j < len(calls); j++ {
		gaps = append(gaps, calls[j].at.Sub(calls[j-1].at))
	}
	return gaps
}

// describeCalls formats calls for a failure message.
func describeCalls(calls []call) string {
	var b strings.Builder
	for i, c := range calls {
		fmt.Fprintf(&b, "\n %d: %s %s %v retries=%d rv=%s size=%d", i, c.req.Sources, c.req.Type,
			c.req.Reasons, c.retries, c.req.Object.ResourceVersion, c.req.Object.Spec.Size)
	}
	return b.String()
}

// updateSpec changes widget ns/a's spec size as a user would.
func updateSpec(t *testing.T, e *env, size int) {
	t.Helper()
	e.update(t, "a", func(w *Widget) { w.Spec.Size = size })
}

// gapsAfterAChange changes ns/a's spec and returns the gaps between the
// reconciles of the 10s that follow, and every reconcile so far.
func gapsAfterAChange(t *testing.T, e *env) (string, []call) {
	n := len(e.rec.snapshot())
	updateSpec(t, e, 2)
	time.Sleep(10 * time.Second)
	synctest.Wait()
	calls := e.rec.snapshot()
	return fmt.Sprint(gapsAfter(calls, n)), calls
}

// An object that keeps changing (another writer, every 30s) while its
// reconcile keeps failing: each change is reconciled at once, but the
// backoff does not start again from its shortest delay at each change, so
// once the delay outgrows 30s there is one reconcile per change, not a
// fresh ladder of retries each time. A turn a change asked for is always
// made: the key is given up on only after MaxRetries retries of its own.
func TestChangesWhileFailingDoNotRestartTheBackoff(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		var down atomic.Bool
		down.Store(true)
		rec := failing(&down)
		e := start(t, rec, func(c *reconcile.Config[*Widget]) {
			c.Backoff = queue.Backoff{Base: 5 * time.Millisecond, Cap: 5 * time.Minute, Jitter: -1}
		}, widget("a"))
		start := time.Now()
		const changes = 120 // an hour
		for i := range changes {
			time.Sleep(30 * time.Second)
			updateSpec(t, e, i+2)
		}
		synctest.Wait()
		calls := rec.snapshot()
		var late int // reconciles in the second half hour
		for _, c := range calls {
			if c.at.Sub(start) > 30*time.Minute {
				late++
			}
		}
		t.Logf("%d changes in an hour: %d reconciles, %d in the second half hour, given up %d times",
			changes, len(calls), late, e.metrics.get("gave_up"))
		if late != changes/2 {
			t.Errorf("%d reconciles in the second half hour, want %d: one per change", late, changes/2)
		}
		if n := e.metrics.get("gave_up"); n != 0 {
			t.Errorf("given up %d times; a turn a change asked for is always made", n)
		}
		if last := calls[len(calls)-1]; last.req.Object.Spec.Size != changes+1 {
			t.Errorf("last reconcile saw size %d, want the last change (%d)", last.req.Object.Spec.Size, changes+1)
		}
		// The dependency comes back: the next retry (at most the 5m cap
		// away) succeeds.
		down.Store(false)
		time.Sleep(5 * time.Minute)
		synctest.Wait()
		if e.metrics.get("done") != 1 {
			t.Errorf("%d successful reconciles within the cap after the dependency came back, want 1", e.metrics.get("done"))
		}
	})
}

// A success ends the streak: the next failure waits the shortest delay
// again.
func TestASuccessStartsTheBackoffAgain(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		var down atomic.Bool
		down.Store(true)
		rec := failing(&down)
		e := start(t, rec, nil, widget("a")) // 1s doubling to 1m
		time.Sleep(10 * time.Second)         // fails at 0, 1, 3, 7s
		down.Store(false)
		time.Sleep(10 * time.Second) // the retry at 15s succeeds
		synctest.Wait()
		down.Store(true)
		if got, calls := gapsAfterAChange(t, e); got != "[1s 2s 4s]" {
			t.Errorf("after a success, retry gaps %s, want [1s 2s 4s]; reconciles:%s", got, describeCalls(calls))
		}
	})
}

// A key given up on ends its streak: its next event's failure waits the
// shortest delay, not the delay the given-up request had reached.
func TestGivingUpEndsTheStreak(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		var down atomic.Bool
		down.Store(true)
		rec := failing(&down)
		e := start(t, rec, func(c *reconcile.Config[*Widget]) { c.MaxRetries = 3 }, widget("a"))
		time.Sleep(time.Minute) // fails at 0, 1, 3, 7s: given up
		synctest.Wait()
		if e.metrics.get("gave_up") != 1 {
			t.Fatalf("given up %d times, want 1", e.metrics.get("gave_up"))
		}
		if got, calls := gapsAfterAChange(t, e); got != "[1s 2s 4s]" {
			t.Errorf("after giving up, the next event's retry gaps %s, want [1s 2s 4s]; reconciles:%s", got, describeCalls(calls))
		}
	})
}
