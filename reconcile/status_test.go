package reconcile_test

import (
	"context"
	"encoding/json"
	"errors"
	"reflect"
	"testing"

	k8stesting "k8s.io/client-go/testing"

	"github.com/opkit/opkit/internal/typed"
	"github.com/opkit/opkit/reconcile"
)

// statusPatches returns the patches of the status subresource dyn saw.
func statusPatches(dyn *fakeDyn) [][]byte {
	var out [][]byte
	for _, a := range dyn.Actions() {
		if p, ok := a.(k8stesting.PatchAction); ok && a.GetSubresource() == "status" {
			out = append(out, p.GetPatch())
		}
	}
	return out
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
	if n := len(statusPatches(dyn)); n != 1 {
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

// A status write is a JSON patch of what changed, after a test of the
// UID: it does not fail when the object changed since it was read (the
// spec, the operator's own earlier status write), and it leaves every
// other field as stored.
func TestStatusWritesOnlyWhatChangedWithoutAPrecondition(t *testing.T) {
	dyn := newFakeDynamic(t, widget("a", func(w *Widget) { w.Status.ObservedGeneration = 1 }))
	st, err := reconcile.NewStatus[*Widget](reconcile.StatusConfig{Dynamic: dyn, Resource: widgets})
	if err != nil {
		t.Fatal(err)
	}
	stale := getWidget(t, dyn, "a")
	// Meanwhile the spec changed (generation 2) and an earlier status
	// write set a phase.
	u, _ := typed.ToUnstructured(widget("a", func(w *Widget) {
		w.Generation, w.Spec.Size, w.ResourceVersion, w.Status.Phase, w.Status.ObservedGeneration = 2, 5, "7", "Old", 1
	}))
	if err := dyn.Tracker().Update(widgets.GroupVersionResource, u, "ns"); err != nil {
		t.Fatal(err)
	}
	dyn.ClearActions()
	out, err := st.Update(context.Background(), stale, func(w *Widget) error { w.Status.Message = "seen size 1"; return nil })
	if err != nil {
		t.Fatal(err)
	}
	patches := statusPatches(dyn)
	if len(patches) != 1 || len(dyn.Actions()) != 1 {
		t.Fatalf("actions %v, want one status patch", dyn.Actions())
	}
	var got []map[string]any
	if err := json.Unmarshal(patches[0], &got); err != nil {
		t.Fatal(err)
	}
	want := []map[string]any{
		{"op": "test", "path": "/metadata/uid", "value": "uid-a"},
		{"op": "add", "path": "/status/message", "value": "seen size 1"},
	}
	if !reflect.DeepEqual(got, want) {
		t.Fatalf("patch %s, want %v: the UID tested, then the changed fields; no resourceVersion", patches[0], want)
	}
	stored := getWidget(t, dyn, "a")
	if stored.Spec.Size != 5 || stored.Status != (WidgetStatus{ObservedGeneration: 1, Phase: "Old", Message: "seen size 1"}) || out.Status != stored.Status {
		t.Fatalf("stored %+v / %+v, returned %+v: want the new spec and the other status field kept", stored.Spec, stored.Status, out.Status)
	}
}

// Within a status that exists, only the members that changed are
// written, and a member mutate removed is removed.
func TestStatusRemovesWhatMutateRemoved(t *testing.T) {
	dyn := newFakeDynamic(t, widget("a", func(w *Widget) { w.Status.Phase, w.Status.ObservedGeneration = "Ready", 1 }))
	st, _ := reconcile.NewStatus[*Widget](reconcile.StatusConfig{Dynamic: dyn, Resource: widgets})
	if _, err := st.Update(context.Background(), getWidget(t, dyn, "a"), func(w *Widget) error { w.Status.Phase, w.Status.Message = "", "m"; return nil }); err != nil {
		t.Fatal(err)
	}
	if got := getWidget(t, dyn, "a").Status; got != (WidgetStatus{ObservedGeneration: 1, Message: "m"}) {
		t.Fatalf("stored status %+v, want the phase gone and the message set", got)
	}
	want := `[{"op":"test","path":"/metadata/uid","value":"uid-a"},{"op":"add","path":"/status/message","value":"m"},{"op":"remove","path":"/status/phase"}]`
	if p := statusPatches(dyn); len(p) != 1 || string(p[0]) != want {
		t.Fatalf("patches %q, want %s", p, want)
	}
}

// A status read empty is written whole: the API server may hold none, and
// a JSON patch cannot add a member to an object that does not exist.
func TestStatusReadEmptyIsWrittenWhole(t *testing.T) {
	dyn := newFakeDynamic(t, widget("a"))
	st, _ := reconcile.NewStatus[*Widget](reconcile.StatusConfig{Dynamic: dyn, Resource: widgets})
	if _, err := st.Update(context.Background(), getWidget(t, dyn, "a"), func(w *Widget) error { w.Status.Phase = "Ready"; return nil }); err != nil {
		t.Fatal(err)
	}
	want := `[{"op":"test","path":"/metadata/uid","value":"uid-a"},{"op":"add","path":"/status","value":{"observedGeneration":1,"phase":"Ready"}}]`
	if p := statusPatches(dyn); len(p) != 1 || string(p[0]) != want {
		t.Fatalf("patches %q, want %s", p, want)
	}
}

func TestStatusReturnsMutateErrorsWithoutWriting(t *testing.T) {
	dyn := newFakeDynamic(t, widget("a"))
	st, _ := reconcile.NewStatus[*Widget](reconcile.StatusConfig{Dynamic: dyn, Resource: widgets})
	boom := errors.New("boom")
	if _, err := st.Update(context.Background(), getWidget(t, dyn, "a"), func(*Widget) error { return boom }); !errors.Is(err, boom) {
		t.Fatalf("err = %v, want boom", err)
	}
	if n := len(statusPatches(dyn)); n != 0 {
		t.Fatalf("%d writes after a failed mutate", n)
	}
}

func TestNewStatusValidatesItsConfig(t *testing.T) {
	dyn := newFakeDynamic(t)
	for _, cfg := range []reconcile.StatusConfig{
		{Resource: widgets},
		{Dynamic: dyn},
	} {
		if _, err := reconcile.NewStatus[*Widget](cfg); err == nil {
			t.Errorf("NewStatus(%+v) accepted", cfg)
		}
	}
}
