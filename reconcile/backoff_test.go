package reconcile_test

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"sync/atomic"
	"testing"
	"testing/synctest"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"

	"github.com/opkit/opkit"
	"github.com/opkit/opkit/internal/typed"
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
// fresh ladder of retries each time. Each change starts a new request, so
// the key is never given up on.
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
			changes, len(calls), late, e.metrics.get(reconcile.OutcomeGaveUp))
		if late != changes/2 {
			t.Errorf("%d reconciles in the second half hour, want %d: one per change", late, changes/2)
		}
		if n := e.metrics.get(reconcile.OutcomeGaveUp); n != 0 {
			t.Errorf("given up %d times; each change starts a new request", n)
		}
		if last := calls[len(calls)-1]; last.req.Object.Spec.Size != changes+1 {
			t.Errorf("last reconcile saw size %d, want the last change (%d)", last.req.Object.Spec.Size, changes+1)
		}
		// The dependency comes back: the next retry (at most the 5m cap
		// away) succeeds.
		down.Store(false)
		time.Sleep(5 * time.Minute)
		synctest.Wait()
		if e.metrics.get(reconcile.OutcomeDone) != 1 {
			t.Errorf("%d successful reconciles within the cap after the dependency came back, want 1", e.metrics.get(reconcile.OutcomeDone))
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

// A recreated object (same name, another UID) does not inherit the old
// object's streak: after the old object's delete (reconciled first), the
// new object's failures start from the shortest delay.
func TestARecreatedObjectStartsTheBackoffAgain(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		rec := &recorder{do: func(_ context.Context, _ int, req reconcile.Request[*Widget]) (reconcile.Result, error) {
			if req.Type == opkit.Deleted {
				return reconcile.Done(), nil
			}
			return reconcile.Done(), errors.New("dependency down")
		}}
		e := start(t, rec, nil, widget("a"))
		time.Sleep(40 * time.Second) // fails at 0, 1, 3, 7, 15, 31s: the next in 32s
		synctest.Wait()
		res := e.dyn.Resource(widgets.GroupVersionResource).Namespace("ns")
		if err := res.Delete(context.Background(), "a", metav1.DeleteOptions{}); err != nil {
			t.Fatal(err)
		}
		u, err := typed.ToUnstructured(widget("a", func(w *Widget) { w.UID, w.ResourceVersion = types.UID("uid-new"), strconv.Itoa(100) }))
		if err != nil {
			t.Fatal(err)
		}
		if _, err := res.Create(context.Background(), u, metav1.CreateOptions{}); err != nil {
			t.Fatal(err)
		}
		time.Sleep(10 * time.Second)
		synctest.Wait()
		calls := rec.snapshot()
		first := -1
		for i, c := range calls {
			if c.req.Object.UID == "uid-new" {
				first = i
				break
			}
		}
		if first < 1 || calls[first-1].req.Type != opkit.Deleted {
			t.Fatalf("want the old object's delete, then the new object; reconciles:%s", describeCalls(calls))
		}
		if got := fmt.Sprint(gapsAfter(calls, first)); got != "[1s 2s 4s]" {
			t.Errorf("the new object's retry gaps %s, want [1s 2s 4s]; reconciles:%s", got, describeCalls(calls))
		}
	})
}

// A delete backs off on its own retries: when the old object's cleanup
// fails once, its retry waits the first step of the backoff, not the old
// object's long streak; and the new object of its name does not wait for
// that retry at all.
func TestADeleteDoesNotTakeTheStreak(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		var deletes atomic.Int32
		rec := &recorder{do: func(_ context.Context, _ int, req reconcile.Request[*Widget]) (reconcile.Result, error) {
			switch {
			case req.Type == opkit.Deleted:
				if deletes.Add(1) == 1 {
					return reconcile.Done(), errors.New("cleanup: dependency down")
				}
			case req.Object.UID != "uid-new":
				return reconcile.Done(), errors.New("dependency down")
			}
			return reconcile.Done(), nil
		}}
		e := start(t, rec, func(c *reconcile.Config[*Widget]) {
			c.Backoff = queue.Backoff{Base: 5 * time.Millisecond, Cap: 5 * time.Minute, Jitter: -1}
		}, widget("a"))
		time.Sleep(15 * time.Minute) // the streak reaches the 5m cap
		synctest.Wait()
		res := e.dyn.Resource(widgets.GroupVersionResource).Namespace("ns")
		if err := res.Delete(context.Background(), "a", metav1.DeleteOptions{}); err != nil {
			t.Fatal(err)
		}
		synctest.Wait()
		u, err := typed.ToUnstructured(widget("a", func(w *Widget) { w.UID, w.ResourceVersion = types.UID("uid-new"), "100" }))
		if err != nil {
			t.Fatal(err)
		}
		created := time.Now()
		if _, err := res.Create(context.Background(), u, metav1.CreateOptions{}); err != nil {
			t.Fatal(err)
		}
		time.Sleep(10 * time.Minute)
		synctest.Wait()
		calls := rec.snapshot()
		var deleted []time.Time
		reconciledNew := false
		for _, c := range calls {
			switch {
			case c.req.Type == opkit.Deleted:
				deleted = append(deleted, c.at)
			case c.req.Object.UID == "uid-new" && !reconciledNew:
				reconciledNew = true
				if w := c.at.Sub(created); w != 0 {
					t.Errorf("the new object was reconciled %v after its creation, want at once (in front of the delete's retry); reconciles:%s", w, describeCalls(calls[len(calls)-5:]))
				}
			}
		}
		if !reconciledNew {
			t.Fatalf("the new object was never reconciled; reconciles:%s", describeCalls(calls))
		}
		if len(deleted) != 2 || deleted[1].Sub(deleted[0]) != 5*time.Millisecond {
			t.Fatalf("delete reconciled at %v, want twice, 5ms apart (the first step of the backoff); reconciles:%s", deleted, describeCalls(calls[len(calls)-5:]))
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
		if e.metrics.get(reconcile.OutcomeGaveUp) != 1 {
			t.Fatalf("given up %d times, want 1", e.metrics.get(reconcile.OutcomeGaveUp))
		}
		if got, calls := gapsAfterAChange(t, e); got != "[1s 2s 4s]" {
			t.Errorf("after giving up, the next event's retry gaps %s, want [1s 2s 4s]; reconciles:%s", got, describeCalls(calls))
		}
	})
}
