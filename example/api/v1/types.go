// Package v1 holds the DemoEntity custom resource (demoentities.demo.opkit.dev/v1)
// as plain Go structs, and the [Resource] that binds them to the API server.
//
// There is no generated code and no scheme registration: opkit reads and
// writes the struct through the dynamic client. The JSON tags are the
// contract with the CRD in config/crd/demoentities.yaml; keep both in step.
// The package has no goroutines and no state.
package v1

import (
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime/schema"

	"github.com/opkit/opkit"
)

const (
	// Group is the API group of the demo resources.
	Group = "demo.opkit.dev"
	// Version is the served and stored version.
	Version = "v1"
	// Kind is the object kind.
	Kind = "DemoEntity"
	// Plural is the resource name used in URLs and RBAC rules.
	Plural = "demoentities"

	// Finalizer is set on every DemoEntity the operator has seen; it is
	// removed once the entity's ConfigMap is gone.
	Finalizer = "demo.opkit.dev/cleanup"

	// ConditionReady is the condition type that says the ConfigMap matches
	// the spec of the generation named in its ObservedGeneration.
	ConditionReady = "Ready"

	// MaxMessageLength is the longest spec.message the CRD accepts.
	MaxMessageLength = 1024
	// MaxReplicas is the largest spec.replicas the CRD accepts.
	MaxReplicas = 10
	// DefaultReplicas is what the API server sets when spec.replicas is omitted.
	DefaultReplicas = 1
)

// Resource binds *DemoEntity to demoentities.demo.opkit.dev/v1.
var Resource = opkit.Resource{
	GroupVersionResource: schema.GroupVersionResource{Group: Group, Version: Version, Resource: Plural},
	Kind:                 Kind,
	Namespaced:           true,
}

// APIVersion is "demo.opkit.dev/v1".
var APIVersion = schema.GroupVersion{Group: Group, Version: Version}.String()

// DemoEntity asks the operator to keep a ConfigMap named "<name>-demo" that
// carries spec.message and spec.replicas.
type DemoEntity struct {
	metav1.TypeMeta   `json:",inline"`
	metav1.ObjectMeta `json:"metadata,omitempty"`

	// Spec is what the user asks for; Status what the operator observed.
	Spec   DemoEntitySpec   `json:"spec"`
	Status DemoEntityStatus `json:"status,omitempty"`
}

// DemoEntitySpec is the desired state.
type DemoEntitySpec struct {
	// Message is copied to the ConfigMap's data.message (1 to 1024 characters).
	Message string `json:"message"`
	// Replicas is copied to the ConfigMap's data.replicas (0 to 10). Nil
	// means the API server's default (1); use [DemoEntitySpec.ReplicaCount].
	Replicas *int32 `json:"replicas,omitempty"`
}

// ReplicaCount returns Replicas, or DefaultReplicas when it is nil.
func (s DemoEntitySpec) ReplicaCount() int32 {
	if s.Replicas == nil {
		return DefaultReplicas
	}
	return *s.Replicas
}

// DemoEntityStatus is the observed state, written only by the operator.
type DemoEntityStatus struct {
	// ObservedGeneration is the metadata.generation the last successful
	// reconcile acted on.
	ObservedGeneration int64 `json:"observedGeneration,omitempty"`
	// LastHandledReconcileAt is the value of the annotation
	// reconcile.opkit.dev/requestedAt the last reconcile handled: set the
	// annotation to a new value (`kubectl annotate --overwrite ...
	// reconcile.opkit.dev/requestedAt="$(date +%s)"`) and wait until this
	// equals it, as with Flux's reconcile.fluxcd.io/requestedAt.
	LastHandledReconcileAt string `json:"lastHandledReconcileAt,omitempty"`
	// LastReconciled is when the status was last written by a reconcile.
	LastReconciled *metav1.MicroTime `json:"lastReconciled,omitempty"`
	// LastTrigger says what caused the last reconcile that wrote the status.
	LastTrigger *LastTrigger `json:"lastTrigger,omitempty"`
	// ReconciledBy is the identity of the operator replica that wrote the status.
	ReconciledBy string `json:"reconciledBy,omitempty"`
	// ConfigMap is the name of the ConfigMap the operator keeps.
	ConfigMap string `json:"configMap,omitempty"`
	// Conditions holds the Ready condition.
	Conditions []metav1.Condition `json:"conditions,omitempty"`
}

// TriggerSource values for LastTrigger.Source (the names of opkit.Source).
const (
	SourceAPIServer = "APIServer"
	SourceOperator  = "Operator"
)

// LastTrigger describes what caused a reconcile.
type LastTrigger struct {
	// Source is "APIServer" (the watch stream) or "Operator" (an external
	// trigger: HTTP or NATS).
	Source string `json:"source"`
	// Reason is the reason an external trigger gave, or the watch event
	// type ("Added", "Modified") for the APIServer source.
	Reason string `json:"reason,omitempty"`
	// At is when the reconcile that handled the trigger ran (microsecond
	// precision, RFC 3339), so it is never earlier than the trigger itself.
	At metav1.MicroTime `json:"at"`
}

// DeepCopy returns a deep copy of e (enough for the reconciler's
// before/after comparison; not generated).
func (e *DemoEntity) DeepCopy() *DemoEntity {
	if e == nil {
		return nil
	}
	out := *e
	e.ObjectMeta.DeepCopyInto(&out.ObjectMeta)
	if e.Spec.Replicas != nil {
		r := *e.Spec.Replicas
		out.Spec.Replicas = &r
	}
	if e.Status.LastReconciled != nil {
		t := *e.Status.LastReconciled
		out.Status.LastReconciled = &t
	}
	if e.Status.LastTrigger != nil {
		t := *e.Status.LastTrigger
		out.Status.LastTrigger = &t
	}
	if e.Status.Conditions != nil {
		out.Status.Conditions = make([]metav1.Condition, len(e.Status.Conditions))
		for i := range e.Status.Conditions {
			e.Status.Conditions[i].DeepCopyInto(&out.Status.Conditions[i])
		}
	}
	return &out
}

// compile-time check: *DemoEntity is an opkit.Object.
var _ opkit.Object = (*DemoEntity)(nil)
