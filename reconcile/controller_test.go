package reconcile_test

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"slices"
	"strconv"
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
	"github.com/opkit/opkit/internal/logsink"
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
	err     error // what the reconciler returned
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
	r.calls[n].ctxErr, r.calls[n].err = ctx.Err(), err
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
	outcomes  map[string]int
	panics    int
	skipped   int
	refetched int
}

func (m *countingMetrics) Reconciled(o string, _ time.Duration) {
	m.mu.Lock()
	defer m.mu.Unlock()
	if m.outcomes == nil {
		m.outcomes = map[string]int{}
	}
	m.outcomes[o]++
}
func (m *countingMetrics) Panicked()      { m.mu.Lock(); m.panics++; m.mu.Unlock() }
func (m *countingMetrics) Skipped(string) { m.mu.Lock(); m.skipped++; m.mu.Unlock() }
func (m *countingMetrics) Refetched()     { m.mu.Lock(); m.refetched++; m.mu.Unlock() }
func (m *countingMetrics) skippedN() int {
	m.mu.Lock()
	defer m.mu.Unlock()
	return m.skipped
}
func (m *countingMetrics) get(o string) int {
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

// update changes ns/name through the fake API server as a real one would:
// a new resourceVersion, and a watch event for it.
func (e *env) update(t *testing.T, name string, mutate func(*Widget)) {
	t.Helper()
	c := typed.New[*Widget](e.dyn, widgets)
	w, err := c.Get(context.Background(), opkit.Key{Namespace: "ns", Name: name})
	if err != nil {
		t.Fatal(err)
	}
	mutate(w)
	rv, _ := strconv.Atoi(w.ResourceVersion)
	w.ResourceVersion = strconv.Itoa(rv + 1)
	if _, err := c.Update(context.Background(), w); err != nil {
		t.Fatal(err)
	}
}

// countEvents counts the Kubernetes Events recorded with reason.
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

// summarize returns "sources type reasons" of each call.
func summarize(calls []call) []string {
	var out []string
	for _, c := range calls {
		out = append(out, strings.TrimSpace(fmt.Sprintf("%s %s %s", c.req.Sources, c.req.Type, strings.Join(c.req.Reasons, ","))))
	}
	return out
}

var apiServer = opkit.Sources(opkit.APIServer)

func TestControllerReconcilesEveryListedObjectOnceWithoutRefetch(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		rec := &recorder{}
		e := start(t, rec, nil, widget("a"), widget("b"), widget("c"))
		synctest.Wait()
		var names []string
		for _, c := range rec.snapshot() {
			if c.req.Type != opkit.Added || c.req.Sources != apiServer || c.req.Retries != 0 || c.req.Object.Name != c.req.Key.Name {
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
		if e.metrics.get("retry") != 3 || e.metrics.get("gave_up") != 1 {
			t.Errorf("outcomes %v", e.metrics.outcomes)
		}
		evs := e.events(t)
		if len(evs) != 1 || evs[0].Type != "Warning" || evs[0].Reason != "ReconcileFailed" || evs[0].Regarding.Name != "a" || evs[0].Regarding.Kind != "Widget" {
			t.Fatalf("events %+v, want one Warning ReconcileFailed about Widget a", evs)
		}
	})
}

// One trigger is one "Triggered" Event and one turn that names it: its
// retry and the requeues that follow carry no source (they are the
// controller's own), and a watch event merged into a requeue brings its
// own source.
func TestControllerRecordsATriggerOnceAcrossItsRetriesAndRequeues(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		rec := &recorder{do: func(_ context.Context, n int, req reconcile.Request[*Widget]) (reconcile.Result, error) {
			if req.Sources.Has(opkit.Operator) {
				return reconcile.Done(), errors.New("not yet") // the triggered attempt fails once
			}
			if req.Sources == 0 {
				return reconcile.RequeueAfter(10 * time.Second), nil // then it polls
			}
			return reconcile.Done(), nil
		}}
		e := start(t, rec, func(c *reconcile.Config[*Widget]) { c.RecordTriggerEvents = true }, widget("a"))
		synctest.Wait()
		e.ctrl.Trigger().Submit(context.Background(), trigger.Request[*Widget]{Object: widget("a"), Type: opkit.Modified, Source: opkit.Operator, Reason: "deployed"})
		time.Sleep(25 * time.Second)
		synctest.Wait()
		e.update(t, "a", func(w *Widget) { w.Spec.Size = 2 }) // merges into the pending requeue
		synctest.Wait()
		var got []string
		for _, c := range rec.snapshot() {
			got = append(got, fmt.Sprintf("%s retries=%d %v", c.req.Sources, c.retries, c.req.Reasons))
		}
		want := []string{
			"APIServer retries=0 []",        // the list
			"Operator retries=0 [deployed]", // the trigger, which fails
			"none retries=1 []",             // its retry, which polls
			"none retries=0 []",             // a requeue
			"none retries=0 []",             // another
			"APIServer retries=0 []",        // the watch event, merged into the next requeue
		}
		if !slices.Equal(got, want) {
			t.Fatalf("reconciles:\n %s\nwant\n %s", strings.Join(got, "\n "), strings.Join(want, "\n "))
		}
		if n := countEvents(t, e, "Triggered"); n != 1 {
			t.Fatalf("%d Triggered Events, want 1", n)
		}
	})
}

