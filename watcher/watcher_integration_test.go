//go:build integration

package watcher_test

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"
	"testing"
	"time"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/dynamic"

	"github.com/opkit/opkit"
	"github.com/opkit/opkit/internal/logsink"
	"github.com/opkit/opkit/internal/testcluster"
	"github.com/opkit/opkit/queue"
	"github.com/opkit/opkit/watcher"
)

// tee hands every add to a recorder and to a real queue.
type tee struct {
	r *recorder
	q *queue.Queue[opkit.Key, opkit.Cause[*Widget]]
}

func (t tee) Add(k opkit.Key, c opkit.Cause[*Widget], o queue.AddOptions) queue.Outcome {
	t.r.Add(k, c, o)
	return t.q.Add(k, c, o)
}

func name(i int) string { return fmt.Sprintf("w%04d", i) }

func setSize(ctx context.Context, res dynamic.ResourceInterface, i, size int) (string, error) {
	u, err := res.Patch(ctx, name(i), types.MergePatchType, fmt.Appendf(nil, `{"spec":{"size":%d}}`, size), metav1.PatchOptions{})
	if err != nil {
		return "", err
	}
	return u.GetResourceVersion(), nil
}

func waitSynced(t *testing.T, w *watcher.Watcher[*Widget]) {
	t.Helper()
	eventually(t, time.Minute, "synced", func() error { return w.Check() })
}

// lastByKey returns each key's latest record.
func lastByKey(rs []record) map[opkit.Key]record {
	m := map[opkit.Key]record{}
	for _, r := range rs {
		m[r.Key] = r
	}
	return m
}

// (a) 1,000 objects: 500 exist before the watcher starts, 500 are created
// while it watches, then all are changed twice. Every final state is
// observed, every write produces exactly one entry (the watcher adds no
// duplicates; only the queue coalesces, down to one entry per key).
func TestIntegrationThousandObjectsEveryStateExactlyOnce(t *testing.T) {
	c := testcluster.Shared(t)
	installWidgets(t, c)
	ns := c.Namespace(t)
	d := dyn(t, c.Config())
	res := d.Resource(widgets.GroupVersionResource).Namespace(ns)
	ctx := context.Background()
	const n = 1000
	create := func(i int) error {
		_, err := res.Create(ctx, newWidget(ns, name(i), 1), metav1.CreateOptions{})
		return err
	}
	parallel(t, n/2, create)

	rec := &recorder{}
	q := queue.New[opkit.Key](queue.Config[opkit.Cause[*Widget]]{Merge: (*opkit.Cause[*Widget]).Merge})
	syncs := &syncLog{}
	logs := &logsink.Buffer{}
	w := mustNew(t, watcher.Config[*Widget]{
		Client: d, Resource: widgets, Namespace: ns, Queue: tee{rec, q},
		PageSize: 100, OnSync: syncs.add, Logger: logs.Logger(),
	})
	stop := start(t, w)
	defer stop()
	waitSynced(t, w)

	parallel(t, n/2, func(i int) error { return create(n/2 + i) })
	final := make([]string, n)
	for size := 2; size <= 3; size++ {
		parallel(t, n, func(i int) (err error) {
			final[i], err = setSize(ctx, res, i, size)
			return err
		})
	}
	eventually(t, 2*time.Minute, "every final state observed", func() error {
		last := lastByKey(rec.all())
		for i := range n {
			if got := last[opkit.Key{Namespace: ns, Name: name(i)}]; got.RV != final[i] {
				return fmt.Errorf("%s: last seen rv %q, want %q", name(i), got.RV, final[i])
			}
		}
		return nil
	})

	all := rec.all()
	seen := map[record]bool{}
	perKey := map[opkit.Key][]record{}
	for _, r := range all {
		if seen[r] {
			t.Errorf("duplicate entry %v", r)
		}
		seen[r] = true
		perKey[r.Key] = append(perKey[r.Key], r)
	}
	if len(perKey) != n || len(all) != 3*n {
		t.Fatalf("%d entries for %d keys, want %d for %d (one per write)", len(all), len(perKey), 3*n, n)
	}
	for k, rs := range perKey {
		// Created while watching, or found by the initial list: never
		// reconciled (no status.observedGeneration), so work at the
		// watch's priority either way.
		const wantPrio = 0
		if rs[0].Type != opkit.Added || rs[0].Priority != wantPrio || rs[1].Type != opkit.Modified || rs[2].Type != opkit.Modified {
			t.Fatalf("%v: entries %v, want Added (priority %d) then two Modified", k, rs, wantPrio)
		}
	}
	if q.Len() != n {
		t.Fatalf("real queue holds %d entries, want %d (coalesced per key)", q.Len(), n)
	}
	ev := syncs.take()
	if len(ev) != 2 || ev[1].Added != n/2 {
		t.Fatalf("sync events %+v, want one list of %d", ev, n/2)
	}
	t.Logf("initial sync: watch RV %s", ev[1].ResourceVersion)
}

