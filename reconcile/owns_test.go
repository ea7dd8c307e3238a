package reconcile_test

import (
	"context"
	"slices"
	"testing"
	"testing/synctest"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/types"

	"github.com/opkit/opkit"
	"github.com/opkit/opkit/reconcile"
)

var configMaps = opkit.Resource{GroupVersionResource: corev1.SchemeGroupVersion.WithResource("configmaps"), Kind: "ConfigMap", Namespaced: true}

// ownedConfigMap is a ConfigMap controlled by the widget named owner.
func ownedConfigMap(name, owner, data string) *unstructured.Unstructured {
	yes := true
	u := &unstructured.Unstructured{Object: map[string]any{"data": map[string]any{"v": data}}}
	u.SetAPIVersion("v1")
	u.SetKind("ConfigMap")
	u.SetNamespace("ns")
	u.SetName(name)
	u.SetOwnerReferences([]metav1.OwnerReference{{APIVersion: "test.opkit.dev/v1", Kind: "Widget", Name: owner, UID: types.UID("uid-" + owner), Controller: &yes}})
	return u
}

// Config.Owns: a term's start reconciles the owner once (its own list),
// not once more per child kind; a child changed or deleted reconciles its
// owner, as source APIServer, naming the resource in Related.
func TestAnOwnedChildsChangeReconcilesItsOwner(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		rec := &recorder{}
		e := start(t, rec, func(c *reconcile.Config[*Widget]) {
			c.Owns = []opkit.Resource{configMaps}
			c.NoEvents = true
		}, widget("a"), widget("b"))
		synctest.Wait() // the term started, every watch open
		cms := e.dyn.Resource(configMaps.GroupVersionResource).Namespace("ns")
		ctx := context.Background()
		if _, err := cms.Create(ctx, ownedConfigMap("a-cm", "a", "1"), metav1.CreateOptions{}); err != nil {
			t.Fatal(err)
		}
		synctest.Wait()
		time.Sleep(time.Second)
		synctest.Wait()
		calls := rec.snapshot()
		if len(calls) != 3 {
			t.Fatalf("%d reconciles, want 3: a and b listed, then a for its new child", len(calls))
		}
		if last := calls[2].req; last.Key.Name != "a" || !slices.Equal(last.Related, []string{"configmaps"}) ||
			last.Sources != opkit.Sources(opkit.APIServer) || last.Object == nil || last.Object.Name != "a" {
			t.Fatalf("the child's reconcile: %+v, want a's, source APIServer, Related [configmaps], with the object read", last)
		}

		// The update and then the delete of the child each reconcile a
		// once more: the deleted child still maps to its owner.
		settle := func() {
			synctest.Wait()
			time.Sleep(time.Second)
			synctest.Wait()
		}
		// The fake keeps the resourceVersion it is given, as the API server
		// would set a new one.
		drifted := ownedConfigMap("a-cm", "a", "drifted")
		drifted.SetResourceVersion("2")
		if _, err := cms.Update(ctx, drifted, metav1.UpdateOptions{}); err != nil {
			t.Fatal(err)
		}
		settle()
		if n := len(rec.snapshot()); n != 4 {
			t.Fatalf("%d reconciles after the child's update, want 4", n)
		}
		if err := cms.Delete(ctx, "a-cm", metav1.DeleteOptions{}); err != nil {
			t.Fatal(err)
		}
		settle()
		calls = rec.snapshot()
		if len(calls) != 5 {
			t.Fatalf("%d reconciles, want 5: one more for the child's update, one for its delete", len(calls))
		}
		for i, c := range calls[3:] {
			if c.req.Key.Name != "a" || !slices.Equal(c.req.Related, []string{"configmaps"}) || c.req.Sources != opkit.Sources(opkit.APIServer) {
				t.Errorf("reconcile %d after the child's %s: %+v, want a's, source APIServer, Related [configmaps]", i+1, []string{"update", "delete"}[i], c.req)
			}
		}
	})
}
