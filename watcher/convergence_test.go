package watcher_test

import (
	"context"
	"errors"
	"fmt"
	"net"
	"os"
	"slices"
	"sync"
	"syscall"
	"testing"
	"testing/synctest"
	"time"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime"
	k8stesting "k8s.io/client-go/testing"

	"github.com/opkit/opkit"
	"github.com/opkit/opkit/queue"
	"github.com/opkit/opkit/watcher"
)

// observed sets status.observedGeneration; without sets none.
func observed(g int64) func(*unstructured.Unstructured) {
	return func(u *unstructured.Unstructured) { u.Object["status"] = map[string]any{"observedGeneration": g} }
}

func withoutStatus(u *unstructured.Unstructured) { delete(u.Object, "status") }

// A term's first list queues what needs work ahead of what is up to date:
// an object whose status.observedGeneration lags behind its generation
// (or is absent) at the watch's priority, more the longer it lags (at
// most MaxRank), an up-to-date one at the list priority.
func TestAListQueuesWhatNeedsWorkFirstTheLongestWaitingFirst(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		c := newFake(
			widget("ns", "current", "u1", "1", 3),                // observedGeneration 3 of 3
			widget("ns", "fresh", "u2", "2", 1, withoutStatus),   // never reconciled
			widget("ns", "behind", "u3", "3", 4, observed(3)),    // one generation behind
			widget("ns", "starved", "u4", "4", 7, observed(3)),   // four behind
			widget("ns", "ancient", "u5", "5", 100, observed(1)), // capped at MaxRank
			widget("ns", "ahead", "u6", "6", 2, observed(5)),     // observed beyond (a restore): up to date
			widget("ns", "nogen", "u7", "7", 0, withoutStatus),   // a resource without generations
		)
		q := &recorder{}
		stop := start(t, mustNew(t, config(c, q)))
		defer stop()
		synctest.Wait()
		sameRecords(t, "initial list", byKey(q.take()), []record{
			{Key: key("ahead"), Type: opkit.Added, RV: "6", UID: "u6", Priority: -1},
			{Key: key("ancient"), Type: opkit.Added, RV: "5", UID: "u5", Priority: watcher.MaxRank - 1},
			{Key: key("behind"), Type: opkit.Added, RV: "3", UID: "u3", Priority: 0},
			{Key: key("current"), Type: opkit.Added, RV: "1", UID: "u1", Priority: -1},
			{Key: key("fresh"), Type: opkit.Added, RV: "2", UID: "u2", Priority: 0},
			{Key: key("nogen"), Type: opkit.Added, RV: "7", UID: "u7", Priority: -1},
			{Key: key("starved"), Type: opkit.Added, RV: "4", UID: "u4", Priority: 3},
		})

		// A watch event is work: at the watch's priority, raised by how
		// long the object has waited.
		res := c.Resource(widgets.GroupVersionResource).Namespace("ns")
		mustDo(t)(res.Update(ctx, widget("ns", "current", "u1", "8", 4, observed(3)), metav1.UpdateOptions{}))
		mustDo(t)(res.Update(ctx, widget("ns", "starved", "u4", "9", 8, observed(3)), metav1.UpdateOptions{}))
		synctest.Wait()
		sameRecords(t, "watch events", q.take(), []record{
			{Key: key("current"), Type: opkit.Modified, RV: "8", UID: "u1", Priority: 0},
			{Key: key("starved"), Type: opkit.Modified, RV: "9", UID: "u4", Priority: 4},
		})
	})
}

// Config.Rank replaces the convention; its answer is kept within
// [0, MaxRank].
func TestRankIsTheUsersToChoose(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		c := newFake(widget("ns", "a", "ua", "1", 1, withoutStatus), widget("ns", "b", "ub", "2", 1), widget("ns", "c", "uc", "3", 1))
		q := &recorder{}
		cfg := config(c, q)
		cfg.ListPriority = new(-5)
		cfg.Priority = 10
		cfg.Rank = func(w *Widget) int {
			return map[string]int{"a": 0, "b": 3, "c": 99}[w.Name]
		}
		stop := start(t, mustNew(t, cfg))
		defer stop()
		synctest.Wait()
		sameRecords(t, "initial list", byKey(q.take()), []record{
			{Key: key("a"), Type: opkit.Added, RV: "1", UID: "ua", Priority: -5},
			{Key: key("b"), Type: opkit.Added, RV: "2", UID: "ub", Priority: 12},
			{Key: key("c"), Type: opkit.Added, RV: "3", UID: "uc", Priority: 10 + watcher.MaxRank - 1},
		})
	})
}