// (b) The watcher's API server is down for 5 s while objects are created,
// changed and deleted through a second API server on the same etcd. After
// it is back, every change and every delete is observed, and nothing is
// emitted for untouched objects.
func TestIntegrationAPIServerOutageLosesNothing(t *testing.T) {
	c := testcluster.Start(t, testcluster.Options{APIServers: 2})
	installWidgets(t, c)
	ns := c.Namespace(t)
	ctx := context.Background()
	res := dyn(t, c.ConfigFor(1)).Resource(widgets.GroupVersionResource).Namespace(ns)
	parallel(t, 30, func(i int) error {
		_, err := res.Create(ctx, newWidget(ns, name(i), 1), metav1.CreateOptions{})
		return err
	})

	rec := &recorder{}
	m := newMetrics()
	logs := &logsink.Buffer{}
	w := mustNew(t, watcher.Config[*Widget]{
		Client: dyn(t, c.ConfigFor(0)), Resource: widgets, Namespace: ns, Queue: rec,
		Backoff: watcher.Backoff{Base: 100 * time.Millisecond, Cap: time.Second},
		Metrics: m, Logger: logs.Logger(),
	})
	stop := start(t, w)
	defer stop()
	waitSynced(t, w)
	if got := len(rec.take()); got != 30 {
		t.Fatalf("initial list emitted %d entries, want 30", got)
	}

	if err := c.StopAPIServer(0); err != nil {
		t.Fatal(err)
	}
	outage := time.Now()
	changed := map[opkit.Key]string{}
	for i := 30; i < 40; i++ { // created
		u, err := res.Create(ctx, newWidget(ns, name(i), 1), metav1.CreateOptions{})
		if err != nil {
			t.Fatal(err)
		}
		changed[opkit.Key{Namespace: ns, Name: name(i)}] = u.GetResourceVersion()
	}
	for i := range 10 { // changed twice
		setSize(ctx, res, i, 2)
		rv, err := setSize(ctx, res, i, 3)
		if err != nil {
			t.Fatal(err)
		}
		changed[opkit.Key{Namespace: ns, Name: name(i)}] = rv
	}
	deleted := map[opkit.Key]bool{}
	for i := 10; i < 20; i++ {
		if err := res.Delete(ctx, name(i), metav1.DeleteOptions{}); err != nil {
			t.Fatal(err)
		}
		deleted[opkit.Key{Namespace: ns, Name: name(i)}] = true
	}
	eventually(t, 30*time.Second, "Check reports the outage", func() error {
		if err := w.Check(); !errors.Is(err, watcher.ErrDisconnected) {
			return fmt.Errorf("Check = %v", err)
		}
		return nil
	})
	time.Sleep(time.Until(outage.Add(5 * time.Second))) // the outage lasts 5 s
	if err := c.StartAPIServer(0); err != nil {
		t.Fatal(err)
	}

	eventually(t, 2*time.Minute, "every change and delete observed", func() error {
		last := lastByKey(rec.all())
		for k, rv := range changed {
			if last[k].RV != rv || last[k].Type == opkit.Deleted {
				return fmt.Errorf("%v: last entry %v, want rv %s", k, last[k], rv)
			}
		}
		for k := range deleted {
			if last[k].Type != opkit.Deleted {
				return fmt.Errorf("%v: last entry %v, want Deleted", k, last[k])
			}
		}
		return w.Check()
	})
	for _, r := range rec.all() {
		if i := r.Key.Name; i >= name(20) && i < name(30) {
			t.Errorf("entry for untouched object: %v", r)
		}
	}
	t.Logf("relists %v, watch restarts %v, errors %v", m.relists, m.restarts, m.errors)
}

