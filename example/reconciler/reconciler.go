// Package reconciler is the demo operator's reconcile logic: for every
// DemoEntity it keeps a ConfigMap "<name>-demo" that carries the entity's
// message and replica count, and reports what it did in the entity's status.
//
// It is a plain [reconcile.Reconciler]: it holds no goroutines; the
// controller calls Reconcile from its workers, never twice at once for the
// same entity.
//
// What one reconcile does:
//
//   - Deleted requests: nothing (the finalizer already cleaned up).
//   - the finalizer demo.opkit.dev/cleanup is added on first sight; when the
//     entity is being deleted, finalize deletes the ConfigMap, records an
//     Event and the finalizer is removed;
//   - the ConfigMap is created or brought back to the spec, owned by the
//     entity (controller reference);
//   - the status is written only when something changed: a new generation,
//     a ConfigMap write, a condition change, or an external trigger (whose
//     source and reason land in status.lastTrigger). A watch event for an
//     entity that is already converged writes nothing.
package reconciler

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"maps"
	"strconv"
	"strings"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/client-go/dynamic"

	"github.com/opkit/opkit"
	demov1 "github.com/opkit/opkit/example/api/v1"
	"github.com/opkit/opkit/reconcile"
)

// Data keys of the ConfigMap.
const (
	KeyMessage  = "message"
	KeyReplicas = "replicas"
)

// Condition reasons of the Ready condition.
const (
	ReasonReconciled        = "Reconciled"
	ReasonConfigMapConflict = "ConfigMapOwnedElsewhere"
)

// Event reasons recorded by the reconciler.
const (
	EventConfigMapDeleted = "ConfigMapDeleted"
)

// LabelEntity is set on every ConfigMap the operator keeps, to the
// entity's name.
const LabelEntity = "demo.opkit.dev/entity"

// ConfigMapName returns the name of the ConfigMap kept for entity name.
func ConfigMapName(entity string) string { return entity + "-demo" }

// Config configures a [Reconciler].
type Config struct {
	// Dynamic reads and writes the entity's finalizer and status, and the
	// ConfigMaps (through the dynamic client too, so one fake client in
	// reconciletest sees every call). Required.
	Dynamic dynamic.Interface
	// Recorder records Events; nil records none.
	Recorder *reconcile.Recorder
	// Identity names this replica in status.reconciledBy (default "demo-operator").
	Identity string
	// Now returns the current time (default time.Now); tests fix it.
	Now func() time.Time
	// Logger receives one record per write; nil means slog.Default().
	Logger *slog.Logger
}

// Reconciler implements reconcile.Reconciler[*demov1.DemoEntity].
type Reconciler struct {
	dyn       dynamic.Interface
	finalizer *reconcile.Finalizer[*demov1.DemoEntity]
	status    *reconcile.Status[*demov1.DemoEntity]
	recorder  *reconcile.Recorder
	identity  string
	now       func() time.Time
	log       *slog.Logger
}

var _ reconcile.Reconciler[*demov1.DemoEntity] = (*Reconciler)(nil)

// New validates cfg and returns a reconciler.
func New(cfg Config) (*Reconciler, error) {
	if cfg.Dynamic == nil {
		return nil, errors.New("reconciler: Config.Dynamic is required")
	}
	fin, err := reconcile.NewFinalizer[*demov1.DemoEntity](cfg.Dynamic, demov1.Resource, demov1.Finalizer)
	if err != nil {
		return nil, err
	}
	st, err := reconcile.NewStatus[*demov1.DemoEntity](reconcile.StatusConfig{Dynamic: cfg.Dynamic, Resource: demov1.Resource})
	if err != nil {
		return nil, err
	}
	r := &Reconciler{dyn: cfg.Dynamic, finalizer: fin, status: st, recorder: cfg.Recorder,
		identity: cfg.Identity, now: cfg.Now, log: cfg.Logger}
	if r.identity == "" {
		r.identity = "demo-operator"
	}
	if r.now == nil {
		r.now = time.Now
	}
	if r.log == nil {
		r.log = slog.Default()
	}
	return r, nil
}

