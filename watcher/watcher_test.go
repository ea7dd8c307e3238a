package watcher_test

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"slices"
	"strings"
	"sync"
	"testing"
	"testing/synctest"
	"time"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/watch"
	k8stesting "k8s.io/client-go/testing"

	"github.com/opkit/opkit"
	"github.com/opkit/opkit/internal/logsink"
	"github.com/opkit/opkit/queue"
	"github.com/opkit/opkit/watcher"
)

var ctx = context.Background()

// byKey sorts records by key, keeping the order of records of one key.
func byKey(rs []record) []record {
	slices.SortStableFunc(rs, func(a, b record) int { return strings.Compare(a.Key.String(), b.Key.String()) })
	return rs
}

// mustNew builds a watcher; a recorder queue gets to read its ledger.
func mustNew(t *testing.T, cfg watcher.Config[*Widget]) *watcher.Watcher[*Widget] {
	t.Helper()
	w, err := watcher.New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	if r, ok := cfg.Queue.(*recorder); ok {
		r.mu.Lock()
		r.w = w
		r.mu.Unlock()
	}
	return w
}

type syncLog struct {
	mu sync.Mutex
	ev []watcher.SyncEvent
}

func (s *syncLog) add(e watcher.SyncEvent) { s.mu.Lock(); s.ev = append(s.ev, e); s.mu.Unlock() }
func (s *syncLog) take() []watcher.SyncEvent {
	s.mu.Lock()
	defer s.mu.Unlock()
	out := s.ev
	s.ev = nil
	return out
}

func TestNewRejectsInvalidConfig(t *testing.T) {
	c := newFake()
	q := &recorder{}
	cluster := widgets
	cluster.Namespaced = false
	for _, tc := range []struct {
		name string
		edit func(*watcher.Config[*Widget])
		want string
	}{
		{"no client", func(c *watcher.Config[*Widget]) { c.Client = nil }, "Client is nil"},
		{"no queue", func(c *watcher.Config[*Widget]) { c.Queue = nil }, "Queue is nil"},
		{"no kind", func(c *watcher.Config[*Widget]) { c.Resource.Kind = "" }, "no kind"},
		{"namespace on cluster-scoped", func(c *watcher.Config[*Widget]) { c.Resource = cluster; c.Namespace = "ns" }, "cluster-scoped"},
		{"negative page size", func(c *watcher.Config[*Widget]) { c.PageSize = -1 }, "PageSize"},
		{"negative idle", func(c *watcher.Config[*Widget]) { c.IdleTimeout = -time.Second }, "IdleTimeout"},
		{"base above cap", func(c *watcher.Config[*Widget]) { c.Backoff = watcher.Backoff{Base: time.Minute, Cap: time.Second} }, "exceeds"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			cfg := config(c, q)
			tc.edit(&cfg)
			_, err := watcher.New(cfg)
			if !errors.Is(err, watcher.ErrInvalidConfig) || !strings.Contains(err.Error(), tc.want) {
				t.Fatalf("New: got %v, want ErrInvalidConfig mentioning %q", err, tc.want)
			}
		})
	}
	if _, err := watcher.New(config(c, q)); err != nil {
		t.Fatalf("valid config rejected: %v", err)
	}
}

func TestInitialListEmitsEveryObjectAsAddedThenWatchEventsFollow(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		c := abFake()
		q := &recorder{}
		syncs := &syncLog{}
		cfg := config(c, q)
		cfg.OnSync = syncs.add
		w := mustNew(t, cfg)
		if err := w.Check(); !errors.Is(err, watcher.ErrNotRunning) {
			t.Fatalf("Check before Run = %v, want ErrNotRunning", err)
		}
		stop := start(t, w)
		defer stop()
		synctest.Wait()

		sameRecords(t, "initial list", byKey(q.take()), []record{
			{Key: key("a"), Type: opkit.Added, RV: "1", UID: "ua", Priority: -1},
			{Key: key("b"), Type: opkit.Added, RV: "2", UID: "ub", Priority: -1},
		})
		if !w.Synced() || w.Check() != nil {
			t.Fatalf("after list: Synced=%v Check=%v, want true, nil", w.Synced(), w.Check())
		}
		ev := syncs.take()
		if len(ev) != 2 || ev[0].Phase != watcher.SyncStarted || !ev[0].Initial ||
			ev[1].Phase != watcher.SyncFinished || ev[1].Added != 2 || ev[1].Reason != watcher.ReasonInitial {
			t.Fatalf("sync events = %+v, want Started then Finished with 2 added", ev)
		}

		res := c.Resource(widgets.GroupVersionResource).Namespace("ns")
		mustDo(t)(res.Create(ctx, widget("ns", "c", "uc", "3", 1), metav1.CreateOptions{}))
		mustDo(t)(res.Update(ctx, widget("ns", "a", "ua", "4", 2), metav1.UpdateOptions{}))
		mustDo(t)(res.Update(ctx, widget("ns", "b", "ub", "2", 1), metav1.UpdateOptions{})) // same resourceVersion: a replay
		if err := res.Delete(ctx, "a", metav1.DeleteOptions{}); err != nil {
			t.Fatal(err)
		}
		synctest.Wait()
		sameRecords(t, "watch events", q.take(), []record{
			{Key: key("c"), Type: opkit.Added, RV: "3", UID: "uc"},
			{Key: key("a"), Type: opkit.Modified, RV: "4", UID: "ua"},
			{Key: key("a"), Type: opkit.Deleted, RV: "4", UID: "ua"},
		})
	})
}

func mustDo(t *testing.T) func(*unstructured.Unstructured, error) {
	return func(_ *unstructured.Unstructured, err error) {
		t.Helper()
		if err != nil {
			t.Fatal(err)
		}
	}
}

var expired = &metav1.Status{Status: metav1.StatusFailure, Code: 410, Reason: metav1.StatusReasonExpired, Message: "too old resource version"}

