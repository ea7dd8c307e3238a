package reconciletest_test

import (
	"context"
	"fmt"
	"testing"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/client-go/dynamic"

	"github.com/opkit/opkit"
	"github.com/opkit/opkit/reconcile"
	"github.com/opkit/opkit/reconcile/reconciletest"
)

// Widget is the custom resource under test: a plain struct.
type Widget struct {
	metav1.TypeMeta   `json:",inline"`
	metav1.ObjectMeta `json:"metadata,omitempty"`
	Spec              struct {
		Size int `json:"size"`
	} `json:"spec"`
	Status struct {
		ObservedGeneration int64  `json:"observedGeneration,omitempty"`
		Phase              string `json:"phase,omitempty"`
	} `json:"status"`
}

var widgets = opkit.Resource{
	GroupVersionResource: schema.GroupVersionResource{Group: "test.opkit.dev", Version: "v1", Resource: "widgets"},
	Kind:                 "Widget",
	Namespaced:           true,
}

// widgetReconciler is what an operator author writes: a finalizer for the
// cleanup, and a status that says the widget is ready.
type widgetReconciler struct {
	fin      *reconcile.Finalizer[*Widget]
	status   *reconcile.Status[*Widget]
	released []string // what the finalize step cleaned up
}

func newWidgetReconciler(dyn dynamic.Interface) (*widgetReconciler, error) {
	fin, err := reconcile.NewFinalizer[*Widget](dyn, widgets, "test.opkit.dev/release")
	if err != nil {
		return nil, err
	}
	st, err := reconcile.NewStatus[*Widget](reconcile.StatusConfig{Dynamic: dyn, Resource: widgets})
	if err != nil {
		return nil, err
	}
	return &widgetReconciler{fin: fin, status: st}, nil
}

func (r *widgetReconciler) Reconcile(ctx context.Context, req reconcile.Request[*Widget]) (reconcile.Result, error) {
	if req.Type == opkit.Deleted {
		return reconcile.Done(), nil
	}
	w, live, err := r.fin.Handle(ctx, req.Object, func(ctx context.Context, w *Widget) error {
		r.released = append(r.released, w.Name)
		return nil
	})
	if err != nil || !live {
		return reconcile.Done(), err
	}
	_, err = r.status.Update(ctx, w, func(w *Widget) error {
		w.Status.Phase = fmt.Sprintf("Ready(%d)", w.Spec.Size)
		return nil
	})
	return reconcile.Done(), err
}

func seedWidget() *Widget {
	w := &Widget{}
	w.Namespace, w.Name, w.Generation, w.ResourceVersion = "shop", "blue", 2, "1"
	w.Spec.Size = 3
	return w
}

func ExampleHarness() {
	t := &testing.T{} // in a real test: the *testing.T given to the test
	h := reconciletest.New[*Widget](t, widgets, seedWidget())
	r, _ := newWidgetReconciler(h.Dynamic)
	key := opkit.Key{Namespace: "shop", Name: "blue"}

	first := h.ReconcileKey(context.Background(), r, key)
	fmt.Println(first.Result, first.Err)
	for _, w := range first.Writes() {
		fmt.Println(w)
	}
	got := h.Get(key)
	fmt.Println(got.Finalizers, got.Status.Phase, got.Status.ObservedGeneration)

	// A second reconcile of the unchanged object must write nothing.
	h.AssertConverged(context.Background(), r, key)
	fmt.Println("converged:", !t.Failed())
	// Output:
	// Done <nil>
	// patch widgets shop/blue
	// update widgets/status shop/blue
	// [test.opkit.dev/release] Ready(3) 2
	// converged: true
}

func ExampleHarness_MarkDeleting() {
	t := &testing.T{}
	w := seedWidget()
	w.Finalizers = []string{"test.opkit.dev/release"}
	h := reconciletest.New[*Widget](t, widgets, w)
	r, _ := newWidgetReconciler(h.Dynamic)
	key := opkit.KeyOf(w)

	h.MarkDeleting(key) // kubectl delete: the finalizer holds the object
	c := h.ReconcileKey(context.Background(), r, key)
	fmt.Println(c.Err, c.Writes())
	fmt.Println("released:", r.released, "still stored:", h.Exists(key))
	// Output:
	// <nil> [patch widgets shop/blue]
	// released: [blue] still stored: false
}
