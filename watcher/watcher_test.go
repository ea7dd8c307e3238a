package watcher_test

import (
	"context"
	"errors"
	"fmt"
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
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/watch"
	"k8s.io/client-go/dynamic"
	dynfake "k8s.io/client-go/dynamic/fake"
	k8stesting "k8s.io/client-go/testing"

	"github.com/opkit/opkit"
	"github.com/opkit/opkit/queue"
	"github.com/opkit/opkit/watcher"
)

var ctx = context.Background()

// byKey sorts records by key, keeping the order of records of one key.
func byKey(rs []record) []record {
	slices.SortStableFunc(rs, func(a, b record) int { return strings.Compare(a.Key.String(), b.Key.String()) })
	return rs
}

func mustNew(t *testing.T, cfg watcher.Config[*Widget]) *watcher.Watcher[*Widget] {
	t.Helper()
	w, err := watcher.New(cfg)
	if err != nil {
		t.Fatal(err)
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
		{"unknown mode", func(c *watcher.Config[*Widget]) { c.WatchList = 7 }, "WatchList"},
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
			{Key: key("b"), Type: opkit.Deleted, RV: "2", UID: "ub", Final: true, Priority: -1},
			{Key: key("e"), Type: opkit.Deleted, RV: "4", UID: "ue", Final: true, Priority: -1},
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
		if got := m.get(func(m *metrics) int { return m.tracked }); got != 4 {
			t.Fatalf("tracked = %d, want 4 (a d e f)", got)
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

// endMarker is the bookmark that ends a WatchList's initial events.
func endMarker(rv string) *unstructured.Unstructured {
	return bookmark(rv, map[string]string{metav1.InitialEventsAnnotationKey: "true"})
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
		cfg.Backoff = watcher.Backoff{Base: time.Second, Cap: 8 * time.Second}
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

func TestForbiddenAndNotFoundAreReportedAndRetriedSlowly(t *testing.T) {
	for _, tc := range []struct {
		name   string
		err    error
		is     func(error) bool
		reason watcher.Reason
	}{
		{"forbidden", apierrors.NewForbidden(widgets.GroupResource(), "", errors.New(`user "u" cannot list`)), apierrors.IsForbidden, watcher.ReasonForbidden},
		{"notfound", apierrors.NewNotFound(widgets.GroupResource(), ""), apierrors.IsNotFound, watcher.ReasonNotFound},
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
				// Slow retries: at least Slow/2 apart, so at most 1 + 120s/15s.
				n := len(attempts())
				if n < 2 || n > 9 {
					t.Fatalf("%d attempts in 2 minutes, want between 2 and 9", n)
				}
				for _, g := range gaps(attempts()) {
					if g < watcher.DefaultBackoffSlow/2 {
						t.Fatalf("retried after %v, want at least %v", g, watcher.DefaultBackoffSlow/2)
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
			if s.emit {
				want = append(want, record{Key: opkit.Key{Namespace: "ns", Name: s.u.GetName()}, Type: opkit.Modified, RV: s.u.GetResourceVersion(), UID: string(s.u.GetUID())})
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

func TestANewRunReportsObjectsDeletedWhileStopped(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		c := abFake()
		q, w := watching(t, c, false)
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
			{Key: key("b"), Type: opkit.Deleted, RV: "2", UID: "ub", Final: true, Priority: -1},
		})
	})
}

// A list cannot show what is gone: a delete the queue did not take (its
// intake suspended at the end of a term) is kept and emitted by the next
// list, once, as a tombstone.
func TestADeleteTheQueueDroppedComesBackWithTheNextList(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		c := abFake()
		q, w := watching(t, c, false)
		stop := start(t, w)
		synctest.Wait()
		q.take()
		q.setOutcome(queue.DroppedSuspended)
		must(t, c.Tracker().Delete(widgets.GroupVersionResource, "ns", "b"))
		synctest.Wait()
		sameRecords(t, "the dropped delete", q.take(), []record{{Key: key("b"), Type: opkit.Deleted, RV: "2", UID: "ub"}})
		if rv, ok := w.ResourceVersion(key("b")); ok {
			t.Errorf("ResourceVersion of the deleted b = %q, true; want false", rv)
		}
		stop()

		q.setOutcome(0)
		stop = start(t, w)
		synctest.Wait()
		stop()
		sameRecords(t, "next run", q.take(), []record{
			{Key: key("a"), Type: opkit.Added, RV: "1", UID: "ua", Priority: -1},
			{Key: key("b"), Type: opkit.Deleted, RV: "2", UID: "ub", Final: true, Priority: -1},
		})
		stop = start(t, w)
		defer stop()
		synctest.Wait()
		sameRecords(t, "the run after: b was delivered", q.take(), []record{
			{Key: key("a"), Type: opkit.Added, RV: "1", UID: "ua", Priority: -1},
		})
	})
}

// With RetainDeletes a delete the queue took is still kept until Settle:
// if it is lost later (cleared with the queue, interrupted), the next
// Run's list emits it again.
func TestRetainDeletesKeepsADeleteUntilSettled(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		c := abFake()
		q, w := watching(t, c, true)
		stop := start(t, w)
		synctest.Wait()
		q.take()
		must(t, c.Tracker().Delete(widgets.GroupVersionResource, "ns", "b"))
		synctest.Wait()
		sameRecords(t, "the delete", q.take(), []record{{Key: key("b"), Type: opkit.Deleted, RV: "2", UID: "ub"}})
		stop()

		second := []record{
			{Key: key("a"), Type: opkit.Added, RV: "1", UID: "ua", Priority: -1},
			{Key: key("b"), Type: opkit.Deleted, RV: "2", UID: "ub", Final: true, Priority: -1},
		}
		stop = start(t, w)
		synctest.Wait()
		sameRecords(t, "next run, not settled", q.take(), second)
		w.Settle(key("b"), "another-incarnation", "2") // not this delete: kept
		stop()
		stop = start(t, w)
		synctest.Wait()
		sameRecords(t, "next run, settled for another uid", q.take(), second)
		w.Settle(key("b"), "ub", "1") // another delete of it: kept
		stop()
		stop = start(t, w)
		synctest.Wait()
		sameRecords(t, "next run, settled for another delete", q.take(), second)
		w.Settle(key("b"), "ub", "2") // while Run runs
		stop()
		stop = start(t, w)
		defer stop()
		synctest.Wait()
		sameRecords(t, "after Settle", q.take(), second[:1])
	})
}

// A held delete the queue took is emitted once per Run: neither a relist
// nor a recreation of the object sends it again (a reconciler would see
// the delete twice), only the next Run's first list.
func TestRetainedDeletesAreNotRepeatedWithinARun(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		c := abFake()
		ws := &watches{}
		ws.install(c)
		q, w := watching(t, c, true)
		stop := start(t, w)
		defer stop()
		synctest.Wait()
		q.take()
		// The cluster changes (the fake's store) and the watch tells.
		must(t, c.Tracker().Delete(widgets.GroupVersionResource, "ns", "b"))
		must(t, c.Tracker().Delete(widgets.GroupVersionResource, "ns", "a"))
		must(t, c.Tracker().Create(widgets.GroupVersionResource, widget("ns", "b", "ub2", "5", 1), "ns"))
		fw := ws.last(t)
		fw.Delete(widget("ns", "b", "ub", "2", 1))
		fw.Delete(widget("ns", "a", "ua", "1", 1))
		fw.Add(widget("ns", "b", "ub2", "5", 1)) // b comes back as a new object
		synctest.Wait()
		fw.Error(expired) // a relist follows
		synctest.Wait()
		sameRecords(t, "one delete each, then the new b", q.take(), []record{
			{Key: key("b"), Type: opkit.Deleted, RV: "2", UID: "ub"},
			{Key: key("a"), Type: opkit.Deleted, RV: "1", UID: "ua"},
			{Key: key("b"), Type: opkit.Added, RV: "5", UID: "ub2"},
		})
	})
}

