package reconcile_test

import (
	"context"
	"slices"
	"testing"
	"testing/synctest"
	"time"

	corev1 "k8s.io/api/core/v1"

	"github.com/opkit/opkit"
	"github.com/opkit/opkit/internal/typed"
	"github.com/opkit/opkit/queue"
	"github.com/opkit/opkit/reconcile"
	"github.com/opkit/opkit/trigger"
)

// A teardown (a Deleted trigger) waits; its object leaves the watch's
// label selector (a watch Deleted of its UID, which the trigger takes) and
// comes back (a watch Added of its UID). The teardown still runs: the
// object's return replaces only the watch's own delete.
func TestATeardownSurvivesASelectorFlap(t *testing.T) {
	k := opkit.Key{Namespace: "ns", Name: "a"}
	q := queue.New[opkit.Key](queue.Config[cmEv]{Merge: reconcile.MergeEvents[*corev1.ConfigMap]})
	q.Add(k, deletedTrigger("u1"), queue.AddOptions{})
	q.Add(k, ev(opkit.Deleted, "u1"), queue.AddOptions{}) // leaves the selector
	q.Add(k, ev(opkit.Added, "u1"), queue.AddOptions{})   // back
	got := drain(t, q, k)
	if !slices.Contains(got, "Operator Deleted u1") {
		t.Fatalf("handed out %q; the teardown (Operator Deleted u1) was dropped", got)
	}
}

// The other order: the watch's delete waits when the teardown arrives.
// The entry becomes the teardown's, carrying the watch's delete, so the
// object's return does not drop it either.
func TestATeardownBehindAWaitingWatchDeleteSurvivesASelectorFlap(t *testing.T) {
	k := opkit.Key{Namespace: "ns", Name: "a"}
	q := queue.New[opkit.Key](queue.Config[cmEv]{Merge: reconcile.MergeEvents[*corev1.ConfigMap]})
	q.Add(k, ev(opkit.Deleted, "u1"), queue.AddOptions{}) // leaves the selector
	q.Add(k, deletedTrigger("u1"), queue.AddOptions{})
	q.Add(k, ev(opkit.Added, "u1"), queue.AddOptions{}) // back
	if got, want := drain(t, q, k), []string{"Operator Deleted u1", "APIServer Added u1"}; !slices.Equal(got, want) {
		t.Fatalf("handed out %q, want %q", got, want)
	}
}

// The same through the controller and its watcher.
func TestATeardownSurvivesASelectorFlapThroughTheController(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		rec := &recorder{}
		shard := func(n string) func(*Widget) { return func(w *Widget) { w.Labels = map[string]string{"shard": n} } }
		e, fw := startWithFakeWatch(t, rec, func(c *reconcile.Config[*Widget]) { c.Watch.LabelSelector = "shard=1" }, widget("a", shard("1")))
		synctest.Wait()
		req := trigger.Request[*Widget]{Object: widget("a", shard("1")), Type: opkit.Deleted, Source: opkit.Operator, Reason: "teardown", Delay: 10 * time.Second}
		if o, err := e.ctrl.Trigger().Submit(context.Background(), req); err != nil || !o.Accepted() {
			t.Fatalf("Submit = %v, %v", o, err)
		}
		left, _ := typed.ToUnstructured(widget("a", shard("2"), func(w *Widget) { w.ResourceVersion = "3" }))
		fw.Delete(left)
		back, _ := typed.ToUnstructured(widget("a", shard("1"), func(w *Widget) { w.ResourceVersion = "4" }))
		fw.Add(back)
		time.Sleep(time.Minute)
		synctest.Wait()
		got := summarize(rec.snapshot()[1:])
		if !slices.Contains(got, "Operator Deleted teardown") {
			t.Errorf("reconciles after the teardown trigger: %q; the teardown never ran", got)
		}
	})
}

// RecordTriggerEvents: a Deleted trigger into which the watch's delete
// merged is still a reconcile an external trigger requested, recorded once.
func TestADeletedTriggerThatTookTheWatchDeleteIsRecorded(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		rec := &recorder{}
		e, fw := startWithFakeWatch(t, rec, func(c *reconcile.Config[*Widget]) { c.RecordTriggerEvents = true }, widget("a"))
		synctest.Wait()
		submitDeleted(t, e)
		gone, _ := typed.ToUnstructured(widget("a", func(w *Widget) { w.ResourceVersion = "3" }))
		fw.Delete(gone)
		time.Sleep(time.Minute)
		synctest.Wait()
		got := summarize(rec.snapshot()[1:])
		triggered := 0
		for _, ev := range e.events(t) {
			if ev.Reason == "Triggered" {
				triggered++
			}
		}
		if triggered != 1 {
			t.Errorf("%d Triggered Events (reconciles %q), want 1", triggered, got)
		}
	})
}

// summarize is each call's source, type and reason.
func summarize(calls []call) []string {
	var s []string
	for _, c := range calls {
		s = append(s, c.req.Source.String()+" "+c.req.Type.String()+" "+c.req.Reason)
	}
	return s
}
