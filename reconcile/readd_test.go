package reconcile_test

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strconv"
	"strings"
	"testing"
	"testing/synctest"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/watch"
	clienttesting "k8s.io/client-go/testing"

	"github.com/opkit/opkit"
	"github.com/opkit/opkit/internal/typed"
	"github.com/opkit/opkit/reconcile"
	"github.com/opkit/opkit/trigger"
)

// The specification here: an event that arrives while a key is reconciled
// is newer than that reconcile, and the controller's own re-add (a retry
// after a failure, a requeue after a success) never replaces it. The new
// event is reconciled as itself: its source and reason, its object, a
// retry count of 0, its own Triggered Event.

func describeCalls(calls []call) string {
	var b strings.Builder
	for i, c := range calls {
		fmt.Fprintf(&b, "\n %d: %s %s reason=%q retries=%d requeued=%v rv=%s size=%d", i, c.req.Source, c.req.Type,
			c.req.Reason, c.retries, c.req.Requeued, c.req.Object.ResourceVersion, c.req.Object.Spec.Size)
	}
	return b.String()
}

func submit(t *testing.T, e *env, w *Widget, reason string) {
	t.Helper()
	o, err := e.ctrl.Trigger().Submit(context.Background(), trigger.Request[*Widget]{Object: w, Type: opkit.Modified, Source: opkit.Operator, Reason: reason, Fetched: true})
	if err != nil || !o.Accepted() {
		t.Fatalf("Submit(%s): %v, %v", reason, o, err)
	}
}

// updateSpec changes widget ns/a's spec size through the fake API server,
// which the controller's watch then delivers; the fake keeps
// resourceVersions as given, so it sets the next one.
func updateSpec(t *testing.T, e *env, size int) {
	t.Helper()
	w, err := typed.New[*Widget](e.dyn, widgets).Get(context.Background(), opkit.Key{Namespace: "ns", Name: "a"})
	if err != nil {
		t.Fatal(err)
	}
	rv, err := strconv.Atoi(w.ResourceVersion)
	if err != nil {
		t.Fatal(err)
	}
	w.Spec.Size, w.ResourceVersion = size, strconv.Itoa(rv+1)
	u, err := typed.ToUnstructured(w)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := e.dyn.Resource(widgets.GroupVersionResource).Namespace("ns").Update(context.Background(), u, metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
}

// withReason returns the calls whose request carries reason.
func withReason(calls []call, reason string) []call {
	var out []call
	for _, c := range calls {
		if c.req.Reason == reason {
			out = append(out, c)
		}
	}
	return out
}

func triggeredNotes(t *testing.T, e *env) []string {
	var notes []string
	for _, ev := range e.events(t) {
		if ev.Reason == "Triggered" {
			notes = append(notes, ev.Note)
		}
	}
	return notes
}

func TestReaddDoesNotReplaceANewerEvent(t *testing.T) {
	for _, tc := range []struct {
		name    string
		outcome func() (reconcile.Result, error) // of the first trigger's reconcile
	}{
		{"retry after a failure", func() (reconcile.Result, error) { return reconcile.Done(), errors.New("first fails") }},
		{"requeue after a success", func() (reconcile.Result, error) { return reconcile.RequeueAfter(time.Hour), nil }},
	} {
		t.Run(tc.name, func(t *testing.T) {
			synctest.Test(t, func(t *testing.T) {
				gate := make(chan struct{})
				rec := &recorder{}
				secondRuns := 0
				rec.do = func(_ context.Context, _ int, req reconcile.Request[*Widget]) (reconcile.Result, error) {
					switch {
					case req.Reason == "first" && req.Retries == 0 && !req.Requeued:
						<-gate
						return tc.outcome()
					case req.Reason == "second":
						secondRuns++
						if secondRuns == 1 {
							return reconcile.Done(), errors.New("transient")
						}
					}
					return reconcile.Done(), nil
				}
				e := start(t, rec, func(c *reconcile.Config[*Widget]) { c.MaxRetries = 1; c.RecordTriggerEvents = true }, widget("a"))
				synctest.Wait()
				submit(t, e, widget("a"), "first")
				synctest.Wait() // the first trigger is in flight
				submit(t, e, widget("a"), "second")
				close(gate)
				time.Sleep(time.Minute)
				synctest.Wait()

				calls := rec.snapshot()
				second := withReason(calls, "second")
				if len(second) != 2 || second[0].retries != 0 || second[0].req.Requeued || second[1].retries != 1 {
					t.Errorf("want the second trigger reconciled with retries 0, then retried once (retries 1); reconciles:%s", describeCalls(calls))
				}
				if n := e.metrics.get(reconcile.OutcomeGaveUp); n != 0 {
					t.Errorf("%d keys given up; the second trigger's one failure had a retry left", n)
				}
				notes := triggeredNotes(t, e)
				slices.Sort(notes)
				if len(notes) != 2 || !strings.HasSuffix(notes[0], ": first") || !strings.HasSuffix(notes[1], ": second") {
					t.Errorf("Triggered Events %q; want one per accepted trigger", notes)
				}
			})
		})
	}
}

// Without triggers: a spec change parked behind a failing reconcile is
// reconciled with its own retries, not as the failed attempt's last one.
func TestRetryDoesNotReplaceAParkedWatchEvent(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		gate := make(chan struct{})
		rec := &recorder{}
		rec.do = func(_ context.Context, n int, req reconcile.Request[*Widget]) (reconcile.Result, error) {
			switch n {
			case 0:
				<-gate
				return reconcile.Done(), errors.New("the list's reconcile fails")
			case 1:
				return reconcile.Done(), errors.New("transient")
			}
			return reconcile.Done(), nil
		}
		e := start(t, rec, func(c *reconcile.Config[*Widget]) { c.MaxRetries = 1 }, widget("a"))
		synctest.Wait() // the list's Added is in flight
		updateSpec(t, e, 2)
		synctest.Wait() // the watch's Modified is parked
		close(gate)
		time.Sleep(time.Hour)
		synctest.Wait()
		calls := rec.snapshot()
		if len(calls) != 3 || calls[1].req.Type != opkit.Modified || calls[1].retries != 0 || calls[1].req.Object.Spec.Size != 2 ||
			calls[2].retries != 1 || calls[2].req.Object.Spec.Size != 2 || e.metrics.get(reconcile.OutcomeGaveUp) != 0 {
			t.Errorf("want the spec change reconciled with retries 0, then retried (retries 1), nothing given up (%d); reconciles:%s",
				e.metrics.get(reconcile.OutcomeGaveUp), describeCalls(calls))
		}
	})
}