// A delete settled the moment the queue takes it (a fast worker) is not
// brought back by the watcher's own bookkeeping.
func TestADeleteSettledAtOnceStaysSettled(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		c := abFake()
		q, w := watching(t, c, true)
		q.after = func(r record) {
			if r.Type == opkit.Deleted {
				w.Settle(r.Key, types.UID(r.UID), r.RV)
			}
		}
		stop := start(t, w)
		synctest.Wait()
		must(t, c.Tracker().Delete(widgets.GroupVersionResource, "ns", "b"))
		synctest.Wait()
		stop()
		q.take()
		stop = start(t, w)
		defer stop()
		synctest.Wait()
		sameRecords(t, "next run", q.take(), []record{{Key: key("a"), Type: opkit.Added, RV: "1", UID: "ua", Priority: -1}})
	})
}

// An object deleted and created again under the same name does not take
// its predecessor's delete with it: while that delete may still be lost
// (dropped by the queue, or not settled with RetainDeletes), the next
// Run's list emits it, before the new object.
func TestARecreatedObjectKeepsItsPredecessorsDelete(t *testing.T) {
	for _, tc := range []struct {
		name   string
		retain bool
		// dropped: the queue takes nothing while b is deleted and
		// recreated (a leadership transition).
		dropped bool
	}{
		{name: "retained, not settled", retain: true},
		{name: "dropped", dropped: true},
		{name: "dropped and retained", retain: true, dropped: true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			synctest.Test(t, func(t *testing.T) {
				r := runAB(t, tc.retain)
				c, ws, q, w, stop := r.c, r.ws, r.q, r.w, r.stop
				if tc.dropped {
					q.setOutcome(queue.DroppedSuspended)
				}
				must(t, c.Tracker().Delete(widgets.GroupVersionResource, "ns", "b"))
				must(t, c.Tracker().Create(widgets.GroupVersionResource, widget("ns", "b", "ub2", "5", 1), "ns"))
				fw := ws.last(t)
				fw.Delete(widget("ns", "b", "ub", "2", 1))
				fw.Add(widget("ns", "b", "ub2", "5", 1))
				synctest.Wait()
				watched := []record{{Key: key("b"), Type: opkit.Deleted, RV: "2", UID: "ub"}}
				if tc.dropped { // the recreation tries the dropped delete again
					watched = append(watched, record{Key: key("b"), Type: opkit.Deleted, RV: "2", UID: "ub", Final: true})
				}
				watched = append(watched, record{Key: key("b"), Type: opkit.Added, RV: "5", UID: "ub2"})
				sameRecords(t, "the watch", q.take(), watched)
				stop() // the term ends before the delete was reconciled
				q.setOutcome(0)

				withDelete := []record{
					{Key: key("a"), Type: opkit.Added, RV: "1", UID: "ua", Priority: -1},
					{Key: key("b"), Type: opkit.Deleted, RV: "2", UID: "ub", Final: true, Priority: -1},
					{Key: key("b"), Type: opkit.Added, RV: "5", UID: "ub2", Priority: -1},
				}
				stop = start(t, w)
				synctest.Wait()
				sameRecords(t, "next run", q.take(), withDelete)
				stop()

				stop = start(t, w)
				synctest.Wait()
				if tc.retain {
					sameRecords(t, "the run after, not settled", q.take(), withDelete)
					w.Settle(key("b"), "ub", "2")
					stop()
					stop = start(t, w)
					synctest.Wait()
				}
				sameRecords(t, "once delivered (and settled)", q.take(), []record{withDelete[0], withDelete[2]})
				stop()
			})
		})
	}
}

