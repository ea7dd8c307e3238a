// Package reconciler is the demo operator's reconcile logic: for every
// DemoEntity it keeps a ConfigMap "<name>-demo" that carries the entity's
// message and replica count, and reports what it did in the entity's status.
//
// One reconcile:
//
//   - adds the finalizer demo.opkit.dev/cleanup on first sight; once the
//     entity is being deleted, records an Event and removes the finalizer
//     (the garbage collector deletes the ConfigMap, which the entity
//     controls);
//   - applies the ConfigMap with a [reconcile.Applier]: one server-side
//     apply creates it or brings it back to the spec. The operator's
//     controller Owns ConfigMaps, so an edit or a delete of one reconciles
//     its entity, which puts it back;
//   - writes the status only when there is something to report: a new
//     generation, a changed condition, or an external trigger (its source
//     and reason land in status.lastTrigger). A converged entity seen
//     again through the watch costs only the apply, which changes nothing.
//
// An update reconcile makes two requests (the apply and the status), a
// create three (the finalizer too).
package reconciler

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"strconv"
	"strings"
	"time"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	corev1ac "k8s.io/client-go/applyconfigurations/core/v1"
	"k8s.io/client-go/dynamic"

	"github.com/opkit/opkit"
	demov1 "github.com/opkit/opkit/example/api/v1"
	"github.com/opkit/opkit/reconcile"
)

// Reasons of the Ready condition, and of the Event the finalizer records.
const (
	ReasonReconciled        = "Reconciled"
	ReasonConfigMapConflict = "ConfigMapOwnedElsewhere"
	EventFinalized          = "Finalized"
)

// ConfigMaps is the resource of the entities' ConfigMaps.
var ConfigMaps = opkit.Resource{GroupVersionResource: corev1.SchemeGroupVersion.WithResource("configmaps"), Kind: "ConfigMap", Namespaced: true}

// ConfigMapName returns the name of the ConfigMap kept for entity name.
func ConfigMapName(entity string) string { return entity + "-demo" }

// Config configures a [Reconciler].
type Config struct {
	// Dynamic reads and writes the entity's finalizer and status, and
	// applies the ConfigMaps. Required.
	Dynamic dynamic.Interface
	// Recorder records Events; nil records none.
	Recorder *reconcile.Recorder
	// Identity names this replica in status.reconciledBy (default "demo-operator").
	Identity string
	// Logger receives a warning when an Event cannot be recorded; nil
	// means slog.Default().
	Logger *slog.Logger
}

// Reconciler implements reconcile.Reconciler[*demov1.DemoEntity].
type Reconciler struct {
	cfg       Config
	apply     *reconcile.Applier
	finalizer *reconcile.Finalizer[*demov1.DemoEntity]
	status    *reconcile.Status[*demov1.DemoEntity]
}

var _ reconcile.Reconciler[*demov1.DemoEntity] = (*Reconciler)(nil)

// New validates cfg and returns a reconciler.
func New(cfg Config) (*Reconciler, error) {
	if cfg.Dynamic == nil {
		return nil, errors.New("reconciler: Config.Dynamic is required")
	}
	cfg.Identity = cmp.Or(cfg.Identity, "demo-operator")
	cfg.Logger = cmp.Or(cfg.Logger, slog.Default())
	fin, err := reconcile.NewFinalizer[*demov1.DemoEntity](cfg.Dynamic, demov1.Resource, demov1.Finalizer)
	if err != nil {
		return nil, err
	}
	st, err := reconcile.NewStatus[*demov1.DemoEntity](reconcile.StatusConfig{Dynamic: cfg.Dynamic, Resource: demov1.Resource})
	if err != nil {
		return nil, err
	}
	apply, err := reconcile.NewApplier(reconcile.ApplyConfig{Dynamic: cfg.Dynamic, FieldManager: "demo.opkit.dev/demo-operator", Owner: demov1.Resource})
	if err != nil {
		return nil, err
	}
	return &Reconciler{cfg: cfg, apply: apply, finalizer: fin, status: st}, nil
}

