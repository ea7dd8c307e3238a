package reconciletest_test

import (
	"context"
	"fmt"
	"testing"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime"
	corev1ac "k8s.io/client-go/applyconfigurations/core/v1"

	"github.com/opkit/opkit"
	"github.com/opkit/opkit/reconcile"
	"github.com/opkit/opkit/reconcile/reconciletest"
	"github.com/opkit/opkit/watcher"
)

// A reconciler that owns a ConfigMap per Widget, tested without a
// cluster: the child's changes reach its owner (watcher.OwnedBy is the
// mapping reconcile.Config.Owns uses), and a reconcile brings a child
// someone deleted back.
func ExampleHarness_owns() {
	t := &testing.T{} // in a real test: the *testing.T given to the test
	h := reconciletest.New[*Widget](t, widgets, blue())
	apply, _ := reconcile.NewApplier(reconcile.ApplyConfig{Dynamic: h.Dynamic, FieldManager: "test.opkit.dev/widgets", Owner: widgets})
	r := reconcile.Func[*Widget](func(ctx context.Context, req reconcile.Request[*Widget]) (reconcile.Result, error) {
		if req.Type == opkit.Deleted {
			return reconcile.Done(), nil // the garbage collector removes the child
		}
		data := map[string]string{"size": fmt.Sprint(req.Object.Spec.Size)}
		_, err := apply.Apply(ctx, req.Object, configMaps, corev1ac.ConfigMap(req.Object.Name+"-config", "").WithData(data))
		return reconcile.Done(), err
	})
	ctx, owner := context.Background(), opkit.Key{Namespace: "shop", Name: "blue"}
	h.ReconcileKey(ctx, r, owner)

	// The child maps to its owner.
	cm, _ := h.Clientset.CoreV1().ConfigMaps("shop").Get(ctx, "blue-config", metav1.GetOptions{})
	m, _ := runtime.DefaultUnstructuredConverter.ToUnstructured(cm)
	fmt.Println("owner of blue-config:", watcher.OwnedBy(widgets)(&unstructured.Unstructured{Object: m}))

	// Someone deletes the child: the owner's reconcile (which the delete
	// asks for, with Request.Related ["configmaps"]) brings it back.
	h.Delete(configMaps, opkit.Key{Namespace: "shop", Name: "blue-config"})
	req := h.Request(owner, opkit.Modified)
	req.Related = []string{"configmaps"}
	c := h.Reconcile(ctx, r, req)
	fmt.Println(c.Err, c.Writes())
	cm, _ = h.Clientset.CoreV1().ConfigMaps("shop").Get(ctx, "blue-config", metav1.GetOptions{})
	fmt.Println(cm.Data)
	// Output:
	// owner of blue-config: [shop/blue]
	// <nil> [patch configmaps shop/blue-config]
	// map[size:3]
}