// A delete the watch never showed (the object was deleted and created
// again while the watch was down) is found by the relist and kept like any
// other: the next Run emits it again until it is settled.
func TestADeleteFoundByARelistIsRetainedToo(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		r := runAB(t, true)
		c, ws, q, w, stop := r.c, r.ws, r.q, r.w, r.stop
		must(t, c.Tracker().Delete(widgets.GroupVersionResource, "ns", "b"))
		must(t, c.Tracker().Create(widgets.GroupVersionResource, widget("ns", "b", "ub2", "5", 1), "ns"))
		ws.last(t).Error(expired) // a relist follows
		synctest.Wait()
		sameRecords(t, "the relist", q.take(), []record{
			{Key: key("b"), Type: opkit.Deleted, RV: "2", UID: "ub", Final: true, Priority: -1},
			{Key: key("b"), Type: opkit.Added, RV: "5", UID: "ub2", Priority: -1},
		})
		stop()
		stop = start(t, w)
		defer stop()
		synctest.Wait()
		sameRecords(t, "next run, not settled", q.take(), []record{
			{Key: key("a"), Type: opkit.Added, RV: "1", UID: "ua", Priority: -1},
			{Key: key("b"), Type: opkit.Deleted, RV: "2", UID: "ub", Final: true, Priority: -1},
			{Key: key("b"), Type: opkit.Added, RV: "5", UID: "ub2", Priority: -1},
		})
	})
}

// A delete kept for an earlier object of a name is emitted again by the
// next Run even when the newer object is gone too: the older delete
// first.
func TestDeletesOfTwoObjectsOfOneNameComeBackInOrder(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		r := runAB(t, true)
		c, ws, q, w, stop := r.c, r.ws, r.q, r.w, r.stop
		must(t, c.Tracker().Delete(widgets.GroupVersionResource, "ns", "b"))
		fw := ws.last(t)
		fw.Delete(widget("ns", "b", "ub", "2", 1))
		fw.Add(widget("ns", "b", "ub2", "5", 1))
		fw.Delete(widget("ns", "b", "ub2", "6", 1))
		synctest.Wait()
		q.take()
		stop()

		want := []record{
			{Key: key("a"), Type: opkit.Added, RV: "1", UID: "ua", Priority: -1},
			{Key: key("b"), Type: opkit.Deleted, RV: "2", UID: "ub", Final: true, Priority: -1},
			{Key: key("b"), Type: opkit.Deleted, RV: "6", UID: "ub2", Final: true, Priority: -1},
		}
		// Each Run emits the deletes not settled yet; settle the newer, then
		// the older.
		settles := []struct {
			uid types.UID
			rv  string
		}{{"ub2", "6"}, {"ub", "2"}}
		for i, what := range []string{"next run", "the newer delete settled", "both settled"} {
			stop = start(t, w)
			synctest.Wait()
			sameRecords(t, what, q.take(), want[:len(want)-i])
			if i < len(settles) {
				w.Settle(key("b"), settles[i].uid, settles[i].rv)
			}
			stop()
		}
	})
}

// A predecessor's delete that the controller settles as soon as the queue
// takes it does not come back in the next Run, however the recreation was
// found: the tombstone is kept before the queue sees the delete.
func TestAPredecessorsDeleteSettledAtOnceStaysSettled(t *testing.T) {
	for _, tc := range []struct {
		name     string
		recreate func(t *testing.T, r abRunning)
		first    []record
	}{
		{
			name: "found by a relist",
			recreate: func(t *testing.T, r abRunning) {
				must(t, r.c.Tracker().Delete(widgets.GroupVersionResource, "ns", "b"))
				must(t, r.c.Tracker().Create(widgets.GroupVersionResource, widget("ns", "b", "ub2", "5", 1), "ns"))
				r.ws.last(t).Error(expired)
			},
			first: []record{
				{Key: key("b"), Type: opkit.Deleted, RV: "2", UID: "ub", Final: true, Priority: -1},
				{Key: key("b"), Type: opkit.Added, RV: "5", UID: "ub2", Priority: -1},
			},
		},
		{
			name: "a dropped delete sent again by the recreation",
			recreate: func(t *testing.T, r abRunning) {
				r.q.setOutcome(queue.DroppedSuspended)
				must(t, r.c.Tracker().Delete(widgets.GroupVersionResource, "ns", "b"))
				fw := r.ws.last(t)
				fw.Delete(widget("ns", "b", "ub", "2", 1))
				synctest.Wait()
				r.q.setOutcome(0)
				must(t, r.c.Tracker().Create(widgets.GroupVersionResource, widget("ns", "b", "ub2", "5", 1), "ns"))
				fw.Add(widget("ns", "b", "ub2", "5", 1))
			},
			first: []record{
				{Key: key("b"), Type: opkit.Deleted, RV: "2", UID: "ub"},
				{Key: key("b"), Type: opkit.Deleted, RV: "2", UID: "ub", Final: true},
				{Key: key("b"), Type: opkit.Added, RV: "5", UID: "ub2"},
			},
		},
	} {
		t.Run(tc.name, func(t *testing.T) {
			synctest.Test(t, func(t *testing.T) {
				r := runAB(t, true)
				settleAtOnce(r)
				tc.recreate(t, r)
				synctest.Wait()
				sameRecords(t, "the recreation", r.q.take(), tc.first)
				r.stop()
				stop := start(t, r.w)
				defer stop()
				synctest.Wait()
				sameRecords(t, "next run: the delete was settled", r.q.take(), []record{
					{Key: key("a"), Type: opkit.Added, RV: "1", UID: "ua", Priority: -1},
					{Key: key("b"), Type: opkit.Added, RV: "5", UID: "ub2", Priority: -1},
				})
			})
		})
	}
}

