//go:build integration

package envtest_test

import (
	"context"
	"fmt"
	"testing"
	"time"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/watch"

	"github.com/opkit/opkit/reconcile/envtest"
)

// TestSmoke proves the control plane is real: a CRD becomes established, an
// object of it goes through create/update/delete and a watch sees each step
// in order, and optimistic concurrency rejects a stale update.
func TestSmoke(t *testing.T) {
	c := envtest.Shared(t)
	ns := c.Namespace(t)
	d := dyn(t, c.Config())
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()

	group := "smoke.opkit.test"
	crd := &unstructured.Unstructured{Object: map[string]any{
		"apiVersion": "apiextensions.k8s.io/v1",
		"kind":       "CustomResourceDefinition",
		"metadata":   map[string]any{"name": "widgets." + group},
		"spec": map[string]any{
			"group": group,
			"scope": "Namespaced",
			"names": map[string]any{"plural": "widgets", "singular": "widget", "kind": "Widget", "listKind": "WidgetList"},
			"versions": []any{map[string]any{
				"name": "v1", "served": true, "storage": true,
				"schema": map[string]any{"openAPIV3Schema": map[string]any{
					"type": "object",
					"properties": map[string]any{
						"spec": map[string]any{"type": "object", "properties": map[string]any{
							"size": map[string]any{"type": "integer"},
						}},
					},
				}},
			}},
		},
	}}
	if _, err := d.Resource(crdGVR).Create(ctx, crd, metav1.CreateOptions{}); err != nil && !apierrors.IsAlreadyExists(err) {
		t.Fatalf("create CRD: %v", err)
	}
	eventually(t, 60*time.Second, "CRD established", func(ctx context.Context) error {
		got, err := d.Resource(crdGVR).Get(ctx, "widgets."+group, metav1.GetOptions{})
		if err != nil {
			return err
		}
		conds, _, _ := unstructured.NestedSlice(got.Object, "status", "conditions")
		for _, cond := range conds {
			m, _ := cond.(map[string]any)
			if m["type"] == "Established" && m["status"] == "True" {
				return nil
			}
		}
		return fmt.Errorf("conditions %v", conds)
	})

	widgets := d.Resource(schema.GroupVersionResource{Group: group, Version: "v1", Resource: "widgets"}).Namespace(ns)
	var list *unstructured.UnstructuredList
	// Established means served; the first list may still race the handler.
	eventually(t, 30*time.Second, "list widgets", func(ctx context.Context) (err error) {
		list, err = widgets.List(ctx, metav1.ListOptions{})
		return err
	})
	if len(list.Items) != 0 {
		t.Fatalf("fresh namespace holds %d widgets, want 0", len(list.Items))
	}
	w, err := widgets.Watch(ctx, metav1.ListOptions{ResourceVersion: list.GetResourceVersion()})
	if err != nil {
		t.Fatalf("watch widgets: %v", err)
	}
	defer w.Stop()

	obj := &unstructured.Unstructured{Object: map[string]any{
		"apiVersion": group + "/v1",
		"kind":       "Widget",
		"metadata":   map[string]any{"name": "w1"},
		"spec":       map[string]any{"size": int64(1)},
	}}
	created, err := widgets.Create(ctx, obj, metav1.CreateOptions{})
	if err != nil {
		t.Fatalf("create widget: %v", err)
	}
	if err := unstructured.SetNestedField(created.Object, int64(2), "spec", "size"); err != nil {
		t.Fatal(err)
	}
	updated, err := widgets.Update(ctx, created, metav1.UpdateOptions{})
	if err != nil {
		t.Fatalf("update widget: %v", err)
	}
	if updated.GetResourceVersion() == created.GetResourceVersion() {
		t.Fatalf("update kept resourceVersion %s", created.GetResourceVersion())
	}
	if err := widgets.Delete(ctx, "w1", metav1.DeleteOptions{}); err != nil {
		t.Fatalf("delete widget: %v", err)
	}
	if _, err := widgets.Get(ctx, "w1", metav1.GetOptions{}); !apierrors.IsNotFound(err) {
		t.Fatalf("get deleted widget: err = %v, want NotFound", err)
	}

	want := []struct {
		typ  watch.EventType
		size int64
	}{{watch.Added, 1}, {watch.Modified, 2}, {watch.Deleted, 2}}
	for i, wantEv := range want {
		select {
		case ev, ok := <-w.ResultChan():
			if !ok {
				t.Fatalf("watch closed before event %d", i)
			}
			u, isU := ev.Object.(*unstructured.Unstructured)
			if !isU {
				t.Fatalf("event %d: %s with %T, want %s of a Widget", i, ev.Type, ev.Object, wantEv.typ)
			}
			size, _, _ := unstructured.NestedInt64(u.Object, "spec", "size")
			if ev.Type != wantEv.typ || u.GetName() != "w1" || size != wantEv.size {
				t.Fatalf("event %d: %s %s size=%d, want %s w1 size=%d", i, ev.Type, u.GetName(), size, wantEv.typ, wantEv.size)
			}
		case <-ctx.Done():
			t.Fatalf("waiting for watch event %d (%s): %v", i, wantEv.typ, ctx.Err())
		}
	}

	// Optimistic concurrency: an update carrying a stale resourceVersion
	// must be rejected with 409 Conflict.
	leases := d.Resource(leaseGVR).Namespace(ns)
	l1, err := leases.Create(ctx, lease(ns, "smoke", "a"), metav1.CreateOptions{})
	if err != nil {
		t.Fatalf("create lease: %v", err)
	}
	stale := l1.DeepCopy()
	if err := unstructured.SetNestedField(l1.Object, "b", "spec", "holderIdentity"); err != nil {
		t.Fatal(err)
	}
	if _, err := leases.Update(ctx, l1, metav1.UpdateOptions{}); err != nil {
		t.Fatalf("first lease update: %v", err)
	}
	if err := unstructured.SetNestedField(stale.Object, "c", "spec", "holderIdentity"); err != nil {
		t.Fatal(err)
	}
	_, err = leases.Update(ctx, stale, metav1.UpdateOptions{})
	if !apierrors.IsConflict(err) {
		t.Fatalf("update with stale resourceVersion %s: err = %v, want 409 Conflict", stale.GetResourceVersion(), err)
	}
	got, err := leases.Get(ctx, "smoke", metav1.GetOptions{})
	if err != nil {
		t.Fatalf("get lease: %v", err)
	}
	if h, _, _ := unstructured.NestedString(got.Object, "spec", "holderIdentity"); h != "b" {
		t.Fatalf("lease holder = %q after rejected update, want %q", h, "b")
	}
}
