package reconcile_test

import (
	"context"
	"fmt"
	"slices"
	"strings"
	"testing"
	"testing/synctest"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/opkit/opkit"
	"github.com/opkit/opkit/internal/typed"
	"github.com/opkit/opkit/queue"
	"github.com/opkit/opkit/reconcile"
	"github.com/opkit/opkit/trigger"
)

// While one reconcile of a key runs, events that alternate between two
// kinds (a Deleted trigger and a change sequenced behind it, then the next
// Deleted trigger) do not grow the key's chain: the repeated Deleted
// trigger is merged into its twin held earlier (MergePrecede walks back
// to it). Every kind is still delivered, in the order it must be.
func TestAlternatingEventsKeepAKeysChainShort(t *testing.T) {
	for _, tc := range []struct {
		name     string
		inFlight opkit.Event[*corev1.ConfigMap]
		a, b     opkit.Event[*corev1.ConfigMap]
		// want is the types and UIDs delivered after the one in flight.
		want []opkit.Event[*corev1.ConfigMap]
	}{
		{"Deleted triggers and watch changes of an object that still exists",
			ev(opkit.Modified, "u1"), deletedTrigger("u1"), ev(opkit.Modified, "u1"),
			[]opkit.Event[*corev1.ConfigMap]{deletedTrigger("u1"), ev(opkit.Modified, "u1")}},
		{"stale Deleted triggers (an older object) and triggers for the current one",
			ev(opkit.Modified, "u2"), deletedTrigger("u1"), trig("u2"),
			[]opkit.Event[*corev1.ConfigMap]{deletedTrigger("u1"), trig("u2")}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			k := opkit.Key{Namespace: "ns", Name: "a"}
			q := queue.New[opkit.Key](queue.Config[opkit.Event[*corev1.ConfigMap]]{Merge: reconcile.MergeEvents[*corev1.ConfigMap]})
			q.Add(k, tc.inFlight, queue.AddOptions{})
			if _, err := q.Get(context.Background()); err != nil {
				t.Fatal(err)
			}
			for range 100 {
				q.Add(k, tc.a, queue.AddOptions{})
				q.Add(k, tc.b, queue.AddOptions{})
			}
			if st := q.Stats(); st.Parked != len(tc.want) {
				t.Fatalf("%d entries parked for 100 pairs, want %d", st.Parked, len(tc.want))
			}
			for i, want := range tc.want {
				q.Done(k)
				it, err := q.Get(context.Background())
				if err != nil {
					t.Fatal(err)
				}
				if it.Value.Type != want.Type || it.Value.Source != want.Source || it.Value.Object.UID != want.Object.UID {
					t.Fatalf("delivery %d: %s %s of %s, want %s %s of %s", i, it.Value.Source, it.Value.Type, it.Value.Object.UID,
						want.Source, want.Type, want.Object.UID)
				}
			}
		})
	}
}

// The same through the controller: teardown triggers (Type Deleted) for
// an object that is deleting with finalizers, while its spec keeps
// changing and one reconcile of it runs. Every Deleted trigger and change
// is served, by one Deleted reconcile and one change after it, not one
// reconcile each.
func TestTeardownTriggersBetweenChangesAreServedOnce(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		rec, gate := blockFirstDelete(func() (reconcile.Result, error) { return reconcile.Done(), nil })
		e := start(t, rec, nil, widget("a"))
		synctest.Wait()
		teardown := func() {
			t.Helper()
			o, err := e.ctrl.Trigger().Submit(context.Background(), trigger.Request[*Widget]{Object: widget("a"), Type: opkit.Deleted, Source: opkit.Operator, Reason: "teardown"})
			if err != nil || !o.Accepted() {
				t.Fatalf("Submit: %v %v", o, err)
			}
		}
		teardown()
		synctest.Wait() // in flight, held at the gate
		const n = 50
		for i := range n {
			teardown()
			updateSpec(t, e, i+2)
			synctest.Wait()
		}
		if parked := e.ctrl.Queue().Stats().Parked; parked != 2 {
			t.Fatalf("%d entries parked behind the reconcile in flight for %d (teardown, spec change) pairs, want 2", parked, n)
		}
		before := len(rec.snapshot())
		close(gate)
		time.Sleep(time.Hour)
		synctest.Wait()
		calls := rec.snapshot()[before:]
		if len(calls) != 2 || calls[0].req.Type != opkit.Deleted || calls[0].req.Reason != "teardown" ||
			calls[1].req.Type == opkit.Deleted || calls[1].req.Object.Spec.Size != n+1 {
			t.Fatalf("after the gate, want a teardown reconcile, then the last change (size %d); reconciles:%s", n+1, describeCalls(calls))
		}
	})
}