// The queue drops b's delete and the recreation's entries, then takes
// entries again (same Run): a Deleted watch event of the newer object must
// not overtake the earlier object's kept delete.
func TestANewerObjectsDeleteDoesNotOvertakeAnEarlierObjectsDelete(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		r := runAB(t, false)
		c, ws, q, w, stop := r.c, r.ws, r.q, r.w, r.stop
		q.setOutcome(queue.DroppedSuspended)
		must(t, c.Tracker().Delete(widgets.GroupVersionResource, "ns", "b"))
		fw := ws.last(t)
		fw.Delete(widget("ns", "b", "ub", "2", 1))
		fw.Add(widget("ns", "b", "ub2", "5", 1))
		synctest.Wait()
		q.take()
		q.setOutcome(0)
		fw.Delete(widget("ns", "b", "ub2", "6", 1))
		synctest.Wait()
		got := q.take()
		stop()
		stop = start(t, w)
		defer stop()
		synctest.Wait()
		got = append(got, q.take()...)
		sameRecords(t, "deletes of b, in order", got, []record{
			{Key: key("b"), Type: opkit.Deleted, RV: "2", UID: "ub", Final: true},
			{Key: key("b"), Type: opkit.Deleted, RV: "6", UID: "ub2"},
			{Key: key("a"), Type: opkit.Added, RV: "1", UID: "ua", Priority: -1},
		})
	})
}

// A controller that settles a retained delete while the watcher is handling
// the Added of the name's next object (between observe's read of the
// tombstone and displace) leaves the settled delete in tracker.earlier: it
// is never settled again in this Run, and the next Run emits it again.
func TestASettleWhileTheNextObjectArrivesStaysSettled(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		c := abFake()
		ws := &watches{}
		ws.install(c)
		q := &policyQueue{}
		m := newMetrics()
		cfg := config(c, nil)
		cfg.Queue = q
		cfg.RetainDeletes = true
		cfg.Metrics = m
		w := mustNew(t, cfg)
		stop := start(t, w)
		synctest.Wait()
		q.take()
		fw := ws.last(t)
		reject := func(record) queue.Outcome { return queue.DroppedSuspended }

		// Set-up: an earlier object ua of "a" whose delete the queue did not take,
		// so that observe emits it again in the window.
		q.set(reject)
		fw.Delete(widget("ns", "a", "ua", "3", 1))
		fw.Add(widget("ns", "a", "ua2", "4", 1))
		synctest.Wait()
		q.set(func(r record) queue.Outcome {
			if r.UID == "ua" {
				return queue.DroppedSuspended
			}
			return queue.Queued
		})
		fw.Delete(widget("ns", "a", "ua2", "5", 1)) // accepted, retained
		synctest.Wait()

		// The controller finishes ua2's delete (Settle) just while the watcher
		// handles ua3's Added.
		q.set(func(r record) queue.Outcome {
			if r.UID == "ua" && r.Type == opkit.Deleted {
				w.Settle(key("a"), "ua2", "5")
			}
			return queue.Queued
		})
		fw.Add(widget("ns", "a", "ua3", "6", 1))
		synctest.Wait()
		w.Settle(key("a"), "ua", "3") // ua's delete is reconciled too
		q.set(nil)
		q.take()
		fw.Modify(widget("ns", "a", "ua3", "7", 1)) // a change: the tracked count is reported
		synctest.Wait()
		q.take()
		if n := m.get(func(m *metrics) int { return m.tracked }); n != 2 {
			t.Errorf("tracked after both deletes were settled: %d, want 2 (a and b)", n)
		}

		// The next term: both deletes were settled, so only the live objects.
		must(t, c.Tracker().Delete(widgets.GroupVersionResource, "ns", "a"))
		must(t, c.Tracker().Create(widgets.GroupVersionResource, widget("ns", "a", "ua3", "7", 1), "ns"))
		stop()
		stop = start(t, w)
		defer stop()
		synctest.Wait()
		sameRecords(t, "next run", q.take(), []record{
			{Key: key("a"), Type: opkit.Added, RV: "7", UID: "ua3", Priority: -1},
			{Key: key("b"), Type: opkit.Added, RV: "2", UID: "ub", Priority: -1},
		})
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

// streaming hides the fake's "no WatchList" marker, so the watcher tries a
// WatchList; a watch reactor then plays the server's part.
type streaming struct{ dynamic.Interface }

// streamingRun starts a watcher with WatchList on over a fake that serves
// it through test-controlled watches, recording entries and sync events.
func streamingRun(t *testing.T) (ws *watches, lists func() int, q *recorder, syncs *syncLog, w *watcher.Watcher[*Widget], stop func()) {
	ws = &watches{}
	_, lists, q, syncs, w, stop = streamingRunOn(t, ws)
	return ws, lists, q, syncs, w, stop
}

// streamingRunOn is streamingRun over a fake cluster holding objs, whose
// watch requests ws serves.
func streamingRunOn(t *testing.T, ws *watches, objs ...runtime.Object) (c *dynfake.FakeDynamicClient, lists func() int, q *recorder, syncs *syncLog, w *watcher.Watcher[*Widget], stop func()) {
	return streamingRunWith(t, ws, nil, objs...)
}

// streamingRunWith is streamingRunOn with the Config edited by edit (if
// not nil) before the watcher is built.
func streamingRunWith(t *testing.T, ws *watches, edit func(*watcher.Config[*Widget]), objs ...runtime.Object) (c *dynfake.FakeDynamicClient, lists func() int, q *recorder, syncs *syncLog, w *watcher.Watcher[*Widget], stop func()) {
	c = newFake(objs...)
	ws.install(c)
	lists = countLists(c)
	q, syncs = &recorder{}, &syncLog{}
	cfg := config(c, q)
	cfg.Client = streaming{c}
	cfg.WatchList = watcher.WatchListAuto
	cfg.OnSync = syncs.add
	if edit != nil {
		edit(&cfg)
	}
	w = mustNew(t, cfg)
	stop = start(t, w)
	synctest.Wait()
	return c, lists, q, syncs, w, stop
}

func TestWatchListStreamsTheInitialObjectsAndGoesOnWatching(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		ws, lists, q, syncs, w, stop := streamingRun(t)
		defer stop()
		ws.mu.Lock()
		opts := ws.requests[0]
		ws.mu.Unlock()
		if opts.SendInitialEvents == nil || !*opts.SendInitialEvents || opts.ResourceVersionMatch != metav1.ResourceVersionMatchNotOlderThan ||
			!opts.AllowWatchBookmarks || opts.ResourceVersion != "" {
			t.Fatalf("WatchList request options = %+v", opts)
		}
		fw := ws.last(t)
		fw.Add(widget("ns", "a", "ua", "1", 1))
		fw.Add(widget("ns", "b", "ub", "2", 1))
		fw.Action(watch.Bookmark, bookmark("3", nil)) // a plain bookmark: not the end
		synctest.Wait()
		if w.Synced() {
			t.Fatal("synced before the initial-events-end bookmark")
		}
		fw.Action(watch.Bookmark, endMarker("5"))
		synctest.Wait()
		if !w.Synced() || lists() != 0 {
			t.Fatalf("Synced=%v lists=%d after the end bookmark, want true and 0", w.Synced(), lists())
		}
		fw.Modify(widget("ns", "a", "ua", "6", 2))
		synctest.Wait()
		sameRecords(t, "stream", q.take(), []record{
			{Key: key("a"), Type: opkit.Added, RV: "1", UID: "ua", Priority: -1},
			{Key: key("b"), Type: opkit.Added, RV: "2", UID: "ub", Priority: -1},
			{Key: key("a"), Type: opkit.Modified, RV: "6", UID: "ua", Priority: 0},
		})
		ev := syncs.take()
		if len(ev) != 2 || !ev[1].Streaming || ev[1].ResourceVersion != "5" || ev[1].Added != 2 {
			t.Fatalf("sync events = %+v", ev)
		}
		// The server ends the stream: an ordinary watch resumes from 6.
		time.Sleep(2 * time.Minute)
		fw.Stop()
		synctest.Wait()
		ws.mu.Lock()
		next := ws.requests[len(ws.requests)-1]
		ws.mu.Unlock()
		if next.SendInitialEvents != nil || next.ResourceVersion != "6" || lists() != 0 {
			t.Fatalf("after the stream: watch options %+v, lists %d; want a plain watch from 6", next, lists())
		}
	})
}

