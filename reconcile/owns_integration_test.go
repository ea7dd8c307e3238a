//go:build integration

package reconcile_test

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	corev1ac "k8s.io/client-go/applyconfigurations/core/v1"

	"github.com/opkit/opkit"
	"github.com/opkit/opkit/internal/testcluster"
	"github.com/opkit/opkit/internal/typed"
	"github.com/opkit/opkit/queue"
	"github.com/opkit/opkit/reconcile"
	"github.com/opkit/opkit/watcher"
)

// childReconciler keeps one ConfigMap "<name>-child" per Widget with the
// Applier, fails while failing is set, and records the Related of every
// reconcile and the errors the Applier returned.
type childReconciler struct {
	apply   *reconcile.Applier
	failing atomic.Bool
	mu      sync.Mutex
	related map[string][][]string // by widget
	errs    map[string]error      // the last Apply error, by widget
}

func (r *childReconciler) Reconcile(ctx context.Context, req reconcile.Request[*Widget]) (reconcile.Result, error) {
	r.mu.Lock()
	r.related[req.Key.Name] = append(r.related[req.Key.Name], req.Related)
	r.mu.Unlock()
	if req.Type == opkit.Deleted || req.Object.DeletionTimestamp != nil {
		return reconcile.Done(), nil // the garbage collector takes the child
	}
	if r.failing.Load() {
		return reconcile.Done(), errors.New("failing on purpose")
	}
	_, err := r.apply.Apply(ctx, req.Object, configMaps, corev1ac.ConfigMap(req.Object.Name+"-child", "").
		WithData(map[string]string{"size": fmt.Sprint(req.Object.Spec.Size)}))
	r.mu.Lock()
	r.errs[req.Key.Name] = err
	r.mu.Unlock()
	return reconcile.Done(), err
}

func (r *childReconciler) lastErr(name string) error {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.errs[name]
}