// A trigger whose read fails is still recorded, once, and its retry
// reads again.
func TestControllerRecordsATriggerWhoseFirstReadFails(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		rec := &recorder{}
		e := start(t, rec, func(c *reconcile.Config[*Widget]) { c.RecordTriggerEvents = true }, widget("a"))
		synctest.Wait()
		failGets(e, 1, apierrors.NewInternalError(errors.New("etcd leader changed")))
		stale := widget("a", func(w *Widget) { w.ResourceVersion = "" }) // a key-only copy: read for its turn
		e.ctrl.Trigger().Enqueue(context.Background(), stale, opkit.Modified, opkit.Operator, 0, 0)
		time.Sleep(time.Minute)
		synctest.Wait()
		calls := rec.snapshot()
		last := calls[len(calls)-1]
		if len(calls) != 2 || last.req.Sources != 0 || last.retries != 1 || last.req.Object.ResourceVersion != "1" {
			t.Fatalf("%d calls, last %+v; want the object reconciled on the trigger's retry, as read", len(calls), last.req)
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
		if e.metrics.get("terminal") != 1 || len(evs) != 1 || evs[0].Reason != "ReconcileTerminalError" {
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
		logs := &logsink.Buffer{}
		e := start(t, rec, func(c *reconcile.Config[*Widget]) { c.Logger = slog.New(slog.NewTextHandler(logs, nil)) }, widget("a"))
		time.Sleep(time.Minute)
		synctest.Wait()
		if l := logs.String(); !strings.Contains(l, `msg="reconcile panicked"`) || !strings.Contains(l, "assignment to entry in nil map") || !strings.Contains(l, "controller_test.go") {
			t.Errorf("panic log lacks the message or the stack:\n%s", l)
		}
		calls := rec.snapshot()
		if len(calls) != 2 || calls[1].retries != 1 || e.metrics.panics != 1 || e.metrics.get("done") != 1 {
			t.Fatalf("calls %d, panics %d, outcomes %v; want the panic retried once", len(calls), e.metrics.panics, e.metrics.outcomes)
		}
	})
}

// A retry reads the object again (here it changed without the watch
// seeing it); a trigger for an object that no longer exists is skipped;
// one that carries a state older than the watch's latest is reconciled
// with what the API server has.
func TestControllerReadsARetryAndSkipsAVanishedObject(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		rec := &recorder{do: func(_ context.Context, n int, _ reconcile.Request[*Widget]) (reconcile.Result, error) {
			if n == 0 {
				return reconcile.Done(), errors.New("retry me")
			}
			return reconcile.Done(), nil
		}}
		e := start(t, rec, nil, widget("a"))
		synctest.Wait()
		e.setSize(t, "a", 7)
		time.Sleep(time.Minute)
		synctest.Wait()
		calls := rec.snapshot()
		if len(calls) != 2 || calls[0].req.Object.Spec.Size != 1 || calls[1].req.Object.Spec.Size != 7 {
			t.Fatalf("calls %+v; want the retry to see size 7", calls)
		}

		gone := widget("gone")
		if ok, err := e.ctrl.Trigger().Enqueue(context.Background(), gone, opkit.Modified, opkit.Operator, 0, 0); !ok || err != nil {
			t.Fatalf("Enqueue = %v, %v", ok, err)
		}
		synctest.Wait()
		if n := len(rec.snapshot()); n != 2 || e.metrics.skipped != 1 {
			t.Fatalf("%d calls, %d skipped; want the vanished object skipped", n, e.metrics.skipped)
		}

		stale := widget("a") // resourceVersion 1, size 1
		e.update(t, "a", func(w *Widget) { w.Spec.Size = 9 })
		synctest.Wait()
		e.ctrl.Trigger().Enqueue(context.Background(), stale, opkit.Modified, opkit.Operator, 0, 0)
		synctest.Wait()
		calls = rec.snapshot()
		if last := calls[len(calls)-1]; last.req.Object.Spec.Size != 9 || !last.req.Sources.Has(opkit.Operator) {
			t.Fatalf("last call %+v; want the trigger reconciled with size 9", last.req)
		}
	})
}