// A stream that synced and then expired is followed by a relist that emits
// only the differences, not by a second initial list.
func TestWatchListExpiredAfterItsEndBookmarkRelistsOnlyTheDifferences(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		ws, _, q, syncs, _, stop := streamingRun(t)
		defer stop()
		fw := ws.last(t)
		fw.Add(widget("ns", "a", "ua", "1", 1))
		fw.Add(widget("ns", "b", "ub", "2", 1))
		fw.Action(watch.Bookmark, endMarker("5"))
		synctest.Wait()
		q.take()
		syncs.take()
		fw.Action(watch.Error, expired)
		synctest.Wait()
		// The next stream: a unchanged, b changed.
		fw = ws.last(t)
		fw.Add(widget("ns", "a", "ua", "1", 1))
		fw.Add(widget("ns", "b", "ub", "7", 2))
		fw.Action(watch.Bookmark, endMarker("8"))
		synctest.Wait()
		sameRecords(t, "relist", q.take(), []record{{Key: key("b"), Type: opkit.Modified, RV: "7", UID: "ub", Priority: -1}})
		ev := syncs.take()
		if len(ev) != 2 || ev[0].Initial || ev[0].Reason != watcher.ReasonExpired || ev[1].Modified != 1 || ev[1].Added != 0 {
			t.Fatalf("sync events = %+v, want a relist for ReasonExpired with one Modified", ev)
		}
	})
}

func TestWatchListRefusedFallsBackToPaginatedList(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		ws := &watches{err: func(_ int, o metav1.ListOptions) error {
			if o.SendInitialEvents != nil {
				return apierrors.NewBadRequest("sendInitialEvents is forbidden for watch unless the WatchList feature gate is enabled")
			}
			return nil
		}}
		_, lists, q, _, w, stop := streamingRunOn(t, ws, widget("ns", "a", "ua", "1", 1))
		defer stop()
		if !w.Synced() || lists() != 1 {
			t.Fatalf("Synced=%v lists=%d, want a fallback list", w.Synced(), lists())
		}
		sameRecords(t, "entries", q.take(), []record{{Key: key("a"), Type: opkit.Added, RV: "1", UID: "ua", Priority: -1}})
		// A later relist does not try WatchList again.
		ws.last(t).Error(expired)
		synctest.Wait()
		if lists() != 2 || len(ws.rvs()) != 3 {
			t.Fatalf("lists=%d watches=%d, want the relist to list directly", lists(), len(ws.rvs()))
		}
	})
}