// Reconcile brings one entity's ConfigMap and status to its spec.
func (r *Reconciler) Reconcile(ctx context.Context, req reconcile.Request[*demov1.DemoEntity]) (reconcile.Result, error) {
	if req.Type == opkit.Deleted || req.Object == nil {
		// The finalizer ran before the entity went; the ConfigMap's owner
		// reference covers the rest (the garbage collector).
		return reconcile.Done(), nil
	}
	obj, live, err := r.finalizer.Handle(ctx, req.Object, r.finalize)
	if err != nil || !live {
		return reconcile.Done(), err
	}
	cm := corev1ac.ConfigMap(ConfigMapName(obj.Name), "").
		WithLabels(map[string]string{"demo.opkit.dev/entity": obj.Name}).
		WithData(map[string]string{
			"message":  obj.Spec.Message,
			"replicas": strconv.Itoa(int(obj.Spec.ReplicaCount())),
		})
	_, applyErr := r.apply.Apply(ctx, obj, ConfigMaps, cm)
	if applyErr != nil && !reconcile.IsTerminal(applyErr) {
		return reconcile.Done(), applyErr
	}
	_, err = r.status.Update(ctx, obj, func(o *demov1.DemoEntity) error {
		cond := metav1.Condition{
			Type:               demov1.ConditionReady,
			Status:             metav1.ConditionTrue,
			ObservedGeneration: o.Generation,
			Reason:             ReasonReconciled,
			Message:            fmt.Sprintf("ConfigMap %s matches generation %d", ConfigMapName(o.Name), o.Generation),
		}
		if applyErr != nil { // the ConfigMap's name is taken: nothing will change until it is freed
			cond.Status, cond.Reason, cond.Message = metav1.ConditionFalse, ReasonConfigMapConflict, applyErr.Error()
		}
		condChanged := meta.SetStatusCondition(&o.Status.Conditions, cond)
		o.Status.ConfigMap = ConfigMapName(o.Name)
		// Anything worth reporting? A converged entity seen again through
		// the watch writes nothing.
		triggered := req.Sources.Has(opkit.Operator)
		if !(condChanged || triggered || o.Status.ObservedGeneration != o.Generation || o.Status.LastTrigger == nil) {
			return nil
		}
		at := metav1.NewMicroTime(time.Now())
		o.Status.LastReconciled = &at
		o.Status.ReconciledBy = r.cfg.Identity
		// The watch (or a retry of the controller's own) records the
		// request's type; an external trigger, the reasons it gave.
		o.Status.LastTrigger = &demov1.LastTrigger{Source: demov1.SourceAPIServer, Reason: req.Type.String(), At: at}
		if triggered {
			o.Status.LastTrigger.Source = demov1.SourceOperator
			o.Status.LastTrigger.Reason = strings.Join(req.Reasons, "; ")
		}
		return nil
	})
	return reconcile.Done(), cmp.Or(err, applyErr)
}

// finalize is where an operator releases what an entity holds outside
// Kubernetes before it goes; the demo holds nothing there and records an
// Event. The ConfigMap needs nothing: its controller reference makes the
// garbage collector delete it with the entity.
func (r *Reconciler) finalize(ctx context.Context, obj *demov1.DemoEntity) error {
	if err := r.cfg.Recorder.Record(ctx, obj, reconcile.EventSpec{
		Reason: EventFinalized,
		Action: "Finalize",
		Note:   fmt.Sprintf("Finalized; the garbage collector deletes ConfigMap %s with the entity", ConfigMapName(obj.Name)),
	}); err != nil {
		// The Event is informational: finalizing itself succeeded.
		r.cfg.Logger.LogAttrs(ctx, slog.LevelWarn, "could not record event", slog.Any("error", err))
	}
	return nil
}
