package reconcile_test

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"testing/synctest"
	"time"

	eventsv1 "k8s.io/api/events/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/watch"
	clienttesting "k8s.io/client-go/testing"

	"github.com/opkit/opkit"
	"github.com/opkit/opkit/internal/typed"
	"github.com/opkit/opkit/queue"
	"github.com/opkit/opkit/reconcile"
	"github.com/opkit/opkit/trigger"
	"github.com/opkit/opkit/watcher"
)

// call is one observed reconcile.
type call struct {
	at      time.Time
	req     reconcile.Request[*Widget]
	ctxErr  error // the context's error when the reconciler returned
	retries int
}

// recorder is a reconciler whose behaviour a test scripts per call.
type recorder struct {
	mu    sync.Mutex
	calls []call
	do    func(ctx context.Context, n int, req reconcile.Request[*Widget]) (reconcile.Result, error)
}

func (r *recorder) Reconcile(ctx context.Context, req reconcile.Request[*Widget]) (reconcile.Result, error) {
	r.mu.Lock()
	n := len(r.calls)
	r.calls = append(r.calls, call{at: time.Now(), req: req, retries: req.Retries})
	r.mu.Unlock()
	var res reconcile.Result
	var err error
	if r.do != nil {
		res, err = r.do(ctx, n, req)
	}
	r.mu.Lock()
	r.calls[n].ctxErr = ctx.Err()
	r.mu.Unlock()
	return res, err
}

func (r *recorder) snapshot() []call {
	r.mu.Lock()
	defer r.mu.Unlock()
	return slices.Clone(r.calls)
}

// countingMetrics counts the controller's measurements.
type countingMetrics struct {
	mu        sync.Mutex
	outcomes  map[reconcile.Outcome]int
	panics    int
	skipped   int
	refetched int
}

func (m *countingMetrics) Reconciled(o reconcile.Outcome, _ time.Duration) {
	m.mu.Lock()
	defer m.mu.Unlock()
	if m.outcomes == nil {
		m.outcomes = map[reconcile.Outcome]int{}
	}
	m.outcomes[o]++
}
func (m *countingMetrics) Panicked()                    { m.mu.Lock(); m.panics++; m.mu.Unlock() }
func (m *countingMetrics) Skipped(reconcile.SkipReason) { m.mu.Lock(); m.skipped++; m.mu.Unlock() }
func (m *countingMetrics) Refetched()                   { m.mu.Lock(); m.refetched++; m.mu.Unlock() }
func (m *countingMetrics) skippedN() int {
	m.mu.Lock()
	defer m.mu.Unlock()
	return m.skipped
}
func (m *countingMetrics) get(o reconcile.Outcome) int {
	m.mu.Lock()
	defer m.mu.Unlock()
	return m.outcomes[o]
}

type env struct {
	dyn     *fakeDyn
	ctrl    *reconcile.Controller[*Widget]
	rec     *recorder
	metrics *countingMetrics
	cancel  context.CancelFunc
	done    chan error
}

var quiet = slog.New(slog.DiscardHandler)

// start builds a controller over a fake cluster holding objs and runs it.
// Call it inside a synctest bubble (or not, for real-time tests).
func start(t *testing.T, rec *recorder, mod func(*reconcile.Config[*Widget]), objs ...*Widget) *env {
	t.Helper()
	e := &env{dyn: newFakeDynamic(t, objs...), rec: rec, metrics: &countingMetrics{}, done: make(chan error, 1)}
	cfg := reconcile.Config[*Widget]{
		Name: "test.opkit.dev/widgets", Resource: widgets, Dynamic: e.dyn,
		Reconciler: rec, Logger: quiet, Metrics: e.metrics,
		Backoff: queue.Backoff{Base: time.Second, Cap: time.Minute, Jitter: -1},
	}
	if mod != nil {
		mod(&cfg)
	}
	ctrl, err := reconcile.NewController(cfg)
	if err != nil {
		t.Fatal(err)
	}
	e.ctrl = ctrl
	ctx, cancel := context.WithCancel(context.Background())
	e.cancel = cancel
	go func() { e.done <- ctrl.Run(ctx) }()
	t.Cleanup(func() {
		cancel()
		if err := <-e.done; err != nil {
			t.Errorf("Run: %v", err)
		}
	})
	return e
}

func (e *env) events(t *testing.T) []eventsv1.Event {
	t.Helper()
	l, err := e.dyn.Resource(reconcile.EventsResource).List(context.Background(), metav1.ListOptions{})
	if err != nil {
		t.Fatal(err)
	}
	var out []eventsv1.Event
	for _, u := range l.Items {
		var ev eventsv1.Event
		if err := runtime.DefaultUnstructuredConverter.FromUnstructured(u.Object, &ev); err != nil {
			t.Fatal(err)
		}
		out = append(out, ev)
	}
	return out
}

func (e *env) setSize(t *testing.T, name string, size int) {
	t.Helper()
	c := typed.New[*Widget](e.dyn, widgets)
	w, err := c.Get(context.Background(), opkit.Key{Namespace: "ns", Name: name})
	if err != nil {
		t.Fatal(err)
	}
	w.Spec.Size = size
	// Through the tracker: no watch event, like a change the watch has not delivered yet.
	u, _ := typed.ToUnstructured(w)
	if err := e.dyn.Tracker().Update(widgets.GroupVersionResource, u, "ns"); err != nil {
		t.Fatal(err)
	}
}

func TestControllerReconcilesEveryListedObjectOnceWithoutRefetch(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		rec := &recorder{}
		e := start(t, rec, nil, widget("a"), widget("b"), widget("c"))
		synctest.Wait()
		var names []string
		for _, c := range rec.snapshot() {
			if c.req.Type != opkit.Added || c.req.Source != opkit.APIServer || c.req.Retries != 0 || c.req.Object.Name != c.req.Key.Name {
				t.Errorf("request %+v", c.req)
			}
			names = append(names, c.req.Key.Name)
		}
		slices.Sort(names)
		if fmt.Sprint(names) != "[a b c]" {
			t.Fatalf("reconciled %v, want [a b c] once each", names)
		}
		if e.metrics.refetched != 0 {
			t.Fatalf("%d re-fetches of fresh watch entries, want 0", e.metrics.refetched)
		}
	})
}