// A delete that polls an external cleanup (RequeueAfter an hour) does not
// hold up a new object of its name: the new object's event, a trigger for
// it and its later changes are reconciled at once, in front of the old
// object's requeue, which still runs at its own time.
func TestARecreatedObjectDoesNotWaitForTheOldDeletesRequeue(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		rec := &recorder{do: func(_ context.Context, _ int, req reconcile.Request[*Widget]) (reconcile.Result, error) {
			if req.Type == opkit.Deleted {
				return reconcile.RequeueAfter(time.Hour), nil // the cleanup is still running
			}
			return reconcile.Done(), nil
		}}
		e := start(t, rec, nil, widget("a"))
		synctest.Wait()
		deletedAt, b := recreateA(t, e)
		submit(t, e, b, "ci")
		synctest.Wait()
		// Half-way between the watcher's idle restarts (every IdleTimeout,
		// 5m, of silence): the fake's watch does not replay from a
		// resourceVersion, so a change made as one closes would be lost.
		time.Sleep(2*time.Minute + 30*time.Second)
		updateSpec(t, e, 9)
		synctest.Wait()
		time.Sleep(time.Hour)
		synctest.Wait()

		calls := rec.snapshot()
		var added, ci, change, requeue time.Time
		for _, c := range calls {
			switch {
			case c.req.Type == opkit.Deleted && c.req.Requeued && requeue.IsZero():
				requeue = c.at
			case c.req.Object.UID != "uid-a2":
			case c.req.Reason == "ci":
				ci = c.at
			case c.req.Object.Spec.Size == 9:
				change = c.at
			case added.IsZero():
				added = c.at
			}
		}
		created := deletedAt.Add(time.Minute)
		switch {
		case !added.Equal(created):
			t.Errorf("the new object was first reconciled at %v, want at its creation %v", added, created)
		case !ci.Equal(created):
			t.Errorf("the trigger for the new object was reconciled at %v, want at once (%v)", ci, created)
		case !change.Equal(created.Add(2*time.Minute + 30*time.Second)):
			t.Errorf("the new object's change was reconciled at %v, want at once (%v)", change, created.Add(2*time.Minute+30*time.Second))
		case !requeue.Equal(deletedAt.Add(time.Hour)):
			t.Errorf("the old delete's requeue ran at %v, want at its own time %v", requeue, deletedAt.Add(time.Hour))
		}
		if t.Failed() {
			t.Logf("reconciles:%s", describeCalls(calls))
		}
	})
}