// The operator's own finalizer going on is its own write, not a change
// worth a reconcile: it only refreshes a waiting entry. Taken off by
// someone else while the object is not being deleted, it is a change.
func TestTheOperatorsOwnFinalizerAddedIsNoChange(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		c := newFake(widget("ns", "a", "ua", "1", 1))
		q := &recorder{}
		cfg := config(c, q)
		cfg.SkipStatusOnly = true
		cfg.OwnFinalizers = []string{"opkit.dev/cleanup"}
		stop := start(t, mustNew(t, cfg))
		defer stop()
		synctest.Wait()
		q.take()

		fins := func(deleting bool, fs ...any) func(*unstructured.Unstructured) {
			return func(u *unstructured.Unstructured) {
				md := u.Object["metadata"].(map[string]any)
				md["finalizers"] = fs
				if deleting {
					md["deletionTimestamp"] = "2026-01-01T00:00:00Z"
				}
			}
		}
		res := c.Resource(widgets.GroupVersionResource).Namespace("ns")
		for _, u := range []*unstructured.Unstructured{
			widget("ns", "a", "ua", "2", 1, fins(false, "opkit.dev/cleanup")),                   // ours, added: refresh
			widget("ns", "a", "ua", "3", 1, fins(false, "opkit.dev/cleanup", "other.dev/keep")), // another's: change
			widget("ns", "a", "ua", "4", 1, fins(false, "other.dev/keep")),                      // ours taken off: change
			widget("ns", "a", "ua", "5", 1, fins(false, "other.dev/keep", "opkit.dev/cleanup")), // ours back: refresh
			widget("ns", "a", "ua", "6", 1, fins(true, "other.dev/keep", "opkit.dev/cleanup")),  // deleting: change
			widget("ns", "a", "ua", "7", 1, fins(true, "other.dev/keep")),                       // ours removed while deleting: refresh
		} {
			mustDo(t)(res.Update(ctx, u, metav1.UpdateOptions{}))
		}
		synctest.Wait()
		sameRecords(t, "finalizer changes", q.take(), []record{
			{Key: key("a"), RV: "2", Refresh: true},
			{Key: key("a"), Type: opkit.Modified, RV: "3", UID: "ua"},
			{Key: key("a"), Type: opkit.Modified, RV: "4", UID: "ua"},
			{Key: key("a"), RV: "5", Refresh: true},
			{Key: key("a"), Type: opkit.Modified, RV: "6", UID: "ua"},
			{Key: key("a"), RV: "7", Refresh: true},
		})
	})
}

// refused is the error a dial to a stopped API server returns.
var refused = &net.OpError{Op: "dial", Net: "tcp", Err: os.NewSyscallError("connect", syscall.ECONNREFUSED)}

// While the API server refuses connections the watcher tries again at most
// Backoff.Transient apart, whatever the failure count: it is back about
// a second after the server is.
func TestAnUnreachableAPIServerIsRetriedAtLeastEverySecond(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		c := newFake(widget("ns", "a", "ua", "1", 1))
		m := newMetrics()
		attempts := listErrors(c, func(i int) error {
			if i <= 20 {
				return refused
			}
			return nil
		})
		cfg := config(c, &recorder{})
		cfg.Metrics = m
		w := mustNew(t, cfg)
		stop := start(t, w)
		defer stop()
		time.Sleep(time.Minute)
		synctest.Wait()
		if !w.Synced() || len(attempts()) != 21 {
			t.Fatalf("synced=%v after %d attempts, want synced after 21", w.Synced(), len(attempts()))
		}
		for i, g := range gaps(attempts()) {
			if g > watcher.DefaultBackoffTransient {
				t.Errorf("wait before attempt %d = %v, want at most %v", i+2, g, watcher.DefaultBackoffTransient)
			}
		}
		if n := m.get(func(m *metrics) int { return m.errors[watcher.ReasonUnreachable] }); n != 20 {
			t.Errorf("errors = %v, want 20 %q", m.errors, watcher.ReasonUnreachable)
		}
	})
}

// A list that succeeds forgets the failures before it: the next failure
// waits the first delay again, not the one the count had reached.
func TestASuccessfulListResetsTheBackoff(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		c := newFake(widget("ns", "a", "ua", "1", 1))
		boom := apierrors.NewInternalError(errors.New("boom"))
		attempts := listErrors(c, func(i int) error {
			if i <= 6 || i == 8 {
				return boom // six failures, a list that works, a failure
			}
			return nil
		})
		ws := &watches{}
		ws.install(c)
		cfg := config(c, &recorder{})
		// A watch open for Reset forgets failures too: not in this test.
		cfg.Backoff = watcher.Backoff{Base: time.Second, Cap: time.Minute, Reset: time.Hour}
		w := mustNew(t, cfg)
		stop := start(t, w)
		defer stop()
		time.Sleep(2 * time.Minute)
		synctest.Wait()
		ws.last(t).Error(expired) // a relist: the eighth list fails
		time.Sleep(time.Minute)
		synctest.Wait()
		at := attempts()
		if len(at) != 9 || !w.Synced() {
			t.Fatalf("%d lists, synced=%v; want 9 and synced", len(at), w.Synced())
		}
		if g := at[8].Sub(at[7]); g > time.Second {
			t.Errorf("the retry after the failure that followed a good list waited %v, want the first delay (at most 1s)", g)
		}
	})
}

