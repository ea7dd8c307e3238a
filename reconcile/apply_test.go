package reconcile_test

import (
	"context"
	"errors"
	"strings"
	"testing"

	appsv1 "k8s.io/api/apps/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/types"
	appsv1ac "k8s.io/client-go/applyconfigurations/apps/v1"
	corev1ac "k8s.io/client-go/applyconfigurations/core/v1"
	metav1ac "k8s.io/client-go/applyconfigurations/meta/v1"

	"github.com/opkit/opkit"
	"github.com/opkit/opkit/reconcile"
	"github.com/opkit/opkit/reconcile/reconciletest"
)

func newApplier(t *testing.T, h *reconciletest.Harness[*Widget], noForce bool) *reconcile.Applier {
	t.Helper()
	a, err := reconcile.NewApplier(reconcile.ApplyConfig{Dynamic: h.Dynamic, FieldManager: "test.opkit.dev/widgets", Owner: widgets, NoForce: noForce})
	if err != nil {
		t.Fatal(err)
	}
	return a
}

// The applied child is in its owner's namespace, controlled by it (the
// reference blocks the owner's deletion until the child is gone), and
// keeps references to other owners it names.
func TestApplyCreatesTheChildWithAControllerReference(t *testing.T) {
	w := widget("a")
	h := reconciletest.New[*Widget](t, widgets, w)
	a := newApplier(t, h, false)
	other := metav1ac.OwnerReference().WithAPIVersion("v1").WithKind("Secret").WithName("s").WithUID("uid-s")
	out, err := a.Apply(context.Background(), w, configMaps, corev1ac.ConfigMap("a-cm", "").WithData(map[string]string{"k": "v"}).
		WithOwnerReferences(other))
	if err != nil {
		t.Fatal(err)
	}
	refs := out.GetOwnerReferences()
	if out.GetNamespace() != "ns" || len(refs) != 2 || refs[0].UID != "uid-a" || refs[0].Kind != "Widget" ||
		refs[0].Controller == nil || !*refs[0].Controller || refs[0].BlockOwnerDeletion == nil || !*refs[0].BlockOwnerDeletion || refs[1].UID != "uid-s" {
		t.Fatalf("applied %s/%s with owner references %+v", out.GetNamespace(), out.GetName(), refs)
	}
}

func TestApplyRefusesAChildItsOwnerCannotOwn(t *testing.T) {
	w := widget("a")
	h := reconciletest.New[*Widget](t, widgets, w)
	a := newApplier(t, h, false)
	nodes := opkit.Resource{GroupVersionResource: schema.GroupVersionResource{Version: "v1", Resource: "nodes"}, Kind: "Node"}
	for _, tc := range []struct {
		name  string
		res   opkit.Resource
		child any
		want  string
	}{
		{"another namespace", configMaps, corev1ac.ConfigMap("x", "elsewhere"), "not in its owner's namespace"},
		{"cluster-scoped", nodes, map[string]any{"metadata": map[string]any{"name": "n"}}, "cluster-scoped"},
		{"no name", configMaps, corev1ac.ConfigMap("", ""), "no name"},
		{"not an object", configMaps, 42, "not an object"},
	} {
		if _, err := a.Apply(context.Background(), w, tc.res, tc.child); err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("%s: err = %v, want one saying %q", tc.name, err, tc.want)
		}
	}
}

// A child another owner controls is not taken over: a terminal error,
// unless that owner is a deleted predecessor of the same name.
func TestApplyLeavesAChildAnotherOwnerControls(t *testing.T) {
	yes := true
	controlledBy := func(kind, name, uid string) *unstructured.Unstructured {
		u := ownedConfigMap("a-cm", name, "old")
		u.SetOwnerReferences([]metav1.OwnerReference{{APIVersion: "test.opkit.dev/v1", Kind: kind, Name: name, UID: types.UID(uid), Controller: &yes}})
		return u
	}
	refused := apierrors.NewInvalid(schema.GroupKind{Kind: "ConfigMap"}, "a-cm", nil)
	refused.ErrStatus.Message = `ConfigMap "a-cm" is invalid: metadata.ownerReferences: Invalid value: []: Only one reference can have Controller set to true`
	for _, tc := range []struct {
		name     string
		existing *unstructured.Unstructured
		terminal bool
	}{
		{"another kind", controlledBy("Gadget", "g", "uid-g"), true},
		{"another widget", controlledBy("Widget", "b", "uid-b"), true},
		{"a deleted widget of the name", controlledBy("Widget", "a", "uid-old-a"), false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			w := widget("a")
			cm := tc.existing
			h := reconciletest.New[*Widget](t, widgets, w, cm)
			h.Fail("patch", "configmaps", 1, refused) // what the API server answers
			_, err := newApplier(t, h, false).Apply(context.Background(), w, configMaps, corev1ac.ConfigMap("a-cm", ""))
			if err == nil || reconcile.IsTerminal(err) != tc.terminal || !strings.Contains(err.Error(), "controlled by") {
				t.Fatalf("err = %v (terminal %v), want terminal=%v, naming the controller", err, reconcile.IsTerminal(err), tc.terminal)
			}
		})
	}
}