// Reconcile brings one entity's ConfigMap and status to its spec.
func (r *Reconciler) Reconcile(ctx context.Context, req reconcile.Request[*demov1.DemoEntity]) (reconcile.Result, error) {
	if req.Type == opkit.Deleted || req.Object == nil {
		// The finalizer ran before the entity went; the ConfigMap's owner
		// reference covers the rest (a GC, where one runs).
		return reconcile.Done(), nil
	}
	obj, live, err := r.finalizer.Handle(ctx, req.Object, r.finalize)
	if err != nil || !live {
		return reconcile.Done(), err
	}

	cmWritten, conflict, err := r.ensureConfigMap(ctx, obj)
	if err != nil {
		return reconcile.Done(), err
	}

	now := r.now()
	_, err = r.status.Update(ctx, obj, func(o *demov1.DemoEntity) error {
		cond := metav1.Condition{
			Type:               demov1.ConditionReady,
			Status:             metav1.ConditionTrue,
			ObservedGeneration: o.Generation,
			Reason:             ReasonReconciled,
			Message:            fmt.Sprintf("ConfigMap %s matches generation %d", ConfigMapName(o.Name), o.Generation),
		}
		if conflict != "" {
			cond.Status, cond.Reason, cond.Message = metav1.ConditionFalse, ReasonConfigMapConflict, conflict
		}
		condChanged := meta.SetStatusCondition(&o.Status.Conditions, cond)
		o.Status.ConfigMap = ConfigMapName(o.Name)
		// Anything worth reporting? A converged entity seen again through
		// the watch writes nothing.
		triggered := req.Sources.Has(opkit.Operator)
		if !(condChanged || cmWritten || triggered ||
			o.Status.ObservedGeneration != o.Generation || o.Status.LastTrigger == nil) {
			return nil
		}
		at := metav1.NewMicroTime(now)
		o.Status.LastReconciled = &at
		o.Status.ReconciledBy = r.identity
		o.Status.LastTrigger = &demov1.LastTrigger{Source: sourceOf(req), Reason: reasonOf(req), At: at}
		return nil
	})
	if err != nil {
		return reconcile.Done(), err
	}
	if conflict != "" {
		// Nothing will change until someone removes the other ConfigMap.
		return reconcile.Done(), reconcile.TerminalError(errors.New(conflict))
	}
	return reconcile.Done(), nil
}

// sourceOf is "Operator" when a trigger asked for the reconcile, else
// "APIServer" (the watch, or a retry of the controller's own).
func sourceOf(req reconcile.Request[*demov1.DemoEntity]) string {
	if req.Sources.Has(opkit.Operator) {
		return opkit.Operator.String()
	}
	return opkit.APIServer.String()
}

// reasonOf is the triggers' reasons, or the request's type.
func reasonOf(req reconcile.Request[*demov1.DemoEntity]) string {
	if req.Sources.Has(opkit.Operator) {
		return strings.Join(req.Reasons, "; ")
	}
	return req.Type.String()
}

// desiredData is the ConfigMap data for obj's spec.
func desiredData(obj *demov1.DemoEntity) map[string]string {
	return map[string]string{
		KeyMessage:  obj.Spec.Message,
		KeyReplicas: strconv.Itoa(int(obj.Spec.ReplicaCount())),
	}
}

// ownerRef is the controller reference from the ConfigMap to obj.
func ownerRef(obj *demov1.DemoEntity) metav1.OwnerReference {
	yes := true
	return metav1.OwnerReference{
		APIVersion:         demov1.APIVersion,
		Kind:               demov1.Kind,
		Name:               obj.Name,
		UID:                obj.UID,
		Controller:         &yes,
		BlockOwnerDeletion: &yes,
	}
}

// ensureConfigMap creates or updates the ConfigMap. written reports a
// write; conflict is non-empty when a ConfigMap of that name is controlled
// by something else (it is then left alone).
func (r *Reconciler) ensureConfigMap(ctx context.Context, obj *demov1.DemoEntity) (written bool, conflict string, err error) {
	name := ConfigMapName(obj.Name)
	cms := configMaps{r.dyn.Resource(configMapsGVR).Namespace(obj.Namespace)}
	cm, err := cms.Get(ctx, name)
	if apierrors.IsNotFound(err) {
		cm = &corev1.ConfigMap{
			ObjectMeta: metav1.ObjectMeta{
				Name:            name,
				Namespace:       obj.Namespace,
				Labels:          map[string]string{LabelEntity: obj.Name},
				OwnerReferences: []metav1.OwnerReference{ownerRef(obj)},
			},
			Data: desiredData(obj),
		}
		if err := cms.Create(ctx, cm); err != nil {
			return false, "", fmt.Errorf("create ConfigMap %s/%s: %w", obj.Namespace, name, err)
		}
		r.log.LogAttrs(ctx, slog.LevelInfo, "created ConfigMap", slog.String("entity", opkit.KeyOf(obj).String()), slog.String("configmap", name))
		return true, "", nil
	}
	if err != nil {
		return false, "", fmt.Errorf("get ConfigMap %s/%s: %w", obj.Namespace, name, err)
	}

	want := cm.DeepCopy()
	if ref := metav1.GetControllerOfNoCopy(cm); ref != nil && ref.UID != obj.UID {
		if ref.Kind != demov1.Kind || ref.Name != obj.Name {
			return false, fmt.Sprintf("ConfigMap %s is controlled by %s %s", name, ref.Kind, ref.Name), nil
		}
		// Left over from an earlier entity of the same name: adopt it.
	}
	refs := []metav1.OwnerReference{ownerRef(obj)}
	for _, ref := range cm.OwnerReferences {
		if ref.Controller == nil || !*ref.Controller {
			refs = append(refs, ref)
		}
	}
	want.OwnerReferences = refs
	if want.Labels == nil {
		want.Labels = map[string]string{}
	}
	want.Labels[LabelEntity] = obj.Name
	want.Data = desiredData(obj)
	if maps.Equal(cm.Data, want.Data) && maps.Equal(cm.Labels, want.Labels) && sameRefs(cm.OwnerReferences, want.OwnerReferences) {
		return false, "", nil
	}
	if err := cms.Update(ctx, want); err != nil {
		return false, "", fmt.Errorf("update ConfigMap %s/%s: %w", obj.Namespace, name, err)
	}
	r.log.LogAttrs(ctx, slog.LevelInfo, "updated ConfigMap", slog.String("entity", opkit.KeyOf(obj).String()), slog.String("configmap", name))
	return true, "", nil
}