// A read answered with a NotFound that names no object means the API
// server does not serve the resource (its CRD being reinstalled, say), not
// that the object is gone: the turn is retried, not skipped.
func TestControllerRetriesAReadWhileTheResourceIsNotServed(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		rec := &recorder{}
		e := start(t, rec, nil, widget("a"))
		synctest.Wait()
		before := len(rec.snapshot())
		failGets(e, 2, apierrors.NewGenericServerResponse(404, "get", schema.GroupResource{}, "", "404 page not found", 0, true))
		keyOnly := widget("a", func(w *Widget) { w.ResourceVersion = "" })
		if ok, err := e.ctrl.Trigger().Enqueue(context.Background(), keyOnly, opkit.Modified, opkit.Operator, 0, 0); !ok || err != nil {
			t.Fatalf("Enqueue = %v, %v", ok, err)
		}
		synctest.Wait()
		if n := len(rec.snapshot()); n != before || e.metrics.skipped != 0 {
			t.Fatalf("%d calls, %d skipped while not served; want neither", n-before, e.metrics.skipped)
		}
		time.Sleep(time.Minute)
		synctest.Wait()
		calls := rec.snapshot()
		if len(calls) != before+1 || calls[before].retries != 2 || e.metrics.skipped != 0 {
			t.Fatalf("calls %+v, %d skipped; want the object reconciled on the second retry", calls[before:], e.metrics.skipped)
		}
	})
}

// A trigger whose object is at the watch's latest resourceVersion (what
// the HTTP handler and the consumer read) is reconciled with that object,
// without another read; one behind the watch is read again: reconciling
// it would put an older state after a newer one, with nothing to follow.
func TestControllerTrustsATriggerAtTheWatchesLatestState(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		rec := &recorder{}
		e := start(t, rec, nil, widget("a"))
		synctest.Wait()
		before := e.metrics.refetched
		read := widget("a") // as read: resourceVersion 1
		if o, err := e.ctrl.Trigger().Submit(context.Background(), trigger.Request[*Widget]{Object: read, Type: opkit.Modified, Source: opkit.Operator, Reason: "ci"}); err != nil || !o.Accepted() {
			t.Fatalf("Submit = %v, %v", o, err)
		}
		synctest.Wait()
		calls := rec.snapshot()
		if last := calls[len(calls)-1]; last.req.Object != read || e.metrics.refetched != before {
			t.Fatalf("reconciled %p (the trigger's %p) after %d reads; want the trigger's object, no read", last.req.Object, read, e.metrics.refetched-before)
		}

		e.update(t, "a", func(w *Widget) { w.Spec.Size = 7 }) // the watch delivers resourceVersion 2
		synctest.Wait()
		if o, err := e.ctrl.Trigger().Submit(context.Background(), trigger.Request[*Widget]{Object: read, Type: opkit.Modified, Source: opkit.Operator}); err != nil || !o.Accepted() {
			t.Fatalf("Submit = %v, %v", o, err)
		}
		synctest.Wait()
		calls = rec.snapshot()
		if last := calls[len(calls)-1]; last.req.Object.Spec.Size != 7 || e.metrics.refetched != before+1 {
			t.Fatalf("reconciled size %d after %d reads; want 7 after one", last.req.Object.Spec.Size, e.metrics.refetched-before)
		}
	})
}