// With NoForce, a field another manager owns is a terminal error.
func TestApplyWithoutForceMakesAConflictTerminal(t *testing.T) {
	w := widget("a")
	h := reconciletest.New[*Widget](t, widgets, w)
	h.Fail("patch", "configmaps", 1, apierrors.NewConflict(schema.GroupResource{Resource: "configmaps"}, "a-cm", errors.New(`conflict with "kubectl": .data.k`)))
	_, err := newApplier(t, h, true).Apply(context.Background(), w, configMaps, corev1ac.ConfigMap("a-cm", "").WithData(map[string]string{"k": "v"}))
	if !reconcile.IsTerminal(err) || !apierrors.IsConflict(err) {
		t.Fatalf("err = %v, want a terminal error wrapping the conflict", err)
	}
}

// Delete removes only a child its owner controls.
func TestDeleteRemovesOnlyWhatTheOwnerControls(t *testing.T) {
	w := widget("a")
	mine := ownedConfigMap("mine", "a", "1")
	theirs := ownedConfigMap("theirs", "a", "1")
	yes := true
	theirs.SetOwnerReferences([]metav1.OwnerReference{{APIVersion: "test.opkit.dev/v1", Kind: "Widget", Name: "a", UID: "uid-new-a", Controller: &yes}})
	h := reconciletest.New[*Widget](t, widgets, w, mine, theirs)
	a := newApplier(t, h, false)
	ctx := context.Background()
	for _, tc := range []struct {
		name    string
		deleted bool
	}{{"mine", true}, {"theirs", false}, {"absent", false}} {
		got, err := a.Delete(ctx, w, configMaps, opkit.Key{Namespace: "ns", Name: tc.name})
		if err != nil || got != tc.deleted {
			t.Errorf("Delete(%s) = %v, %v; want %v", tc.name, got, err, tc.deleted)
		}
	}
	if _, err := h.Clientset.CoreV1().ConfigMaps("ns").Get(ctx, "theirs", metav1.GetOptions{}); err != nil {
		t.Fatalf("the new widget's child: %v, want it kept", err)
	}
}

// ApplyAs hands the child back in its Go type, as the API server stored
// it: a Deployment's spec and status read as fields.
func TestApplyAsReturnsTheTypedChild(t *testing.T) {
	w := widget("a")
	h := reconciletest.New[*Widget](t, widgets, w)
	a := newApplier(t, h, false)
	deployments := opkit.Resource{GroupVersionResource: appsv1.SchemeGroupVersion.WithResource("deployments"), Kind: "Deployment", Namespaced: true}
	child := appsv1ac.Deployment("a-web", "").WithSpec(appsv1ac.DeploymentSpec().WithReplicas(3).
		WithSelector(metav1ac.LabelSelector().WithMatchLabels(map[string]string{"app": "a"})))
	d, err := reconcile.ApplyAs[*appsv1.Deployment](context.Background(), a, w, deployments, child)
	if err != nil {
		t.Fatal(err)
	}
	if d.Name != "a-web" || d.Namespace != "ns" || d.Spec.Replicas == nil || *d.Spec.Replicas != 3 || d.Status.AvailableReplicas != 0 {
		t.Fatalf("ApplyAs = %s/%s replicas %v, available %d", d.Namespace, d.Name, d.Spec.Replicas, d.Status.AvailableReplicas)
	}
	if _, err := reconcile.ApplyAs[*appsv1.Deployment](context.Background(), a, w, deployments, "not an object"); err == nil {
		t.Fatal("ApplyAs of a string: no error")
	}
}
