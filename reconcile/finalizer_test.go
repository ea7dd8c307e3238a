package reconcile_test

import (
	"context"
	"errors"
	"slices"
	"strings"
	"testing"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/schema"
	dynfake "k8s.io/client-go/dynamic/fake"
	k8stesting "k8s.io/client-go/testing"

	"github.com/opkit/opkit"
	"github.com/opkit/opkit/internal/typed"
	"github.com/opkit/opkit/reconcile"
)

const fin = "test.opkit.dev/cleanup"

func mustFinalizer(t *testing.T, dyn *fakeDyn) *reconcile.Finalizer[*Widget] {
	t.Helper()
	f, err := reconcile.NewFinalizer[*Widget](dyn, widgets, fin)
	if err != nil {
		t.Fatal(err)
	}
	return f
}

type fakeDyn = dynfake.FakeDynamicClient

func getWidget(t *testing.T, dyn *fakeDyn, name string) *Widget {
	t.Helper()
	w, err := typed.New[*Widget](dyn, widgets).Get(context.Background(), opkit.Key{Namespace: "ns", Name: name})
	if err != nil {
		t.Fatal(err)
	}
	return w
}

func patches(dyn *fakeDyn) []string {
	var out []string
	for _, a := range dyn.Actions() {
		if p, ok := a.(k8stesting.PatchAction); ok {
			out = append(out, string(p.GetPatch()))
		}
	}
	return out
}

func TestNewFinalizerValidatesItsInput(t *testing.T) {
	dyn := newFakeDynamic(t)
	if _, err := reconcile.NewFinalizer[*Widget](nil, widgets, fin); err == nil {
		t.Error("nil client accepted")
	}
	if _, err := reconcile.NewFinalizer[*Widget](dyn, opkit.Resource{}, fin); err == nil {
		t.Error("empty resource accepted")
	}
	if _, err := reconcile.NewFinalizer[*Widget](dyn, widgets, "not a/valid/name"); err == nil {
		t.Error("invalid finalizer name accepted")
	}
}

func TestFinalizerIsAddedOnFirstReconcileWithAResourceVersionPrecondition(t *testing.T) {
	dyn := newFakeDynamic(t, widget("a", func(w *Widget) { w.Finalizers = []string{"other/keep"} }))
	f := mustFinalizer(t, dyn)
	called := false
	out, live, err := f.Handle(context.Background(), getWidget(t, dyn, "a"), func(context.Context, *Widget) error { called = true; return nil })
	if err != nil || !live || called {
		t.Fatalf("Handle = (live %v, err %v), finalize called %v; want live, no error, not called", live, err, called)
	}
	want := []string{"other/keep", fin}
	if !slices.Equal(out.Finalizers, want) || !slices.Equal(getWidget(t, dyn, "a").Finalizers, want) {
		t.Fatalf("finalizers: returned %v, stored %v, want %v", out.Finalizers, getWidget(t, dyn, "a").Finalizers, want)
	}
	p := patches(dyn)
	if len(p) != 1 || !strings.Contains(p[0], `"resourceVersion":"1"`) {
		t.Fatalf("patches = %q, want one with the resourceVersion precondition", p)
	}

	// Second reconcile: already there, nothing written.
	dyn.ClearActions()
	if _, live, err := f.Handle(context.Background(), out, nil); err != nil || !live {
		t.Fatalf("second Handle = (%v, %v)", live, err)
	}
	if len(dyn.Actions()) != 0 {
		t.Fatalf("second Handle made API calls: %v", dyn.Actions())
	}
}

func TestFinalizerRereadsAndRetriesOnConflictKeepingTheOtherWritersFinalizer(t *testing.T) {
	dyn := newFakeDynamic(t, widget("a"))
	stale := getWidget(t, dyn, "a")
	conflicts := 0
	dyn.PrependReactor("patch", "widgets", func(a k8stesting.Action) (bool, runtime.Object, error) {
		if conflicts > 0 {
			return false, nil, nil
		}
		conflicts++
		// Another writer got there first: it added its own finalizer.
		other := widget("a", func(w *Widget) { w.Finalizers = []string{"other/keep"}; w.ResourceVersion = "2" })
		u, _ := typed.ToUnstructured(other)
		if err := dyn.Tracker().Update(widgets.GroupVersionResource, u, "ns"); err != nil {
			t.Error(err)
		}
		return true, nil, apierrors.NewConflict(widgets.GroupResource(), "a", errors.New("rv mismatch"))
	})
	out, live, err := mustFinalizer(t, dyn).Handle(context.Background(), stale, nil)
	if err != nil || !live {
		t.Fatalf("Handle = (%v, %v)", live, err)
	}
	want := []string{"other/keep", fin}
	if !slices.Equal(out.Finalizers, want) || !slices.Equal(getWidget(t, dyn, "a").Finalizers, want) {
		t.Fatalf("finalizers: returned %v, stored %v; want %v", out.Finalizers, getWidget(t, dyn, "a").Finalizers, want)
	}
	p := patches(dyn)
	if len(p) != 2 || !strings.Contains(p[1], `"resourceVersion":"2"`) {
		t.Fatalf("patches = %q, want a retry computed from resourceVersion 2", p)
	}
}

