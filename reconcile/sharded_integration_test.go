//go:build integration

package reconcile_test

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/dynamic"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"

	"github.com/opkit/opkit"
	"github.com/opkit/opkit/internal/testcluster"
	"github.com/opkit/opkit/leader"
	"github.com/opkit/opkit/reconcile"
	"github.com/opkit/opkit/watcher"
)

// ledger is what the replicas' reconcilers record: per UID, the replica
// working on it now and the newest generation reconciled; objects
// finalized; and every time two replicas worked on one object at once.
type ledger struct {
	mu       sync.Mutex
	inFlight map[types.UID]string
	gen      map[types.UID]int64
	deleted  map[types.UID]bool
	overlaps []string
}

// reconciler returns replica's reconciler: it records, holds each object
// a moment (so that overlaps would show), keeps a finalizer on live
// objects (so that every delete is served, whichever replica holds the
// shard then) and records the finalize step.
func (l *ledger) reconciler(replica string, fin *reconcile.Finalizer[*Widget]) reconcile.Func[*Widget] {
	return func(ctx context.Context, req reconcile.Request[*Widget]) (reconcile.Result, error) {
		uid := req.Object.UID
		l.mu.Lock()
		if other, busy := l.inFlight[uid]; busy {
			l.overlaps = append(l.overlaps, fmt.Sprintf("%s (%s) by %s while %s", req.Key, uid, replica, other))
		}
		l.inFlight[uid] = replica
		l.mu.Unlock()
		select {
		case <-time.After(5 * time.Millisecond):
		case <-ctx.Done():
		}
		l.mu.Lock()
		defer l.mu.Unlock()
		delete(l.inFlight, uid)
		if ctx.Err() != nil {
			return reconcile.Done(), ctx.Err()
		}
		if req.Type == opkit.Deleted {
			return reconcile.Done(), nil // the finalizer served it
		}
		l.mu.Unlock()
		w, live, err := fin.Handle(ctx, req.Object, func(context.Context, *Widget) error {
			l.mu.Lock()
			l.deleted[uid] = true
			l.mu.Unlock()
			return nil
		})
		l.mu.Lock()
		if err != nil || !live {
			return reconcile.Done(), err
		}
		l.gen[uid] = max(l.gen[uid], w.Generation)
		return reconcile.Done(), nil
	}
}

// cuttable is an http.RoundTripper that fails every request once cut, as
// a crashed or partitioned replica's would.
type cuttable struct {
	rt  http.RoundTripper
	cut *atomic.Bool
}

func (c cuttable) RoundTrip(r *http.Request) (*http.Response, error) {
	if c.cut.Load() {
		return nil, errors.New("replica cut off")
	}
	return c.rt.RoundTrip(r)
}

type shardedReplica struct {
	cut    atomic.Bool
	cancel context.CancelFunc
	done   chan error
}

// Three replicas share eight shards under churn: objects created,
// changed, deleted and created again under the same names while a replica
// leaves, another joins and one crashes. Every object converges (its
// newest generation reconciled, every delete reconciled), no object is
// reconciled by two replicas at once (from the reconcilers' own records),
// and after each change settles every shard's Lease is held by exactly
// one live replica, none holding more than its share.
//
// It runs with the ShardedListAndWatch gate (the API server filters) and
// without it (every shard's watcher filters on its side).
func TestIntegrationShardedReplicasShareTheWorkUnderChurn(t *testing.T) {
	t.Run("gate=on", func(t *testing.T) {
		dyn, ns := realCluster(t)
		shardedUnderChurn(t, testcluster.Shared(t), dyn, ns)
	})
	t.Run("gate=off", func(t *testing.T) {
		c, dyn, _, ns := privateWidgets(t, testcluster.Options{DisableShardedListAndWatch: true})
		shardedUnderChurn(t, c, dyn, ns)
	})
}