func TestControllerRetriesWithBackoffThenGivesUpAndRecordsAnEvent(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		boom := errors.New("boom")
		rec := &recorder{do: func(context.Context, int, reconcile.Request[*Widget]) (reconcile.Result, error) {
			return reconcile.Done(), boom
		}}
		e := start(t, rec, func(c *reconcile.Config[*Widget]) { c.MaxRetries = 3 }, widget("a"))
		time.Sleep(time.Hour)
		synctest.Wait()
		calls := rec.snapshot()
		if len(calls) != 4 {
			t.Fatalf("%d calls, want 4 (first attempt + MaxRetries 3)", len(calls))
		}
		var gaps []time.Duration
		for i, c := range calls {
			if c.retries != i {
				t.Errorf("call %d: Retries %d, want %d", i, c.retries, i)
			}
			if i > 0 {
				gaps = append(gaps, c.at.Sub(calls[i-1].at))
			}
		}
		if fmt.Sprint(gaps) != "[1s 2s 4s]" {
			t.Errorf("retry gaps %v, want [1s 2s 4s] (base 1s, doubling, no jitter)", gaps)
		}
		if e.metrics.get(reconcile.OutcomeRetry) != 3 || e.metrics.get(reconcile.OutcomeGaveUp) != 1 {
			t.Errorf("outcomes %v", e.metrics.outcomes)
		}
		evs := e.events(t)
		if len(evs) != 1 || evs[0].Type != "Warning" || evs[0].Reason != "ReconcileFailed" || evs[0].Regarding.Name != "a" || evs[0].Regarding.Kind != "Widget" {
			t.Fatalf("events %+v, want one Warning ReconcileFailed about Widget a", evs)
		}
	})
}

// One trigger is one "Triggered" Event and one triggered reconcile: its
// retries keep the attribution but record nothing more, and once it
// succeeded, the requeues it asks for (and watch events merged into them)
// are no longer the trigger's.
func TestControllerRecordsATriggerOnceAcrossItsRetriesAndRequeues(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		rec := &recorder{do: func(_ context.Context, n int, req reconcile.Request[*Widget]) (reconcile.Result, error) {
			if req.Source == opkit.Operator && req.Retries == 0 && !req.Requeued {
				return reconcile.Done(), errors.New("not yet") // the triggered attempt fails once
			}
			return reconcile.RequeueAfter(10 * time.Second), nil // then it polls
		}}
		e := start(t, rec, func(c *reconcile.Config[*Widget]) { c.RecordTriggerEvents = true }, widget("a"))
		synctest.Wait()
		e.ctrl.Trigger().Enqueue(context.Background(), widget("a"), opkit.Modified, opkit.Operator, 0, 0)
		time.Sleep(55 * time.Second)
		synctest.Wait()
		// A watch event merges into the pending requeue and replaces it.
		c := typed.New[*Widget](e.dyn, widgets)
		w, err := c.Get(context.Background(), opkit.Key{Namespace: "ns", Name: "a"})
		if err != nil {
			t.Fatal(err)
		}
		w.Spec.Size, w.ResourceVersion = 2, "2" // the fake does not bump it
		if _, err := c.Update(context.Background(), w); err != nil {
			t.Fatal(err)
		}
		synctest.Wait()
		var got []string
		for _, c := range rec.snapshot() {
			got = append(got, fmt.Sprintf("%s retries=%d requeued=%v", c.req.Source, c.retries, c.req.Requeued))
		}
		if len(got) < 8 || got[1] != "Operator retries=0 requeued=false" || got[2] != "Operator retries=1 requeued=false" ||
			got[3] != "Operator retries=0 requeued=true" || got[len(got)-1] != "APIServer retries=0 requeued=false" {
			t.Fatalf("reconciles:\n %s\nwant the trigger, its retry, then requeues, the last one replaced by the watch event", strings.Join(got, "\n "))
		}
		var triggered int
		for _, ev := range e.events(t) {
			if ev.Reason == "Triggered" {
				triggered++
			}
		}
		if triggered != 1 {
			t.Fatalf("%d Triggered Events over %d reconciles, want 1", triggered, len(got))
		}
	})
}

// A trigger whose first re-fetch fails is still recorded, once.
func TestControllerRecordsATriggerWhoseFirstReadFails(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		rec := &recorder{}
		e := start(t, rec, func(c *reconcile.Config[*Widget]) { c.RecordTriggerEvents = true }, widget("a"))
		synctest.Wait()
		failGets(e, 1, apierrors.NewInternalError(errors.New("etcd leader changed")))
		e.ctrl.Trigger().Enqueue(context.Background(), widget("a"), opkit.Modified, opkit.Operator, 0, 0)
		time.Sleep(time.Minute)
		synctest.Wait()
		calls := rec.snapshot()
		last := calls[len(calls)-1]
		if len(calls) != 2 || last.req.Source != opkit.Operator || last.retries != 1 {
			t.Fatalf("%d calls, last %+v; want the trigger reconciled on its retry", len(calls), last.req)
		}
		if triggered := countEvents(t, e, "Triggered"); triggered != 1 {
			t.Fatalf("%d Triggered Events, want 1", triggered)
		}
	})
}