// A new object of the name that requeues itself every 10 minutes does not
// hold back the old object's delete for ever: once the delete's requeue is
// due, nothing goes in front of it.
func TestAPeriodicRequeueDoesNotStarveAWaitingDelete(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		rec := &recorder{do: func(_ context.Context, _ int, req reconcile.Request[*Widget]) (reconcile.Result, error) {
			if req.Type == opkit.Deleted {
				return reconcile.RequeueAfter(time.Hour), nil
			}
			return reconcile.RequeueAfter(10 * time.Minute), nil // periodic resync
		}}
		e := start(t, rec, nil, widget("a"))
		synctest.Wait()
		deletedAt, _ := recreateA(t, e)
		time.Sleep(4 * time.Hour)
		synctest.Wait()
		var requeues, resyncs []time.Time
		for _, c := range rec.snapshot() {
			switch {
			case c.req.Type == opkit.Deleted && c.req.Requeued:
				requeues = append(requeues, c.at)
			case c.req.Object.UID == "uid-a2":
				resyncs = append(resyncs, c.at)
			}
		}
		// The delete's requeue runs at its own time, hourly.
		for i, at := range requeues {
			if want := deletedAt.Add(time.Duration(i+1) * time.Hour); !at.Equal(want) {
				t.Fatalf("the old delete's requeue %d ran at %v, want %v; all: %v", i, at, want, requeues)
			}
		}
		if len(requeues) != 4 {
			t.Fatalf("the old delete's requeue ran %d times in 4h, want 4: %v", len(requeues), requeues)
		}
		// And the new object's resync is never lost or held up.
		for i := 1; i < len(resyncs); i++ {
			if d := resyncs[i].Sub(resyncs[i-1]); d != 10*time.Minute {
				t.Fatalf("the new object's resyncs %d and %d are %v apart, want 10m: %v", i-1, i, d, resyncs)
			}
		}
	})
}

// A teardown trigger that ran and asked for a requeue, a change of its
// object that went in front of it, then the object's real delete from the
// watch, all while the only worker is busy: the real delete is reconciled
// (it merged into the waiting teardown, which then stands for a new delete
// and is not taken over by the change before it).
func TestTheRealDeleteBehindAWaitingTeardownIsReconciled(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		gate := make(chan struct{})
		rec := &recorder{do: func(_ context.Context, _ int, req reconcile.Request[*Widget]) (reconcile.Result, error) {
			switch {
			case req.Key.Name == "b" && req.Reason == "block":
				<-gate
			case req.Type == opkit.Deleted && req.Source == opkit.Operator:
				return reconcile.RequeueAfter(time.Hour), nil // teardown in progress
			}
			return reconcile.Done(), nil
		}}
		e := start(t, rec, func(c *reconcile.Config[*Widget]) { c.Concurrency = 1 }, widget("a"), widget("b"))
		synctest.Wait()
		if o, err := e.ctrl.Trigger().Submit(context.Background(), trigger.Request[*Widget]{Object: widget("a"), Type: opkit.Deleted, Source: opkit.Operator, Reason: "teardown"}); err != nil || !o.Accepted() {
			t.Fatal(o, err)
		}
		synctest.Wait() // teardown ran, requeued in 1h
		submit(t, e, widget("b"), "block")
		synctest.Wait() // the only worker is busy with b
		updateSpec(t, e, 5)
		synctest.Wait()
		if err := e.dyn.Resource(widgets.GroupVersionResource).Namespace("ns").Delete(context.Background(), "a", metav1.DeleteOptions{}); err != nil {
			t.Fatal(err)
		}
		synctest.Wait()
		before := len(rec.snapshot())
		close(gate)
		time.Sleep(3 * time.Hour)
		synctest.Wait()
		calls := rec.snapshot()[before:]
		for _, c := range calls {
			if c.req.Key.Name == "a" && c.req.Type == opkit.Deleted {
				return
			}
		}
		t.Fatalf("no Deleted reconcile of a after its real delete; reconciles:%s", describeCalls(calls))
	})
}