func TestRelistAfterExpiredEmitsOnlyTheDifferences(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		c := newFake(widget("ns", "a", "ua", "1", 1), widget("ns", "b", "ub", "2", 1),
			widget("ns", "d", "ud", "3", 1), widget("ns", "e", "ue", "4", 1))
		ws := &watches{}
		ws.install(c)
		lists := countLists(c)
		q := &recorder{}
		m := newMetrics()
		syncs := &syncLog{}
		cfg := config(c, q)
		cfg.Metrics = m
		cfg.OnSync = syncs.add
		stop := start(t, mustNew(t, cfg))
		defer stop()
		synctest.Wait()
		if n := len(q.take()); n != 4 {
			t.Fatalf("initial list emitted %d entries, want 4", n)
		}
		syncs.take()

		// The store changes while the watch is not looking.
		tr := c.Tracker()
		gvr := widgets.GroupVersionResource
		must(t, tr.Update(gvr, widget("ns", "a", "ua", "10", 2), "ns"))  // changed
		must(t, tr.Delete(gvr, "ns", "b"))                               // vanished
		must(t, tr.Delete(gvr, "ns", "e"))                               // recreated...
		must(t, tr.Create(gvr, widget("ns", "e", "ue2", "11", 1), "ns")) // ...with a new UID
		must(t, tr.Create(gvr, widget("ns", "f", "uf", "12", 1), "ns"))  // new
		ws.last(t).Error(expired)
		synctest.Wait()

		sameRecords(t, "relist", byKey(q.take()), []record{
			{Key: key("a"), Type: opkit.Modified, RV: "10", UID: "ua", Priority: -1},
			{Key: key("b"), Type: opkit.Deleted, RV: "2", UID: "ub", Final: true, Priority: 0},
			{Key: key("e"), Type: opkit.Deleted, RV: "4", UID: "ue", Final: true, Priority: 0},
			{Key: key("e"), Type: opkit.Added, RV: "11", UID: "ue2", Priority: -1},
			{Key: key("f"), Type: opkit.Added, RV: "12", UID: "uf", Priority: -1},
		})
		if lists() != 2 || m.get(func(m *metrics) int { return m.relists[watcher.ReasonExpired] }) != 1 {
			t.Fatalf("lists=%d relists(expired)=%d, want 2 and 1", lists(), m.relists[watcher.ReasonExpired])
		}
		ev := syncs.take()
		if len(ev) != 2 || ev[1].Initial || ev[1].Reason != watcher.ReasonExpired ||
			ev[1].Added != 2 || ev[1].Modified != 1 || ev[1].Deleted != 2 || ev[1].Unchanged != 1 {
			t.Fatalf("relist sync events = %+v", ev)
		}
		if got := m.get(func(m *metrics) int { return m.tracked }); got != 6 {
			t.Fatalf("tracked = %d, want 6 (a d e f, and the unsettled deletes of b and e)", got)
		}
		if rvs := ws.rvs(); len(rvs) != 2 || rvs[1] == rvs[0] {
			t.Fatalf("watch resourceVersions = %v, want a second watch from the relist's", rvs)
		}
	})
}

func must(t *testing.T, err error) {
	t.Helper()
	if err != nil {
		t.Fatal(err)
	}
}

func bookmark(rv string, annotations map[string]string) *unstructured.Unstructured {
	u := &unstructured.Unstructured{Object: map[string]any{"apiVersion": "test.opkit.dev/v1", "kind": "Widget"}}
	u.SetResourceVersion(rv)
	if annotations != nil {
		u.SetAnnotations(annotations)
	}
	return u
}

func TestClosedWatchResumesFromTheLastResourceVersionWithoutRelist(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		c := newFake(widget("ns", "a", "ua", "1", 1))
		ws := &watches{}
		ws.install(c)
		lists := countLists(c)
		q := &recorder{}
		stop := start(t, mustNew(t, config(c, q)))
		defer stop()
		synctest.Wait()
		q.take()

		fw := ws.last(t)
		fw.Add(widget("ns", "c", "uc", "7", 1))
		fw.Modify(widget("ns", "a", "ua", "8", 2))
		fw.Action(watch.Bookmark, bookmark("9", nil))
		time.Sleep(2 * time.Minute) // a healthy, long-lived watch...
		fw.Stop()                   // ...that the server ends
		synctest.Wait()

		// Reopened at once (no backoff after a healthy watch), from the
		// bookmark's resourceVersion, with no relist.
		rvs := ws.rvs()
		if len(rvs) != 2 || rvs[1] != "9" || lists() != 1 {
			t.Fatalf("watch RVs = %v, lists = %d; want a second watch from 9 and 1 list", rvs, lists())
		}
		sameRecords(t, "events", q.take(), []record{
			{Key: key("c"), Type: opkit.Added, RV: "7", UID: "uc"},
			{Key: key("a"), Type: opkit.Modified, RV: "8", UID: "ua"},
		})

		// A watch the server closes at once is reopened only after a backoff.
		ws.last(t).Stop()
		synctest.Wait()
		if n := len(ws.rvs()); n != 2 {
			t.Fatalf("reopened a short-lived watch without backoff (%d watches)", n)
		}
		time.Sleep(watcher.DefaultBackoffBase)
		synctest.Wait()
		if rvs := ws.rvs(); len(rvs) != 3 || rvs[2] != "9" {
			t.Fatalf("watch RVs = %v, want a third watch from 9 after the backoff", rvs)
		}
	})
}

