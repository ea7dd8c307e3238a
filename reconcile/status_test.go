package reconcile_test

import (
	"context"
	"errors"
	"testing"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/runtime"
	k8stesting "k8s.io/client-go/testing"

	"github.com/opkit/opkit/internal/typed"
	"github.com/opkit/opkit/reconcile"
)

func updateStatusActions(dyn *fakeDyn) int {
	n := 0
	for _, a := range dyn.Actions() {
		if a.GetVerb() == "update" && a.GetSubresource() == "status" {
			n++
		}
	}
	return n
}

func TestStatusSetsObservedGenerationAndSkipsUnchangedWrites(t *testing.T) {
	dyn := newFakeDynamic(t, widget("a", func(w *Widget) { w.Generation = 3 }))
	st, err := reconcile.NewStatus[*Widget](reconcile.StatusConfig{Dynamic: dyn, Resource: widgets})
	if err != nil {
		t.Fatal(err)
	}
	ready := func(w *Widget) error { w.Status.Phase = "Ready"; return nil }
	out, err := st.Update(context.Background(), getWidget(t, dyn, "a"), ready)
	if err != nil {
		t.Fatal(err)
	}
	stored := getWidget(t, dyn, "a")
	if out.Status != (WidgetStatus{ObservedGeneration: 3, Phase: "Ready"}) || stored.Status != out.Status {
		t.Fatalf("status: returned %+v, stored %+v; want phase Ready, observedGeneration 3", out.Status, stored.Status)
	}
	if n := updateStatusActions(dyn); n != 1 {
		t.Fatalf("%d status writes, want 1", n)
	}
	dyn.ClearActions()
	if _, err := st.Update(context.Background(), stored, ready); err != nil {
		t.Fatal(err)
	}
	if len(dyn.Actions()) != 0 {
		t.Fatalf("converged status written again: %v", dyn.Actions())
	}
}

func TestStatusReappliesMutateToAFreshCopyOnConflict(t *testing.T) {
	dyn := newFakeDynamic(t, widget("a"))
	st, err := reconcile.NewStatus[*Widget](reconcile.StatusConfig{Dynamic: dyn, Resource: widgets})
	if err != nil {
		t.Fatal(err)
	}
	stale := getWidget(t, dyn, "a")
	first := true
	dyn.PrependReactor("update", "widgets", func(a k8stesting.Action) (bool, runtime.Object, error) {
		if !first || a.GetSubresource() != "status" {
			return false, nil, nil
		}
		first = false
		// Someone changed the spec meanwhile (generation 2).
		u, _ := typed.ToUnstructured(widget("a", func(w *Widget) { w.Generation, w.Spec.Size, w.ResourceVersion = 2, 5, "2" }))
		if err := dyn.Tracker().Update(widgets.GroupVersionResource, u, "ns"); err != nil {
			t.Error(err)
		}
		return true, nil, apierrors.NewConflict(widgets.GroupResource(), "a", errors.New("rv mismatch"))
	})
	var seen []int
	out, err := st.Update(context.Background(), stale, func(w *Widget) error {
		seen = append(seen, w.Spec.Size)
		w.Status.Phase = "Sized"
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	if len(seen) != 2 || seen[0] != 1 || seen[1] != 5 {
		t.Fatalf("mutate saw sizes %v, want [1 5] (stale, then fresh)", seen)
	}
	if stored := getWidget(t, dyn, "a"); stored.Status.ObservedGeneration != 2 || stored.Spec.Size != 5 || out.Status.Phase != "Sized" {
		t.Fatalf("stored %+v / %+v, want the fresh spec kept and observedGeneration 2", stored.Spec, stored.Status)
	}
}

func TestStatusReturnsMutateErrorsWithoutWriting(t *testing.T) {
	dyn := newFakeDynamic(t, widget("a"))
	st, _ := reconcile.NewStatus[*Widget](reconcile.StatusConfig{Dynamic: dyn, Resource: widgets})
	boom := errors.New("boom")
	if _, err := st.Update(context.Background(), getWidget(t, dyn, "a"), func(*Widget) error { return boom }); !errors.Is(err, boom) {
		t.Fatalf("err = %v, want boom", err)
	}
	if n := updateStatusActions(dyn); n != 0 {
		t.Fatalf("%d writes after a failed mutate", n)
	}
}

func TestNewStatusValidatesItsConfig(t *testing.T) {
	dyn := newFakeDynamic(t)
	for _, cfg := range []reconcile.StatusConfig{
		{Resource: widgets},
		{Dynamic: dyn},
		{Dynamic: dyn, Resource: widgets, ConflictRetries: -1},
	} {
		if _, err := reconcile.NewStatus[*Widget](cfg); err == nil {
			t.Errorf("NewStatus(%+v) accepted", cfg)
		}
	}
}

// uid-a's status write conflicts because uid-a was deleted and a new object
// of the same name (uid-b) created: the retry must not write uid-a's
// reconcile outcome onto uid-b, which nothing has reconciled yet.
func TestStatusRetryAfterAConflictLeavesARecreatedObjectAlone(t *testing.T) {
	dyn := newFakeDynamic(t, widget("a"))
	st, err := reconcile.NewStatus[*Widget](reconcile.StatusConfig{Dynamic: dyn, Resource: widgets})
	if err != nil {
		t.Fatal(err)
	}
	old := getWidget(t, dyn, "a")
	first := true
	dyn.PrependReactor("update", "widgets", func(a k8stesting.Action) (bool, runtime.Object, error) {
		if !first {
			return false, nil, nil
		}
		first = false
		u, _ := typed.ToUnstructured(widget("a", func(w *Widget) { w.UID = "uid-b"; w.ResourceVersion = "9" }))
		if err := dyn.Tracker().Update(widgets.GroupVersionResource, u, "ns"); err != nil {
			t.Error(err)
		}
		return true, nil, apierrors.NewConflict(widgets.GroupResource(), "a", errors.New("rv mismatch"))
	})
	out, err := st.Update(context.Background(), old, func(w *Widget) error { w.Status.Phase = "Ready"; return nil })
	t.Logf("Update: out uid %v, err %v", func() any {
		if out == nil {
			return nil
		}
		return out.UID
	}(), err)
	if now := getWidget(t, dyn, "a"); now.UID == "uid-b" && now.Status.Phase == "Ready" {
		t.Fatalf("uid-a's status was written onto the recreated object uid-b: %+v", now.Status)
	}
}

// The status records the durable trigger it handled: the request
// annotation's value as status.lastHandledReconcileAt (when the status
// has the field).
func TestStatusRecordsTheHandledRequest(t *testing.T) {
	dyn := newFakeDynamic(t, widget("a", func(w *Widget) {
		w.Annotations = map[string]string{"reconcile.opkit.dev/requestedAt": "2026-12-02T10:00:00Z"}
	}))
	st, _ := reconcile.NewStatus[*Widget](reconcile.StatusConfig{Dynamic: dyn, Resource: widgets})
	if _, err := st.Update(context.Background(), getWidget(t, dyn, "a"), func(w *Widget) error { w.Status.Phase = "Ready"; return nil }); err != nil {
		t.Fatal(err)
	}
	if got := getWidget(t, dyn, "a").Status.LastHandledReconcileAt; got != "2026-12-02T10:00:00Z" {
		t.Fatalf("lastHandledReconcileAt %q, want the annotation's value", got)
	}
}