// recreateA deletes object a, lets its Deleted reconcile run, and a minute
// later creates a new object a (UID uid-a2); it returns when the delete ran
// and the new object.
func recreateA(t *testing.T, e *env) (deletedAt time.Time, b *Widget) {
	t.Helper()
	res := e.dyn.Resource(widgets.GroupVersionResource).Namespace("ns")
	if err := res.Delete(context.Background(), "a", metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
	synctest.Wait() // the delete ran (and asked for whatever it asks for)
	deletedAt = time.Now()
	time.Sleep(time.Minute)
	b = widget("a", func(w *Widget) { w.UID = "uid-a2"; w.ResourceVersion = "7" })
	u, err := typed.ToUnstructured(b)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := res.Create(context.Background(), u, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	synctest.Wait()
	return deletedAt, b
}

// Every mix of two objects' events (a stale Deleted trigger and a late
// tombstone of the old object; triggers, changes, Deleted triggers and
// objectless triggers of the new one), repeated while one reconcile runs,
// keeps the key's chain short: at most 4 entries behind the one in flight
// for any pattern of three repeated 50 times (4 is what the rule reaches;
// before MergePrecede, some patterns grew by one or two entries per
// round).
func TestChainsOfTwoObjectsStayShort(t *testing.T) {
	objectless := func(e opkit.Event[*corev1.ConfigMap]) opkit.Event[*corev1.ConfigMap] {
		e.Object = nil
		return e
	}
	kinds := []opkit.Event[*corev1.ConfigMap]{
		deletedTrigger("u1"), ev(opkit.Deleted, "u1"),
		trig("u2"), ev(opkit.Modified, "u2"), deletedTrigger("u2"), objectless(trig("u2")), objectless(deletedTrigger("u2")),
	}
	for _, inFlight := range []opkit.Event[*corev1.ConfigMap]{ev(opkit.Modified, "u2"), retried(ev(opkit.Deleted, "u1"))} {
		for _, a := range kinds {
			for _, b := range kinds {
				for _, c := range kinds {
					k := opkit.Key{Namespace: "ns", Name: "a"}
					q := queue.New[opkit.Key](queue.Config[opkit.Event[*corev1.ConfigMap]]{Merge: reconcile.MergeEvents[*corev1.ConfigMap]})
					q.Add(k, inFlight, queue.AddOptions{})
					if _, err := q.Get(context.Background()); err != nil {
						t.Fatal(err)
					}
					for range 50 {
						for _, e := range []opkit.Event[*corev1.ConfigMap]{a, b, c} {
							if !q.Add(k, e, queue.AddOptions{}).Accepted() {
								t.Fatal("add dropped")
							}
						}
					}
					if p := q.Stats().Parked; p > 4 {
						t.Errorf("in flight %s; %s, %s, %s 50 times: %d entries parked, want at most 4",
							describeEvent(inFlight), describeEvent(a), describeEvent(b), describeEvent(c), p)
					}
				}
			}
		}
	}
}

// describeEvent is an event's source, type and UID.
func describeEvent(e opkit.Event[*corev1.ConfigMap]) string {
	uid := "no object"
	if e.Object != nil {
		uid = string(e.Object.UID)
	}
	return fmt.Sprintf("%s %s %s", e.Source, e.Type, uid)
}

// Nothing holds a waiting delete past its own due time: an add due later
// (a delayed trigger, a longer requeue) goes behind it, not in front.
func TestADelayedEventDoesNotHoldBackAWaitingDelete(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		k := opkit.Key{Namespace: "ns", Name: "a"}
		q := queue.New[opkit.Key](queue.Config[opkit.Event[*corev1.ConfigMap]]{Merge: reconcile.MergeEvents[*corev1.ConfigMap]})
		start := time.Now()
		q.Add(k, retried(ev(opkit.Deleted, "u1")), queue.AddOptions{Delay: 10 * time.Second, Retries: 3})
		q.Add(k, trig("u2"), queue.AddOptions{Delay: time.Hour})
		for _, want := range []struct {
			typ   opkit.Type
			after time.Duration
		}{{opkit.Deleted, 10 * time.Second}, {opkit.Modified, time.Hour}} {
			it, err := q.Get(context.Background())
			if err != nil {
				t.Fatal(err)
			}
			if it.Value.Type != want.typ || time.Since(start) != want.after {
				t.Fatalf("handed out %s after %v, want %s after %v", it.Value.Type, time.Since(start), want.typ, want.after)
			}
			q.Done(k)
		}
	})
}