// Some servers send the end marker late (kube-apiserver before 1.32, from
// its bookmark timer; some aggregated servers): a change that comes before
// it is taken as it comes, and the stream stays a WatchList.
func TestWatchListTakesAChangeBeforeTheEndMarker(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		ws := &watches{}
		_, lists, q, _, w, stop := streamingRunOn(t, ws, widget("ns", "a", "ua", "1", 1))
		defer stop()
		fw := ws.last(t)
		fw.Add(widget("ns", "a", "ua", "1", 1))
		fw.Modify(widget("ns", "a", "ua", "3", 2)) // changed after the snapshot
		fw.Action(watch.Bookmark, endMarker("3"))
		synctest.Wait()
		if !w.Synced() || lists() != 0 || fw.IsStopped() {
			t.Fatalf("Synced=%v lists=%d stream stopped=%v; want the stream kept (no paged list)", w.Synced(), lists(), fw.IsStopped())
		}
		sameRecords(t, "entries", q.take(), []record{
			{Key: key("a"), Type: opkit.Added, RV: "1", UID: "ua", Priority: -1},
			{Key: key("a"), Type: opkit.Added, RV: "3", UID: "ua", Priority: -1}, // a first list's entries are all Added
		})
	})
}

// A server that does not serve WatchList semantics (an old or third-party
// API server ignoring sendInitialEvents) replays the objects as a plain
// watch and never sends the end marker. The watcher falls back to a
// paginated list when the initial phase has not ended within IdleTimeout
// (5 minutes here), however many events keep coming.
func TestWatchListThatNeverEndsItsInitialEventsFallsBack(t *testing.T) {
	for _, tc := range []struct {
		name string
		// serve feeds the stream after the replayed object; it returns
		// once the watcher must have fallen back.
		serve func(t *testing.T, c *dynfake.FakeDynamicClient, fw *watch.RaceFreeFakeWatcher)
	}{
		{"plain bookmarks only", func(_ *testing.T, _ *dynfake.FakeDynamicClient, fw *watch.RaceFreeFakeWatcher) {
			for range 6 {
				time.Sleep(time.Minute)
				fw.Action(watch.Bookmark, bookmark("2", nil))
			}
		}},
		{"changes every minute", func(_ *testing.T, _ *dynfake.FakeDynamicClient, fw *watch.RaceFreeFakeWatcher) {
			for range 6 {
				time.Sleep(time.Minute)
				if !fw.IsStopped() {
					fw.Modify(widget("ns", "a", "ua", "1", 1))
				}
			}
		}},
		{"new objects every minute", func(t *testing.T, c *dynfake.FakeDynamicClient, fw *watch.RaceFreeFakeWatcher) {
			for i := range 6 {
				time.Sleep(time.Minute)
				if !fw.IsStopped() {
					obj := widget("ns", fmt.Sprintf("new-%d", i), fmt.Sprintf("un%d", i), fmt.Sprint(10+i), 1)
					must(t, c.Tracker().Create(widgets.GroupVersionResource, obj, "ns"))
					fw.Add(obj)
				}
			}
		}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			synctest.Test(t, func(t *testing.T) {
				ws := &watches{}
				c, lists, q, _, w, stop := streamingRunOn(t, ws, widget("ns", "a", "ua", "1", 1))
				defer stop()
				fw := ws.last(t)
				fw.Add(widget("ns", "a", "ua", "1", 1))
				tc.serve(t, c, fw)
				synctest.Wait()
				if !w.Synced() || lists() != 1 || !fw.IsStopped() {
					t.Fatalf("Synced=%v lists=%d stream stopped=%v; want a fallback list", w.Synced(), lists(), fw.IsStopped())
				}
				// The list decides what is there: a again, and whatever the
				// stream showed, nothing deleted.
				as := 0
				for _, r := range q.take() {
					if r.Type == opkit.Deleted {
						t.Errorf("%v after the fallback: nothing was deleted", r)
					}
					if r == (record{Key: key("a"), Type: opkit.Added, RV: "1", UID: "ua", Priority: -1}) {
						as++
					}
				}
				if as < 2 {
					t.Errorf("a emitted %d times, want at least twice (replayed, then listed)", as)
				}
			})
		})
	}
}

func TestWorksWithTheRealQueue(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		c := abFake()
		q := queue.New[opkit.Key, opkit.Event[*Widget]](queue.Config[opkit.Event[*Widget]]{})
		stop := start(t, mustNew(t, watcher.Config[*Widget]{Client: c, Resource: widgets, Queue: q, Logger: discard}))
		defer stop()
		synctest.Wait()
		mustDo(t)(c.Resource(widgets.GroupVersionResource).Namespace("ns").Update(ctx, widget("ns", "b", "ub", "3", 2), metav1.UpdateOptions{}))
		synctest.Wait()
		if q.Len() != 2 {
			t.Fatalf("queue holds %d entries, want 2", q.Len())
		}
		// b's watch event (priority 0) is served before a's list entry (-1).
		for _, want := range []record{{Key: key("b"), Type: opkit.Modified, RV: "3"}, {Key: key("a"), Type: opkit.Added, RV: "1", Priority: -1}} {
			it, err := q.Get(ctx)
			if err != nil {
				t.Fatal(err)
			}
			if it.Key != want.Key || it.Value.Type != want.Type || it.Value.Object.ResourceVersion != want.RV || it.Priority != want.Priority || it.Value.Object.Spec.Size != 1 {
				t.Fatalf("Get = %v %v rv=%s prio=%d, want %v", it.Key, it.Value.Type, it.Value.Object.ResourceVersion, it.Priority, want)
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
		var mu sync.Mutex
		var got []opkit.Event[*Widget]
		cfg := config(c, nil)
		cfg.Queue = adderFunc(func(_ opkit.Key, ev opkit.Event[*Widget], _ queue.AddOptions) queue.Outcome {
			mu.Lock()
			got = append(got, ev)
			mu.Unlock()
			return queue.Queued
		})
		w := mustNew(t, cfg)
		stop := start(t, w)
		synctest.Wait()
		stop()
		must(t, c.Tracker().Delete(widgets.GroupVersionResource, "ns", "a"))
		stop = start(t, w)
		defer stop()
		synctest.Wait()
		mu.Lock()
		defer mu.Unlock()
		ts := got[len(got)-1]
		o := ts.Object
		if ts.Type != opkit.Deleted || !ts.FinalStateUnknown || o.Namespace != "ns" || o.Name != "a" || o.UID != "ua" ||
			o.ResourceVersion != "1" || o.Kind != "Widget" || o.APIVersion != "test.opkit.dev/v1" || o.Spec.Size != 0 {
			t.Fatalf("tombstone event = %+v", ts)
		}
	})
}