// Watch entries that waited in a backlog are reconciled as the watch saw
// them: the watch's latest state needs no read, however long it waited.
func TestControllerDoesNotReadWatchEntriesThatWaitedInABacklog(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		rec := &recorder{do: func(context.Context, int, reconcile.Request[*Widget]) (reconcile.Result, error) {
			time.Sleep(2 * time.Second)
			return reconcile.Done(), nil
		}}
		e := start(t, rec, func(c *reconcile.Config[*Widget]) { c.Concurrency = 1 }, widget("a"), widget("b"), widget("c"))
		time.Sleep(time.Minute)
		synctest.Wait()
		if n := len(rec.snapshot()); n != 3 || e.metrics.refetched != 0 {
			t.Fatalf("%d calls, %d reads; want 3 calls and no read", n, e.metrics.refetched)
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
		if n := e.metrics.get("interrupted"); n != 1 || len(e.events(t)) != 0 {
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
		if slices.Contains(req.Reasons, "last") {
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
	// A final trigger per key: its reason reaches a reconcile of the key,
	// merged with whatever else is pending.
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

func TestControllerReadsARequeuedObjectTheReconcilerChanged(t *testing.T) {
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
			return reconcile.RequeueAfter(0), nil
		}}
		start(t, rec, func(c *reconcile.Config[*Widget]) { c.Dynamic = fake })
		time.Sleep(time.Minute)
		synctest.Wait()
		calls := rec.snapshot()
		if len(calls) != 2 || calls[1].req.Object.Spec.Size != 5 {
			t.Fatalf("calls %+v; want the requeue to read the reconciler's own write (size 5)", calls)
		}
	})
}

// The controller's trigger reaches only what its watch sees: a controller
// for one namespace and label selector does not reconcile other objects on
// a trigger's word (another shard's, or outside its RBAC). Labels are
// judged on the object the turn reconciles, read for it unless the
// trigger's copy is the watch's latest state.
func TestControllerTriggerHasTheWatchScope(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		rec := &recorder{}
		shard := func(n string) func(*Widget) {
			return func(w *Widget) { w.Labels = map[string]string{"shard": n} }
		}
		keyOnly := func(w *Widget) { w.ResourceVersion = "" }
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
		for _, w := range []*Widget{widget("moved", shard("1")), widget("mine", keyOnly)} {
			if ok, err := tr.Enqueue(context.Background(), w, opkit.Modified, opkit.Operator, 0, 0); !ok || err != nil {
				t.Errorf("Enqueue(%s) = %v, %v", w.Name, ok, err)
			}
		}
		synctest.Wait()
		var triggered []string
		for _, c := range rec.snapshot() {
			if c.req.Sources.Has(opkit.Operator) {
				triggered = append(triggered, c.req.Key.Name)
			}
		}
		if len(triggered) != 1 || triggered[0] != "mine" || e.metrics.skippedN() != 1 {
			t.Errorf("triggered reconciles %v, %d skipped; want only mine, and moved skipped", triggered, e.metrics.skippedN())
		}
	})
}

// An object that left the label selector while its reconcile ran: the
// requeue that reconcile asks for finds the delete the watch delivered,
// and no live object to read. A Deleted trigger is judged on the object
// it carries.
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
			got := summarize(rec.snapshot())
			if want := []string{"APIServer Added", "APIServer Deleted"}; !slices.Equal(got, want) || e.metrics.refetched != 0 {
				t.Errorf("reconciles %q after %d reads; want %q and no read", got, e.metrics.refetched, want)
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

// A teardown (a Deleted trigger) of an object that still exists is a
// Deleted reconcile of the object as it is now, also when the watch
// reports a change to it while the teardown waits.
func TestControllerATeardownOfALiveObjectSurvivesAWatchModified(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		rec := &recorder{}
		e, fw := startWithFakeWatch(t, rec, nil, widget("a"))
		synctest.Wait()
		submitDeleted(t, e)
		mod, err := typed.ToUnstructured(widget("a", func(w *Widget) { w.ResourceVersion, w.Spec.Size = "2", 3 }))
		if err != nil {
			t.Fatal(err)
		}
		fw.Modify(mod) // the watch delivers a change while the trigger waits
		time.Sleep(time.Minute)
		synctest.Wait()
		calls := rec.snapshot()
		got := summarize(calls)
		if want := []string{"APIServer Added", "APIServer|Operator Deleted pipeline"}; !slices.Equal(got, want) || calls[1].req.Object.Spec.Size != 3 {
			t.Errorf("reconciles %q; want %q, of the object as the watch saw it last", got, want)
		}
	})
}

