package reconciler_test

import (
	"context"
	"fmt"
	"testing"

	"github.com/opkit/opkit"
	demov1 "github.com/opkit/opkit/example/api/v1"
	"github.com/opkit/opkit/example/reconciler"
	"github.com/opkit/opkit/reconcile/reconciletest"
)

// The reconciler on reconciletest's fake clients: the first reconcile adds
// the finalizer, applies the ConfigMap and writes the status; an external
// trigger records its reason; a second watch reconcile changes nothing
// (its apply of the ConfigMap as it is).
func ExampleNew() {
	t := &testing.T{} // in a real test: the test's *testing.T
	replicas := int32(2)
	e := &demov1.DemoEntity{}
	e.Namespace, e.Name, e.UID, e.Generation = "team-a", "hello", "uid-1", 1
	e.Spec.Message, e.Spec.Replicas = "Hello from opkit", &replicas

	h := reconciletest.New[*demov1.DemoEntity](t, demov1.Resource, e)
	r, err := reconciler.New(reconciler.Config{Dynamic: h.Dynamic, Identity: "replica-1"})
	if err != nil {
		panic(err)
	}
	ctx, key := context.Background(), opkit.KeyOf(e)

	fmt.Println(h.ReconcileKey(ctx, r, key).Writes())

	req := h.Request(key, opkit.Modified)
	req.Sources, req.Reasons = opkit.Sources(opkit.Operator), []string{"deployed build 42"}
	fmt.Println(h.Reconcile(ctx, r, req).Writes())
	lt := h.Get(key).Status.LastTrigger
	fmt.Println(lt.Source, lt.Reason)

	fmt.Println(h.AssertConverged(ctx, r, key).Writes(), t.Failed())
	// Output:
	// [patch demoentities team-a/hello patch configmaps team-a/hello-demo update demoentities/status team-a/hello]
	// [patch configmaps team-a/hello-demo update demoentities/status team-a/hello]
	// Operator deployed build 42
	// [patch configmaps team-a/hello-demo] false
}