func TestControllerErrorWithDelayWaitsAtLeastTheDelay(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		rec := &recorder{do: func(_ context.Context, n int, _ reconcile.Request[*Widget]) (reconcile.Result, error) {
			switch n {
			case 0: // backoff for retry 1 is 1s; the delay wins
				return reconcile.RequeueAfter(10 * time.Second), errors.New("not yet")
			case 1: // backoff for retry 2 is 2s; it wins over a smaller delay
				return reconcile.RequeueAfter(time.Millisecond), errors.New("not yet")
			}
			return reconcile.Done(), nil
		}}
		start(t, rec, nil, widget("a"))
		time.Sleep(time.Minute)
		synctest.Wait()
		calls := rec.snapshot()
		if len(calls) != 3 {
			t.Fatalf("%d calls, want 3", len(calls))
		}
		if g1, g2 := calls[1].at.Sub(calls[0].at), calls[2].at.Sub(calls[1].at); g1 != 10*time.Second || g2 != 2*time.Second {
			t.Fatalf("gaps %v, %v; want 10s (delay floor) then 2s (backoff)", g1, g2)
		}
	})
}

func TestControllerRequeueAfterResetsTheRetryCount(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		rec := &recorder{do: func(_ context.Context, n int, _ reconcile.Request[*Widget]) (reconcile.Result, error) {
			switch n {
			case 0, 1:
				return reconcile.Done(), errors.New("flaky")
			case 2:
				return reconcile.RequeueAfter(30 * time.Second), nil
			}
			return reconcile.Done(), nil
		}}
		start(t, rec, nil, widget("a"))
		time.Sleep(time.Minute)
		synctest.Wait()
		calls := rec.snapshot()
		var retries []int
		for _, c := range calls {
			retries = append(retries, c.retries)
		}
		if fmt.Sprint(retries) != "[0 1 2 0]" {
			t.Fatalf("Retries per call %v, want [0 1 2 0]", retries)
		}
		if gap := calls[3].at.Sub(calls[2].at); gap != 30*time.Second {
			t.Fatalf("requeue gap %v, want 30s", gap)
		}
	})
}

func TestControllerDoesNotRetryATerminalError(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		rec := &recorder{do: func(context.Context, int, reconcile.Request[*Widget]) (reconcile.Result, error) {
			return reconcile.RequeueAfter(time.Second), fmt.Errorf("spec: %w", reconcile.TerminalError(errors.New("size must be positive")))
		}}
		e := start(t, rec, nil, widget("a"))
		time.Sleep(time.Hour)
		synctest.Wait()
		if n := len(rec.snapshot()); n != 1 {
			t.Fatalf("%d calls, want 1", n)
		}
		evs := e.events(t)
		if e.metrics.get(reconcile.OutcomeTerminal) != 1 || len(evs) != 1 || evs[0].Reason != "ReconcileTerminalError" {
			t.Fatalf("outcomes %v, events %+v", e.metrics.outcomes, evs)
		}
	})
}

func TestControllerCancelsAReconcileAtItsTimeoutAndRetriesIt(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		rec := &recorder{do: func(ctx context.Context, n int, _ reconcile.Request[*Widget]) (reconcile.Result, error) {
			if n == 0 {
				<-ctx.Done() // a stuck call
				return reconcile.Done(), ctx.Err()
			}
			return reconcile.Done(), nil
		}}
		start(t, rec, func(c *reconcile.Config[*Widget]) { c.Timeout = 3 * time.Second }, widget("a"))
		time.Sleep(time.Minute)
		synctest.Wait()
		calls := rec.snapshot()
		if len(calls) != 2 || !errors.Is(calls[0].ctxErr, context.DeadlineExceeded) || calls[1].retries != 1 {
			t.Fatalf("calls %+v; want a timed-out call then one retry", calls)
		}
		// Timeout 3s, then backoff 1s.
		if gap := calls[1].at.Sub(calls[0].at); gap != 4*time.Second {
			t.Fatalf("gap %v, want 4s", gap)
		}
	})
}

func TestControllerTurnsAPanicIntoARetriedError(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		rec := &recorder{do: func(_ context.Context, n int, _ reconcile.Request[*Widget]) (reconcile.Result, error) {
			if n == 0 {
				var m map[string]int
				m["x"]++ // nil map write
			}
			return reconcile.Done(), nil
		}}
		logs := &syncBuffer{}
		e := start(t, rec, func(c *reconcile.Config[*Widget]) { c.Logger = slog.New(slog.NewTextHandler(logs, nil)) }, widget("a"))
		time.Sleep(time.Minute)
		synctest.Wait()
		if l := logs.String(); !strings.Contains(l, `msg="reconcile panicked"`) || !strings.Contains(l, "assignment to entry in nil map") || !strings.Contains(l, "controller_test.go") {
			t.Errorf("panic log lacks the message or the stack:\n%s", l)
		}
		calls := rec.snapshot()
		if len(calls) != 2 || calls[1].retries != 1 || e.metrics.panics != 1 || e.metrics.get(reconcile.OutcomeDone) != 1 {
			t.Fatalf("calls %d, panics %d, outcomes %v; want the panic retried once", len(calls), e.metrics.panics, e.metrics.outcomes)
		}
	})
}

