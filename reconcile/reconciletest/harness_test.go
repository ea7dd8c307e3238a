package reconciletest_test

import (
	"context"
	"errors"
	"slices"
	"strconv"
	"testing"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime/schema"
	corev1ac "k8s.io/client-go/applyconfigurations/core/v1"

	"github.com/opkit/opkit"
	"github.com/opkit/opkit/reconcile"
	"github.com/opkit/opkit/reconcile/reconciletest"
)

var configMaps = opkit.Resource{GroupVersionResource: corev1.SchemeGroupVersion.WithResource("configmaps"), Kind: "ConfigMap", Namespaced: true}

func blue() *Widget {
	w := &Widget{ObjectMeta: metav1.ObjectMeta{Namespace: "shop", Name: "blue", UID: "uid-blue"}}
	w.Spec.Size = 3
	return w
}

// The typed clientset and the dynamic client see one store of built-in
// objects: what one writes, the other reads; a server-side apply through
// the dynamic client (the Applier's) creates, then updates, a ConfigMap
// the typed client reads.
func TestBothClientsSeeOneStoreOfBuiltinObjects(t *testing.T) {
	seeded := &corev1.ConfigMap{TypeMeta: metav1.TypeMeta{APIVersion: "v1", Kind: "ConfigMap"},
		ObjectMeta: metav1.ObjectMeta{Namespace: "shop", Name: "seeded"}, Data: map[string]string{"k": "v"}}
	h := reconciletest.New[*Widget](t, widgets, blue(), seeded)
	ctx := context.Background()
	if got, err := h.Clientset.CoreV1().ConfigMaps("shop").Get(ctx, "seeded", metav1.GetOptions{}); err != nil || got.Data["k"] != "v" {
		t.Fatalf("typed Get of a seeded ConfigMap = %v, %v", got, err)
	}
	u, err := h.Dynamic.Resource(configMaps.GroupVersionResource).Namespace("shop").Get(ctx, "seeded", metav1.GetOptions{})
	if err != nil || u.GetName() != "seeded" {
		t.Fatalf("dynamic Get of a seeded ConfigMap = %v, %v", u, err)
	}

	apply, err := reconcile.NewApplier(reconcile.ApplyConfig{Dynamic: h.Dynamic, FieldManager: "test.opkit.dev/widgets", Owner: widgets})
	if err != nil {
		t.Fatal(err)
	}
	r := reconcile.Func[*Widget](func(ctx context.Context, req reconcile.Request[*Widget]) (reconcile.Result, error) {
		_, err := apply.Apply(ctx, req.Object, configMaps, corev1ac.ConfigMap("blue-cm", "").WithData(map[string]string{"size": "3"}))
		return reconcile.Done(), err
	})
	c := h.ReconcileKey(ctx, r, opkit.Key{Namespace: "shop", Name: "blue"})
	if c.Err != nil || !slices.Equal(c.Writes(), []string{"patch configmaps shop/blue-cm"}) {
		t.Fatalf("reconcile: %v, writes %q; want one apply (a patch)", c.Err, c.Writes())
	}
	cm, err := h.Clientset.CoreV1().ConfigMaps("shop").Get(ctx, "blue-cm", metav1.GetOptions{})
	if err != nil || cm.Data["size"] != "3" {
		t.Fatalf("typed Get of the applied ConfigMap = %v, %v", cm, err)
	}
	if ref := metav1.GetControllerOf(cm); ref == nil || ref.UID != "uid-blue" || ref.Kind != "Widget" {
		t.Fatalf("controller reference %+v, want the Widget blue", ref)
	}
	h.AssertConverged(ctx, reconcile.Func[*Widget](func(ctx context.Context, req reconcile.Request[*Widget]) (reconcile.Result, error) {
		return reconcile.Done(), nil
	}), opkit.Key{Namespace: "shop", Name: "blue"})
}

// Change stores a user's edit: a spec change bumps the generation, a
// label or status change does not; the resourceVersion goes up each time.
func TestChangeBumpsTheGenerationOnSpecChanges(t *testing.T) {
	h := reconciletest.New[*Widget](t, widgets, blue())
	key := opkit.Key{Namespace: "shop", Name: "blue"}
	if g := h.Get(key).Generation; g != 1 {
		t.Fatalf("seeded generation %d, want 1", g)
	}
	w := h.Get(key)
	w.Labels = map[string]string{"tier": "gold"}
	w.Status.Phase = "Ready"
	h.Change(w)
	if got := h.Get(key); got.Generation != 1 || got.Labels["tier"] != "gold" || got.Status.Phase != "Ready" {
		t.Fatalf("after a label and status change: generation %d, %+v", got.Generation, got)
	}
	rv := h.Get(key).ResourceVersion
	w = h.Get(key)
	w.Spec.Size = 5
	h.Change(w)
	if got := h.Get(key); got.Generation != 2 || got.Spec.Size != 5 || got.ResourceVersion == rv {
		t.Fatalf("after a spec change: generation %d, size %d, resourceVersion %s (was %s)", got.Generation, got.Spec.Size, got.ResourceVersion, rv)
	}
}