func TestWatchErrorEventBacksOffAndResumes(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		c := newFake(widget("ns", "a", "ua", "1", 1))
		ws := &watches{}
		ws.install(c)
		lists := countLists(c)
		q := &recorder{}
		m := newMetrics()
		cfg := config(c, q)
		cfg.Metrics = m
		w := mustNew(t, cfg)
		stop := start(t, w)
		defer stop()
		synctest.Wait()
		ws.last(t).Action(watch.Bookmark, bookmark("5", nil))
		ws.last(t).Error(&metav1.Status{Status: metav1.StatusFailure, Code: 500, Reason: metav1.StatusReasonInternalError, Message: "etcd hiccup"})
		synctest.Wait()
		if err := w.Check(); !errors.Is(err, watcher.ErrDisconnected) || !apierrors.IsInternalError(err) {
			t.Fatalf("Check = %v, want ErrDisconnected wrapping the 500", err)
		}
		time.Sleep(watcher.DefaultBackoffBase)
		synctest.Wait()
		if rvs := ws.rvs(); len(rvs) != 2 || rvs[1] != "5" || lists() != 1 {
			t.Fatalf("watch RVs = %v, lists = %d; want a resume from 5 and no relist", rvs, lists())
		}
		if err := w.Check(); err != nil {
			t.Fatalf("Check after reconnect = %v", err)
		}
		if m.get(func(m *metrics) int { return m.errors[watcher.ReasonError] }) != 1 {
			t.Fatalf("errors = %v, want one %q", m.errors, watcher.ReasonError)
		}
	})
}

func TestWatchRequestRefusedWith410Relists(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		c := newFake(widget("ns", "a", "ua", "1", 1))
		ws := &watches{err: func(n int, _ metav1.ListOptions) error {
			if n == 1 {
				return apierrors.NewResourceExpired("too old resource version")
			}
			return nil
		}}
		ws.install(c)
		lists := countLists(c)
		q := &recorder{}
		stop := start(t, mustNew(t, config(c, q)))
		defer stop()
		synctest.Wait()
		if lists() != 2 || len(ws.rvs()) != 2 {
			t.Fatalf("lists = %d, watches = %d; want a relist then a second watch", lists(), len(ws.rvs()))
		}
		// The relist found nothing new: only the initial Added.
		sameRecords(t, "entries", q.take(), []record{{Key: key("a"), Type: opkit.Added, RV: "1", UID: "ua", Priority: -1}})
	})
}

func TestIdleWatchIsRestarted(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		c := newFake()
		ws := &watches{}
		ws.install(c)
		m := newMetrics()
		cfg := config(c, &recorder{})
		cfg.Metrics = m
		stop := start(t, mustNew(t, cfg))
		defer stop()
		synctest.Wait()
		first := ws.last(t)

		// A bookmark proves the watch alive and resets the idle timer.
		time.Sleep(watcher.DefaultIdleTimeout - time.Minute)
		first.Action(watch.Bookmark, bookmark("42", nil))
		time.Sleep(watcher.DefaultIdleTimeout - time.Second)
		synctest.Wait()
		if n := len(ws.rvs()); n != 1 {
			t.Fatalf("%d watches after a bookmark kept the first alive, want 1", n)
		}
		time.Sleep(2 * time.Second)
		synctest.Wait()
		rvs := ws.rvs()
		if len(rvs) != 2 || rvs[1] != "42" || !first.IsStopped() {
			t.Fatalf("watch RVs = %v, first stopped = %v; want a restart from 42 and the stalled watch stopped", rvs, first.IsStopped())
		}
		if m.get(func(m *metrics) int { return m.restarts[watcher.ReasonIdle] }) != 1 {
			t.Fatalf("restarts = %v, want one idle", m.restarts)
		}
	})
}

// listErrors makes the first n lists fail with err(i) and records when
// every list was attempted.
func listErrors(c interface {
	PrependReactor(string, string, k8stesting.ReactionFunc)
}, fail func(i int) error) func() []time.Time {
	var mu sync.Mutex
	var at []time.Time
	c.PrependReactor("list", "widgets", func(k8stesting.Action) (bool, runtime.Object, error) {
		mu.Lock()
		defer mu.Unlock()
		at = append(at, time.Now())
		if err := fail(len(at)); err != nil {
			return true, nil, err
		}
		return false, nil, nil
	})
	return func() []time.Time { mu.Lock(); defer mu.Unlock(); return slices.Clone(at) }
}

func gaps(at []time.Time) []time.Duration {
	var out []time.Duration
	for i := 1; i < len(at); i++ {
		out = append(out, at[i].Sub(at[i-1]))
	}
	return out
}

func TestTransientErrorsBackOffExponentiallyWithJitterUpToTheCap(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		c := newFake(widget("ns", "a", "ua", "1", 1))
		const failures = 7
		attempts := listErrors(c, func(i int) error {
			if i <= failures {
				return apierrors.NewInternalError(errors.New("boom"))
			}
			return nil
		})
		q := &recorder{}
		cfg := config(c, q)
		cfg.Backoff = watcher.Backoff{Base: time.Second, Cap: 8 * time.Second, Transient: 8 * time.Second}
		w := mustNew(t, cfg)
		stop := start(t, w)
		defer stop()
		time.Sleep(time.Minute)
		synctest.Wait()
		at := attempts()
		if len(at) != failures+1 || !w.Synced() {
			t.Fatalf("%d list attempts, synced=%v; want %d and synced", len(at), w.Synced(), failures+1)
		}
		for i, g := range gaps(at) {
			d := min(time.Second<<i, 8*time.Second)
			if g < d/2 || g > d {
				t.Errorf("wait before attempt %d = %v, want within [%v, %v]", i+2, g, d/2, d)
			}
		}
	})
}