// The old object's delete polls its cleanup every 10 minutes while the new
// object of its name resyncs hourly: the delete keeps its own cadence.
func TestADeleteRequeueKeepsItsCadenceBesideANewObjectsResync(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		rec := &recorder{do: func(_ context.Context, _ int, req reconcile.Request[*Widget]) (reconcile.Result, error) {
			if req.Type == opkit.Deleted {
				return reconcile.RequeueAfter(10 * time.Minute), nil
			}
			return reconcile.RequeueAfter(time.Hour), nil
		}}
		e := start(t, rec, nil, widget("a"))
		synctest.Wait()
		deletedAt, _ := recreateA(t, e)
		time.Sleep(4 * time.Hour)
		synctest.Wait()
		var requeues []time.Duration
		for _, c := range rec.snapshot() {
			if c.req.Type == opkit.Deleted && c.req.Requeued {
				requeues = append(requeues, c.at.Sub(deletedAt))
			}
		}
		if len(requeues) != 24 {
			t.Fatalf("the delete's 10m requeue ran %d times in 4h1m, want 24: %v", len(requeues), requeues)
		}
		for i, d := range requeues {
			if want := time.Duration(i+1) * 10 * time.Minute; d != want {
				t.Fatalf("requeue %d ran %v after the delete, want %v: %v", i, d, want, requeues)
			}
		}
	})
}

// A requeue carries no object, so a delete behind it may be another
// object's: neither is lost to the other, whether the delete meets the
// requeue or a retried delete of its object held before it.
func TestARequeueIsNotLostToADeleteOfAnotherObject(t *testing.T) {
	requeue := ev(opkit.Added, "u2")
	requeue.Object, requeue.Requeued = nil, true // as afterReconcile adds it
	for _, tc := range []struct {
		name    string
		add     func(q *queue.Queue[opkit.Key, opkit.Event[*corev1.ConfigMap]], k opkit.Key)
		deletes []string // the deletes, handed out first
	}{
		{"a stale Deleted trigger behind the requeue", func(q *queue.Queue[opkit.Key, opkit.Event[*corev1.ConfigMap]], k opkit.Key) {
			q.Add(k, requeue, queue.AddOptions{Delay: 10 * time.Minute})
			q.Add(k, deletedTrigger("u1"), queue.AddOptions{})
		}, []string{"Operator Deleted u1"}},
		{"a new delete merged into a retried one held next to the requeue", func(q *queue.Queue[opkit.Key, opkit.Event[*corev1.ConfigMap]], k opkit.Key) {
			q.Add(k, ev(opkit.Modified, "u2"), queue.AddOptions{})
			if _, err := q.Get(context.Background()); err != nil {
				t.Fatal(err)
			}
			q.Add(k, requeue, queue.AddOptions{Delay: 10 * time.Minute})
			q.Add(k, retried(ev(opkit.Deleted, "u1")), queue.AddOptions{Delay: time.Minute, Retries: 1})
			q.Add(k, deletedTrigger("u1"), queue.AddOptions{})
			q.Done(k)
		}, []string{"Operator Deleted u1", "APIServer Deleted u1"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			synctest.Test(t, func(t *testing.T) {
				k := opkit.Key{Namespace: "ns", Name: "a"}
				q := queue.New[opkit.Key](queue.Config[opkit.Event[*corev1.ConfigMap]]{Merge: reconcile.MergeEvents[*corev1.ConfigMap]})
				tc.add(q, k)
				if got, want := drain(t, q, k), append(tc.deletes, "APIServer Added no object"); !slices.Equal(got, want) {
					t.Fatalf("handed out %q, want %q", got, want)
				}
			})
		})
	}
}

// drain hands out and finishes everything q holds for k, in order, and
// returns each entry's source, type and UID.
func drain(t *testing.T, q *queue.Queue[opkit.Key, opkit.Event[*corev1.ConfigMap]], k opkit.Key) []string {
	t.Helper()
	var got []string
	for q.Len() > 0 {
		it, err := q.Get(context.Background())
		if err != nil {
			t.Fatal(err)
		}
		got = append(got, describeEvent(it.Value))
		q.Done(k)
	}
	return got
}