func TestFinalizerGivesUpAfterRepeatedConflicts(t *testing.T) {
	dyn := newFakeDynamic(t, widget("a"))
	dyn.PrependReactor("patch", "widgets", func(k8stesting.Action) (bool, runtime.Object, error) {
		return true, nil, apierrors.NewConflict(widgets.GroupResource(), "a", errors.New("rv mismatch"))
	})
	_, _, err := mustFinalizer(t, dyn).Handle(context.Background(), getWidget(t, dyn, "a"), nil)
	if !apierrors.IsConflict(err) {
		t.Fatalf("err = %v, want a wrapped Conflict", err)
	}
	if got := len(patches(dyn)); got != reconcile.DefaultConflictRetries+1 {
		t.Fatalf("%d patches, want %d", got, reconcile.DefaultConflictRetries+1)
	}
}

func deleting(w *Widget) {
	now := metav1.Now()
	w.DeletionTimestamp = &now
	w.Finalizers = []string{"other/keep", fin}
}

func TestFinalizerIsRemovedOnlyAfterFinalizeSucceeded(t *testing.T) {
	dyn := newFakeDynamic(t, widget("a", deleting))
	f := mustFinalizer(t, dyn)
	boom := errors.New("cloud API down")
	calls := 0
	_, live, err := f.Handle(context.Background(), getWidget(t, dyn, "a"), func(_ context.Context, w *Widget) error {
		calls++
		return boom
	})
	if !errors.Is(err, boom) || live {
		t.Fatalf("Handle = (%v, %v), want not live and the finalize error", live, err)
	}
	if got := getWidget(t, dyn, "a").Finalizers; !slices.Contains(got, fin) || len(patches(dyn)) != 0 {
		t.Fatalf("after failed finalize: finalizers %v, patches %q; want the finalizer kept and no write", got, patches(dyn))
	}

	out, live, err := f.Handle(context.Background(), getWidget(t, dyn, "a"), func(context.Context, *Widget) error { calls++; return nil })
	if err != nil || live || calls != 2 {
		t.Fatalf("Handle = (%v, %v), calls %d", live, err, calls)
	}
	if want := []string{"other/keep"}; !slices.Equal(out.Finalizers, want) || !slices.Equal(getWidget(t, dyn, "a").Finalizers, want) {
		t.Fatalf("finalizers after finalize: %v, want %v", getWidget(t, dyn, "a").Finalizers, want)
	}
}

func TestFinalizerDoesNothingForADeletingObjectWithoutIt(t *testing.T) {
	dyn := newFakeDynamic(t, widget("a", deleting, func(w *Widget) { w.Finalizers = []string{"other/keep"} }))
	called := false
	_, live, err := mustFinalizer(t, dyn).Handle(context.Background(), getWidget(t, dyn, "a"), func(context.Context, *Widget) error { called = true; return nil })
	if err != nil || live || called || len(patches(dyn)) != 0 {
		t.Fatalf("Handle = (%v, %v), called %v, patches %q; want nothing done", live, err, called, patches(dyn))
	}
}

func TestFinalizerOnAVanishedObjectIsNotLive(t *testing.T) {
	dyn := newFakeDynamic(t)
	_, live, err := mustFinalizer(t, dyn).Handle(context.Background(), widget("gone"), nil)
	if err != nil || live {
		t.Fatalf("Handle = (%v, %v), want (false, nil)", live, err)
	}
}

// A NotFound that names no object is the API server not serving the
// resource: Handle reports it as an error (the reconcile is retried)
// rather than calling a possibly existing object gone.
func TestFinalizerReportsAResourceNotServed(t *testing.T) {
	dyn := newFakeDynamic(t, widget("a"))
	dyn.PrependReactor("patch", "widgets", func(k8stesting.Action) (bool, runtime.Object, error) {
		return true, nil, apierrors.NewGenericServerResponse(404, "patch", schema.GroupResource{}, "", "404 page not found", 0, true)
	})
	_, live, err := mustFinalizer(t, dyn).Handle(context.Background(), getWidget(t, dyn, "a"), nil)
	if err == nil || live {
		t.Fatalf("Handle = (%v, %v), want an error", live, err)
	}
}

// The object being deleted (uid-a) is finalized, but removing the
// finalizer conflicts: meanwhile uid-a went (someone else stripped its
// finalizers) and a new object of the same name (uid-b) was created and got
// our finalizer from its own reconcile. The re-read after the conflict
// finds uid-b: its finalizer is not ours to remove (it would not be
// finalized if deleted before its next reconcile), and uid-a is gone.
func TestFinalizerRemovalAfterAConflictLeavesARecreatedObjectAlone(t *testing.T) {
	dyn := newFakeDynamic(t, widget("a", deleting))
	old := getWidget(t, dyn, "a")
	conflicts := 0
	dyn.PrependReactor("patch", "widgets", func(a k8stesting.Action) (bool, runtime.Object, error) {
		if conflicts > 0 {
			return false, nil, nil
		}
		conflicts++
		recreated := widget("a", func(w *Widget) { w.UID = "uid-b"; w.ResourceVersion = "7"; w.Finalizers = []string{fin} })
		u, _ := typed.ToUnstructured(recreated)
		if err := dyn.Tracker().Update(widgets.GroupVersionResource, u, "ns"); err != nil {
			t.Error(err)
		}
		return true, nil, apierrors.NewConflict(widgets.GroupResource(), "a", errors.New("rv mismatch"))
	})
	_, live, err := mustFinalizer(t, dyn).Handle(context.Background(), old, func(context.Context, *Widget) error { return nil })
	t.Logf("Handle = (live %v, err %v)", live, err)
	now := getWidget(t, dyn, "a")
	if now.UID == "uid-b" && !slices.Contains(now.Finalizers, fin) {
		t.Fatalf("the recreated object %s lost our finalizer: %v", now.UID, now.Finalizers)
	}
}
