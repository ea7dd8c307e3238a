package reconciler_test

import (
	"context"
	"slices"
	"strings"
	"testing"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/schema"

	"github.com/opkit/opkit"
	demov1 "github.com/opkit/opkit/example/api/v1"
	"github.com/opkit/opkit/example/reconciler"
	"github.com/opkit/opkit/reconcile"
	"github.com/opkit/opkit/reconcile/reconciletest"
)

var key = opkit.Key{Namespace: "team-a", Name: "hello"}

func entity(msg string, replicas int32) *demov1.DemoEntity {
	e := &demov1.DemoEntity{}
	e.Namespace, e.Name, e.UID, e.Generation, e.ResourceVersion = key.Namespace, key.Name, "uid-1", 1, "1"
	e.Spec.Message, e.Spec.Replicas = msg, &replicas
	return e
}

type fixture struct {
	h *reconciletest.Harness[*demov1.DemoEntity]
	r *reconciler.Reconciler
}

func setup(t *testing.T, objs ...opkit.Object) *fixture {
	t.Helper()
	f := &fixture{h: reconciletest.New[*demov1.DemoEntity](t, demov1.Resource, objs...)}
	rec, err := reconcile.NewRecorder(reconcile.RecorderConfig{Dynamic: f.h.Dynamic, Controller: "demo.opkit.dev/demo-operator", Resource: demov1.Resource})
	if err != nil {
		t.Fatal(err)
	}
	f.r, err = reconciler.New(reconciler.Config{Dynamic: f.h.Dynamic, Recorder: rec, Identity: "replica-a"})
	if err != nil {
		t.Fatal(err)
	}
	return f
}

func (f *fixture) configMap(t *testing.T) (*corev1.ConfigMap, bool) {
	t.Helper()
	u, err := f.h.Dynamic.Resource(corev1.SchemeGroupVersion.WithResource("configmaps")).Namespace(key.Namespace).
		Get(context.Background(), reconciler.ConfigMapName(key.Name), metav1.GetOptions{})
	if err != nil {
		return nil, false
	}
	cm := &corev1.ConfigMap{}
	if err := runtime.DefaultUnstructuredConverter.FromUnstructured(u.Object, cm); err != nil {
		t.Fatal(err)
	}
	return cm, true
}

func TestCreateMakesOwnedConfigMapAndStatus(t *testing.T) {
	f := setup(t, entity("hi", 3))
	c := f.h.ReconcileKey(context.Background(), f.r, key)
	if c.Err != nil {
		t.Fatal(c.Err)
	}
	want := []string{
		"patch demoentities team-a/hello",         // the finalizer
		"patch configmaps team-a/hello-demo",      // the ConfigMap, applied
		"update demoentities/status team-a/hello", // the status
	}
	if got := c.Writes(); !slices.Equal(got, want) {
		t.Fatalf("writes = %q, want %q", got, want)
	}
	cm, ok := f.configMap(t)
	if !ok {
		t.Fatal("no ConfigMap")
	}
	if cm.Data["message"] != "hi" || cm.Data["replicas"] != "3" {
		t.Errorf("ConfigMap data = %v, want message=hi replicas=3", cm.Data)
	}
	ref := metav1.GetControllerOf(cm)
	if ref == nil || ref.UID != "uid-1" || ref.Kind != "DemoEntity" || ref.APIVersion != "demo.opkit.dev/v1" ||
		ref.BlockOwnerDeletion == nil || !*ref.BlockOwnerDeletion {
		t.Errorf("controller reference = %+v, want the entity", ref)
	}
	e := f.h.Get(key)
	if !slices.Contains(e.Finalizers, demov1.Finalizer) {
		t.Errorf("finalizers = %v, want %s", e.Finalizers, demov1.Finalizer)
	}
	st := e.Status
	if st.ObservedGeneration != 1 || st.ReconciledBy != "replica-a" || st.ConfigMap != "hello-demo" ||
		st.LastReconciled == nil {
		t.Fatalf("status = %+v", st)
	}
	if lt := st.LastTrigger; lt == nil || lt.Source != "APIServer" || lt.Reason != "Modified" || !lt.At.Equal(st.LastReconciled) {
		t.Errorf("lastTrigger = %+v, want APIServer/Modified at lastReconciled (%v)", lt, st.LastReconciled)
	}
	if cond := meta.FindStatusCondition(st.Conditions, demov1.ConditionReady); cond == nil ||
		cond.Status != metav1.ConditionTrue || cond.ObservedGeneration != 1 || cond.Reason != reconciler.ReasonReconciled {
		t.Errorf("Ready = %+v", cond)
	}
}