// Fail makes calls fail, through either client, as many times as asked.
func TestFailInjectsErrors(t *testing.T) {
	h := reconciletest.New[*Widget](t, widgets, blue())
	boom := apierrors.NewInternalError(errors.New("etcd leader changed"))
	h.Fail("get", "configmaps", 1, boom)
	ctx := context.Background()
	if _, err := h.Clientset.CoreV1().ConfigMaps("shop").Get(ctx, "x", metav1.GetOptions{}); !apierrors.IsInternalError(err) {
		t.Fatalf("first get: %v, want the injected 500", err)
	}
	if _, err := h.Clientset.CoreV1().ConfigMaps("shop").Get(ctx, "x", metav1.GetOptions{}); !apierrors.IsNotFound(err) {
		t.Fatalf("second get: %v, want a NotFound from the store", err)
	}
	clear := h.Fail("patch", "*", -1, boom)
	ws := h.Dynamic.Resource(schema.GroupVersionResource{Group: "test.opkit.dev", Version: "v1", Resource: "widgets"}).Namespace("shop")
	for range 3 {
		_, err := ws.Patch(ctx, "blue", "application/merge-patch+json", []byte(`{}`), metav1.PatchOptions{})
		if !apierrors.IsInternalError(err) {
			t.Fatalf("patch: %v, want the injected 500 every time", err)
		}
	}
	clear()
	if _, err := ws.Patch(ctx, "blue", "application/merge-patch+json", []byte(`{}`), metav1.PatchOptions{}); err != nil {
		t.Fatalf("patch after clear: %v, want it to reach the store", err)
	}
}

// A failure injected on a resource is not one on its subresources, and
// one on a subresource ("widgets/status") is on it alone.
func TestFailTellsAResourceFromItsSubresources(t *testing.T) {
	h := reconciletest.New[*Widget](t, widgets, blue())
	ctx := context.Background()
	boom := apierrors.NewInternalError(errors.New("etcd leader changed"))
	ws := h.Dynamic.Resource(widgets.GroupVersionResource).Namespace("shop")
	update := func(sub ...string) error {
		u, err := ws.Get(ctx, "blue", metav1.GetOptions{})
		if err != nil {
			t.Fatal(err)
		}
		_, err = ws.Update(ctx, u, metav1.UpdateOptions{}, sub...)
		return err
	}
	clear := h.Fail("update", "widgets", -1, boom)
	if err := update(); !apierrors.IsInternalError(err) {
		t.Fatalf("update of widgets: %v, want the injected 500", err)
	}
	if err := update("status"); err != nil {
		t.Fatalf("update of widgets/status: %v, want it to reach the store", err)
	}
	clear()
	h.Fail("update", "widgets/status", -1, boom)
	if err := update("status"); !apierrors.IsInternalError(err) {
		t.Fatalf("update of widgets/status: %v, want the injected 500", err)
	}
	if err := update(); err != nil {
		t.Fatalf("update of widgets: %v, want it to reach the store", err)
	}
}

// A child the reconciler creates, by an apply as by a create, has
// generation 1, as the API server gives it.
func TestCreatedChildrenHaveTheirFirstGeneration(t *testing.T) {
	h := reconciletest.New[*Widget](t, widgets, blue())
	apply, err := reconcile.NewApplier(reconcile.ApplyConfig{Dynamic: h.Dynamic, FieldManager: "test.opkit.dev/widgets", Owner: widgets})
	if err != nil {
		t.Fatal(err)
	}
	r := reconcile.Func[*Widget](func(ctx context.Context, req reconcile.Request[*Widget]) (reconcile.Result, error) {
		if _, err := apply.Apply(ctx, req.Object, configMaps, corev1ac.ConfigMap("applied", "")); err != nil {
			return reconcile.Done(), err
		}
		_, err := h.Clientset.CoreV1().ConfigMaps("shop").Create(ctx, &corev1.ConfigMap{ObjectMeta: metav1.ObjectMeta{Name: "created", Namespace: "shop"}}, metav1.CreateOptions{})
		return reconcile.Done(), err
	})
	ctx := context.Background()
	if c := h.ReconcileKey(ctx, r, opkit.Key{Namespace: "shop", Name: "blue"}); c.Err != nil {
		t.Fatal(c.Err)
	}
	for _, name := range []string{"applied", "created"} {
		cm, err := h.Clientset.CoreV1().ConfigMaps("shop").Get(ctx, name, metav1.GetOptions{})
		if err != nil || cm.Generation != 1 {
			t.Errorf("ConfigMap %s: generation %v (%v), want 1", name, cm.GetGeneration(), err)
		}
	}
}

// A server-side apply of what is stored already changes nothing: the
// reconciler that does it is converged; one whose apply changes the
// ConfigMap each time is not.
func TestAssertConvergedJudgesChangesNotCalls(t *testing.T) {
	for _, tc := range []struct {
		name      string
		changing  bool
		converged bool
	}{{"same apply", false, true}, {"changing apply", true, false}} {
		t.Run(tc.name, func(t *testing.T) {
			rtb := &recordingTB{TB: t}
			h := reconciletest.New[*Widget](rtb, widgets, blue())
			apply := newTestApplier(t, h)
			n := 0
			r := reconcile.Func[*Widget](func(ctx context.Context, req reconcile.Request[*Widget]) (reconcile.Result, error) {
				n++
				data := map[string]string{"size": "3"}
				if tc.changing {
					data["call"] = strconv.Itoa(n)
				}
				_, err := apply.Apply(ctx, req.Object, configMaps, corev1ac.ConfigMap("blue-cm", "").WithData(data))
				return reconcile.Done(), err
			})
			key := opkit.Key{Namespace: "shop", Name: "blue"}
			h.ReconcileKey(context.Background(), r, key)
			h.AssertConverged(context.Background(), r, key)
			if got := len(rtb.errors) == 0; got != tc.converged {
				t.Fatalf("converged = %v (%q), want %v", got, rtb.errors, tc.converged)
			}
		})
	}
}

func newTestApplier(t *testing.T, h *reconciletest.Harness[*Widget]) *reconcile.Applier {
	t.Helper()
	a, err := reconcile.NewApplier(reconcile.ApplyConfig{Dynamic: h.Dynamic, FieldManager: "test.opkit.dev/widgets", Owner: widgets})
	if err != nil {
		t.Fatal(err)
	}
	return a
}