func TestControllerRefetchesAWaitingRequestAndSkipsAVanishedObject(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		rec := &recorder{do: func(_ context.Context, n int, _ reconcile.Request[*Widget]) (reconcile.Result, error) {
			if n == 0 {
				return reconcile.Done(), errors.New("retry me")
			}
			return reconcile.Done(), nil
		}}
		e := start(t, rec, nil, widget("a"))
		synctest.Wait()
		// While the retry waits, the object changes without a watch event.
		e.setSize(t, "a", 7)
		time.Sleep(time.Minute)
		synctest.Wait()
		calls := rec.snapshot()
		if len(calls) != 2 || calls[0].req.Object.Spec.Size != 1 || calls[1].req.Object.Spec.Size != 7 {
			t.Fatalf("calls %+v; want the retry to see size 7", calls)
		}

		// A trigger for an object that no longer exists is skipped.
		gone := widget("gone")
		if ok, err := e.ctrl.Trigger().Enqueue(context.Background(), gone, opkit.Modified, opkit.Operator, 0, 0); !ok || err != nil {
			t.Fatalf("Enqueue = %v, %v", ok, err)
		}
		synctest.Wait()
		if n := len(rec.snapshot()); n != 2 || e.metrics.skipped != 1 {
			t.Fatalf("%d calls, %d skipped; want the vanished object skipped", n, e.metrics.skipped)
		}

		// A trigger carrying a stale object is reconciled with the fresh one.
		stale := widget("a") // size 1
		e.setSize(t, "a", 9)
		e.ctrl.Trigger().Enqueue(context.Background(), stale, opkit.Modified, opkit.Operator, 0, 0)
		synctest.Wait()
		calls = rec.snapshot()
		if len(calls) != 3 || calls[2].req.Object.Spec.Size != 9 || calls[2].req.Source != opkit.Operator {
			t.Fatalf("calls %+v; want the trigger reconciled with size 9", calls[len(calls)-1])
		}
	})
}

// A re-fetch answered with a NotFound that names no object means the API
// server does not serve the resource (its CRD being reinstalled, say), not
// that the object is gone: the request is retried, not skipped.
func TestControllerRetriesARefetchWhileTheResourceIsNotServed(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		rec := &recorder{}
		e := start(t, rec, nil, widget("a"))
		synctest.Wait()
		before := len(rec.snapshot())
		failGets(e, 2, apierrors.NewGenericServerResponse(404, "get", schema.GroupResource{}, "", "404 page not found", 0, true))
		if ok, err := e.ctrl.Trigger().Enqueue(context.Background(), widget("a"), opkit.Modified, opkit.Operator, 0, 0); !ok || err != nil {
			t.Fatalf("Enqueue = %v, %v", ok, err)
		}
		synctest.Wait()
		if n := len(rec.snapshot()); n != before || e.metrics.skipped != 0 {
			t.Fatalf("%d calls, %d skipped while not served; want neither", n-before, e.metrics.skipped)
		}
		time.Sleep(time.Minute)
		synctest.Wait()
		calls := rec.snapshot()
		if len(calls) != before+1 || calls[before].req.Source != opkit.Operator || calls[before].retries != 2 || e.metrics.skipped != 0 {
			t.Fatalf("calls %+v, %d skipped; want the trigger reconciled on its second retry", calls[before:], e.metrics.skipped)
		}
	})
}

// A trigger marked Fetched (the HTTP handler and the consumer mark theirs)
// is reconciled with the object it carries when a worker takes it within
// FreshFor: no second read of the API server. One that waited longer (here
// delayed) is re-fetched like any request that waited.
func TestControllerTrustsAFetchedTriggerWhileFresh(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		rec := &recorder{}
		e := start(t, rec, nil, widget("a"))
		synctest.Wait()
		before := e.metrics.refetched

		// The trigger carries size 5 while the server holds size 1, so a
		// re-fetch would show.
		w := widget("a")
		w.Spec.Size = 5
		req := trigger.Request[*Widget]{Object: w, Type: opkit.Modified, Source: opkit.Operator, Reason: "ci", Fetched: true}
		if o, err := e.ctrl.Trigger().Submit(context.Background(), req); err != nil || !o.Accepted() {
			t.Fatalf("Submit = %v, %v", o, err)
		}
		synctest.Wait()
		calls := rec.snapshot()
		last := calls[len(calls)-1]
		if last.req.Object.Spec.Size != 5 || last.req.Source != opkit.Operator || e.metrics.refetched != before {
			t.Fatalf("reconciled size %d from %v after %d re-fetches; want the trigger's size 5 and no re-fetch",
				last.req.Object.Spec.Size, last.req.Source, e.metrics.refetched-before)
		}

		// Delayed past FreshFor: read again, and the server now says 7.
		e.setSize(t, "a", 7)
		req.Delay = 2 * time.Second
		if o, err := e.ctrl.Trigger().Submit(context.Background(), req); err != nil || !o.Accepted() {
			t.Fatalf("Submit = %v, %v", o, err)
		}
		time.Sleep(2 * time.Second)
		synctest.Wait()
		calls = rec.snapshot()
		last = calls[len(calls)-1]
		if last.req.Object.Spec.Size != 7 || e.metrics.refetched != before+1 {
			t.Fatalf("reconciled size %d after %d re-fetches; want 7 after one", last.req.Object.Spec.Size, e.metrics.refetched-before)
		}
	})
}

// A fetched trigger whose GET was answered before the watch delivered a
// newer state is read again: trusting it would reconcile the older state
// after the newer one, with nothing to follow. Its resourceVersion is not
// the watcher's latest for the key, which is how the controller tells.
func TestControllerRefetchesAFetchedTriggerBehindTheWatch(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		rec := &recorder{}
		e := start(t, rec, nil, widget("a")) // resourceVersion 1, size 1
		synctest.Wait()
		got := widget("a") // what a trigger's GET returned: RV 1

		// Then the object changes, and the watch delivers RV 2 (size 7).
		newer := widget("a", func(w *Widget) { w.ResourceVersion, w.Spec.Size = "2", 7 })
		u, _ := typed.ToUnstructured(newer)
		if _, err := e.dyn.Resource(widgets.GroupVersionResource).Namespace("ns").Update(context.Background(), u, metav1.UpdateOptions{}); err != nil {
			t.Fatal(err)
		}
		synctest.Wait()
		before := e.metrics.refetched

		// The trigger with the older GET result arrives afterwards.
		req := trigger.Request[*Widget]{Object: got, Type: opkit.Modified, Source: opkit.Operator, Fetched: true}
		if o, err := e.ctrl.Trigger().Submit(context.Background(), req); err != nil || !o.Accepted() {
			t.Fatalf("Submit = %v, %v", o, err)
		}
		synctest.Wait()
		calls := rec.snapshot()
		last := calls[len(calls)-1]
		if last.req.Source != opkit.Operator || last.req.Object.Spec.Size != 7 || e.metrics.refetched != before+1 {
			t.Fatalf("last reconcile: %v with size %d after %d re-fetches; want the trigger re-fetched (size 7)",
				last.req.Source, last.req.Object.Spec.Size, e.metrics.refetched-before)
		}

		// A GET that returned the watch's latest (RV 2) is trusted.
		req.Object = newer
		if o, err := e.ctrl.Trigger().Submit(context.Background(), req); err != nil || !o.Accepted() {
			t.Fatalf("Submit = %v, %v", o, err)
		}
		synctest.Wait()
		if e.metrics.refetched != before+1 {
			t.Fatalf("a trigger at the watch's resourceVersion was re-fetched")
		}
	})
}