// A watch event that merges into a trigger's pending retry is a new event:
// it starts at retry 0 whatever the trigger's count was.
func TestWatchEventMergedIntoARetryStartsAtRetryZero(t *testing.T) {
	for _, src := range []opkit.Source{opkit.Operator, opkit.APIServer} {
		t.Run(src.String(), func(t *testing.T) {
			synctest.Test(t, func(t *testing.T) {
				rec := &recorder{}
				failed := false
				rec.do = func(_ context.Context, n int, req reconcile.Request[*Widget]) (reconcile.Result, error) {
					if n == 0 && src == opkit.Operator {
						return reconcile.Done(), nil // the list; the trigger fails next
					}
					if !failed {
						failed = true
						return reconcile.Done(), errors.New("transient")
					}
					return reconcile.Done(), nil
				}
				e := start(t, rec, func(c *reconcile.Config[*Widget]) {
					c.MaxRetries = 1
					c.Backoff.Base, c.Backoff.Cap = time.Hour, time.Hour // the retry waits
				}, widget("a"))
				synctest.Wait()
				if src == opkit.Operator {
					submit(t, e, widget("a"), "deploy")
				}
				synctest.Wait()
				time.Sleep(time.Minute) // the retry (retries 1) is pending for an hour
				updateSpec(t, e, 2)
				time.Sleep(time.Minute)
				synctest.Wait()
				calls := rec.snapshot()
				last := calls[len(calls)-1]
				if last.req.Source != opkit.APIServer || last.retries != 0 || last.req.Object.Spec.Size != 2 {
					t.Errorf("want the spec change reconciled at once as a watch event with retries 0; reconciles:%s", describeCalls(calls))
				}
			})
		})
	}
}

