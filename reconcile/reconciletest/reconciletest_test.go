package reconciletest_test

import (
	"context"
	"fmt"
	"strings"
	"testing"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/opkit/opkit"
	"github.com/opkit/opkit/internal/typed"
	"github.com/opkit/opkit/reconcile"
	"github.com/opkit/opkit/reconcile/reconciletest"
)

// recordingTB captures failures instead of failing the test.
type recordingTB struct {
	testing.TB
	errors []string
}

func (r *recordingTB) Helper() {}
func (r *recordingTB) Errorf(format string, args ...any) {
	r.errors = append(r.errors, fmt.Sprintf(format, args...))
}

func TestAssertConvergedCatchesAReconcilerThatWritesEveryTime(t *testing.T) {
	tb := &recordingTB{TB: t}
	h := reconciletest.New[*Widget](tb, widgets, seedWidget())
	client := typed.New[*Widget](h.Dynamic, widgets)
	// Not idempotent: stamps a counter on every call.
	calls := 0
	r := reconcile.Func[*Widget](func(ctx context.Context, req reconcile.Request[*Widget]) (reconcile.Result, error) {
		calls++
		req.Object.Annotations = map[string]string{"calls": fmt.Sprint(calls)}
		_, err := client.Update(ctx, req.Object)
		return reconcile.Done(), err
	})
	key := opkit.Key{Namespace: "shop", Name: "blue"}
	if c := h.ReconcileKey(context.Background(), r, key); c.Err != nil || len(c.Writes()) != 1 {
		t.Fatalf("first call: err %v, writes %q", c.Err, c.Writes())
	}
	h.AssertConverged(context.Background(), r, key)
	if len(tb.errors) != 1 || !strings.Contains(tb.errors[0], "update widgets shop/blue") {
		t.Fatalf("AssertConverged reported %q, want the second update", tb.errors)
	}
	if got := h.Get(key).Annotations["calls"]; got != "2" {
		t.Fatalf("stored annotation %q, want 2", got)
	}
}

func TestHarnessSeedsOtherResourcesAndRecordsTheirWrites(t *testing.T) {
	cm := &corev1.ConfigMap{
		TypeMeta:   metav1.TypeMeta{APIVersion: "v1", Kind: "ConfigMap"},
		ObjectMeta: metav1.ObjectMeta{Namespace: "shop", Name: "blue-config"},
		Data:       map[string]string{"size": "1"},
	}
	h := reconciletest.New[*Widget](t, widgets, seedWidget(), cm)
	cms := h.Dynamic.Resource(corev1.SchemeGroupVersion.WithResource("configmaps"))
	r := reconcile.Func[*Widget](func(ctx context.Context, req reconcile.Request[*Widget]) (reconcile.Result, error) {
		u, err := cms.Namespace("shop").Get(ctx, req.Key.Name+"-config", metav1.GetOptions{})
		if err != nil {
			return reconcile.Done(), err
		}
		u.Object["data"] = map[string]any{"size": fmt.Sprint(req.Object.Spec.Size)}
		_, err = cms.Namespace("shop").Update(ctx, u, metav1.UpdateOptions{})
		return reconcile.Done(), err
	})
	c := h.ReconcileKey(context.Background(), r, opkit.Key{Namespace: "shop", Name: "blue"})
	if c.Err != nil || fmt.Sprint(c.Writes()) != "[update configmaps shop/blue-config]" || len(c.Actions) != 2 {
		t.Fatalf("err %v, writes %q, actions %d; want one get and one update", c.Err, c.Writes(), len(c.Actions))
	}
}

func TestRequestForDeletedCarriesTheLastStateAndRemovesTheObject(t *testing.T) {
	h := reconciletest.New[*Widget](t, widgets, seedWidget())
	key := opkit.Key{Namespace: "shop", Name: "blue"}
	req := h.Request(key, opkit.Deleted)
	if req.Type != opkit.Deleted || req.Object.Spec.Size != 3 || h.Exists(key) {
		t.Fatalf("request %+v, exists %v", req, h.Exists(key))
	}
}

func TestHarnessShowsTheEventsARecorderCreated(t *testing.T) {
	h := reconciletest.New[*Widget](t, widgets, seedWidget())
	rec, err := reconcile.NewRecorder(reconcile.RecorderConfig{Dynamic: h.Dynamic, Controller: "test.opkit.dev/widgets", Resource: widgets})
	if err != nil {
		t.Fatal(err)
	}
	r := reconcile.Func[*Widget](func(ctx context.Context, req reconcile.Request[*Widget]) (reconcile.Result, error) {
		return reconcile.Done(), rec.Record(ctx, req.Object, reconcile.EventSpec{Reason: "Resized", Note: "size 3"})
	})
	c := h.ReconcileKey(context.Background(), r, opkit.Key{Namespace: "shop", Name: "blue"})
	if w := c.Writes(); c.Err != nil || fmt.Sprint(h.Events()) != "[Normal Resized: size 3]" || len(w) != 1 || !strings.HasPrefix(w[0], "create events shop/blue.") {
		t.Fatalf("err %v, events %q, writes %q", c.Err, h.Events(), c.Writes())
	}
}
