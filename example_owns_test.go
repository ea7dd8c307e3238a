package opkit_test

import (
	"context"
	"fmt"
	"log"
	"os"
	"os/signal"
	"strconv"
	"syscall"
	"testing"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	corev1ac "k8s.io/client-go/applyconfigurations/core/v1"
	"k8s.io/client-go/dynamic"
	"k8s.io/client-go/rest"

	"github.com/opkit/opkit"
	"github.com/opkit/opkit/reconcile"
	"github.com/opkit/opkit/reconcile/reconciletest"
)

var configMaps = opkit.Resource{GroupVersionResource: corev1.SchemeGroupVersion.WithResource("configmaps"), Kind: "ConfigMap", Namespaced: true}

// sizer keeps a ConfigMap "<name>-size" for every Widget, holding its
// size: the child is stated, the Applier writes it (server-side apply,
// with a controller reference to the Widget).
type sizer struct{ apply *reconcile.Applier }

func newSizer(dyn dynamic.Interface) (*sizer, error) {
	apply, err := reconcile.NewApplier(reconcile.ApplyConfig{Dynamic: dyn, FieldManager: "example.com/widgets", Owner: widgets})
	return &sizer{apply: apply}, err
}

func (s *sizer) Reconcile(ctx context.Context, req reconcile.Request[*Widget]) (reconcile.Result, error) {
	if req.Type == opkit.Deleted || req.Object.DeletionTimestamp != nil {
		return reconcile.Done(), nil // the garbage collector deletes the child
	}
	child := corev1ac.ConfigMap(req.Object.Name+"-size", "").
		WithData(map[string]string{"size": strconv.Itoa(req.Object.Spec.Size)})
	_, err := s.apply.Apply(ctx, req.Object, configMaps, child)
	return reconcile.Done(), err
}

// An operator that owns children: Config.Owns makes a change or a delete
// of a ConfigMap reconcile the Widget that controls it, so an edit by hand
// is put back. Compiled, not run: it needs a cluster.
func Example_ownedChildren() {
	cfg, err := rest.InClusterConfig()
	if err != nil {
		log.Fatal(err)
	}
	dyn := dynamic.NewForConfigOrDie(reconcile.WithClientDefaults(cfg))
	r, err := newSizer(dyn)
	if err != nil {
		log.Fatal(err)
	}
	ctrl, err := reconcile.NewController(reconcile.Config[*Widget]{
		Name:       "example.com/widgets",
		Resource:   widgets,
		Dynamic:    dyn,
		Reconciler: r,
		Owns:       []opkit.Resource{configMaps},
	})
	if err != nil {
		log.Fatal(err)
	}
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	if err := ctrl.Run(ctx); err != nil {
		log.Fatal(err)
	}
}

// The same reconciler unit-tested with reconciletest, as a test function
// would (here t is a stand-in for the test's *testing.T): the first
// reconcile creates the child, a second changes nothing, and a child
// someone deleted comes back.
func Example_testingAReconciler() {
	t := &testing.T{}
	w := &Widget{ObjectMeta: metav1.ObjectMeta{Namespace: "shop", Name: "blue", UID: "uid-blue"}}
	w.Spec.Size = 3
	h := reconciletest.New[*Widget](t, widgets, w)
	r, _ := newSizer(h.Dynamic)
	ctx, key := context.Background(), opkit.KeyOf(w)

	fmt.Println(h.ReconcileKey(ctx, r, key).Writes())
	h.AssertConverged(ctx, r, key)
	fmt.Println("converged:", !t.Failed())

	h.Delete(configMaps, opkit.Key{Namespace: "shop", Name: "blue-size"})
	h.ReconcileKey(ctx, r, key) // what the child's delete asks for (Config.Owns)
	cm, err := h.Clientset.CoreV1().ConfigMaps("shop").Get(ctx, "blue-size", metav1.GetOptions{})
	fmt.Println(cm.Data, err, metav1.GetControllerOf(cm).Name)
	// Output:
	// [patch configmaps shop/blue-size]
	// converged: true
	// map[size:3] <nil> blue
}