type adderFunc func(opkit.Key, opkit.Event[*Widget], queue.AddOptions) queue.Outcome

func (f adderFunc) Add(k opkit.Key, ev opkit.Event[*Widget], o queue.AddOptions) queue.Outcome {
	return f(k, ev, o)
}

// The same object deleted twice (it left a label selector, came back and
// left again): settling the first delete keeps the second, which the next
// Run emits again if it was never dealt with.
func TestSettleOfOneDeleteKeepsALaterDeleteOfTheSameObject(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		r := runAB(t, true)
		c, q, w, stop := r.c, r.q, r.w, r.stop
		fw := r.ws.last(t)
		fw.Delete(widget("ns", "b", "ub", "3", 1)) // leaves
		fw.Add(widget("ns", "b", "ub", "4", 1))    // comes back
		fw.Delete(widget("ns", "b", "ub", "5", 1)) // leaves again
		synctest.Wait()
		w.Settle(key("b"), "ub", "3") // the first delete's reconcile finished
		// b is outside the selector now: the next list does not show it.
		must(t, c.Tracker().Delete(widgets.GroupVersionResource, "ns", "b"))
		stop() // the term ends before the second delete ran
		q.take()
		stop = start(t, w)
		defer stop()
		synctest.Wait()
		for _, r := range q.take() {
			if r.Key == key("b") && r.Type == opkit.Deleted && r.RV == "5" {
				return
			}
		}
		t.Errorf("the next Run did not emit the second delete of b (rv 5) again; it was never settled")
	})
}

// A Run's first list by WatchList takes changes as they come: a delete
// that arrives before the end marker (a server that sends it late) is
// emitted once in the Run, as after a paged list, not a second time by
// the end of the list or by the name's recreation; the next Run's first
// list emits it again while it is not settled.
func TestWatchListDeleteBeforeTheEndMarkerIsEmittedOnce(t *testing.T) {
	for _, recreate := range []bool{false, true} {
		t.Run(fmt.Sprintf("recreated=%v", recreate), func(t *testing.T) {
			synctest.Test(t, func(t *testing.T) {
				ws := &watches{}
				c := newFake(widget("ns", "a", "ua", "1", 1))
				ws.install(c)
				q := &recorder{}
				cfg := config(c, q)
				cfg.Client = streaming{c}
				cfg.WatchList = watcher.WatchListAuto
				cfg.RetainDeletes = true
				w := mustNew(t, cfg)
				stop := start(t, w)
				synctest.Wait()
				fw := ws.last(t)
				fw.Add(widget("ns", "a", "ua", "1", 1))
				fw.Delete(widget("ns", "a", "ua", "2", 1)) // deleted after the snapshot
				if recreate {
					fw.Add(widget("ns", "a", "ua2", "3", 1))
				}
				fw.Action(watch.Bookmark, endMarker("3"))
				synctest.Wait()
				deletesOfUA := func(recs []record) (n int) {
					for _, r := range recs {
						if r.Type == opkit.Deleted && r.UID == "ua" {
							n++
						}
					}
					return n
				}
				if recs := q.take(); deletesOfUA(recs) != 1 {
					t.Errorf("ua's delete emitted %d times in the Run, want 1: %v", deletesOfUA(recs), recs)
				}
				stop()
				stop = start(t, w) // the next Run (the next term): not settled, so emitted again
				defer stop()
				synctest.Wait()
				ws.last(t).Action(watch.Bookmark, endMarker("4"))
				synctest.Wait()
				if recs := q.take(); deletesOfUA(recs) != 1 {
					t.Errorf("the next Run emitted ua's unsettled delete %d times, want 1: %v", deletesOfUA(recs), recs)
				}
			})
		})
	}
}

// A delete a WatchList streams before its end marker is an entry of the
// list, like the changes before it: the list's SyncFinished counts it.
func TestWatchListCountsADeleteBeforeTheEndMarker(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		ws, _, q, syncs, _, stop := streamingRun(t)
		defer stop()
		fw := ws.last(t)
		fw.Add(widget("ns", "a", "ua", "1", 1))
		fw.Add(widget("ns", "b", "ub", "2", 1))
		fw.Delete(widget("ns", "b", "ub", "3", 1)) // deleted after the snapshot
		fw.Action(watch.Bookmark, endMarker("3"))
		synctest.Wait()
		if recs := q.take(); len(recs) != 3 || recs[2].Type != opkit.Deleted {
			t.Fatalf("entries = %v, want a, b and b's delete", recs)
		}
		ev := syncs.take()
		if len(ev) != 2 || ev[1].Phase != watcher.SyncFinished || ev[1].Added != 2 || ev[1].Deleted != 1 {
			t.Fatalf("sync events = %+v, want SyncFinished with Added 2, Deleted 1", ev)
		}
	})
}