// trackedMetrics is a watcher.Metrics that records how much the watcher
// holds (live objects and unsettled deletes).
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

// A teardown waiting when the object goes (being deleted with finalizers,
// then gone) is served by the watch's delete, reconciled in the same
// turn with its final state and settled: one Deleted reconcile, and the
// watcher forgets the object.
func TestControllerATeardownIsServedByTheWatchesDelete(t *testing.T) {
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
		if err := e.dyn.Tracker().Delete(widgets.GroupVersionResource, "ns", "a"); err != nil {
			t.Fatal(err)
		}
		fw.Delete(gone) // the object is gone while the trigger waits
		time.Sleep(time.Minute)
		synctest.Wait()
		z, err := typed.ToUnstructured(widget("z"))
		if err != nil {
			t.Fatal(err)
		}
		fw.Add(z) // the watcher reports how much it holds after each change
		time.Sleep(time.Minute)
		synctest.Wait()
		var deletes []string
		for _, c := range rec.snapshot() {
			if c.req.Type == opkit.Deleted {
				deletes = append(deletes, c.req.Sources.String()+" rv "+c.req.Object.ResourceVersion)
			}
		}
		if n := wm.get(); n != 1 || !slices.Equal(deletes, []string{"APIServer|Operator rv 3"}) {
			t.Errorf("watcher holds %d, deletes reconciled %q; want 1 (z) and the watch's delete (rv 3) once", n, deletes)
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

// submitDeleted submits a teardown (a Deleted trigger) of widget ns/a, due
// in ten seconds, with reason "pipeline".
func submitDeleted(t *testing.T, e *env) {
	t.Helper()
	req := trigger.Request[*Widget]{Object: widget("a"), Type: opkit.Deleted, Source: opkit.Operator, Reason: "pipeline", Delay: 10 * time.Second}
	if o, err := e.ctrl.Trigger().Submit(context.Background(), req); err != nil || !o.Accepted() {
		t.Fatalf("Submit = %v, %v", o, err)
	}
}

// A teardown of an object that is gone, whose delete the watch never
// delivered, is a Deleted reconcile of the newest state known: the
// object the trigger carried.
func TestControllerATeardownOfAGoneObjectReconcilesTheTriggersObject(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		rec := &recorder{}
		e := start(t, rec, nil)
		synctest.Wait()
		obj := widget("a", func(w *Widget) { w.Spec.Size = 4 })
		if ok, err := e.ctrl.Trigger().Enqueue(context.Background(), obj, opkit.Deleted, opkit.Operator, 0, 0); !ok || err != nil {
			t.Fatalf("Enqueue = %v, %v", ok, err)
		}
		synctest.Wait()
		calls := rec.snapshot()
		if len(calls) != 1 || calls[0].req.Type != opkit.Deleted || calls[0].req.Object != obj || calls[0].req.FinalStateUnknown {
			t.Fatalf("calls %+v; want one Deleted reconcile of the trigger's object", calls)
		}
	})
}