func TestControllerRefetchesWatchEntriesThatWaitedInABacklog(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		rec := &recorder{do: func(context.Context, int, reconcile.Request[*Widget]) (reconcile.Result, error) {
			time.Sleep(2 * time.Second) // longer than FreshFor (1s)
			return reconcile.Done(), nil
		}}
		e := start(t, rec, func(c *reconcile.Config[*Widget]) { c.Concurrency = 1 }, widget("a"), widget("b"), widget("c"))
		time.Sleep(time.Minute)
		synctest.Wait()
		if n := len(rec.snapshot()); n != 3 || e.metrics.refetched != 2 {
			t.Fatalf("%d calls, %d re-fetches; want 3 calls, the 2 that waited re-fetched", n, e.metrics.refetched)
		}
	})
}

func TestControllerShutdownLetsInFlightReconcilesFinishWithinTheDrain(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		release := make(chan struct{})
		rec := &recorder{do: func(ctx context.Context, _ int, _ reconcile.Request[*Widget]) (reconcile.Result, error) {
			select {
			case <-release:
			case <-ctx.Done():
			}
			return reconcile.Done(), nil
		}}
		e := start(t, rec, func(c *reconcile.Config[*Widget]) { c.ShutdownTimeout = 10 * time.Second }, widget("a"))
		synctest.Wait()
		e.cancel()
		time.Sleep(5 * time.Second)
		synctest.Wait()
		select {
		case <-e.done:
			t.Fatal("Run returned while a reconcile was in flight")
		default:
		}
		close(release)
		synctest.Wait()
		calls := rec.snapshot()
		if len(calls) != 1 || calls[0].ctxErr != nil {
			t.Fatalf("calls %+v; want one call that finished with its context intact", calls)
		}
		err := <-e.done
		e.done <- err // for the cleanup
	})
}

func TestControllerShutdownCancelsReconcilesThatOutliveTheDrain(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		rec := &recorder{do: func(ctx context.Context, _ int, _ reconcile.Request[*Widget]) (reconcile.Result, error) {
			<-ctx.Done()
			return reconcile.Done(), ctx.Err()
		}}
		e := start(t, rec, func(c *reconcile.Config[*Widget]) { c.ShutdownTimeout = 10 * time.Second }, widget("a"))
		synctest.Wait()
		began := time.Now()
		e.cancel()
		err := <-e.done
		e.done <- err
		if took := time.Since(began); took != 10*time.Second {
			t.Fatalf("Run returned %v after cancel, want at the 10s drain deadline", took)
		}
		if calls := rec.snapshot(); len(calls) != 1 || !errors.Is(calls[0].ctxErr, context.Canceled) {
			t.Fatalf("calls %+v; want one call cancelled at the deadline, no retry", calls)
		}
		if n := e.metrics.get(reconcile.OutcomeInterrupted); n != 1 || len(e.events(t)) != 0 {
			t.Fatalf("interrupted %d, events %d; want 1 interrupted and no Event", n, len(e.events(t)))
		}
	})
}

func TestControllerNeverRunsTwoReconcilesOfOneKeyAtOnce(t *testing.T) {
	// Real time and the race detector: many triggers on few keys.
	keys := []string{"k0", "k1", "k2", "k3"}
	var objs []*Widget
	for _, k := range keys {
		objs = append(objs, widget(k))
	}
	var (
		inFlight sync.Map // key -> *atomic.Int32
		overlaps atomic.Int32
		last     sync.Map // key -> true once its final trigger was reconciled
		lastSeen atomic.Int32
	)
	rec := &recorder{do: func(_ context.Context, _ int, req reconcile.Request[*Widget]) (reconcile.Result, error) {
		v, _ := inFlight.LoadOrStore(req.Key, new(atomic.Int32))
		n := v.(*atomic.Int32)
		if n.Add(1) > 1 {
			overlaps.Add(1)
		}
		time.Sleep(50 * time.Microsecond)
		n.Add(-1)
		if req.Reason == "last" {
			if _, loaded := last.LoadOrStore(req.Key, true); !loaded {
				lastSeen.Add(1)
			}
		}
		return reconcile.Done(), nil
	}}
	e := start(t, rec, func(c *reconcile.Config[*Widget]) { c.Concurrency = 8 }, objs...)
	var wg sync.WaitGroup
	for p := range 4 {
		wg.Go(func() {
			for i := range 500 {
				w := widget(keys[(p+i)%len(keys)])
				if ok, err := e.ctrl.Trigger().Enqueue(context.Background(), w, opkit.Modified, opkit.Operator, 0, 0); !ok || err != nil {
					t.Errorf("Enqueue = %v, %v", ok, err)
					return
				}
			}
		})
	}
	wg.Wait()
	// A final trigger per key: the newest payload wins on merge, so each
	// key's last reconcile carries this reason.
	for _, k := range keys {
		if _, err := e.ctrl.Trigger().Submit(context.Background(), trigger.Request[*Widget]{Object: widget(k), Type: opkit.Modified, Source: opkit.Operator, Reason: "last"}); err != nil {
			t.Fatal(err)
		}
	}
	deadline := time.Now().Add(60 * time.Second)
	for lastSeen.Load() < int32(len(keys)) && time.Now().Before(deadline) {
		time.Sleep(10 * time.Millisecond)
	}
	if got := lastSeen.Load(); got != int32(len(keys)) {
		t.Fatalf("final triggers reconciled for %d of %d keys", got, len(keys))
	}
	if overlaps.Load() != 0 {
		t.Fatalf("%d overlapping reconciles of one key", overlaps.Load())
	}
}

