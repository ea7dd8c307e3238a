package reconcile_test

import (
	"context"
	"strconv"
	"testing"
	"testing/synctest"

	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime"
	k8stesting "k8s.io/client-go/testing"

	"github.com/opkit/opkit"
	"github.com/opkit/opkit/reconcile"
	"github.com/opkit/opkit/trigger"
)

// A key's next turn that starts before the watch delivered the operator's
// own status write does not reconcile the older state it holds (its
// status write would fail with a 409 on that write): it reads the object.
func TestTheNextTurnReadsAnObjectTheLastTurnWrote(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		var st *reconcile.Status[*Widget]
		var e *env
		rec := &recorder{do: func(ctx context.Context, n int, req reconcile.Request[*Widget]) (reconcile.Result, error) {
			if n == 0 {
				// While in flight, a trigger parks the key with the state
				// read before this turn's write.
				o, err := e.ctrl.Trigger().Submit(ctx, trigger.Request[*Widget]{Object: req.Object, Type: opkit.Modified, Source: opkit.Operator, Reason: "again"})
				if err != nil || !o.Accepted() {
					t.Errorf("Submit = %v, %v", o, err)
				}
			}
			_, err := st.Update(ctx, req.Object, func(w *Widget) error { w.Status.Phase = "Ready"; return nil })
			return reconcile.Done(), err
		}}
		started := make(chan struct{})
		rec.do = func(do func(context.Context, int, reconcile.Request[*Widget]) (reconcile.Result, error)) func(context.Context, int, reconcile.Request[*Widget]) (reconcile.Result, error) {
			return func(ctx context.Context, n int, req reconcile.Request[*Widget]) (reconcile.Result, error) {
				<-started // e is set
				return do(ctx, n, req)
			}
		}(rec.do)
		e, _ = startWithFakeWatch(t, rec, func(c *reconcile.Config[*Widget]) { // the watch delivers nothing
			c.NoEvents = true
			dyn := c.Dynamic.(*fakeDyn)
			bumpResourceVersions(t, dyn)
			var err error
			if st, err = reconcile.NewStatus[*Widget](reconcile.StatusConfig{Dynamic: dyn, Resource: widgets}); err != nil {
				t.Fatal(err)
			}
		}, widget("a"))
		close(started)
		synctest.Wait()
		calls := rec.snapshot()
		if len(calls) != 2 {
			t.Fatalf("%d reconciles, want 2", len(calls))
		}
		first, second := calls[0].req.Object.ResourceVersion, calls[1].req.Object.ResourceVersion
		if second == first || calls[1].err != nil || e.metrics.refetched != 1 {
			t.Fatalf("second turn reconciled resourceVersion %s (the first had %s), err %v, %d reads; want a read of the written object, no error",
				second, first, calls[1].err, e.metrics.refetched)
		}
	})
}

// bumpResourceVersions makes dyn's updates give the object a new
// resourceVersion, as the API server does (the fake does not).
func bumpResourceVersions(t *testing.T, dyn *fakeDyn) {
	dyn.PrependReactor("update", "widgets", func(a k8stesting.Action) (bool, runtime.Object, error) {
		u := a.(k8stesting.UpdateAction).GetObject().(*unstructured.Unstructured).DeepCopy()
		cur, err := dyn.Tracker().Get(a.GetResource(), a.GetNamespace(), u.GetName())
		if err != nil {
			return true, nil, err
		}
		rv, _ := strconv.Atoi(cur.(*unstructured.Unstructured).GetResourceVersion())
		u.SetResourceVersion(strconv.Itoa(rv + 1))
		return true, u, dyn.Tracker().Update(a.GetResource(), u, a.GetNamespace())
	})
}