// A trigger that read a newer object than the watch has delivered keeps
// it when the retry of an older reconcile (carrying the watch's older
// object) is added behind it.
func TestRetryDoesNotReplaceATriggersObject(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		gate := make(chan struct{})
		rec := &recorder{}
		rec.do = func(_ context.Context, n int, req reconcile.Request[*Widget]) (reconcile.Result, error) {
			if n == 0 {
				<-gate
				return reconcile.Done(), errors.New("the list's reconcile fails")
			}
			return reconcile.Done(), nil
		}
		lagging := watch.NewFake() // a watch that delivers nothing
		e := start(t, rec, func(c *reconcile.Config[*Widget]) {
			c.Dynamic.(*fakeDyn).PrependWatchReactor("widgets", func(clienttesting.Action) (bool, watch.Interface, error) { return true, lagging, nil })
		}, widget("a"))
		synctest.Wait()
		updateSpec(t, e, 7)
		read, err := typed.New[*Widget](e.dyn, widgets).Get(context.Background(), opkit.Key{Namespace: "ns", Name: "a"})
		if err != nil {
			t.Fatal(err)
		}
		submit(t, e, read, "ci")
		close(gate)
		synctest.Wait()
		calls := rec.snapshot()
		ci := withReason(calls, "ci")
		if len(ci) != 1 || ci[0].req.Object.ResourceVersion != read.ResourceVersion || ci[0].req.Object.Spec.Size != 7 {
			t.Errorf("want the trigger reconciled once with the object it read (rv %s, size 7); reconciles:%s", read.ResourceVersion, describeCalls(calls))
		}
	})
}

// blockFirstDelete returns a reconciler whose first Deleted request waits
// until gate is closed and then returns outcome; every other request
// succeeds.
func blockFirstDelete(outcome func() (reconcile.Result, error)) (rec *recorder, gate chan struct{}) {
	gate = make(chan struct{})
	first := true
	rec = &recorder{do: func(_ context.Context, _ int, req reconcile.Request[*Widget]) (reconcile.Result, error) {
		if req.Type == opkit.Deleted && first {
			first = false
			<-gate
			return outcome()
		}
		return reconcile.Done(), nil
	}}
	return rec, gate
}

// A trigger accepted while a delete of the same object is reconciled is
// not swallowed by that delete's retry or requeue: the object may still
// exist (deleting with finalizers after a Deleted trigger, or back in the
// watch's label selector), so both run, the trigger first.
func TestARetriedDeleteDoesNotSwallowAParkedTrigger(t *testing.T) {
	shard := func(n string) func(*Widget) { return func(w *Widget) { w.Labels = map[string]string{"shard": n} } }
	for _, tc := range []struct {
		name     string
		selector bool // the delete is the object leaving the selector; else a Deleted trigger
		outcome  func() (reconcile.Result, error)
		back     string // with selector: "watchThenTrigger" or "triggerThenWatch"
	}{
		{"Deleted trigger retried", false, func() (reconcile.Result, error) { return reconcile.Done(), errors.New("cleanup failed") }, ""},
		{"Deleted trigger requeued", false, func() (reconcile.Result, error) { return reconcile.RequeueAfter(time.Minute), nil }, ""},
		{"selector leave retried, back in the watch first", true, func() (reconcile.Result, error) { return reconcile.Done(), errors.New("cleanup failed") }, "watchThenTrigger"},
		{"selector leave retried, trigger first", true, func() (reconcile.Result, error) { return reconcile.Done(), errors.New("cleanup failed") }, "triggerThenWatch"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			synctest.Test(t, func(t *testing.T) {
				rec, gate := blockFirstDelete(tc.outcome)
				e, fw := startWithFakeWatch(t, rec, func(c *reconcile.Config[*Widget]) {
					if tc.selector {
						c.Watch.LabelSelector = "shard=1"
					}
				}, widget("a", shard("1")))
				synctest.Wait()
				back := widget("a", shard("1"), func(w *Widget) { w.ResourceVersion = "4" })
				ub, err := typed.ToUnstructured(back)
				if err != nil {
					t.Fatal(err)
				}
				// The object as the reconciles will read it (the watch
				// delivers only what the test pushes).
				if err := e.dyn.Tracker().Update(widgets.GroupVersionResource, ub, "ns"); err != nil {
					t.Fatal(err)
				}
				ci := func() {
					o, err := e.ctrl.Trigger().Submit(context.Background(), trigger.Request[*Widget]{Object: back, Type: opkit.Modified, Source: opkit.Operator, Reason: "ci", Fetched: true})
					if err != nil || !o.Accepted() {
						t.Fatalf("Submit: %v %v", o, err)
					}
				}
				if tc.selector {
					left, err := typed.ToUnstructured(widget("a", shard("2"), func(w *Widget) { w.ResourceVersion = "3" }))
					if err != nil {
						t.Fatal(err)
					}
					fw.Delete(left) // left the selector: its Deleted is in flight, blocked
					synctest.Wait()
					if tc.back == "watchThenTrigger" {
						fw.Add(ub)
						synctest.Wait()
						ci()
					} else {
						ci()
						fw.Add(ub)
						synctest.Wait()
					}
				} else {
					if o, err := e.ctrl.Trigger().Submit(context.Background(), trigger.Request[*Widget]{Object: widget("a", shard("1")), Type: opkit.Deleted, Source: opkit.Operator, Reason: "teardown"}); err != nil || !o.Accepted() {
						t.Fatal(o, err)
					}
					synctest.Wait() // in flight, blocked
					ci()
				}
				close(gate) // the delete's retry or requeue merges into the parked trigger
				time.Sleep(2 * time.Hour)
				synctest.Wait()
				calls := rec.snapshot()
				if got := withReason(calls, "ci"); len(got) != 1 || got[0].req.Type != opkit.Modified || got[0].req.Object.ResourceVersion != "4" {
					t.Errorf("want the accepted ci trigger reconciled once with the object as it is now; reconciles:%s", describeCalls(calls))
				}
				deletes := 0
				for _, c := range calls {
					if c.req.Type == opkit.Deleted {
						deletes++
					}
				}
				if deletes != 2 {
					t.Errorf("%d Deleted reconciles, want 2 (the delete and its retry or requeue); reconciles:%s", deletes, describeCalls(calls))
				}
			})
		})
	}
}