// The end marker is a bookmark the stream delivered: the watch the stream
// goes on as gets a full IdleTimeout from it, however long before it the
// last object came.
func TestWatchListEndMarkerKeepsTheWatchAlive(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		ws, _, _, _, w, stop := streamingRun(t)
		defer stop()
		fw := ws.last(t)
		fw.Add(widget("ns", "a", "ua", "1", 1))
		time.Sleep(watcher.DefaultIdleTimeout - time.Minute) // a server that sends the marker late
		fw.Action(watch.Bookmark, endMarker("3"))
		synctest.Wait()
		if !w.Synced() {
			t.Fatal("not synced after the end marker")
		}
		time.Sleep(watcher.DefaultIdleTimeout - time.Second)
		synctest.Wait()
		if fw.IsStopped() || len(ws.rvs()) != 1 {
			t.Fatalf("stream stopped=%v, %d watches, %v after the end marker; want it kept for IdleTimeout",
				fw.IsStopped(), len(ws.rvs()), watcher.DefaultIdleTimeout-time.Second)
		}
		time.Sleep(2 * time.Second)
		synctest.Wait()
		if rvs := ws.rvs(); !fw.IsStopped() || len(rvs) != 2 || rvs[1] != "3" {
			t.Fatalf("stream stopped=%v, watch RVs %v; want the silent watch restarted from 3", fw.IsStopped(), rvs)
		}
	})
}

// A server that refuses WatchList with an error event on the stream (not
// on the request) has not failed: the fallback list follows at once, and
// the backoff of a later failure starts from Base, as after a refusal of
// the request.
func TestWatchListRefusedByAnErrorEventIsNotAFailure(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		ws := &watches{}
		m := newMetrics()
		_, lists, _, _, w, stop := streamingRunWith(t, ws, func(c *watcher.Config[*Widget]) {
			c.Metrics = m
			c.Backoff = watcher.Backoff{Base: time.Second, Cap: 8 * time.Second}
		}, widget("ns", "a", "ua", "1", 1))
		defer stop()
		ws.last(t).Error(&metav1.Status{Status: metav1.StatusFailure, Code: 400, Reason: metav1.StatusReasonBadRequest,
			Message: "sendInitialEvents is forbidden for watch unless the WatchList feature gate is enabled"})
		synctest.Wait()
		if !w.Synced() || lists() != 1 || len(ws.rvs()) != 2 {
			t.Fatalf("Synced=%v lists=%d watches=%d; want a fallback list and a watch", w.Synced(), lists(), len(ws.rvs()))
		}
		if n := m.get(func(m *metrics) int { return len(m.errors) }); n != 0 {
			t.Errorf("errors = %v, want none for a refusal", m.errors)
		}
		ws.last(t).Stop() // the first failure: wait within [Base/2, Base]
		synctest.Wait()
		time.Sleep(time.Second)
		synctest.Wait()
		if n := len(ws.rvs()); n != 3 {
			t.Fatalf("%d watches a Base (1s) after the first failure, want the watch reopened (3)", n)
		}
	})
}

// The server ends every watch after its timeoutSeconds. One that ignores
// sendInitialEvents (and never sends the end marker) must still be given
// up on after IdleTimeout when IdleTimeout is longer than the watch
// timeout, not streamed again and again.
func TestWatchListWithALongIdleTimeoutFallsBackFromAServerThatNeverEndsItsInitialEvents(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		c := newFake(widget("ns", "a", "ua", "1", 1))
		lists := countLists(c)
		done := make(chan struct{})
		defer close(done)
		c.PrependWatchReactor("widgets", func(a k8stesting.Action) (bool, watch.Interface, error) {
			opts := a.(k8stesting.WatchActionImpl).ListOptions
			fw := watch.NewRaceFreeFake()
			fw.Add(widget("ns", "a", "ua", "1", 1)) // a replay, as for any watch from ""
			go func() {
				select {
				case <-time.After(time.Duration(*opts.TimeoutSeconds) * time.Second):
				case <-done:
				}
				fw.Stop()
			}()
			return true, fw, nil
		})
		cfg := config(c, &recorder{})
		cfg.Client = streaming{c}
		cfg.WatchList = watcher.WatchListAuto
		cfg.IdleTimeout = 15 * time.Minute
		w := mustNew(t, cfg)
		stop := start(t, w)
		defer stop()
		time.Sleep(time.Hour)
		synctest.Wait()
		if !w.Synced() || lists() == 0 {
			t.Fatalf("after an hour: Synced=%v lists=%d; want a fallback to a paginated list", w.Synced(), lists())
		}
	})
}

// A watch the server keeps closing at once delivers nothing: Check must
// not call that healthy.
func TestCheckReportsAWatchClosedAtOnce(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		r := runAB(t, false)
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

// WatchList streams that keep ending before their end marker (a proxy
// that cuts long streams, say) are given up on after three: the Run lists
// by pages, and until then Check says the list is not getting through.
func TestWatchListStreamsThatKeepEndingEarlyFallBackToPages(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		ws := &watches{}
		_, lists, _, _, w, stop := streamingRunOn(t, ws, widget("ns", "a", "ua", "1", 1))
		defer stop()
		for i := range 3 {
			fw := ws.last(t)
			fw.Add(widget("ns", "a", "ua", "1", 1))
			fw.Stop() // cut before the end marker
			synctest.Wait()
			if err := w.Check(); !errors.Is(err, watcher.ErrDisconnected) {
				t.Fatalf("Check after stream %d ended early = %v, want ErrDisconnected", i+1, err)
			}
			if lists() != 0 || w.Synced() {
				t.Fatalf("after stream %d ended early: lists=%d Synced=%v, want WatchList tried again", i+1, lists(), w.Synced())
			}
			time.Sleep(watcher.DefaultBackoffCap)
			synctest.Wait()
		}
		if lists() != 1 || !w.Synced() {
			t.Fatalf("after 3 streams ended early: lists=%d Synced=%v, want a paginated list", lists(), w.Synced())
		}
		if n := len(ws.rvs()); n != 4 {
			t.Fatalf("%d watch requests, want 3 streams and the watch after the list", n)
		}
		if err := w.Check(); err != nil {
			t.Fatalf("Check once listed and watching = %v", err)
		}
	})
}