// A delete that fails waits for its retry without holding up the new
// object of the name, and the new object's failures do not hold up the
// delete: each turn reconciles the unsettled delete first, then the live
// object, and the turn goes on past a failure.
func TestControllerAFailingDeleteAndAFailingNewObjectDoNotHoldEachOtherUp(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		var deleteFails, liveFails atomic.Bool
		deleteFails.Store(true)
		rec := &recorder{do: func(_ context.Context, _ int, req reconcile.Request[*Widget]) (reconcile.Result, error) {
			if req.Type == opkit.Deleted && deleteFails.Load() || req.Type != opkit.Deleted && req.Object.UID == "uid-new" && liveFails.Load() {
				return reconcile.Done(), errors.New("down")
			}
			return reconcile.Done(), nil
		}}
		e, fw := startWithFakeWatch(t, rec, nil, widget("a"))
		synctest.Wait()
		old, _ := typed.ToUnstructured(widget("a", func(w *Widget) { w.ResourceVersion = "2" }))
		fw.Delete(old)
		synctest.Wait() // the delete fails and waits 1s for its retry
		recreated, _ := typed.ToUnstructured(widget("a", func(w *Widget) { w.UID, w.ResourceVersion = "uid-new", "3" }))
		if err := e.dyn.Tracker().Update(widgets.GroupVersionResource, recreated, "ns"); err != nil {
			t.Fatal(err)
		}
		fw.Add(recreated)
		synctest.Wait() // taken at once: the delete again, then the new object
		got := summarize(rec.snapshot())
		if want := []string{"APIServer Added", "APIServer Deleted", "APIServer Deleted", "APIServer Added"}; !slices.Equal(got, want) {
			t.Fatalf("reconciles %q, want %q", got, want)
		}
		// Now the new object fails and the delete succeeds: the delete is
		// settled on the next turn, and only the new object is retried.
		liveFails.Store(true)
		deleteFails.Store(false)
		time.Sleep(2 * time.Second)
		synctest.Wait()
		liveFails.Store(false)
		time.Sleep(time.Minute)
		synctest.Wait()
		calls := rec.snapshot()[4:]
		got = summarize(calls)
		if want := []string{"none Deleted", "none Modified", "none Modified"}; !slices.Equal(got, want) {
			t.Fatalf("reconciles after the swap %q, want %q: the delete settled once, the new object retried until it succeeds", got, want)
		}
		if calls[1].err == nil || calls[2].err != nil {
			t.Fatalf("the new object's reconciles returned %v, %v; want a failure, then a success", calls[1].err, calls[2].err)
		}
		if calls[2].req.Object.UID != "uid-new" {
			t.Fatalf("last reconcile %+v, want the new object's", calls[2].req)
		}
	})
}

// An object recreated under its name before its delete's turn: one turn
// reconciles the old object's delete, with its final state, then the new
// object.
func TestControllerATurnReconcilesTheOldObjectsDeleteBeforeTheNewObject(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		gate := make(chan struct{})
		rec := &recorder{do: func(_ context.Context, n int, _ reconcile.Request[*Widget]) (reconcile.Result, error) {
			if n == 0 {
				<-gate // the first reconcile holds the key while both events arrive
			}
			return reconcile.Done(), nil
		}}
		e, fw := startWithFakeWatch(t, rec, nil, widget("a"))
		synctest.Wait()
		final, _ := typed.ToUnstructured(widget("a", func(w *Widget) { w.ResourceVersion, w.Spec.Size = "2", 8 }))
		fw.Delete(final)
		recreated, _ := typed.ToUnstructured(widget("a", func(w *Widget) { w.UID, w.ResourceVersion = "uid-new", "3" }))
		if err := e.dyn.Tracker().Update(widgets.GroupVersionResource, recreated, "ns"); err != nil {
			t.Fatal(err)
		}
		fw.Add(recreated)
		synctest.Wait()
		close(gate)
		synctest.Wait()
		calls := rec.snapshot()
		got := summarize(calls)
		if want := []string{"APIServer Added", "APIServer Deleted", "APIServer Added"}; !slices.Equal(got, want) {
			t.Fatalf("reconciles %q, want %q", got, want)
		}
		if calls[1].req.Object.UID != "uid-a" || calls[1].req.Object.Spec.Size != 8 || calls[2].req.Object.UID != "uid-new" {
			t.Fatalf("the delete carried %s size %d, the live reconcile %s; want uid-a's final state (size 8), then uid-new",
				calls[1].req.Object.UID, calls[1].req.Object.Spec.Size, calls[2].req.Object.UID)
		}
	})
}

// An object that leaves the label selector and comes back before its
// turn was not deleted: the turn reconciles it live, and no delete.
func TestControllerASelectorFlapBeforeTheTurnIsNoDelete(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		gate := make(chan struct{})
		rec := &recorder{do: func(_ context.Context, n int, _ reconcile.Request[*Widget]) (reconcile.Result, error) {
			if n == 0 {
				<-gate
			}
			return reconcile.Done(), nil
		}}
		_, fw := startWithFakeWatch(t, rec, nil, widget("a"))
		synctest.Wait()
		left, _ := typed.ToUnstructured(widget("a", func(w *Widget) { w.ResourceVersion = "2" }))
		fw.Delete(left)
		back, _ := typed.ToUnstructured(widget("a", func(w *Widget) { w.ResourceVersion = "3" }))
		fw.Add(back)
		synctest.Wait()
		close(gate)
		synctest.Wait()
		if got, want := summarize(rec.snapshot()), []string{"APIServer Added", "APIServer Added"}; !slices.Equal(got, want) {
			t.Fatalf("reconciles %q, want %q", got, want)
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