func sameRefs(a, b []metav1.OwnerReference) bool {
	if len(a) != len(b) {
		return false
	}
	for i := range a {
		x, y := a[i], b[i]
		if x.APIVersion != y.APIVersion || x.Kind != y.Kind || x.Name != y.Name || x.UID != y.UID ||
			!boolEq(x.Controller, y.Controller) || !boolEq(x.BlockOwnerDeletion, y.BlockOwnerDeletion) {
			return false
		}
	}
	return true
}

func boolEq(a, b *bool) bool { return (a != nil && *a) == (b != nil && *b) }

// finalize deletes the entity's ConfigMap (only one it controls) and
// records an Event. It is idempotent: a missing ConfigMap is success.
func (r *Reconciler) finalize(ctx context.Context, obj *demov1.DemoEntity) error {
	name := ConfigMapName(obj.Name)
	cms := configMaps{r.dyn.Resource(configMapsGVR).Namespace(obj.Namespace)}
	cm, err := cms.Get(ctx, name)
	if apierrors.IsNotFound(err) {
		return nil
	}
	if err != nil {
		return fmt.Errorf("get ConfigMap %s/%s: %w", obj.Namespace, name, err)
	}
	if ref := metav1.GetControllerOfNoCopy(cm); ref == nil || ref.UID != obj.UID {
		return nil // not ours: leave it
	}
	uid := cm.UID
	err = cms.ri.Delete(ctx, name, metav1.DeleteOptions{Preconditions: &metav1.Preconditions{UID: &uid}})
	if err != nil && !apierrors.IsNotFound(err) {
		return fmt.Errorf("delete ConfigMap %s/%s: %w", obj.Namespace, name, err)
	}
	r.log.LogAttrs(ctx, slog.LevelInfo, "deleted ConfigMap", slog.String("entity", opkit.KeyOf(obj).String()), slog.String("configmap", name))
	if err := r.recorder.Record(ctx, obj, reconcile.EventSpec{
		Reason: EventConfigMapDeleted,
		Action: "Finalize",
		Note:   fmt.Sprintf("Deleted ConfigMap %s before the entity's deletion", name),
	}); err != nil {
		// The Event is informational: the cleanup itself succeeded.
		r.log.LogAttrs(ctx, slog.LevelWarn, "could not record event", slog.Any("error", err))
	}
	return nil
}

var configMapsGVR = corev1.SchemeGroupVersion.WithResource("configmaps")

// configMaps reads and writes ConfigMaps as typed objects over the dynamic
// client.
type configMaps struct{ ri dynamic.ResourceInterface }

func (c configMaps) Get(ctx context.Context, name string) (*corev1.ConfigMap, error) {
	u, err := c.ri.Get(ctx, name, metav1.GetOptions{})
	if err != nil {
		return nil, err
	}
	cm := &corev1.ConfigMap{}
	if err := runtime.DefaultUnstructuredConverter.FromUnstructured(u.Object, cm); err != nil {
		return nil, fmt.Errorf("decode ConfigMap %s: %w", name, err)
	}
	return cm, nil
}

func (c configMaps) Create(ctx context.Context, cm *corev1.ConfigMap) error {
	u, err := toUnstructured(cm)
	if err != nil {
		return err
	}
	_, err = c.ri.Create(ctx, u, metav1.CreateOptions{})
	return err
}

func (c configMaps) Update(ctx context.Context, cm *corev1.ConfigMap) error {
	u, err := toUnstructured(cm)
	if err != nil {
		return err
	}
	_, err = c.ri.Update(ctx, u, metav1.UpdateOptions{})
	return err
}

func toUnstructured(cm *corev1.ConfigMap) (*unstructured.Unstructured, error) {
	m, err := runtime.DefaultUnstructuredConverter.ToUnstructured(cm)
	if err != nil {
		return nil, err
	}
	u := &unstructured.Unstructured{Object: m}
	u.SetAPIVersion("v1")
	u.SetKind("ConfigMap")
	return u, nil
}