// What an API server's restart answers (refused and reset connections,
// 5xx, 403 while its authorizer syncs) is retried within
// Backoff.Transient (1s) however long it lasts, so the watcher is back
// within a second of the server; an outage longer than Backoff.Stalled
// (10s) is logged once, with its last error, Check says for how long,
// and the end of it is logged.
func TestARestartingAPIServerIsRetriedWithinASecondAndALongOutageLoggedOnce(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		c := newFake(widget("ns", "a", "ua", "1", 1))
		restart := []error{
			errors.New("dial tcp 127.0.0.1:6443: connect: connection refused"),
			errors.New("read tcp 127.0.0.1:40000->127.0.0.1:6443: read: connection reset by peer"),
			apierrors.NewServiceUnavailable("apiserver not ready"),
			apierrors.NewInternalError(errors.New("etcd leader changed")),
		}
		const failures = 30
		attempts := listErrors(c, func(i int) error {
			switch {
			case i > failures:
				return nil
			case i > failures-queue.TransientRefusals: // the authorizer syncs
				return apierrors.NewForbidden(widgets.GroupResource(), "", errors.New(`user "u" cannot list`))
			}
			return restart[i%len(restart)]
		})
		logs := &logsink.Buffer{}
		cfg := config(c, &recorder{})
		cfg.Logger = slog.New(slog.NewTextHandler(logs, nil))
		w := mustNew(t, cfg)
		stop := start(t, w)
		defer stop()
		time.Sleep(12 * time.Second)
		synctest.Wait()
		if err := w.Check(); !errors.Is(err, watcher.ErrDisconnected) || !strings.Contains(err.Error(), "for 1") {
			t.Errorf("Check during the outage = %v, want it disconnected, saying for how long", err)
		}
		time.Sleep(time.Minute)
		synctest.Wait()
		at := attempts()
		if len(at) != failures+1 || !w.Synced() {
			t.Fatalf("%d list attempts, synced=%v; want %d and synced", len(at), w.Synced(), failures+1)
		}
		for i, g := range gaps(at) {
			if g > watcher.DefaultBackoffTransient {
				t.Errorf("wait before attempt %d = %v, want at most %v", i+2, g, watcher.DefaultBackoffTransient)
			}
		}
		l := logs.String()
		if n := strings.Count(l, "have not resumed"); n != 1 || !strings.Contains(l, "resumed after an outage") {
			t.Errorf("logged the stall %d times (want once) and its end %v:\n%s", n, strings.Contains(l, "resumed after an outage"), l)
		}
		if err := w.Check(); err != nil {
			t.Errorf("Check after the outage = %v", err)
		}
	})
}

func TestThrottledListHonoursRetryAfter(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		c := newFake()
		m := newMetrics()
		attempts := listErrors(c, func(i int) error {
			if i <= 2 {
				return apierrors.NewTooManyRequests("slow down", 20)
			}
			return nil
		})
		cfg := config(c, &recorder{})
		cfg.Metrics = m
		stop := start(t, mustNew(t, cfg))
		defer stop()
		time.Sleep(time.Minute)
		synctest.Wait()
		g := gaps(attempts())
		if len(g) != 2 || g[0] < 20*time.Second || g[1] < 20*time.Second {
			t.Fatalf("waits between attempts = %v, want two of at least Retry-After (20s)", g)
		}
		if m.get(func(m *metrics) int { return m.errors[watcher.ReasonThrottled] }) != 2 {
			t.Fatalf("errors = %v, want 2 throttled", m.errors)
		}
	})
}

// A 404 is retried slowly at once; a 401 or 403 after the first
// queue.TransientRefusals in a row, which are retried as fast as any
// transient failure (a just-started API server refuses until its
// authorizer has synced).
func TestForbiddenAndNotFoundAreReportedAndRetriedSlowly(t *testing.T) {
	for _, tc := range []struct {
		name   string
		err    error
		is     func(error) bool
		reason watcher.Reason
		fast   int // retries before the slow ones
	}{
		{"forbidden", apierrors.NewForbidden(widgets.GroupResource(), "", errors.New(`user "u" cannot list`)), apierrors.IsForbidden, watcher.ReasonForbidden, queue.TransientRefusals},
		{"unauthorized", apierrors.NewUnauthorized("token expired"), apierrors.IsUnauthorized, watcher.ReasonForbidden, queue.TransientRefusals},
		{"notfound", apierrors.NewNotFound(widgets.GroupResource(), ""), apierrors.IsNotFound, watcher.ReasonNotFound, 0},
	} {
		t.Run(tc.name, func(t *testing.T) {
			synctest.Test(t, func(t *testing.T) {
				c := newFake(widget("ns", "a", "ua", "1", 1))
				var mu sync.Mutex
				fixed := false
				attempts := listErrors(c, func(int) error {
					mu.Lock()
					defer mu.Unlock()
					if fixed {
						return nil
					}
					return tc.err
				})
				m := newMetrics()
				cfg := config(c, &recorder{})
				cfg.Metrics = m
				w := mustNew(t, cfg)
				stop := start(t, w)
				defer stop()
				synctest.Wait()
				err := w.Check()
				if !errors.Is(err, watcher.ErrNotSynced) || !tc.is(err) || !strings.Contains(err.Error(), "widgets") {
					t.Fatalf("Check = %v, want ErrNotSynced wrapping the %s error, naming the resource", err, tc.name)
				}
				time.Sleep(2 * time.Minute)
				// Slow retries: at least Slow/2 apart, so at most
				// 1 + fast + 120s/15s.
				n := len(attempts())
				if n < 2+tc.fast || n > 9+tc.fast {
					t.Fatalf("%d attempts in 2 minutes, want between %d and %d", n, 2+tc.fast, 9+tc.fast)
				}
				for i, g := range gaps(attempts()) {
					if slow := g >= watcher.DefaultBackoffSlow/2; slow != (i >= tc.fast) {
						t.Fatalf("retry %d after %v: want it slow (at least %v) from retry %d on", i+1, g, watcher.DefaultBackoffSlow/2, tc.fast+1)
					}
				}
				if m.get(func(m *metrics) int { return m.errors[tc.reason] }) != n {
					t.Fatalf("errors = %v, want %d %q", m.errors, n, tc.reason)
				}
				mu.Lock()
				fixed = true
				mu.Unlock()
				time.Sleep(watcher.DefaultBackoffSlow)
				synctest.Wait()
				if err := w.Check(); err != nil || !w.Synced() {
					t.Fatalf("after the grant: Check = %v, Synced = %v", err, w.Synced())
				}
			})
		})
	}
}