// With a label selector: the object leaves (a delete whose reconcile
// fails), comes back, gets a trigger, and leaves again while the first
// delete's retry waits behind the trigger. The retry carries the later
// delete, so its reconcile settles the tombstone the watcher holds.
func TestALaterSelectorExitBehindARetriedDeleteIsSettled(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		shard := func(n string) func(*Widget) { return func(w *Widget) { w.Labels = map[string]string{"shard": n} } }
		rv := func(v string) func(*Widget) { return func(w *Widget) { w.ResourceVersion = v } }
		rec, gate := blockFirstDelete(func() (reconcile.Result, error) { return reconcile.Done(), errors.New("cleanup failed") })
		wm := &trackedMetrics{}
		e, fw := startWithFakeWatch(t, rec, func(c *reconcile.Config[*Widget]) {
			c.Watch.Metrics, c.Watch.LabelSelector = wm, "shard=1"
		}, widget("a", shard("1")))
		synctest.Wait()
		unstr := func(w *Widget) *unstructured.Unstructured {
			u, err := typed.ToUnstructured(w)
			if err != nil {
				t.Fatal(err)
			}
			return u
		}
		fw.Delete(unstr(widget("a", shard("2"), rv("3"))))
		synctest.Wait() // in flight, blocked
		fw.Add(unstr(widget("a", shard("1"), rv("4"))))
		synctest.Wait()
		submit(t, e, widget("a", shard("1"), rv("4")), "ci")
		close(gate) // the retry (rv 3) goes behind ci
		synctest.Wait()
		left2 := unstr(widget("a", shard("2"), rv("5")))
		fw.Delete(left2) // merges into the parked retry
		if err := e.dyn.Tracker().Update(widgets.GroupVersionResource, left2, "ns"); err != nil {
			t.Fatal(err)
		}
		time.Sleep(time.Minute)
		synctest.Wait()
		fw.Add(unstr(widget("z", shard("1")))) // a watch event, so that the metric reports again
		time.Sleep(time.Minute)
		synctest.Wait()
		if n := wm.get(); n != 1 {
			t.Errorf("watcher tracks %d keys, want 1 (z): a's delete at rv 5 was never settled; reconciles:%s", n, describeCalls(rec.snapshot()))
		}
	})
}