func TestNewControllerValidatesItsConfig(t *testing.T) {
	dyn := newFakeDynamic(t)
	ok := reconcile.Config[*Widget]{Name: "n", Resource: widgets, Dynamic: dyn, Reconciler: &recorder{}}
	for name, mod := range map[string]func(*reconcile.Config[*Widget]){
		"no name":                   func(c *reconcile.Config[*Widget]) { c.Name = "" },
		"no dynamic":                func(c *reconcile.Config[*Widget]) { c.Dynamic = nil },
		"no reconciler":             func(c *reconcile.Config[*Widget]) { c.Reconciler = nil },
		"bad resource":              func(c *reconcile.Config[*Widget]) { c.Resource = opkit.Resource{} },
		"negative workers":          func(c *reconcile.Config[*Widget]) { c.Concurrency = -1 },
		"watch client set":          func(c *reconcile.Config[*Widget]) { c.Watch.Client = dyn },
		"trigger events, no events": func(c *reconcile.Config[*Widget]) { c.RecordTriggerEvents, c.NoEvents = true, true },
	} {
		cfg := ok
		mod(&cfg)
		if _, err := reconcile.NewController(cfg); !errors.Is(err, reconcile.ErrInvalidConfig) {
			t.Errorf("%s: err = %v, want ErrInvalidConfig", name, err)
		}
	}
	if _, err := reconcile.NewController(ok); err != nil {
		t.Fatalf("valid config refused: %v", err)
	}
}

func TestControllerRefetchesARequeuedObjectTheReconcilerChanged(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		// The fake exists before the controller starts: the first reconcile
		// may run before start returns.
		fake := newFakeDynamic(t, widget("a"))
		rec := &recorder{do: func(ctx context.Context, n int, req reconcile.Request[*Widget]) (reconcile.Result, error) {
			if n > 0 {
				return reconcile.Done(), nil
			}
			// The reconciler writes the object, as a real one does, and asks
			// to be called again at once.
			w := *req.Object
			w.Spec.Size = 5
			if _, err := typed.New[*Widget](fake, widgets).Update(ctx, &w); err != nil {
				return reconcile.Done(), err
			}
			time.Sleep(time.Millisecond) // the write's watch event reaches the queue meanwhile
			return reconcile.RequeueAfter(0), nil
		}}
		start(t, rec, func(c *reconcile.Config[*Widget]) { c.Dynamic = fake })
		time.Sleep(time.Minute)
		synctest.Wait()
		calls := rec.snapshot()
		if len(calls) < 2 {
			t.Fatalf("%d calls, want the requeue reconciled", len(calls))
		}
		for i, c := range calls[1:] {
			if c.req.Object.Spec.Size != 5 {
				t.Errorf("call %d after the requeue saw size %d, want the reconciler's own write (5)", i+1, c.req.Object.Spec.Size)
			}
		}
	})
}

// The controller's trigger reaches only what its watch sees: a controller
// for one namespace and label selector does not reconcile other objects on
// a trigger's word (another shard's, or outside its RBAC). Labels are
// judged on the object read for the reconcile, not on the caller's copy.
func TestControllerTriggerHasTheWatchScope(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		rec := &recorder{}
		shard := func(n string) func(*Widget) {
			return func(w *Widget) { w.Labels = map[string]string{"shard": n} }
		}
		e := start(t, rec, func(c *reconcile.Config[*Widget]) {
			c.Watch.Namespace, c.Watch.LabelSelector = "ns", "shard=1"
		}, widget("moved", shard("2")), widget("mine", shard("1")))
		synctest.Wait()
		tr := e.ctrl.Trigger()
		other := widget("x", shard("1"), func(w *Widget) { w.Namespace = "other" })
		if ok, err := tr.Enqueue(context.Background(), other, opkit.Modified, opkit.Operator, 0, 0); ok || !errors.Is(err, trigger.ErrOutOfScope) {
			t.Errorf("Enqueue(another namespace) = %v, %v; want ErrOutOfScope", ok, err)
		}
		// A stale copy that still says shard 1 (the object moved to shard 2),
		// and a key-only copy of one in shard 1: both accepted, and judged
		// as read for the reconcile.
		for _, w := range []*Widget{widget("moved", shard("1")), widget("mine")} {
			if ok, err := tr.Enqueue(context.Background(), w, opkit.Modified, opkit.Operator, 0, 0); !ok || err != nil {
				t.Errorf("Enqueue(%s) = %v, %v", w.Name, ok, err)
			}
		}
		synctest.Wait()
		var triggered []string
		for _, c := range rec.snapshot() {
			if c.req.Source == opkit.Operator {
				triggered = append(triggered, c.req.Key.Name)
			}
		}
		if len(triggered) != 1 || triggered[0] != "mine" || e.metrics.skippedN() != 1 {
			t.Errorf("triggered reconciles %v, %d skipped; want only mine, and moved skipped", triggered, e.metrics.skippedN())
		}
	})
}