func TestSkipStatusOnlyDropsSameGenerationChangesExceptNamedOnes(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		c := newFake(widget("ns", "a", "ua", "1", 1), widget("ns", "cm", "ucm", "2", 0))
		q := &recorder{}
		cfg := config(c, q)
		cfg.SkipStatusOnly = true
		cfg.WatchLabels = []string{"tier"}
		cfg.WatchAnnotations = []string{"note"}
		stop := start(t, mustNew(t, cfg))
		defer stop()
		synctest.Wait()
		q.take()

		res := c.Resource(widgets.GroupVersionResource).Namespace("ns")
		meta := func(f func(m map[string]any)) func(u *unstructured.Unstructured) {
			return func(u *unstructured.Unstructured) { f(u.Object["metadata"].(map[string]any)) }
		}
		steps := []struct {
			u    *unstructured.Unstructured
			emit bool
		}{
			{widget("ns", "a", "ua", "3", 1, func(u *unstructured.Unstructured) { u.Object["status"] = map[string]any{"ready": true} }), false},
			{widget("ns", "a", "ua", "4", 1, meta(func(m map[string]any) { m["labels"] = map[string]any{"tier": "x"} })), true},
			{widget("ns", "a", "ua", "5", 1, meta(func(m map[string]any) { m["labels"] = map[string]any{"tier": "x", "other": "y"} })), false},
			{widget("ns", "a", "ua", "6", 1, meta(func(m map[string]any) { m["annotations"] = map[string]any{"note": "z"} })), true},
			{widget("ns", "a", "ua", "7", 1, meta(func(m map[string]any) {
				m["annotations"] = map[string]any{"note": "z"}
				m["finalizers"] = []any{"f"}
			})), true},
			{widget("ns", "a", "ua", "8", 1, meta(func(m map[string]any) {
				m["annotations"] = map[string]any{"note": "z"}
				m["finalizers"] = []any{"f"}
				m["deletionTimestamp"] = "2026-01-01T00:00:00Z"
			})), true},
			{widget("ns", "a", "ua", "9", 2), true}, // spec change
			{widget("ns", "cm", "ucm", "10", 0, func(u *unstructured.Unstructured) { u.Object["status"] = map[string]any{"ready": true} }), true}, // generation not maintained
		}
		var want []record
		for _, s := range steps {
			mustDo(t)(res.Update(ctx, s.u, metav1.UpdateOptions{}))
			k := opkit.Key{Namespace: "ns", Name: s.u.GetName()}
			if s.emit {
				want = append(want, record{Key: k, Type: opkit.Modified, RV: s.u.GetResourceVersion(), UID: string(s.u.GetUID())})
			} else { // the newer state only refreshes a waiting entry
				want = append(want, record{Key: k, RV: s.u.GetResourceVersion(), Refresh: true})
			}
		}
		synctest.Wait()
		sameRecords(t, "emitted", q.take(), want)
	})
}

// ResourceVersion reports the latest state seen, status-only changes
// included (they are tracked though not emitted), and forgets a deleted
// object.
func TestResourceVersionIsTheLatestSeen(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		c := newFake(widget("ns", "a", "ua", "1", 1))
		cfg := config(c, &recorder{})
		cfg.SkipStatusOnly = true
		w := mustNew(t, cfg)
		key := opkit.Key{Namespace: "ns", Name: "a"}
		if rv, ok := w.ResourceVersion(key); ok {
			t.Fatalf("before any list: %q, true; want nothing tracked", rv)
		}
		stop := start(t, w)
		defer stop()
		synctest.Wait()
		if rv, ok := w.ResourceVersion(key); !ok || rv != "1" {
			t.Fatalf("after the list: %q, %v; want 1", rv, ok)
		}
		res := c.Resource(widgets.GroupVersionResource).Namespace("ns")
		mustDo(t)(res.Update(ctx, widget("ns", "a", "ua", "2", 1, func(u *unstructured.Unstructured) { u.Object["status"] = map[string]any{"ready": true} }), metav1.UpdateOptions{}))
		synctest.Wait()
		if rv, ok := w.ResourceVersion(key); !ok || rv != "2" {
			t.Fatalf("after a status-only change: %q, %v; want 2", rv, ok)
		}
		if err := res.Delete(ctx, "a", metav1.DeleteOptions{}); err != nil {
			t.Fatal(err)
		}
		synctest.Wait()
		if rv, ok := w.ResourceVersion(key); ok {
			t.Fatalf("after the delete: %q, true; want nothing tracked", rv)
		}
	})
}

func TestDroppedAddsAreCountedAndTrackingGoesOn(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		c := abFake()
		q := &recorder{outcome: queue.DroppedSuspended}
		m := newMetrics()
		cfg := config(c, q)
		cfg.Metrics = m
		w := mustNew(t, cfg)
		stop := start(t, w)
		synctest.Wait()
		if got := m.get(func(m *metrics) int { return m.events["Added/DroppedSuspended"] }); got != 2 {
			t.Fatalf("dropped adds counted = %v, want 2 Added/DroppedSuspended", m.events)
		}
		q.take()
		q.setOutcome(0)
		res := c.Resource(widgets.GroupVersionResource).Namespace("ns")
		mustDo(t)(res.Update(ctx, widget("ns", "a", "ua", "1", 1), metav1.UpdateOptions{})) // known state: nothing
		mustDo(t)(res.Update(ctx, widget("ns", "b", "ub", "3", 2), metav1.UpdateOptions{})) // tracked: Modified
		synctest.Wait()
		sameRecords(t, "after the drops", q.take(), []record{{Key: key("b"), Type: opkit.Modified, RV: "3", UID: "ub"}})
		stop()

		// The caller's recovery: a new Run re-lists and re-emits everything.
		stop = start(t, w)
		defer stop()
		synctest.Wait()
		sameRecords(t, "new run", byKey(q.take()), []record{
			{Key: key("a"), Type: opkit.Added, RV: "1", UID: "ua", Priority: -1},
			{Key: key("b"), Type: opkit.Added, RV: "3", UID: "ub", Priority: -1},
		})
	})
}