// A trigger that does not carry the new object's UID (read just before
// the old object was deleted, or of only namespace and name) is not folded
// into the old object's delete: the new object is still reconciled after
// the delete, by its Added or by the trigger.
func TestATriggerWithoutTheNewUIDDoesNotEndInTheOldDelete(t *testing.T) {
	noUID := func(e opkit.Event[*corev1.ConfigMap]) opkit.Event[*corev1.ConfigMap] {
		e.Object.UID = ""
		return e
	}
	for _, tc := range []struct {
		name string
		late opkit.Event[*corev1.ConfigMap]
	}{
		{"a stale trigger of the old object", trig("u1")},
		{"a trigger without UID", noUID(trig("x"))},
		{"a Deleted trigger without UID", noUID(deletedTrigger("x"))},
	} {
		t.Run(tc.name, func(t *testing.T) {
			synctest.Test(t, func(t *testing.T) {
				k := opkit.Key{Namespace: "ns", Name: "a"}
				q := queue.New[opkit.Key](queue.Config[opkit.Event[*corev1.ConfigMap]]{Merge: reconcile.MergeEvents[*corev1.ConfigMap]})
				q.Add(k, ev(opkit.Deleted, "u1"), queue.AddOptions{})
				q.Add(k, ev(opkit.Added, "u2"), queue.AddOptions{})
				q.Add(k, tc.late, queue.AddOptions{})
				got := drain(t, q, k)
				if len(got) < 2 || !strings.HasSuffix(got[0], "Deleted u1") {
					t.Fatalf("handed out %q, want u1's delete and then a reconcile that reaches u2", got)
				}
			})
		})
	}
}

// A trigger without UID behind a stale Deleted trigger of the old object
// (the new object exists) runs after it instead of merging into it.
func TestATriggerWithoutUIDBehindAStaleDeleteIsReconciled(t *testing.T) {
	k := opkit.Key{Namespace: "ns", Name: "a"}
	q := queue.New[opkit.Key](queue.Config[opkit.Event[*corev1.ConfigMap]]{Merge: reconcile.MergeEvents[*corev1.ConfigMap]})
	q.Add(k, deletedTrigger("u1"), queue.AddOptions{})
	anon := trig("x")
	anon.Object.UID = ""
	q.Add(k, anon, queue.AddOptions{})
	if got, want := drain(t, q, k), []string{"Operator Deleted u1", "Operator Modified "}; !slices.Equal(got, want) {
		t.Fatalf("handed out %q, want %q", got, want)
	}
}

// The watch's real delete of an object, arriving while Deleted triggers of
// only namespace and name and a change of the object wait, is handed out
// with the object (its watcher settles it by UID and resourceVersion).
func TestTheWatchDeleteKeepsItsObjectAmongNamelessDeletedTriggers(t *testing.T) {
	for _, final := range []bool{true, false} {
		synctest.Test(t, func(t *testing.T) {
			k := opkit.Key{Namespace: "ns", Name: "a"}
			q := queue.New[opkit.Key](queue.Config[opkit.Event[*corev1.ConfigMap]]{Merge: reconcile.MergeEvents[*corev1.ConfigMap]})
			dt := deletedTrigger("")
			q.Add(k, dt, queue.AddOptions{})
			if _, err := q.Get(context.Background()); err != nil {
				t.Fatal(err)
			}
			q.Add(k, dt, queue.AddOptions{})
			q.Add(k, ev(opkit.Modified, "u1"), queue.AddOptions{})
			q.Add(k, retried(dt), queue.AddOptions{Delay: 2 * time.Second, Retries: 1})
			q.Done(k)
			del := ev(opkit.Deleted, "u1")
			del.FinalStateUnknown = final
			q.Add(k, del, queue.AddOptions{})
			if got := drain(t, q, k); !slices.Contains(got, "APIServer Deleted u1") && !slices.Contains(got, "Operator Deleted u1") {
				t.Fatalf("tombstone %v: handed out %q, no delete carrying u1's object", final, got)
			}
		})
	}
}