// Owned children on a real control plane with a garbage collector
// (kube-controller-manager): drift and deletes of children are repaired
// by their owner's reconcile, an owner deleted in the foreground takes
// its children with it, a child controlled by someone else is left
// alone, and a Watches mapping reaches several owners.
func TestIntegrationOwnedChildren(t *testing.T) {
	_, dyn, kube, ns := privateWidgets(t, testcluster.Options{ControllerManager: true})
	ctx := context.Background()
	apply, err := reconcile.NewApplier(reconcile.ApplyConfig{Dynamic: dyn, FieldManager: "test.opkit.dev/owners", Owner: widgets})
	if err != nil {
		t.Fatal(err)
	}
	rec := &childReconciler{apply: apply, related: map[string][][]string{}, errs: map[string]error{}}
	// Secrets labelled "widgets: a.b" concern the widgets a and b.
	secrets := opkit.Resource{GroupVersionResource: corev1.SchemeGroupVersion.WithResource("secrets"), Kind: "Secret", Namespaced: true}
	byLabel := func(obj *unstructured.Unstructured) []opkit.Key {
		var keys []opkit.Key
		for name := range strings.SplitSeq(obj.GetLabels()["widgets"], ".") {
			if name != "" {
				keys = append(keys, opkit.Key{Namespace: obj.GetNamespace(), Name: name})
			}
		}
		return keys
	}
	ctrl := runController(t, reconcile.Config[*Widget]{
		Name: "test.opkit.dev/owners", Resource: widgets, Dynamic: dyn, Reconciler: rec, NoEvents: true, Logger: quiet,
		Owns:    []opkit.Resource{configMaps},
		Watches: []reconcile.Watch{{Resource: secrets, Map: byLabel}},
		Watch:   watcher.Config[*Widget]{Namespace: ns},
		Backoff: fastBackoff,
	})
	cms := kube.CoreV1().ConfigMaps(ns)
	child := func(name string) (*corev1.ConfigMap, error) { return cms.Get(ctx, name+"-child", metav1.GetOptions{}) }
	childSize := func(name, want string) func() error {
		return func() error {
			cm, err := child(name)
			if err != nil {
				return err
			}
			if cm.Data["size"] != want {
				return fmt.Errorf("size %q", cm.Data["size"])
			}
			return nil
		}
	}
	for _, name := range []string{"a", "b", "gone", "taken"} {
		create(t, dyn, ns, name, 1)
	}
	eventually(t, time.Minute, "the controller ready", ctrl.Check)
	for _, name := range []string{"a", "b", "gone"} {
		eventually(t, time.Minute, "the child of "+name, childSize(name, "1"))
	}

	t.Run("drift is repaired", func(t *testing.T) {
		cm, err := child("a")
		if err != nil {
			t.Fatal(err)
		}
		cm.Data["size"] = "999"
		if _, err := cms.Update(ctx, cm, metav1.UpdateOptions{}); err != nil {
			t.Fatal(err)
		}
		eventually(t, time.Minute, "the edited child back", childSize("a", "1"))
		rec.mu.Lock()
		defer rec.mu.Unlock()
		if !slices.ContainsFunc(rec.related["a"], func(r []string) bool { return slices.Equal(r, []string{"configmaps"}) }) {
			t.Fatalf("a's reconciles had Related %v, want one [configmaps]", rec.related["a"])
		}
	})

	t.Run("a child deleted while its owner's reconcile fails comes back", func(t *testing.T) {
		rec.failing.Store(true)
		client := typed.New[*Widget](dyn, widgets)
		w, err := client.Get(ctx, opkit.Key{Namespace: ns, Name: "b"})
		if err != nil {
			t.Fatal(err)
		}
		w.Spec.Size = 2
		if _, err := client.Update(ctx, w); err != nil { // b's reconcile fails now
			t.Fatal(err)
		}
		if err := cms.Delete(ctx, "b-child", metav1.DeleteOptions{}); err != nil {
			t.Fatal(err)
		}
		time.Sleep(time.Second) // some failed attempts
		rec.failing.Store(false)
		eventually(t, time.Minute, "b's child recreated at size 2", childSize("b", "2"))
	})

	t.Run("a child controlled by another object is left alone", func(t *testing.T) {
		yes := true
		// taken-child exists already, controlled by a Secret.
		sec, err := kube.CoreV1().Secrets(ns).Create(ctx, &corev1.Secret{ObjectMeta: metav1.ObjectMeta{Name: "holder"}}, metav1.CreateOptions{})
		if err != nil {
			t.Fatal(err)
		}
		cm, err := child("taken")
		if apierrors.IsNotFound(err) {
			cm, err = cms.Create(ctx, &corev1.ConfigMap{ObjectMeta: metav1.ObjectMeta{Name: "taken-child"}}, metav1.CreateOptions{})
		}
		if err != nil {
			t.Fatal(err)
		}
		cm.OwnerReferences = []metav1.OwnerReference{{APIVersion: "v1", Kind: "Secret", Name: "holder", UID: sec.UID, Controller: &yes}}
		cm.Data = map[string]string{"size": "theirs"}
		if _, err := cms.Update(ctx, cm, metav1.UpdateOptions{}); err != nil {
			t.Fatal(err)
		}
		eventually(t, time.Minute, "a terminal error for taken", func() error {
			if err := rec.lastErr("taken"); !reconcile.IsTerminal(err) {
				return fmt.Errorf("last apply error %v", err)
			}
			return nil
		})
		if got, _ := child("taken"); got.Data["size"] != "theirs" || metav1.GetControllerOf(got).Kind != "Secret" {
			t.Fatalf("taken-child %v controlled by %+v: want it left as the Secret keeps it", got.Data, metav1.GetControllerOf(got))
		}
	})

	t.Run("a mapping to several owners reaches each", func(t *testing.T) {
		rec.mu.Lock()
		before := map[string]int{"a": len(rec.related["a"]), "b": len(rec.related["b"])}
		rec.mu.Unlock()
		if _, err := kube.CoreV1().Secrets(ns).Create(ctx, &corev1.Secret{ObjectMeta: metav1.ObjectMeta{Name: "shared",
			Labels: map[string]string{"widgets": "a.b"}}}, metav1.CreateOptions{}); err != nil {
			t.Fatal(err)
		}
		eventually(t, time.Minute, "a and b reconciled for the secret", func() error {
			rec.mu.Lock()
			defer rec.mu.Unlock()
			for _, name := range []string{"a", "b"} {
				if !slices.ContainsFunc(rec.related[name][before[name]:], func(r []string) bool { return slices.Contains(r, "secrets") }) {
					return fmt.Errorf("%s not reconciled for the secret yet", name)
				}
			}
			return nil
		})
	})

	t.Run("an owner deleted in the foreground takes its child", func(t *testing.T) {
		fg := metav1.DeletePropagationForeground
		if err := dyn.Resource(widgets.GroupVersionResource).Namespace(ns).Delete(ctx, "gone", metav1.DeleteOptions{PropagationPolicy: &fg}); err != nil {
			t.Fatal(err)
		}
		eventually(t, time.Minute, "the owner and its child gone", func() error {
			if _, err := child("gone"); !apierrors.IsNotFound(err) {
				return fmt.Errorf("child: %v", err)
			}
			if _, err := dyn.Resource(widgets.GroupVersionResource).Namespace(ns).Get(ctx, "gone", metav1.GetOptions{}); !apierrors.IsNotFound(err) {
				return fmt.Errorf("owner: %v", err)
			}
			return nil
		})
		// The owner's reconciles while it was deleting must not have
		// brought the child back: it stays gone.
		time.Sleep(time.Second)
		if _, err := child("gone"); !apierrors.IsNotFound(err) {
			t.Fatalf("the child after the owner went: %v, want NotFound", err)
		}
	})
}

var fastBackoff = queue.Backoff{Base: 100 * time.Millisecond, Cap: time.Second}