// A watch delete is recorded in the ledger with the final state the watch
// delivered, then its key is added (without an object); the object is no
// longer tracked as live.
func TestADeleteIsRecordedWithItsFinalStateThenItsKeyIsAdded(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		r := runAB(t)
		defer r.stop()
		final := widget("ns", "b", "ub", "3", 1, func(u *unstructured.Unstructured) { u.Object["spec"] = map[string]any{"size": int64(7)} })
		r.ws.last(t).Delete(final)
		synctest.Wait()
		sameRecords(t, "the delete", r.q.take(), []record{{Key: key("b"), Type: opkit.Deleted, RV: "3", UID: "ub"}})
		ds := r.w.Deletes(key("b"))
		if len(ds) != 1 || ds[0].FinalStateUnknown || ds[0].Object.Spec.Size != 7 || ds[0].Object.UID != "ub" {
			t.Fatalf("Deletes(b) = %+v, want the final state (size 7)", ds)
		}
		if rv, ok := r.w.ResourceVersion(key("b")); ok {
			t.Errorf("ResourceVersion of the deleted b = %q, true; want false", rv)
		}
	})
}

// The ledger keeps a delete until it is settled, by UID and
// resourceVersion; until then every Run's first list adds its key again,
// whatever happened to the queue of the Run before (a term's end cleared
// it, or its intake dropped the add).
func TestTheLedgerKeepsADeleteUntilSettledAndEachRunAddsItsKey(t *testing.T) {
	for _, dropped := range []bool{false, true} {
		t.Run(fmt.Sprintf("dropped=%v", dropped), func(t *testing.T) {
			synctest.Test(t, func(t *testing.T) {
				r := runAB(t)
				if dropped {
					r.q.setOutcome(queue.DroppedSuspended)
				}
				must(t, r.c.Tracker().Delete(widgets.GroupVersionResource, "ns", "b"))
				r.ws.last(t).Delete(widget("ns", "b", "ub", "2", 1))
				synctest.Wait()
				sameRecords(t, "the delete", r.q.take(), []record{{Key: key("b"), Type: opkit.Deleted, RV: "2", UID: "ub"}})
				r.stop()
				r.q.setOutcome(0)

				next := []record{
					{Key: key("a"), Type: opkit.Added, RV: "1", UID: "ua", Priority: -1},
					{Key: key("b"), Type: opkit.Deleted, RV: "2", UID: "ub", Priority: 0},
				}
				run := func(what string, want []record) {
					t.Helper()
					stop := start(t, r.w)
					synctest.Wait()
					stop()
					sameRecords(t, what, r.q.take(), want)
				}
				run("next run, not settled", next)
				r.w.Settle(key("b"), "another-object", "2") // not this delete: kept
				r.w.Settle(key("b"), "ub", "1")             // another delete of it: kept
				run("next run, settled for others", next)
				if got := deletes(r.w, key("b")); !slices.Equal(got, []string{"ub rv=2"}) {
					t.Fatalf("Deletes(b) = %q, want the final state at rv 2", got)
				}
				r.w.Settle(key("b"), "ub", "2")
				run("after Settle", next[:1])
			})
		})
	}
}

// A list cannot show what is gone: objects deleted while no Run was
// active are recorded as tombstones by the next Run's list.
func TestANewRunRecordsObjectsDeletedWhileStoppedAsTombstones(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		c := abFake()
		q, w := watching(t, c)
		stop := start(t, w)
		synctest.Wait()
		stop()
		if w.Synced() || !errors.Is(w.Check(), watcher.ErrNotRunning) {
			t.Fatalf("after Run: Synced=%v Check=%v, want false, ErrNotRunning", w.Synced(), w.Check())
		}
		q.take()
		must(t, c.Tracker().Delete(widgets.GroupVersionResource, "ns", "b"))
		stop = start(t, w)
		defer stop()
		synctest.Wait()
		sameRecords(t, "second run", q.take(), []record{
			{Key: key("a"), Type: opkit.Added, RV: "1", UID: "ua", Priority: -1},
			{Key: key("b"), Type: opkit.Deleted, RV: "2", UID: "ub", Final: true, Priority: 0},
		})
	})
}

// An object deleted and created again under its name: the old object's
// delete stays in the ledger beside the new live object, and the next
// Run's list adds the key once (its Added: a turn reconciles the key's
// deletes first).
func TestARecreatedObjectLeavesItsPredecessorsDeleteInTheLedger(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		r := runAB(t)
		must(t, r.c.Tracker().Delete(widgets.GroupVersionResource, "ns", "b"))
		must(t, r.c.Tracker().Create(widgets.GroupVersionResource, widget("ns", "b", "ub2", "5", 1), "ns"))
		fw := r.ws.last(t)
		fw.Delete(widget("ns", "b", "ub", "2", 1))
		fw.Add(widget("ns", "b", "ub2", "5", 1))
		synctest.Wait()
		sameRecords(t, "the watch", r.q.take(), []record{
			{Key: key("b"), Type: opkit.Deleted, RV: "2", UID: "ub"},
			{Key: key("b"), Type: opkit.Added, RV: "5", UID: "ub2"},
		})
		r.stop()
		stop := start(t, r.w)
		defer stop()
		synctest.Wait()
		sameRecords(t, "next run", r.q.take(), []record{
			{Key: key("a"), Type: opkit.Added, RV: "1", UID: "ua", Priority: -1},
			{Key: key("b"), Type: opkit.Added, RV: "5", UID: "ub2", Priority: -1},
		})
		if got := deletes(r.w, key("b")); !slices.Equal(got, []string{"ub rv=2"}) {
			t.Fatalf("Deletes(b) = %q, want the old object's", got)
		}
	})
}