// An object that left the label selector while its reconcile ran: the
// requeue that reconcile asks for reads the object again and finds it out
// of the watch's scope, so the Deleted the watch delivered is the last
// word. And a Deleted trigger is judged on the object it carries.
func TestControllerLabelScopeAfterTheWatch(t *testing.T) {
	shard := func(n string) func(*Widget) { return func(w *Widget) { w.Labels = map[string]string{"shard": n} } }
	t.Run("requeue of an object that left", func(t *testing.T) {
		synctest.Test(t, func(t *testing.T) {
			gate := make(chan struct{})
			rec := &recorder{do: func(_ context.Context, n int, _ reconcile.Request[*Widget]) (reconcile.Result, error) {
				if n == 0 {
					<-gate
					return reconcile.RequeueAfter(0), nil
				}
				return reconcile.Done(), nil
			}}
			e, fw := startWithFakeWatch(t, rec, func(c *reconcile.Config[*Widget]) {
				c.Watch.Namespace, c.Watch.LabelSelector = "ns", "shard=1"
			}, widget("a", shard("1")))
			synctest.Wait() // the list's Added is being reconciled
			moved, err := typed.ToUnstructured(widget("a", shard("2"), func(w *Widget) { w.ResourceVersion = "2" }))
			if err != nil {
				t.Fatal(err)
			}
			if err := e.dyn.Tracker().Update(widgets.GroupVersionResource, moved, "ns"); err != nil {
				t.Fatal(err)
			}
			fw.Delete(moved.DeepCopy()) // what a label-selected watch reports
			synctest.Wait()
			close(gate)
			time.Sleep(time.Minute)
			synctest.Wait()
			calls := rec.snapshot()
			if last := calls[len(calls)-1]; last.req.Type != opkit.Deleted || e.metrics.skippedN() != 1 {
				t.Errorf("last reconcile %s %s (shard %s), %d skipped; want the Deleted last and the requeue skipped",
					last.req.Source, last.req.Type, last.req.Object.Labels["shard"], e.metrics.skippedN())
			}
		})
	})
	t.Run("Deleted trigger", func(t *testing.T) {
		synctest.Test(t, func(t *testing.T) {
			rec := &recorder{}
			e := start(t, rec, func(c *reconcile.Config[*Widget]) {
				c.Watch.Namespace, c.Watch.LabelSelector = "ns", "shard=1"
			}, widget("other", shard("2")))
			synctest.Wait()
			for _, w := range []*Widget{widget("other"), widget("other", shard("2"))} {
				if ok, err := e.ctrl.Trigger().Enqueue(context.Background(), w, opkit.Deleted, opkit.Operator, 0, 0); ok || !errors.Is(err, trigger.ErrOutOfScope) {
					t.Errorf("Enqueue(Deleted, labels %v) = %v, %v; want ErrOutOfScope", w.Labels, ok, err)
				}
			}
			synctest.Wait()
			if calls := rec.snapshot(); len(calls) != 0 {
				t.Errorf("%d reconciles; want none (the only object is another shard's)", len(calls))
			}
		})
	})
}

// An external Deleted trigger for an object that still exists keeps its
// reconcile when the watch then reports a change to the object.
func TestControllerDeletedTriggerSurvivesAWatchModified(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		rec := &recorder{}
		e, fw := startWithFakeWatch(t, rec, nil, widget("a"))
		synctest.Wait()
		submitDeleted(t, e)
		e.setSize(t, "a", 3)
		mod, err := typed.ToUnstructured(widget("a", func(w *Widget) { w.ResourceVersion, w.Spec.Size = "2", 3 }))
		if err != nil {
			t.Fatal(err)
		}
		fw.Modify(mod) // the watch delivers a change while the trigger waits
		time.Sleep(time.Minute)
		synctest.Wait()
		got := summarize(rec.snapshot()[1:])
		found := slices.Contains(got, "Operator Deleted pipeline")
		if !found {
			t.Errorf("reconciles after the accepted Deleted trigger: %q; want its reconcile", got)
		}
	})
}

// trackedMetrics is a watcher.Metrics that records how many keys the
// watcher tracks (tombstones included).
type trackedMetrics struct {
	mu sync.Mutex
	n  int
}

func (*trackedMetrics) Event(opkit.Type, queue.Outcome) {}
func (*trackedMetrics) Relist(watcher.Reason)           {}
func (*trackedMetrics) WatchRestart(watcher.Reason)     {}
func (*trackedMetrics) Error(watcher.Reason)            {}
func (m *trackedMetrics) Tracked(n int)                 { m.mu.Lock(); m.n = n; m.mu.Unlock() }
func (*trackedMetrics) Observed(time.Time)              {}
func (m *trackedMetrics) get() int                      { m.mu.Lock(); defer m.mu.Unlock(); return m.n }

// A pending Deleted trigger absorbs the watch's delete of the same object
// (being deleted with finalizers, then gone): its reconcile settles the
// delete the watcher holds, so the watcher forgets the object.
func TestControllerDeletedTriggerSettlesTheWatchDelete(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		rec := &recorder{}
		wm := &trackedMetrics{}
		e, fw := startWithFakeWatch(t, rec, func(c *reconcile.Config[*Widget]) { c.Watch.Metrics = wm }, widget("a"))
		synctest.Wait()
		submitDeleted(t, e)
		gone, err := typed.ToUnstructured(widget("a", func(w *Widget) { w.ResourceVersion = "3" }))
		if err != nil {
			t.Fatal(err)
		}
		fw.Delete(gone) // the object is gone while the trigger waits
		time.Sleep(time.Minute)
		synctest.Wait()
		z, err := typed.ToUnstructured(widget("z"))
		if err != nil {
			t.Fatal(err)
		}
		fw.Add(z) // the watcher reports how many keys it tracks after each change
		time.Sleep(time.Minute)
		synctest.Wait()
		var deletes []string
		for _, c := range rec.snapshot() {
			if c.req.Type == opkit.Deleted {
				deletes = append(deletes, c.req.Source.String()+" "+c.req.Reason+" rv "+c.req.Object.ResourceVersion)
			}
		}
		if n := wm.get(); n != 1 || len(deletes) != 1 {
			t.Errorf("watcher tracks %d keys, deletes reconciled %q; want 1 key (z) and one delete (the trigger's, carrying the watch's rv 3)", n, deletes)
		}
	})
}