// (c) etcd compaction past the watcher's resourceVersion. The watcher's API
// server (watch cache off, so a resume is served by etcd) is stopped; through
// the second one objects are changed, deleted and created, then etcd is
// compacted. When the server is back, the watcher's resume from its old
// resourceVersion must fail with 410, and the relist must emit exactly the
// changed (Modified), vanished (Deleted tombstones) and new (Added) objects.
func TestIntegrationCompactionRelistEmitsExactlyTheDifferences(t *testing.T) {
	c := testcluster.Start(t, testcluster.Options{APIServers: 2, DisableWatchCache: true})
	installWidgets(t, c)
	ns := c.Namespace(t)
	ctx := context.Background()
	res := dyn(t, c.ConfigFor(1)).Resource(widgets.GroupVersionResource).Namespace(ns)
	uids := map[string]string{}
	rvs := map[string]string{}
	for i := range 20 {
		u, err := res.Create(ctx, newWidget(ns, name(i), 1), metav1.CreateOptions{})
		if err != nil {
			t.Fatal(err)
		}
		uids[name(i)], rvs[name(i)] = string(u.GetUID()), u.GetResourceVersion()
	}

	rec := &recorder{}
	m := newMetrics()
	syncs := &syncLog{}
	w := mustNew(t, watcher.Config[*Widget]{
		Client: dyn(t, c.ConfigFor(0)), Resource: widgets, Namespace: ns, Queue: rec,
		Backoff: watcher.Backoff{Base: 100 * time.Millisecond, Cap: time.Second},
		Metrics: m, OnSync: syncs.add, Logger: (&logsink.Buffer{}).Logger(),
	})
	stop := start(t, w)
	defer stop()
	waitSynced(t, w)
	if got := len(rec.take()); got != 20 {
		t.Fatalf("initial list emitted %d entries, want 20", got)
	}
	syncs.take()

	if err := c.StopAPIServer(0); err != nil {
		t.Fatal(err)
	}
	var want []record
	for i := range 5 {
		rv, err := setSize(ctx, res, i, 9)
		if err != nil {
			t.Fatal(err)
		}
		// Changed and not reconciled since: work, at the watch's priority.
		want = append(want, record{Key: opkit.Key{Namespace: ns, Name: name(i)}, Type: opkit.Modified, RV: rv, UID: uids[name(i)], Priority: 0})
	}
	for i := 5; i < 10; i++ {
		if err := res.Delete(ctx, name(i), metav1.DeleteOptions{}); err != nil {
			t.Fatal(err)
		}
		// A delete is work, at the watch's priority.
		want = append(want, record{Key: opkit.Key{Namespace: ns, Name: name(i)}, Type: opkit.Deleted, RV: rvs[name(i)], UID: uids[name(i)], Final: true, Priority: 0})
	}
	for i := 20; i < 23; i++ {
		u, err := res.Create(ctx, newWidget(ns, name(i), 1), metav1.CreateOptions{})
		if err != nil {
			t.Fatal(err)
		}
		// Never reconciled (no status.observedGeneration): work, at the
		// watch's priority.
		want = append(want, record{Key: opkit.Key{Namespace: ns, Name: name(i)}, Type: opkit.Added, RV: u.GetResourceVersion(), UID: string(u.GetUID()), Priority: 0})
	}
	rev, err := c.Compact(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if err := c.StartAPIServer(0); err != nil {
		t.Fatal(err)
	}

	eventually(t, 2*time.Minute, "relist after 410", func() error {
		for _, e := range syncs.take() {
			if e.Phase == watcher.SyncFinished {
				if e.Reason != watcher.ReasonExpired || e.Initial {
					return fmt.Errorf("unexpected sync %+v", e)
				}
				return nil
			}
		}
		return errors.New("no relist yet")
	})
	slices.SortStableFunc(want, func(a, b record) int { return strings.Compare(a.Key.Name, b.Key.Name) })
	sameRecords(t, "relist entries", byKey(rec.take()), want)
	if got := m.get(func(m *metrics) int { return m.relists[watcher.ReasonExpired] }); got != 1 {
		t.Errorf("relists %v, want exactly one expired", m.relists)
	}
	t.Logf("compacted at revision %d", rev)
}

// (d) A watcher running as a user without RBAC grants reports a clear
// permission error in Check and in its logs once queue.TransientRefusals
// refusals came in a row (the first are warnings: a just-started API
// server refuses too), and does not hammer the server.
func TestIntegrationUnprivilegedUserGetsAClearPermissionError(t *testing.T) {
	c := testcluster.Shared(t)
	installWidgets(t, c)
	ns := c.Namespace(t)
	logs := &logsink.Buffer{}
	m := newMetrics()
	w := mustNew(t, watcher.Config[*Widget]{
		Client: dyn(t, c.UserConfig()), Resource: widgets, Namespace: ns, Queue: &recorder{},
		Metrics: m, Logger: logs.Logger(),
	})
	stop := start(t, w)
	defer stop()
	var err error
	eventually(t, 30*time.Second, "permission error reported", func() error {
		if err = w.Check(); !apierrors.IsForbidden(err) {
			return fmt.Errorf("Check = %v, want a 403", err)
		}
		return nil
	})
	if !errors.Is(err, watcher.ErrNotSynced) || !strings.Contains(err.Error(), testcluster.UnprivilegedUser) ||
		!strings.Contains(err.Error(), "widgets") {
		t.Fatalf("Check = %v; want not synced, naming the user and the resource", err)
	}
	eventually(t, 30*time.Second, "permission error logged", func() error {
		if l := logs.String(); !strings.Contains(l, "level=ERROR") || !strings.Contains(l, "permission denied") {
			return fmt.Errorf("logs do not report the permission error:\n%s", l)
		}
		return nil
	})
	refusals := m.get(func(m *metrics) int { return m.errors[watcher.ReasonForbidden] })
	if l := logs.String(); refusals != queue.TransientRefusals+1 || strings.Count(l, "refused; retrying") != queue.TransientRefusals {
		t.Fatalf("%d refusals, then the error; want %d warned about first:\n%s", refusals, queue.TransientRefusals, l)
	}
	time.Sleep(3 * time.Second) // room for a hot loop, if there were one
	if got := m.get(func(m *metrics) int { return m.errors[watcher.ReasonForbidden] }); got > refusals+1 {
		t.Fatalf("%d forbidden attempts in the 3s after the error, want at most 1 (slow retry)", got-refusals)
	}
	if w.Synced() {
		t.Fatal("synced without permission")
	}
	t.Logf("Check: %v", err)
}

var _ = unstructured.Unstructured{}