func TestSecondReconcileWritesNothing(t *testing.T) {
	f := setup(t, entity("hi", 3))
	if c := f.h.ReconcileKey(context.Background(), f.r, key); c.Err != nil {
		t.Fatal(c.Err)
	}
	before := f.h.Get(key).Status
	c := f.h.AssertConverged(context.Background(), f.r, key)
	if got, want := c.Writes(), []string{"patch configmaps team-a/hello-demo"}; !slices.Equal(got, want) {
		t.Errorf("writes = %q, want %q: the apply, which changes nothing", got, want)
	}
	if got := f.h.Get(key).Status; !got.LastReconciled.Equal(before.LastReconciled) || *got.LastTrigger != *before.LastTrigger {
		t.Errorf("status moved from %+v to %+v on a no-op reconcile", before, got)
	}
}

func TestSpecChangeUpdatesConfigMapAndObservedGeneration(t *testing.T) {
	f := setup(t, entity("hi", 3))
	f.h.ReconcileKey(context.Background(), f.r, key)
	e := f.h.Get(key)
	e.Spec.Message, e.Spec.Replicas = "bye", new(int32) // a user's edit: Change bumps the generation
	f.h.Change(e)
	c := f.h.ReconcileKey(context.Background(), f.r, key)
	if c.Err != nil {
		t.Fatal(c.Err)
	}
	want := []string{"patch configmaps team-a/hello-demo", "update demoentities/status team-a/hello"}
	if got := c.Writes(); !slices.Equal(got, want) {
		t.Fatalf("writes = %q, want %q", got, want)
	}
	cm, _ := f.configMap(t)
	if cm.Data["message"] != "bye" || cm.Data["replicas"] != "0" {
		t.Errorf("ConfigMap data = %v, want message=bye replicas=0", cm.Data)
	}
	st := f.h.Get(key).Status
	if st.ObservedGeneration != 2 {
		t.Errorf("status = %+v, want observedGeneration 2", st)
	}
	f.h.AssertConverged(context.Background(), f.r, key)
}

