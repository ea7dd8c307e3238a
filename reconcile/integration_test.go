//go:build integration

package reconcile_test

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/dynamic"

	"github.com/opkit/opkit"
	"github.com/opkit/opkit/internal/testcluster"
	"github.com/opkit/opkit/internal/typed"
	"github.com/opkit/opkit/queue"
	"github.com/opkit/opkit/reconcile"
)

func TestMain(m *testing.M) { testcluster.Main(m) }

// realCluster returns a dynamic client for the shared cluster with the
// widgets CRD served (status subresource, so generation tracks the spec),
// and a fresh namespace.
func realCluster(t *testing.T) (dynamic.Interface, string) {
	t.Helper()
	c := testcluster.Shared(t)
	cfg := c.Config()
	cfg.QPS, cfg.Burst = -1, 0
	dyn, err := dynamic.NewForConfig(cfg)
	if err != nil {
		t.Fatal(err)
	}
	crd := testcluster.CRD{Resource: widgets.GroupVersionResource, Kind: widgets.Kind, Namespaced: true}
	if err := c.InstallCRD(context.Background(), crd); err != nil {
		t.Fatal(err)
	}
	return dyn, c.Namespace(t)
}

func eventually(t *testing.T, within time.Duration, what string, f func() error) {
	t.Helper()
	deadline := time.Now().Add(within)
	for {
		err := f()
		if err == nil {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("%s: not within %v: %v", what, within, err)
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// runController builds a controller from cfg and runs it until the test
// ends, failing the test if Run returns an error.
func runController(t *testing.T, cfg reconcile.Config[*Widget]) *reconcile.Controller[*Widget] {
	t.Helper()
	ctrl, err := reconcile.NewController(cfg)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- ctrl.Run(ctx) }()
	t.Cleanup(func() {
		cancel()
		if err := <-done; err != nil {
			t.Errorf("Run: %v", err)
		}
	})
	return ctrl
}

func create(t *testing.T, dyn dynamic.Interface, ns, name string, size int) *Widget {
	t.Helper()
	w := &Widget{TypeMeta: metav1.TypeMeta{APIVersion: "test.opkit.dev/v1", Kind: "Widget"}, ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: name}, Spec: WidgetSpec{Size: size}}
	u, _ := typed.ToUnstructured(w)
	out, err := dyn.Resource(widgets.GroupVersionResource).Namespace(ns).Create(context.Background(), u, metav1.CreateOptions{})
	if err != nil {
		t.Fatal(err)
	}
	got, err := typed.FromUnstructured[*Widget](out)
	if err != nil {
		t.Fatal(err)
	}
	return got
}

func TestIntegrationFinalizerFlow(t *testing.T) {
	dyn, ns := realCluster(t)
	ctx := context.Background()
	client := typed.New[*Widget](dyn, widgets)
	f, err := reconcile.NewFinalizer[*Widget](dyn, widgets, fin)
	if err != nil {
		t.Fatal(err)
	}
	stale := create(t, dyn, ns, "w", 1)
	key := opkit.KeyOf(stale)

	// Another writer adds its finalizer after we read: our patch, computed
	// from the stale resourceVersion, must conflict and be recomputed.
	other, _ := client.Get(ctx, key)
	other.Finalizers = []string{"other.opkit.dev/keep"}
	if _, err := client.Update(ctx, other); err != nil {
		t.Fatal(err)
	}
	out, live, err := f.Handle(ctx, stale, nil)
	if err != nil || !live {
		t.Fatalf("Handle = (%v, %v)", live, err)
	}
	if want := []string{"other.opkit.dev/keep", fin}; !slices.Equal(out.Finalizers, want) {
		t.Fatalf("finalizers %v, want %v (the other writer's kept)", out.Finalizers, want)
	}

	// kubectl delete: the finalizers hold the object.
	if err := client.Dynamic(ns).Delete(ctx, "w", metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
	deleting, _ := client.Get(ctx, key)
	if deleting.DeletionTimestamp == nil {
		t.Fatal("no deletionTimestamp after delete")
	}
	if _, live, err := f.Handle(ctx, deleting, func(context.Context, *Widget) error { return errors.New("cloud down") }); err == nil || live {
		t.Fatalf("Handle with a failing finalize = (%v, %v), want an error", live, err)
	}
	if got, _ := client.Get(ctx, key); !slices.Contains(got.Finalizers, fin) {
		t.Fatalf("finalizer removed although finalize failed: %v", got.Finalizers)
	}
	finalized := 0
	if _, live, err := f.Handle(ctx, deleting, func(context.Context, *Widget) error { finalized++; return nil }); err != nil || live || finalized != 1 {
		t.Fatalf("Handle = (%v, %v), finalized %d", live, err, finalized)
	}
	got, err := client.Get(ctx, key)
	if err != nil || !slices.Equal(got.Finalizers, []string{"other.opkit.dev/keep"}) {
		t.Fatalf("after finalize: %v, %v; want only the other finalizer left", got, err)
	}
	// The other writer lets go: the object is gone.
	got.Finalizers = nil
	if _, err := client.Update(ctx, got); err != nil {
		t.Fatal(err)
	}
	if _, err := client.Get(ctx, key); !apierrors.IsNotFound(err) {
		t.Fatalf("Get after last finalizer = %v, want NotFound", err)
	}
}

func TestIntegrationStatusRetriesAConflictOnTheFreshObject(t *testing.T) {
	dyn, ns := realCluster(t)
	ctx := context.Background()
	client := typed.New[*Widget](dyn, widgets)
	stale := create(t, dyn, ns, "w", 1)
	// The spec changes after our read: generation 2, a new resourceVersion.
	fresh, _ := client.Get(ctx, opkit.KeyOf(stale))
	fresh.Spec.Size = 5
	if _, err := client.Update(ctx, fresh); err != nil {
		t.Fatal(err)
	}
	st, err := reconcile.NewStatus[*Widget](reconcile.StatusConfig{Dynamic: dyn, Resource: widgets})
	if err != nil {
		t.Fatal(err)
	}
	var sizes []int
	out, err := st.Update(ctx, stale, func(w *Widget) error {
		sizes = append(sizes, w.Spec.Size)
		w.Status.Phase = "Sized"
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	if !slices.Equal(sizes, []int{1, 5}) {
		t.Fatalf("mutate saw sizes %v, want [1 5]: a 409, then the fresh object", sizes)
	}
	got, _ := client.Get(ctx, opkit.KeyOf(stale))
	if got.Status.Phase != "Sized" || got.Status.ObservedGeneration != 2 || got.Spec.Size != 5 || out.ResourceVersion != got.ResourceVersion {
		t.Fatalf("stored %+v %+v, want phase Sized, observedGeneration 2, size 5", got.Spec, got.Status)
	}
}

// finalizingReconciler adds a finalizer, sets the status, and records
// what it was asked to do.
type finalizingReconciler struct {
	fin       *reconcile.Finalizer[*Widget]
	status    *reconcile.Status[*Widget]
	mu        sync.Mutex
	finalized []string
	deleted   []string
	calls     atomic.Int32
}

func (r *finalizingReconciler) Reconcile(ctx context.Context, req reconcile.Request[*Widget]) (reconcile.Result, error) {
	r.calls.Add(1)
	if req.Type == opkit.Deleted {
		r.mu.Lock()
		r.deleted = append(r.deleted, req.Key.Name)
		r.mu.Unlock()
		return reconcile.Done(), nil
	}
	w, live, err := r.fin.Handle(ctx, req.Object, func(_ context.Context, w *Widget) error {
		r.mu.Lock()
		r.finalized = append(r.finalized, w.Name)
		r.mu.Unlock()
		return nil
	})
	if err != nil || !live {
		return reconcile.Done(), err
	}
	_, err = r.status.Update(ctx, w, func(w *Widget) error { w.Status.Phase = "Ready"; return nil })
	return reconcile.Done(), err
}

func TestIntegrationControllerRunsTheFinalizerFlowEndToEnd(t *testing.T) {
	dyn, ns := realCluster(t)
	ctx := context.Background()
	client := typed.New[*Widget](dyn, widgets)
	f, _ := reconcile.NewFinalizer[*Widget](dyn, widgets, fin)
	st, _ := reconcile.NewStatus[*Widget](reconcile.StatusConfig{Dynamic: dyn, Resource: widgets})
	r := &finalizingReconciler{fin: f, status: st}
	cfg := reconcile.Config[*Widget]{Name: "test.opkit.dev/widgets", Resource: widgets, Dynamic: dyn, Reconciler: r, Logger: quiet}
	cfg.Watch.Namespace = ns
	cfg.Watch.SkipStatusOnly = true
	ctrl := runController(t, cfg)

	w := create(t, dyn, ns, "w", 2)
	key := opkit.KeyOf(w)
	eventually(t, time.Minute, "finalizer and status", func() error {
		got, err := client.Get(ctx, key)
		if err != nil {
			return err
		}
		if !slices.Contains(got.Finalizers, fin) || got.Status.Phase != "Ready" || got.Status.ObservedGeneration != got.Generation {
			return errors.New("not yet: " + got.Status.Phase)
		}
		return nil
	})
	eventually(t, time.Minute, "controller ready", ctrl.Check)

	if err := client.Dynamic(ns).Delete(ctx, "w", metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
	eventually(t, time.Minute, "object gone after finalize", func() error {
		if _, err := client.Get(ctx, key); !apierrors.IsNotFound(err) {
			return errors.New("still there")
		}
		r.mu.Lock()
		defer r.mu.Unlock()
		if len(r.deleted) == 0 {
			return errors.New("no Deleted request yet")
		}
		return nil
	})
	r.mu.Lock()
	defer r.mu.Unlock()
	if !slices.Equal(r.finalized, []string{"w"}) || !slices.Equal(r.deleted, []string{"w"}) {
		t.Fatalf("finalized %v, deleted %v; want each once", r.finalized, r.deleted)
	}
}

// labelReconciler records every request and fails the first Deleted one
// once the test says so, so that its retry meets the object's return.
type labelReconciler struct {
	mu       sync.Mutex
	calls    []reconcile.Request[*Widget]
	deleting chan struct{} // closed when the first Deleted request starts
	release  chan struct{} // the first Deleted request fails when this closes
	once     sync.Once
}

func (r *labelReconciler) Reconcile(ctx context.Context, req reconcile.Request[*Widget]) (reconcile.Result, error) {
	r.mu.Lock()
	r.calls = append(r.calls, req)
	first := req.Type == opkit.Deleted && req.Retries == 0
	r.mu.Unlock()
	if first {
		r.once.Do(func() { close(r.deleting) })
		select {
		case <-r.release:
		case <-ctx.Done():
			return reconcile.Done(), ctx.Err()
		}
		return reconcile.Done(), errors.New("cleanup failed")
	}
	return reconcile.Done(), nil
}

// On the real API server a watch with a label selector reports an object
// whose labels stop matching as DELETED and one that matches again as
// ADDED, with the same UID. The controller reconciles the delete, and the
// object's return after it, even when the delete fails while the object
// comes back: the object is back, so it was not deleted, and its failed
// delete is not retried; the key's next turn counts the failed one.
func TestIntegrationObjectLeavingAndReenteringTheLabelSelector(t *testing.T) {
	dyn, ns := realCluster(t)
	ctx := context.Background()
	client := typed.New[*Widget](dyn, widgets)
	r := &labelReconciler{deleting: make(chan struct{}), release: make(chan struct{})}
	cfg := reconcile.Config[*Widget]{Name: "test.opkit.dev/widgets", Resource: widgets, Dynamic: dyn, Reconciler: r, Logger: quiet,
		Backoff: queue.Backoff{Base: 10 * time.Millisecond, Cap: 10 * time.Millisecond, Jitter: -1}} // a kept retry would come at once
	cfg.Watch.Namespace, cfg.Watch.LabelSelector = ns, "shard=1"
	ctrl := runController(t, cfg)
	eventually(t, time.Minute, "controller ready", ctrl.Check)

	label := func(shard string) {
		t.Helper()
		patch := []byte(`{"metadata":{"labels":{"shard":"` + shard + `"}}}`)
		if _, err := client.Dynamic(ns).Patch(ctx, "w", types.MergePatchType, patch, metav1.PatchOptions{}); err != nil {
			t.Fatal(err)
		}
	}
	w := create(t, dyn, ns, "w", 1)
	label("1")
	label("2") // leaves the selector: a Deleted request, held by the reconciler
	select {
	case <-r.deleting:
	case <-time.After(time.Minute):
		t.Fatal("no Deleted request within a minute after the label stopped matching")
	}
	label("1") // back: its event is parked behind the running delete
	eventually(t, time.Minute, "the return parked behind the delete", func() error {
		if st := ctrl.QueueStats(); st.Parked != 1 {
			return fmt.Errorf("queue stats %+v", st)
		}
		return nil
	})
	close(r.release) // the delete fails; its retry meets the parked return
	eventually(t, time.Minute, "queue idle", func() error {
		if st := ctrl.QueueStats(); st.Ready+st.Delayed+st.Parked+st.InFlight != 0 {
			return fmt.Errorf("queue stats %+v", st)
		}
		return nil
	})

	r.mu.Lock()
	defer r.mu.Unlock()
	var deletes int
	for _, c := range r.calls {
		if c.Object != nil && c.Object.UID != w.UID {
			t.Errorf("a request for UID %s, want only %s", c.Object.UID, w.UID)
		}
		if c.Type == opkit.Deleted {
			deletes++
		}
	}
	last := r.calls[len(r.calls)-1]
	if deletes != 1 || last.Type != opkit.Added || last.Retries != 1 || last.Object == nil || last.Object.Labels["shard"] != "1" {
		t.Errorf("%d Deleted requests, last %v (retries %d); want one delete, then the object back (Added, shard=1, after one failed turn) and no retry of the delete", deletes, last.Type, last.Retries)
	}
}
