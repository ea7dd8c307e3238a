package reconcile_test

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"testing"
	"testing/synctest"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"

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
// The teardown keeps an entry of its own behind it, so the object's
// return does not drop it either.
func TestATeardownBehindAWaitingWatchDeleteSurvivesASelectorFlap(t *testing.T) {
	k := opkit.Key{Namespace: "ns", Name: "a"}
	q := queue.New[opkit.Key](queue.Config[cmEv]{Merge: reconcile.MergeEvents[*corev1.ConfigMap]})
	q.Add(k, ev(opkit.Deleted, "u1"), queue.AddOptions{}) // leaves the selector
	q.Add(k, deletedTrigger("u1"), queue.AddOptions{})
	q.Add(k, ev(opkit.Added, "u1"), queue.AddOptions{}) // back
	if got, want := drain(t, q, k), []string{"APIServer Deleted u1", "Operator Deleted u1", "APIServer Added u1"}; !slices.Equal(got, want) {
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

// A teardown runs and fails (or asks for a requeue); meanwhile its object
// leaves the label selector (the watch's delete waits behind it). The
// teardown's retry merges with that delete, and the object comes back:
// the teardown still runs, as it does when nothing waits behind it.
func TestARetriedTeardownSurvivesASelectorFlap(t *testing.T) {
	for _, tc := range []struct {
		name  string
		watch bool // the watch's delete waits behind the running teardown
		readd func(*cmEv)
	}{
		{"retried, behind the watch's delete", true, func(e *cmEv) { e.Retried = true }},
		{"requeued, behind the watch's delete", true, func(e *cmEv) { e.Requeued = true }},
		{"retried, alone", false, func(e *cmEv) { e.Retried = true }},
	} {
		t.Run(tc.name, func(t *testing.T) {
			synctest.Test(t, func(t *testing.T) {
				k := opkit.Key{Namespace: "ns", Name: "a"}
				q := queue.New[opkit.Key](queue.Config[cmEv]{Merge: reconcile.MergeEvents[*corev1.ConfigMap]})
				q.Add(k, deletedTrigger("u1"), queue.AddOptions{})
				it, err := q.Get(context.Background()) // the teardown runs
				if err != nil {
					t.Fatal(err)
				}
				if tc.watch {
					q.Add(k, ev(opkit.Deleted, "u1"), queue.AddOptions{}) // leaves the selector
				}
				again := it.Value
				tc.readd(&again)
				q.Add(k, again, queue.AddOptions{Retries: 1, Delay: time.Second})
				q.Done(k)
				if !tc.watch {
					q.Add(k, ev(opkit.Deleted, "u1"), queue.AddOptions{}) // leaves the selector now
				}
				q.Add(k, ev(opkit.Added, "u1"), queue.AddOptions{}) // back
				if got := drain(t, q, k); !slices.Contains(got, "Operator Deleted u1") {
					t.Fatalf("handed out %q, want the teardown (Operator Deleted u1) among them", got)
				}
			})
		})
	}
}

// RecordTriggerEvents: a teardown that merges into the watch's delete
// waiting for its retry runs as the teardown, and is recorded once,
// although the entry keeps the delete's retry count.
func TestATeardownMergedIntoARetriedWatchDeleteIsRecorded(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		rec := &recorder{do: func(_ context.Context, _ int, req reconcile.Request[*Widget]) (reconcile.Result, error) {
			if req.Type == opkit.Deleted && req.Source == opkit.APIServer {
				return reconcile.Done(), errors.New("the watch's delete fails once")
			}
			return reconcile.Done(), nil
		}}
		e, fw := startWithFakeWatch(t, rec, func(c *reconcile.Config[*Widget]) { c.RecordTriggerEvents = true }, widget("a"))
		synctest.Wait()
		gone, err := typed.ToUnstructured(widget("a", func(w *Widget) { w.ResourceVersion = "3" }))
		if err != nil {
			t.Fatal(err)
		}
		fw.Delete(gone)
		synctest.Wait() // the watch's delete ran and failed: its retry waits
		submitDeleted(t, e)
		time.Sleep(time.Minute)
		synctest.Wait()
		if n := len(triggeredNotes(t, e)); n != 1 {
			t.Errorf("%d Triggered Events, want 1; reconciles %q", n, summarize(rec.snapshot()[1:]))
		}
	})
}