// WaitSynced returns once the Run's first list is queued, and after the
// Run ends waits for the next Run's.
func TestWaitSyncedWaitsForTheFirstListOfTheRun(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		c := newFake(widget("ns", "a", "ua", "1", 1))
		release := make(chan struct{})
		c.PrependReactor("list", "widgets", func(k8stesting.Action) (bool, runtime.Object, error) {
			<-release
			return false, nil, nil
		})
		q := &recorder{}
		w := mustNew(t, config(c, q))
		waited := make(chan error, 1)
		go func() { waited <- w.WaitSynced(context.Background()) }()
		stop := start(t, w)
		synctest.Wait()
		select {
		case err := <-waited:
			t.Fatalf("WaitSynced returned %v before the first list", err)
		default:
		}
		release <- struct{}{}
		synctest.Wait()
		if err := <-waited; err != nil || len(q.take()) != 1 {
			t.Fatalf("WaitSynced = %v with %d entries queued; want nil once the list is queued", err, len(q.take()))
		}
		stop()
		ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
		defer cancel()
		if err := w.WaitSynced(ctx); !errors.Is(err, context.DeadlineExceeded) {
			t.Fatalf("WaitSynced after Run ended = %v, want to wait for the next Run (deadline exceeded)", err)
		}
		close(release)
		stop = start(t, w)
		defer stop()
		if err := w.WaitSynced(context.Background()); err != nil {
			t.Fatalf("WaitSynced in the next Run = %v", err)
		}
	})
}

// A durable trigger through the API server: while the request annotation
// differs from status.lastHandledReconcileAt, the object's entries carry
// source Operator, the request as reason, at the trigger priority; a
// status write that records it handled refreshes only, and other changes
// do not look like a request.
func TestTheRequestAnnotationIsADurableTrigger(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		const ann = watcher.DefaultRequestAnnotation
		annotated := func(at, handled string) func(*unstructured.Unstructured) {
			return func(u *unstructured.Unstructured) {
				if at != "" {
					u.SetAnnotations(map[string]string{ann: at})
				}
				st := u.Object["status"].(map[string]any)
				if handled != "" {
					st["lastHandledReconcileAt"] = handled
				}
			}
		}
		c := newFake(widget("ns", "a", "ua", "1", 1, annotated("t1", "")))
		adds := &causes{}
		cfg := watcher.Config[*Widget]{Client: c, Resource: widgets, Queue: adds, Logger: discard,
			SkipStatusOnly: true, RequestAnnotation: ann, TriggerPriority: 100}
		stop := start(t, mustNew(t, cfg))
		defer stop()
		synctest.Wait()
		res := c.Resource(widgets.GroupVersionResource).Namespace("ns")
		for _, u := range []*unstructured.Unstructured{
			widget("ns", "a", "ua", "2", 1, annotated("t1", "t1")), // handled: a status write, refresh only
			widget("ns", "a", "ua", "3", 1, annotated("t1", "t1"), func(u *unstructured.Unstructured) {
				u.SetLabels(map[string]string{"x": "y"}) // some other metadata change: no request
			}),
			widget("ns", "a", "ua", "4", 1, annotated("t2", "t1")), // a new request
		} {
			mustDo(t)(res.Update(ctx, u, metav1.UpdateOptions{}))
		}
		synctest.Wait()
		want := []string{
			"a rv=1 APIServer|Operator [requestedAt t1] prio=100", // the list found a pending request
			"a rv=2 refresh",
			"a rv=3 refresh", // a label no one watches: not a change, and not a request
			"a rv=4 APIServer|Operator [requestedAt t2] prio=100",
		}
		if got := adds.take(); !slices.Equal(got, want) {
			t.Fatalf("adds:\n got  %q\n want %q", got, want)
		}
	})
}

// causes is a fake queue that describes every add's cause.
type causes struct {
	mu  sync.Mutex
	got []string
}

func (c *causes) Add(key opkit.Key, cause opkit.Cause[*Widget], opts queue.AddOptions) queue.Outcome {
	c.mu.Lock()
	defer c.mu.Unlock()
	s := fmt.Sprintf("%s rv=%s", key.Name, cause.Object.ResourceVersion)
	if opts.MergeOnly {
		s += " refresh"
	} else {
		s += fmt.Sprintf(" %s %v prio=%d", cause.Sources, cause.Reasons, opts.Priority)
	}
	c.got = append(c.got, s)
	return queue.Queued
}

func (c *causes) take() []string {
	c.mu.Lock()
	defer c.mu.Unlock()
	out := c.got
	c.got = nil
	return out
}