// A delete the watch never showed (the object was deleted and created
// again while the watch was down) is found by the relist and recorded as
// a tombstone before the new object is added.
func TestARelistRecordsAReplacedObjectAsATombstone(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		r := runAB(t)
		defer r.stop()
		must(t, r.c.Tracker().Delete(widgets.GroupVersionResource, "ns", "b"))
		must(t, r.c.Tracker().Create(widgets.GroupVersionResource, widget("ns", "b", "ub2", "5", 1), "ns"))
		r.ws.last(t).Error(expired) // a relist follows
		synctest.Wait()
		sameRecords(t, "the relist", r.q.take(), []record{
			{Key: key("b"), Type: opkit.Deleted, RV: "2", UID: "ub", Final: true, Priority: 0},
			{Key: key("b"), Type: opkit.Added, RV: "5", UID: "ub2", Priority: -1},
		})
		if got := deletes(r.w, key("b")); !slices.Equal(got, []string{"ub rv=2 tombstone"}) {
			t.Fatalf("Deletes(b) = %q", got)
		}
	})
}

// Deletes of two objects of one name are kept in the order the watch
// reported them, and each is settled on its own.
func TestDeletesOfTwoObjectsOfOneNameAreKeptInOrder(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		r := runAB(t)
		defer r.stop()
		fw := r.ws.last(t)
		fw.Delete(widget("ns", "b", "ub", "2", 1))
		fw.Add(widget("ns", "b", "ub2", "5", 1))
		fw.Delete(widget("ns", "b", "ub2", "6", 1))
		synctest.Wait()
		if got := deletes(r.w, key("b")); !slices.Equal(got, []string{"ub rv=2", "ub2 rv=6"}) {
			t.Fatalf("Deletes(b) = %q, want ub's then ub2's", got)
		}
		r.w.Settle(key("b"), "ub2", "6")
		if got := deletes(r.w, key("b")); !slices.Equal(got, []string{"ub rv=2"}) {
			t.Fatalf("after settling ub2: Deletes(b) = %q", got)
		}
		r.w.Settle(key("b"), "ub", "2")
		if got := r.w.Deletes(key("b")); got != nil {
			t.Fatalf("after settling both: Deletes(b) = %+v", got)
		}
	})
}

// An object that leaves the label selector is deleted as far as the watch
// knows; when it comes back (same UID) it was not: its delete goes from
// the ledger. Leaving again records a new delete, settled on its own.
func TestAnObjectBackInTheWatchWasNotDeleted(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		r := runAB(t)
		defer r.stop()
		fw := r.ws.last(t)
		fw.Delete(widget("ns", "b", "ub", "3", 1)) // leaves
		synctest.Wait()
		if got := deletes(r.w, key("b")); !slices.Equal(got, []string{"ub rv=3"}) {
			t.Fatalf("after leaving: Deletes(b) = %q", got)
		}
		fw.Add(widget("ns", "b", "ub", "4", 1)) // comes back
		synctest.Wait()
		if got := r.w.Deletes(key("b")); got != nil {
			t.Fatalf("after coming back: Deletes(b) = %+v, want none", got)
		}
		fw.Delete(widget("ns", "b", "ub", "5", 1)) // leaves again
		synctest.Wait()
		r.w.Settle(key("b"), "ub", "3") // a reconcile of the first delete that finished late
		if got := deletes(r.w, key("b")); !slices.Equal(got, []string{"ub rv=5"}) {
			t.Fatalf("Deletes(b) = %q, want the second delete", got)
		}
	})
}

// The ledger is bounded: beyond MaxFinalStates a delete keeps only its
// identity (a tombstone), and beyond MaxDeletesPerKey the oldest delete of
// the key is dropped, logged and counted.
func TestTheLedgerIsBounded(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		c := abFake()
		ws := &watches{}
		ws.install(c)
		q := &recorder{}
		m := newMetrics()
		cfg := config(c, q)
		cfg.Metrics, cfg.MaxFinalStates, cfg.MaxDeletesPerKey = m, 1, 2
		w := mustNew(t, cfg)
		stop := start(t, w)
		defer stop()
		synctest.Wait()
		fw := ws.last(t)
		fw.Delete(widget("ns", "a", "ua", "3", 1))
		fw.Delete(widget("ns", "b", "ub", "4", 1))
		synctest.Wait()
		if a, b := deletes(w, key("a")), deletes(w, key("b")); !slices.Equal(a, []string{"ua rv=3"}) || !slices.Equal(b, []string{"ub rv=4 tombstone"}) {
			t.Fatalf("Deletes = %q, %q; want a's final state and b as a tombstone", a, b)
		}
		fw.Add(widget("ns", "b", "ub2", "5", 1))
		fw.Delete(widget("ns", "b", "ub2", "6", 1))
		fw.Add(widget("ns", "b", "ub3", "7", 1))
		fw.Delete(widget("ns", "b", "ub3", "8", 1))
		synctest.Wait()
		if got := deletes(w, key("b")); !slices.Equal(got, []string{"ub2 rv=6 tombstone", "ub3 rv=8 tombstone"}) {
			t.Fatalf("Deletes(b) = %q, want the newest two", got)
		}
		if n := m.get(func(m *metrics) int { return m.errors[watcher.ReasonOverflow] }); n != 1 {
			t.Fatalf("overflows counted: %d, want 1", n)
		}
		w.Settle(key("a"), "ua", "3") // a final state's room is free again
		fw.Add(widget("ns", "c", "uc", "9", 1))
		fw.Delete(widget("ns", "c", "uc", "10", 1))
		synctest.Wait()
		if got := deletes(w, key("c")); !slices.Equal(got, []string{"uc rv=10"}) {
			t.Fatalf("Deletes(c) = %q, want its final state", got)
		}
	})
}