// RecordTriggerEvents records a teardown once, when its re-add (a retry or
// requeue) meets the watch's delete of its object: the delete arriving
// while the re-add waits, or waiting behind the running teardown.
func TestARetriedTeardownThatMeetsTheWatchDeleteIsRecordedOnce(t *testing.T) {
	for _, tc := range []struct {
		name    string
		outcome func() (reconcile.Result, error)
		parked  bool // the watch's delete arrives while the teardown runs
	}{
		{"retry, then the delete", func() (reconcile.Result, error) { return reconcile.Done(), errors.New("fails once") }, false},
		{"requeue, then the delete", func() (reconcile.Result, error) { return reconcile.RequeueAfter(time.Hour), nil }, false},
		{"retry, the delete parked", func() (reconcile.Result, error) { return reconcile.Done(), errors.New("fails once") }, true},
		{"requeue, the delete parked", func() (reconcile.Result, error) { return reconcile.RequeueAfter(time.Hour), nil }, true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			synctest.Test(t, func(t *testing.T) {
				gate := make(chan struct{})
				if !tc.parked {
					close(gate)
				}
				runs := 0
				rec := &recorder{do: func(_ context.Context, _ int, req reconcile.Request[*Widget]) (reconcile.Result, error) {
					if req.Type == opkit.Deleted && req.Source == opkit.Operator {
						if runs++; runs == 1 {
							<-gate
							return tc.outcome()
						}
					}
					return reconcile.Done(), nil
				}}
				e, fw := startWithFakeWatch(t, rec, func(c *reconcile.Config[*Widget]) {
					c.RecordTriggerEvents = true
					c.Backoff = queue.Backoff{Base: time.Hour, Cap: time.Hour, Jitter: -1}
				}, widget("a"))
				synctest.Wait()
				submitDeleted(t, e) // due in 10s
				time.Sleep(11 * time.Second)
				synctest.Wait() // the teardown runs (held at the gate if parked)
				gone, err := typed.ToUnstructured(widget("a", func(w *Widget) { w.ResourceVersion = "3" }))
				if err != nil {
					t.Fatal(err)
				}
				fw.Delete(gone)
				synctest.Wait()
				if tc.parked {
					close(gate)
				}
				time.Sleep(2 * time.Hour)
				synctest.Wait()
				if n := len(triggeredNotes(t, e)); n != 1 {
					t.Errorf("%d Triggered Events for one trigger, want 1; reconciles %q", n, summarize(rec.snapshot()[1:]))
				}
			})
		})
	}
}

// A stale trigger (the object it carries is an earlier one of the name)
// whose re-fetch fails is retried without that object: the retry reads the
// name again, instead of merging into a stale Deleted trigger of that
// earlier object, and so reaches the object that exists.
func TestAStaleTriggerWhoseReadFailsStillReachesTheObject(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		rec := &recorder{}
		e := start(t, rec, nil, widget("a"))
		synctest.Wait()
		n := len(rec.snapshot())
		failGets(e, 1, apierrors.NewInternalError(errors.New("etcd leader changed")))
		stale := widget("a", func(w *Widget) { w.UID = "uid-old" })
		for _, typ := range []opkit.Type{opkit.Modified, opkit.Deleted} {
			if o, err := e.ctrl.Trigger().Submit(context.Background(), trigger.Request[*Widget]{Object: stale, Type: typ, Source: opkit.Operator, Reason: "stale"}); err != nil || !o.Accepted() {
				t.Fatalf("Submit(%v): %v %v", typ, o, err)
			}
		}
		time.Sleep(time.Minute)
		synctest.Wait()
		for _, c := range rec.snapshot()[n:] {
			if c.req.Type != opkit.Deleted && c.req.Object.UID == widget("a").UID {
				return
			}
		}
		t.Fatalf("no reconcile of the object that exists after the stale trigger; reconciles:%s", describeCalls(rec.snapshot()[n:]))
	})
}