func shardedUnderChurn(t *testing.T, c *testcluster.Cluster, dyn dynamic.Interface, ns string) {
	res := dyn.Resource(widgets.GroupVersionResource).Namespace(ns)
	ctx := context.Background()
	const shards, n = 8, 120
	l := &ledger{inFlight: map[types.UID]string{}, gen: map[types.UID]int64{}, deleted: map[types.UID]bool{}}

	start := func(name string) *shardedReplica {
		r := &shardedReplica{done: make(chan error, 1)}
		cfg := rest.CopyConfig(c.Config())
		cfg.QPS, cfg.Burst = -1, 0
		cfg.WrapTransport = func(rt http.RoundTripper) http.RoundTripper { return cuttable{rt, &r.cut} }
		kube, err := kubernetes.NewForConfig(cfg)
		if err != nil {
			t.Fatal(err)
		}
		d, err := dynamic.NewForConfig(cfg)
		if err != nil {
			t.Fatal(err)
		}
		fin, err := reconcile.NewFinalizer[*Widget](d, widgets, "test.opkit.dev/sharded")
		if err != nil {
			t.Fatal(err)
		}
		s, err := reconcile.NewController(reconcile.Config[*Widget]{
			Name: "test.opkit.dev/sharded", Resource: widgets, Dynamic: d, Reconciler: l.reconciler(name, fin), Shards: opkit.Shards{Count: shards},
			Concurrency: 2, NoEvents: true, Logger: quiet, Watch: watcher.Config[*Widget]{Namespace: ns},
			Leader: &leader.Config{Client: kube, Namespace: ns, Name: "sharded", Identity: name,
				LeaseDuration: 6 * time.Second, RenewDeadline: 4 * time.Second, RetryPeriod: 500 * time.Millisecond},
		})
		if err != nil {
			t.Fatal(err)
		}
		rctx, cancel := context.WithCancel(ctx)
		r.cancel = cancel
		go func() { r.done <- s.Run(rctx) }()
		t.Cleanup(func() { r.stop(t) })
		return r
	}

	uids := map[string]types.UID{} // name -> the UID of its current object
	var mu sync.Mutex
	createAll := func(from, to int) {
		for i := from; i < to; i++ {
			w := create(t, dyn, ns, fmt.Sprintf("w%03d", i), 1)
			mu.Lock()
			uids[w.Name] = w.UID
			mu.Unlock()
		}
	}
	bumpAll := func(size int) {
		for name := range uids {
			patch := fmt.Appendf(nil, `{"spec":{"size":%d}}`, size)
			if _, err := res.Patch(ctx, name, types.MergePatchType, patch, metav1.PatchOptions{}); err != nil && !apierrors.IsNotFound(err) {
				t.Fatal(err)
			}
		}
	}

	// converged waits until every object's newest generation and every
	// delete of gone was reconciled.
	var gone []types.UID
	converged := func(within time.Duration) {
		t.Helper()
		eventually(t, within, "every object and delete reconciled", func() error {
			list, err := res.List(ctx, metav1.ListOptions{})
			if err != nil {
				return err
			}
			l.mu.Lock()
			defer l.mu.Unlock()
			var behind []string
			for _, u := range list.Items {
				if l.gen[u.GetUID()] != u.GetGeneration() {
					behind = append(behind, fmt.Sprintf("%s at %d of %d", u.GetName(), l.gen[u.GetUID()], u.GetGeneration()))
				}
			}
			for _, uid := range gone {
				if !l.deleted[uid] {
					behind = append(behind, "the delete of "+string(uid))
				}
			}
			if len(behind) > 0 {
				return fmt.Errorf("%d behind: %s", len(behind), strings.Join(behind[:min(5, len(behind))], ", "))
			}
			return nil
		})
	}

	kube, err := kubernetes.NewForConfig(c.Config())
	if err != nil {
		t.Fatal(err)
	}
	spread := func(live ...string) { waitSpread(t, kube, ns, "sharded", shards, live...) }

	start("a")
	b, cr := start("b"), start("c")
	createAll(0, n)
	bumpAll(2)
	converged(time.Minute) // every object has the finalizer
	spread("a", "b", "c")

	cr.stop(t) // leaves gracefully
	start("d")
	for i := range 20 { // deleted; half of them created again: new UIDs
		name := fmt.Sprintf("w%03d", i)
		if err := res.Delete(ctx, name, metav1.DeleteOptions{}); err != nil {
			t.Fatal(err)
		}
		gone = append(gone, uids[name])
		delete(uids, name)
	}
	eventually(t, time.Minute, "the deleted objects gone", func() error {
		list, err := res.List(ctx, metav1.ListOptions{})
		if err != nil || len(list.Items) != n-20 {
			return fmt.Errorf("%d objects, %v", len(list.Items), err)
		}
		return nil
	})
	createAll(0, 10)
	bumpAll(3)
	converged(2 * time.Minute)
	spread("a", "b", "d")

	b.cut.Store(true) // crashes: neither releases nor deletes anything
	bumpAll(4)

	converged(2 * time.Minute)

	spread("a", "d")
	l.mu.Lock()
	defer l.mu.Unlock()
	if len(l.overlaps) > 0 {
		t.Fatalf("%d reconciles overlapped another replica's of the same object: %v", len(l.overlaps), l.overlaps)
	}
}

// stop ends the replica (at most once) and checks that Run returned nil
// unless it was cut off.
func (r *shardedReplica) stop(t *testing.T) {
	if r.cancel == nil {
		return
	}
	r.cancel()
	r.cancel = nil
	if err := <-r.done; err != nil && !r.cut.Load() {
		t.Errorf("Run: %v", err)
	}
}

// waitSpread waits until every shard Lease (group-i, i < shards) in ns is
// held by one of live, none holding more than its share, and returns the
// holders.
func waitSpread(t *testing.T, kube kubernetes.Interface, ns, group string, shards int, live ...string) []string {
	t.Helper()
	share := (shards + len(live) - 1) / len(live)
	holders := make([]string, shards)
	eventually(t, time.Minute, fmt.Sprintf("every shard held by one of %v, at most %d each", live, share), func() error {
		held := map[string]int{}
		for i := range shards {
			lease, err := kube.CoordinationV1().Leases(ns).Get(context.Background(), fmt.Sprintf("%s-%d", group, i), metav1.GetOptions{})
			if err != nil {
				return err
			}
			h := ""
			if lease.Spec.HolderIdentity != nil {
				h = *lease.Spec.HolderIdentity
			}
			if !slices.Contains(live, h) {
				return fmt.Errorf("shard %d held by %q", i, h)
			}
			if held[h]++; held[h] > share {
				return fmt.Errorf("%s holds more than %d", h, share)
			}
			holders[i] = h
		}
		return nil
	})
	return holders
}