func TestListPriorityAndWatchPriorityAreConfigurable(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		c := newFake(widget("ns", "a", "ua", "1", 1))
		q := &recorder{}
		cfg := config(c, q)
		cfg.ListPriority = new(0)
		cfg.Priority = 5
		stop := start(t, mustNew(t, cfg))
		defer stop()
		synctest.Wait()
		mustDo(t)(c.Resource(widgets.GroupVersionResource).Namespace("ns").Update(ctx, widget("ns", "a", "ua", "2", 2), metav1.UpdateOptions{}))
		synctest.Wait()
		sameRecords(t, "priorities", q.take(), []record{
			{Key: key("a"), Type: opkit.Added, RV: "1", UID: "ua", Priority: 0},
			{Key: key("a"), Type: opkit.Modified, RV: "2", UID: "ua", Priority: 5},
		})
	})
}

func TestRunIsExclusiveAndCancelStopsEveryWatch(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		c := newFake()
		ws := &watches{}
		ws.install(c)
		w := mustNew(t, config(c, &recorder{}))
		stop := start(t, w)
		synctest.Wait()
		if err := w.Run(ctx); !errors.Is(err, watcher.ErrAlreadyRunning) {
			t.Fatalf("second Run = %v, want ErrAlreadyRunning", err)
		}
		ws.last(t).Stop() // closed by the server: reopened later
		time.Sleep(time.Second)
		synctest.Wait()
		stop()
		// synctest.Test also fails if Run left a goroutine behind.
		ws.mu.Lock()
		defer ws.mu.Unlock()
		for i, fw := range ws.opened {
			if !fw.IsStopped() {
				t.Errorf("watch %d still open after Run returned", i)
			}
		}
		if len(ws.opened) != 2 {
			t.Errorf("%d watches opened, want 2", len(ws.opened))
		}
	})
}

func TestWorksWithTheRealQueue(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		c := abFake()
		q := queue.New[opkit.Key](queue.Config[opkit.Cause[*Widget]]{Merge: (*opkit.Cause[*Widget]).Merge})
		stop := start(t, mustNew(t, watcher.Config[*Widget]{Client: c, Resource: widgets, Queue: q, Logger: discard}))
		defer stop()
		synctest.Wait()
		mustDo(t)(c.Resource(widgets.GroupVersionResource).Namespace("ns").Update(ctx, widget("ns", "b", "ub", "3", 2), metav1.UpdateOptions{}))
		synctest.Wait()
		if q.Len() != 2 {
			t.Fatalf("queue holds %d entries, want 2", q.Len())
		}
		// b's watch event (priority 0) is served before a's list entry
		// (-1); b's entry joins the list's Added and the newer object.
		for _, want := range []record{{Key: key("b"), Type: opkit.Added, RV: "3"}, {Key: key("a"), Type: opkit.Added, RV: "1", Priority: -1}} {
			it, err := q.Get(ctx)
			if err != nil {
				t.Fatal(err)
			}
			if it.Key != want.Key || !it.Value.Added || it.Value.Object.ResourceVersion != want.RV || it.Priority != want.Priority || it.Value.Object.Spec.Size != 1 {
				t.Fatalf("Get = %v %+v prio=%d, want %v", it.Key, it.Value, it.Priority, want)
			}
			q.Done(it.Key)
		}
	})
}

func TestAnObjectTheUsersTypeCannotHoldIsTrackedButNotEmitted(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		bad := widget("ns", "bad", "ub", "1", 1, func(u *unstructured.Unstructured) { u.Object["spec"] = map[string]any{"size": "huge"} })
		c := newFake(bad, widget("ns", "good", "ug", "2", 1))
		q := &recorder{}
		m := newMetrics()
		cfg := config(c, q)
		cfg.Metrics = m
		w := mustNew(t, cfg)
		stop := start(t, w)
		defer stop()
		synctest.Wait()
		sameRecords(t, "entries", q.take(), []record{{Key: key("good"), Type: opkit.Added, RV: "2", UID: "ug", Priority: -1}})
		if !w.Synced() || m.get(func(m *metrics) int { return m.errors[watcher.ReasonDecode] }) != 1 || m.get(func(m *metrics) int { return m.tracked }) != 2 {
			t.Fatalf("synced=%v errors=%v tracked=%d; want synced, one decode error, 2 tracked", w.Synced(), m.errors, m.tracked)
		}
	})
}

func TestTombstonesCarryIdentityAndKind(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		c := newFake(widget("ns", "a", "ua", "1", 1))
		q, w := watching(t, c)
		stop := start(t, w)
		synctest.Wait()
		stop()
		must(t, c.Tracker().Delete(widgets.GroupVersionResource, "ns", "a"))
		stop = start(t, w)
		defer stop()
		synctest.Wait()
		q.take()
		ds := w.Deletes(key("a"))
		if len(ds) != 1 {
			t.Fatalf("Deletes(a) = %+v, want one tombstone", ds)
		}
		o := ds[0].Object
		if !ds[0].FinalStateUnknown || o.Namespace != "ns" || o.Name != "a" || o.UID != "ua" ||
			o.ResourceVersion != "1" || o.Kind != "Widget" || o.APIVersion != "test.opkit.dev/v1" || o.Spec.Size != 0 {
			t.Fatalf("tombstone = %+v", ds[0])
		}
	})
}

// A watch the server keeps closing at once delivers nothing: Check must
// not call that healthy.
func TestCheckReportsAWatchClosedAtOnce(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		r := runAB(t)
		defer r.stop()
		if err := r.w.Check(); err != nil {
			t.Fatalf("Check with the watch open = %v", err)
		}
		r.ws.last(t).Stop()
		synctest.Wait()
		if err := r.w.Check(); !errors.Is(err, watcher.ErrDisconnected) || errors.Is(err, watcher.ErrNotSynced) {
			t.Fatalf("Check after a watch closed at once = %v, want ErrDisconnected", err)
		}
		time.Sleep(watcher.DefaultBackoffBase)
		synctest.Wait()
		if n := len(r.ws.rvs()); n != 2 {
			t.Fatalf("%d watches, want the watch reopened", n)
		}
		if err := r.w.Check(); err != nil {
			t.Fatalf("Check with the watch open again = %v", err)
		}
	})
}