func TestConfigMapDriftIsRepaired(t *testing.T) {
	f := setup(t, entity("hi", 3))
	f.h.ReconcileKey(context.Background(), f.r, key)
	cm, _ := f.configMap(t)
	cm.Data["message"] = "tampered"
	u, _ := runtime.DefaultUnstructuredConverter.ToUnstructured(cm)
	cmU := toU(u)
	cmU.SetAPIVersion("v1")
	cmU.SetKind("ConfigMap")
	if _, err := f.h.Dynamic.Resource(corev1.SchemeGroupVersion.WithResource("configmaps")).Namespace(key.Namespace).
		Update(context.Background(), cmU, metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
	c := f.h.ReconcileKey(context.Background(), f.r, key)
	if got := c.Writes(); len(got) == 0 || got[0] != "patch configmaps team-a/hello-demo" {
		t.Fatalf("writes = %q, want the ConfigMap applied", got)
	}
	if cm, _ := f.configMap(t); cm.Data["message"] != "hi" {
		t.Errorf("message = %q after repair", cm.Data["message"])
	}
}

func TestTriggerReasonLandsInStatus(t *testing.T) {
	f := setup(t, entity("hi", 3))
	f.h.ReconcileKey(context.Background(), f.r, key)
	req := f.h.Request(key, opkit.Modified)
	req.Sources, req.Reasons = opkit.Sources(opkit.Operator), []string{"deployed build 42"}
	c := f.h.Reconcile(context.Background(), f.r, req)
	if c.Err != nil {
		t.Fatal(c.Err)
	}
	// Nothing changed but the trigger is recorded: the (unchanged) apply,
	// and a status write.
	if got, want := c.Writes(), []string{"patch configmaps team-a/hello-demo", "update demoentities/status team-a/hello"}; !slices.Equal(got, want) {
		t.Fatalf("writes = %q, want %q", got, want)
	}
	st := f.h.Get(key).Status
	if lt := st.LastTrigger; lt == nil || lt.Source != "Operator" || lt.Reason != "deployed build 42" || !lt.At.Equal(st.LastReconciled) {
		t.Fatalf("lastTrigger = %+v, want Operator/deployed build 42 at lastReconciled (%v)", lt, st.LastReconciled)
	}
	// The watch event caused by that status write changes nothing.
	f.h.AssertConverged(context.Background(), f.r, key)
	if lt := f.h.Get(key).Status.LastTrigger; lt.Source != "Operator" {
		t.Errorf("a converged watch reconcile overwrote lastTrigger with %+v", lt)
	}
}

// The finalizer records an Event and lets the entity go; its ConfigMap
// is the garbage collector's (the fakes have none, so it stays here).
func TestFinalizerRecordsAnEventAndLeavesTheConfigMapToTheCollector(t *testing.T) {
	f := setup(t, entity("hi", 3))
	f.h.ReconcileKey(context.Background(), f.r, key)
	f.h.MarkDeleting(key)
	c := f.h.ReconcileKey(context.Background(), f.r, key)
	if c.Err != nil {
		t.Fatal(c.Err)
	}
	want := []string{"create events team-a/" /* generated name */, "patch demoentities team-a/hello"}
	got := c.Writes()
	if len(got) == 2 && strings.HasPrefix(got[0], want[0]) {
		got[0] = want[0]
	}
	if !slices.Equal(got, want) {
		t.Fatalf("writes = %q, want %q", got, want)
	}
	if f.h.Exists(key) {
		t.Error("entity still stored after its finalizer was removed")
	}
	evs := f.h.Events()
	if want := "Normal " + reconciler.EventFinalized + ": Finalized; the garbage collector deletes ConfigMap hello-demo with the entity"; len(evs) != 1 || evs[0] != want {
		t.Fatalf("events = %q, want [%q]", evs, want)
	}
	// The Deleted event that follows needs nothing.
	del := reconcile.Request[*demov1.DemoEntity]{Key: key, Object: entity("hi", 3), Type: opkit.Deleted, Sources: opkit.Sources(opkit.APIServer)}
	if c := f.h.Reconcile(context.Background(), f.r, del); c.Err != nil || len(c.Actions) != 0 {
		t.Errorf("Deleted request: err %v, calls %d; want none", c.Err, len(c.Actions))
	}
}

func TestConfigMapControlledByAnotherKindIsAConflict(t *testing.T) {
	yes := true
	other := &corev1.ConfigMap{
		TypeMeta: metav1.TypeMeta{APIVersion: "v1", Kind: "ConfigMap"},
		ObjectMeta: metav1.ObjectMeta{Namespace: key.Namespace, Name: "hello-demo",
			OwnerReferences: []metav1.OwnerReference{{APIVersion: "apps/v1", Kind: "Deployment", Name: "web", UID: "u-9", Controller: &yes}}},
	}
	f := setup(t, entity("hi", 3), other)
	// The API server refuses a second controller reference (the fake
	// does not check): its answer.
	refused := apierrors.NewInvalid(schema.GroupKind{Kind: "ConfigMap"}, "hello-demo", nil)
	refused.ErrStatus.Message = "Only one reference can have Controller set to true"
	f.h.Fail("patch", "configmaps", 1, refused)
	c := f.h.ReconcileKey(context.Background(), f.r, key)
	if !reconcile.IsTerminal(c.Err) {
		t.Fatalf("err = %v, want a terminal error", c.Err)
	}
	cond := meta.FindStatusCondition(f.h.Get(key).Status.Conditions, demov1.ConditionReady)
	if cond == nil || cond.Status != metav1.ConditionFalse || cond.Reason != reconciler.ReasonConfigMapConflict || !strings.Contains(cond.Message, "Deployment web") {
		t.Fatalf("Ready = %+v, want False/%s naming the Deployment", cond, reconciler.ReasonConfigMapConflict)
	}
	if cm, _ := f.configMap(t); cm.Data != nil {
		t.Errorf("foreign ConfigMap was modified: %v", cm.Data)
	}
}