// A second teardown that arrives while the first one's retry or requeue
// waits runs as the new request and is recorded: one Triggered Event per
// accepted trigger.
func TestASecondTeardownIntoARetriedOneIsRecorded(t *testing.T) {
	for _, tc := range []struct {
		name    string
		outcome func() (reconcile.Result, error)
	}{
		{"retry", func() (reconcile.Result, error) { return reconcile.Done(), errors.New("fails once") }},
		{"requeue", func() (reconcile.Result, error) { return reconcile.RequeueAfter(time.Hour), nil }},
	} {
		t.Run(tc.name, func(t *testing.T) {
			synctest.Test(t, func(t *testing.T) {
				runs := 0
				rec := &recorder{do: func(_ context.Context, _ int, req reconcile.Request[*Widget]) (reconcile.Result, error) {
					if req.Type == opkit.Deleted && req.Source == opkit.Operator {
						if runs++; runs == 1 {
							return tc.outcome()
						}
					}
					return reconcile.Done(), nil
				}}
				e := start(t, rec, func(c *reconcile.Config[*Widget]) {
					c.RecordTriggerEvents = true
					c.Backoff = queue.Backoff{Base: time.Hour, Cap: time.Hour, Jitter: -1}
				}, widget("a"))
				synctest.Wait()
				for i, reason := range []string{"first", "second"} {
					req := trigger.Request[*Widget]{Object: widget("a"), Type: opkit.Deleted, Source: opkit.Operator, Reason: reason}
					if o, err := e.ctrl.Trigger().Submit(context.Background(), req); err != nil || !o.Accepted() {
						t.Fatalf("Submit = %v, %v", o, err)
					}
					if i == 0 {
						time.Sleep(time.Minute)
						synctest.Wait() // the first ran; its re-add waits an hour
					}
				}
				time.Sleep(2 * time.Hour)
				synctest.Wait()
				if notes := triggeredNotes(t, e); len(notes) != 2 {
					t.Errorf("Triggered Events %q, want one per accepted trigger; reconciles %q", notes, summarize(rec.snapshot()[1:]))
				}
			})
		})
	}
}

// Giving up after reads that keep failing records the Warning Event,
// although the retries carried no object: it names the key.
func TestGivingUpAfterFailedReadsRecordsAnEvent(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		rec := &recorder{}
		e := start(t, rec, func(c *reconcile.Config[*Widget]) { c.MaxRetries = 2 }, widget("a"))
		synctest.Wait()
		failGets(e, 100, apierrors.NewInternalError(errors.New("etcd leader changed")))
		e.ctrl.Trigger().Enqueue(context.Background(), widget("a"), opkit.Modified, opkit.Operator, 0, 0)
		time.Sleep(time.Hour)
		synctest.Wait()
		if e.metrics.get(reconcile.OutcomeGaveUp) != 1 {
			t.Fatalf("outcomes %v, want one given up", e.metrics.outcomes)
		}
		if failed := countEvents(t, e, "ReconcileFailed"); failed != 1 {
			t.Errorf("%d ReconcileFailed Events after giving up, want 1", failed)
		}
	})
}

// countEvents counts the Events recorded with reason.
func countEvents(t *testing.T, e *env, reason string) int {
	t.Helper()
	n := 0
	for _, ev := range e.events(t) {
		if ev.Reason == reason {
			n++
		}
	}
	return n
}