// When deletes of one object merge, the entry carries the latest delete
// the watch delivered: its watcher holds that one (by UID and
// resourceVersion) until the reconcile settles it, so an older one would
// leave it held for ever, and re-emitted at the next term.
func TestAMergedDeleteCarriesTheDeleteTheWatcherHolds(t *testing.T) {
	watch := func(typ opkit.Type, uid string, rv int) cmEv {
		return cmEv{Object: simObj(uid, rv), Type: typ, Source: opkit.APIServer}
	}
	trigger := func(typ opkit.Type, uid string, rv int) cmEv {
		return cmEv{Object: simObj(uid, rv), Type: typ, Source: opkit.Operator, Reason: "r"}
	}
	type step func(t *testing.T, q *queue.Queue[opkit.Key, cmEv], k opkit.Key)
	add := func(e cmEv, o queue.AddOptions) step {
		return func(_ *testing.T, q *queue.Queue[opkit.Key, cmEv], k opkit.Key) { q.Add(k, e, o) }
	}
	var inFlight []cmEv // hand-outs so far, for failAgain
	get := func(t *testing.T, q *queue.Queue[opkit.Key, cmEv], _ opkit.Key) {
		it, err := q.Get(context.Background())
		if err != nil {
			t.Fatal(err)
		}
		inFlight = append(inFlight, it.Value)
	}
	fail := func(t *testing.T, q *queue.Queue[opkit.Key, cmEv], k opkit.Key) { // the last hand-out failed
		e := inFlight[len(inFlight)-1]
		e.Retried = true
		q.Add(k, e, queue.AddOptions{Retries: 1})
		q.Done(k)
	}
	for _, tc := range []struct {
		name  string
		steps []step
		want  string // uid@rv a handed-out delete must carry
	}{
		{"a later watch delete walked back to an earlier pending one", []step{
			add(watch(opkit.Deleted, "b", 3), queue.AddOptions{}), // leaves the selector
			add(trigger(opkit.Modified, "a", 0), queue.AddOptions{}),
			add(watch(opkit.Added, "b", 4), queue.AddOptions{}), // back
			add(trigger(opkit.Modified, "", 0), queue.AddOptions{}),
			add(watch(opkit.Deleted, "b", 5), queue.AddOptions{}), // leaves again
		}, "b@5"},
		{"a retried older delete against a Deleted trigger that took the later one", []step{
			add(watch(opkit.Deleted, "a", 1), queue.AddOptions{}), get,
			add(watch(opkit.Added, "a", 3), queue.AddOptions{}),
			add(trigger(opkit.Deleted, "a", 9), queue.AddOptions{}),
			add(watch(opkit.Deleted, "a", 4), queue.AddOptions{}),
			fail,
		}, "a@4"},
		{"a retried nameless Deleted trigger that carries the watch's delete", []step{
			add(trigger(opkit.Deleted, "", 0), queue.AddOptions{}),
			add(watch(opkit.Deleted, "a", 5), queue.AddOptions{}), get,
			add(trigger(opkit.Deleted, "", 0), queue.AddOptions{}),
			fail,
		}, "a@5"},
		{"two retried deletes of one object", []step{
			add(watch(opkit.Deleted, "a", 2), queue.AddOptions{}), get,
			add(watch(opkit.Added, "a", 3), queue.AddOptions{}),
			add(watch(opkit.Deleted, "a", 4), queue.AddOptions{}),
			add(watch(opkit.Added, "b", 5), queue.AddOptions{}),
			fail, get, fail,
		}, "a@4"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			inFlight = nil
			k := opkit.Key{Namespace: "ns", Name: "a"}
			q := queue.New[opkit.Key](queue.Config[cmEv]{Merge: reconcile.MergeEvents[*corev1.ConfigMap]})
			for _, s := range tc.steps {
				s(t, q, k)
			}
			var deletes []string
			for q.Len() > 0 {
				it, err := q.Get(context.Background())
				if err != nil {
					t.Fatal(err)
				}
				if it.Value.Type == opkit.Deleted {
					deletes = append(deletes, uidS(it.Value.Object)+"@"+it.Value.Object.ResourceVersion)
				}
				q.Done(k)
			}
			if !slices.Contains(deletes, tc.want) {
				t.Fatalf("deletes handed out %v, none carries %s (the one the watcher holds)", deletes, tc.want)
			}
		})
	}
}
