package reconciletest_test

import (
	"context"
	"slices"
	"testing"

	"github.com/opkit/opkit/reconcile"
	"github.com/opkit/opkit/reconcile/reconciletest"
)

// Events are returned in creation order, not in the fake's list order
// (by namespace and name; an Event's name starts with its object's).
func TestHarnessEventsAreInCreationOrder(t *testing.T) {
	h := reconciletest.New[*Widget](t, widgets)
	rec, err := reconcile.NewRecorder(reconcile.RecorderConfig{Dynamic: h.Dynamic, Controller: "test.opkit.dev/w", Resource: widgets})
	if err != nil {
		t.Fatal(err)
	}
	for _, name := range []string{"zeta", "alpha"} {
		w := &Widget{}
		w.Namespace, w.Name = "shop", name
		if err := rec.Record(context.Background(), w, reconcile.EventSpec{Reason: "R", Note: name}); err != nil {
			t.Fatal(err)
		}
	}
	if got, want := h.Events(), []string{"Normal R: zeta", "Normal R: alpha"}; !slices.Equal(got, want) {
		t.Fatalf("Events() = %q, want creation order %q", got, want)
	}
}