// startWithFakeWatch is start with the controller's watch served by the
// returned fake watcher, which the test drives (the list still comes from
// the fake cluster).
func startWithFakeWatch(t *testing.T, rec *recorder, mod func(*reconcile.Config[*Widget]), objs ...*Widget) (*env, *watch.FakeWatcher) {
	t.Helper()
	fw := watch.NewFakeWithChanSize(10, false)
	e := start(t, rec, func(c *reconcile.Config[*Widget]) {
		if mod != nil {
			mod(c)
		}
		c.Dynamic.(*fakeDyn).PrependWatchReactor("widgets", func(clienttesting.Action) (bool, watch.Interface, error) { return true, fw, nil })
	}, objs...)
	return e, fw
}

// submitDeleted submits an external Deleted trigger for widget ns/a, due in
// ten seconds, with reason "pipeline".
func submitDeleted(t *testing.T, e *env) {
	t.Helper()
	req := trigger.Request[*Widget]{Object: widget("a"), Type: opkit.Deleted, Source: opkit.Operator, Reason: "pipeline", Delay: 10 * time.Second}
	if o, err := e.ctrl.Trigger().Submit(context.Background(), req); err != nil || !o.Accepted() {
		t.Fatalf("Submit = %v, %v", o, err)
	}
}

// The watch's delete of an object that left the label selector (or a
// tombstone, which has no labels) merged into a pending Deleted trigger is
// reconciled and settled: deletes are never skipped as out of scope.
func TestControllerDeletedTriggerTakesADeleteOutsideTheSelector(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		rec := &recorder{}
		wm := &trackedMetrics{}
		shard := func(n string) func(*Widget) { return func(w *Widget) { w.Labels = map[string]string{"shard": n} } }
		e, fw := startWithFakeWatch(t, rec, func(c *reconcile.Config[*Widget]) {
			c.Watch.Metrics, c.Watch.LabelSelector = wm, "shard=1"
		}, widget("a", shard("1")))
		synctest.Wait()
		req := trigger.Request[*Widget]{Object: widget("a", shard("1")), Type: opkit.Deleted, Source: opkit.Operator, Reason: "pipeline", Delay: 10 * time.Second}
		if o, err := e.ctrl.Trigger().Submit(context.Background(), req); err != nil || !o.Accepted() {
			t.Fatalf("Submit = %v, %v", o, err)
		}
		left, err := typed.ToUnstructured(widget("a", shard("2"), func(w *Widget) { w.ResourceVersion = "3" }))
		if err != nil {
			t.Fatal(err)
		}
		fw.Delete(left) // the object left the selector while the trigger waits
		time.Sleep(time.Minute)
		synctest.Wait()
		z, err := typed.ToUnstructured(widget("z", shard("1")))
		if err != nil {
			t.Fatal(err)
		}
		fw.Add(z) // the watcher reports how many keys it tracks after each change
		time.Sleep(time.Minute)
		synctest.Wait()
		deletes := 0
		for _, c := range rec.snapshot() {
			if c.req.Type == opkit.Deleted {
				deletes++
			}
		}
		if n := wm.get(); n != 1 || deletes != 1 || e.metrics.skippedN() != 0 {
			t.Errorf("watcher tracks %d keys, %d deletes reconciled, %d skipped; want 1 key (z), 1 delete, none skipped", n, deletes, e.metrics.skippedN())
		}
	})
}

// A watch delete that failed and is retried while a Deleted trigger of the
// object waits: the trigger takes the retried delete's object, so its
// reconcile settles the delete the watcher holds.
func TestControllerDeletedTriggerTakesARetriedWatchDelete(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		gate := make(chan struct{})
		failed := false
		rec := &recorder{do: func(_ context.Context, _ int, req reconcile.Request[*Widget]) (reconcile.Result, error) {
			if req.Type == opkit.Deleted && req.Source == opkit.APIServer && !failed {
				failed = true
				<-gate
				return reconcile.Done(), errors.New("cleanup failed")
			}
			return reconcile.Done(), nil
		}}
		wm := &trackedMetrics{}
		e, fw := startWithFakeWatch(t, rec, func(c *reconcile.Config[*Widget]) { c.Watch.Metrics = wm }, widget("a"))
		synctest.Wait()
		gone, err := typed.ToUnstructured(widget("a", func(w *Widget) { w.ResourceVersion = "3" }))
		if err != nil {
			t.Fatal(err)
		}
		fw.Delete(gone)
		synctest.Wait() // the watch's delete is in flight
		if ok, err := e.ctrl.Trigger().Enqueue(context.Background(), widget("a"), opkit.Deleted, opkit.Operator, 0, 0); !ok || err != nil {
			t.Fatalf("Enqueue = %v, %v", ok, err)
		}
		close(gate) // the delete fails; its retry merges into the parked trigger
		time.Sleep(time.Minute)
		synctest.Wait()
		z, err := typed.ToUnstructured(widget("z"))
		if err != nil {
			t.Fatal(err)
		}
		fw.Add(z)
		time.Sleep(time.Minute)
		synctest.Wait()
		var deletes []string
		for _, c := range rec.snapshot() {
			if c.req.Type == opkit.Deleted {
				deletes = append(deletes, c.req.Source.String()+" rv "+c.req.Object.ResourceVersion)
			}
		}
		if n := wm.get(); n != 1 {
			t.Errorf("watcher tracks %d keys (deletes reconciled %q); want 1 (z): the delete the watcher held was settled", n, deletes)
		}
	})
}

// failGets makes the next n GETs of widgets fail with err.
func failGets(e *env, n int, err error) {
	e.dyn.PrependReactor("get", "widgets", func(clienttesting.Action) (bool, runtime.Object, error) {
		if n == 0 {
			return false, nil, nil
		}
		n--
		return true, nil, err
	})
}