// A stale trigger (an earlier object's UID) whose read fails does not
// restart the key's failure streak: the failure counts for the key, and
// the next reconciles keep the capped delay the streak had reached.
func TestAFailedReadOfAStaleTriggerKeepsTheStreak(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		rec := &recorder{do: func(context.Context, int, reconcile.Request[*Widget]) (reconcile.Result, error) {
			return reconcile.Done(), errors.New("always fails")
		}}
		e := start(t, rec, func(c *reconcile.Config[*Widget]) { c.MaxRetries = -1 }, widget("a"))
		time.Sleep(10 * time.Minute) // the streak's delay reaches the cap (1m)
		synctest.Wait()
		n := len(rec.snapshot())
		failGets(e, 1, apierrors.NewInternalError(errors.New("etcd leader changed")))
		stale := widget("a", func(w *Widget) { w.UID = "uid-old" })
		if o, err := e.ctrl.Trigger().Submit(context.Background(), trigger.Request[*Widget]{Object: stale, Type: opkit.Modified, Source: opkit.Operator}); err != nil || !o.Accepted() {
			t.Fatalf("Submit: %v %v", o, err)
		}
		time.Sleep(10 * time.Minute)
		synctest.Wait()
		calls := rec.snapshot()[n:]
		if len(calls) < 3 {
			t.Fatalf("%d reconciles after the stale trigger, want several; reconciles:%s", len(calls), describeCalls(calls))
		}
		for i := 1; i < 3; i++ {
			if gap := calls[i].at.Sub(calls[i-1].at); gap != time.Minute {
				t.Fatalf("reconciles %d and %d after the stale trigger are %v apart, want the capped 1m; reconciles:%s", i-1, i, gap, describeCalls(calls))
			}
		}
	})
}

// A Deleted trigger of only the name (which took in a trigger of the
// object that has the name, as a trigger merges into a delete that has not
// run) is not turned into a delete of an earlier object by a stale Deleted
// trigger naming that object's UID: both run, each with its own.
func TestANameOnlyTeardownIsNotTurnedIntoAStaleOne(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		release := make(chan struct{})
		rec := &recorder{do: func(_ context.Context, n int, _ reconcile.Request[*Widget]) (reconcile.Result, error) {
			if n == 0 {
				<-release
			}
			return reconcile.Done(), nil
		}}
		e := start(t, rec, nil, widget("a"))
		synctest.Wait() // the list's reconcile of a is in flight
		for _, tc := range []struct {
			w      *Widget
			typ    opkit.Type
			reason string
		}{
			{widget("a", func(w *Widget) { w.UID = "" }), opkit.Deleted, "by-name"},
			{widget("a"), opkit.Modified, "current"},
			{widget("a", func(w *Widget) { w.UID = "uid-old" }), opkit.Deleted, "stale"},
		} {
			if o, err := e.ctrl.Trigger().Submit(context.Background(), trigger.Request[*Widget]{Object: tc.w, Type: tc.typ, Source: opkit.Operator, Reason: tc.reason}); err != nil || !o.Accepted() {
				t.Fatalf("Submit %s: %v %v", tc.reason, o, err)
			}
		}
		close(release)
		time.Sleep(time.Minute)
		synctest.Wait()
		var got []string
		for _, c := range rec.snapshot()[1:] {
			got = append(got, fmt.Sprintf("%s %s %q", c.req.Type, c.req.Object.UID, c.req.Reason))
		}
		if want := []string{`Deleted  "by-name"`, `Deleted uid-old "stale"`}; !slices.Equal(got, want) {
			t.Fatalf("reconciles %q, want %q", got, want)
		}
	})
}

// A name-only teardown that ran and waits for its requeue holds up no new
// teardown naming a UID: the new one takes the entry over and runs now.
func TestAWaitingNameOnlyTeardownHoldsUpNoNewTeardown(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		k := opkit.Key{Namespace: "ns", Name: "a"}
		q := queue.New[opkit.Key](queue.Config[cmEv]{Merge: reconcile.MergeEvents[*corev1.ConfigMap]})
		q.Add(k, requeued(deletedTrigger("")), queue.AddOptions{Delay: time.Hour})
		q.Add(k, deletedTrigger("u1"), queue.AddOptions{})
		ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
		defer cancel()
		it, err := q.Get(ctx)
		if err != nil {
			t.Fatalf("the new teardown was not handed out within a minute: %v (parked %d)", err, q.Stats().Parked)
		}
		if it.Value.Type != opkit.Deleted || it.Value.Object.UID != "u1" {
			t.Fatalf("handed out %s, want the teardown of u1", describeEvent(it.Value))
		}
	})
}
