package opkit

import (
	"fmt"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime/schema"
)

// Type is the kind of change a reconcile reacts to.
// The zero value is invalid, so a forgotten field is caught by [Type.Valid].
type Type uint8

const (
	// Added: the object appeared (initial list, a create, or a relist found it).
	Added Type = iota + 1
	// Modified: the object changed, or an external trigger asks for a reconcile.
	Modified
	// Deleted: the object is gone; the event carries its last known state.
	Deleted
)

// Valid reports whether t is one of Added, Modified or Deleted.
func (t Type) Valid() bool { return t >= Added && t <= Deleted }

// String returns "Added", "Modified", "Deleted", or "Type(n)" for invalid values.
func (t Type) String() string {
	switch t {
	case Added:
		return "Added"
	case Modified:
		return "Modified"
	case Deleted:
		return "Deleted"
	}
	return fmt.Sprintf("Type(%d)", uint8(t))
}

// Source says who asked for a reconcile.
// The zero value is invalid, so a forgotten field is caught by [Source.Valid].
type Source uint8

const (
	// APIServer: the Kubernetes watch stream (watch events and relists).
	// It is reserved for the watcher; external triggers must not use it.
	APIServer Source = iota + 1
	// Operator: a trigger from outside the watch stream (HTTP, message bus,
	// the operator's own code).
	Operator
)

// Valid reports whether s is APIServer or Operator.
func (s Source) Valid() bool { return s == APIServer || s == Operator }

// String returns "APIServer", "Operator", or "Source(n)" for invalid values.
func (s Source) String() string {
	switch s {
	case APIServer:
		return "APIServer"
	case Operator:
		return "Operator"
	}
	return fmt.Sprintf("Source(%d)", uint8(s))
}

// Key identifies an object within one resource: namespace and name, with an
// empty namespace for cluster-scoped objects. Keys are comparable and are the
// unit of deduplication and exclusivity in the queue.
type Key struct {
	// Namespace is the object's namespace, "" for a cluster-scoped one.
	Namespace string
	// Name is the object's name.
	Name string
}

// KeyOf returns the key of obj.
func KeyOf(obj metav1.Object) Key {
	return Key{Namespace: obj.GetNamespace(), Name: obj.GetName()}
}

// String returns "namespace/name", or "name" for cluster-scoped keys.
func (k Key) String() string {
	if k.Namespace == "" {
		return k.Name
	}
	return k.Namespace + "/" + k.Name
}

// Object is what opkit needs of a Kubernetes object: its metadata and its
// kind. A plain Go struct that embeds metav1.TypeMeta and metav1.ObjectMeta
// (with json tags) satisfies it through a pointer, with no generated code
// and no scheme registration; so do the built-in types (*corev1.ConfigMap).
//
// Type parameters named T across opkit are pointer types such as
// *MyResource: opkit allocates new values of the pointed-to struct.
type Object interface {
	metav1.Object
	GetObjectKind() schema.ObjectKind
}

// Resource binds a Go type to the API resource it is served as.
//
// For a custom resource `demoentities.demo.opkit.dev/v1`:
//
//	opkit.Resource{
//		GroupVersionResource: schema.GroupVersionResource{Group: "demo.opkit.dev", Version: "v1", Resource: "demoentities"},
//		Kind:                 "DemoEntity",
//		Namespaced:           true,
//	}
type Resource struct {
	schema.GroupVersionResource
	// Kind is the object kind (e.g. "DemoEntity"); used to check that an
	// object handed to opkit is of this resource, and for Events.
	Kind string
	// Namespaced is true for namespaced resources, false for cluster-scoped.
	Namespaced bool
}

// GroupVersionKind returns the resource's group, version and kind.
func (r Resource) GroupVersionKind() schema.GroupVersionKind {
	return r.GroupVersion().WithKind(r.Kind)
}

// Validate reports a missing version, resource or kind.
func (r Resource) Validate() error {
	switch {
	case r.Version == "":
		return fmt.Errorf("opkit: resource %q has no version", r.GroupVersionResource.String())
	case r.Resource == "":
		return fmt.Errorf("opkit: resource %q has no resource (plural) name", r.GroupVersionResource.String())
	case r.Kind == "":
		return fmt.Errorf("opkit: resource %q has no kind", r.GroupVersionResource.String())
	}
	return nil
}

// Event is the payload queued for a key: what happened to which object and
// who asked. It is what the watcher and the triggers put into the queue and
// what a worker turns into a reconcile request.
type Event[T Object] struct {
	// Object is the state that came with the event. For Deleted it is the
	// last known state; see FinalStateUnknown.
	Object T
	// Type is Added, Modified or Deleted.
	Type Type
	// Source is APIServer for the watch stream, Operator for triggers.
	Source Source
	// Reason is an optional human-readable reason given by an external
	// trigger (carried into logs and Kubernetes Events).
	Reason string
	// Fetched marks an external trigger whose Object was read from the API
	// server just before it was queued (the HTTP handler and the message
	// consumer re-fetch every trigger), or that took the object of a watch
	// event merged into it. The controller reconciles such an object
	// without another read when it is the latest state its watcher has
	// seen and a worker takes it soon enough (reconcile.Config.FreshFor);
	// any other trigger is read again first. Watch events need no mark.
	Fetched bool
	// Requeued marks an event re-added after a reconcile that succeeded
	// and asked to be run again (reconcile.RequeueAfter): the request it
	// came from has been served. Source and Reason still name what
	// started the chain, but a requeued trigger no longer counts as a
	// trigger (no "Triggered" Kubernetes Event, and a watch event merged
	// into it replaces it).
	Requeued bool
	// Retried marks an event re-added after a reconcile that failed (the
	// queue entry carries the retry count). Requeued and Retried events
	// are re-adds of a request already served once: an event that arrived
	// while that reconcile ran is newer, and a re-add merged with it gives
	// way to it (see reconcile.MergeEvents).
	Retried bool
	// FinalStateUnknown marks a Deleted event whose object is only a
	// tombstone: the watcher noticed the object vanished during a relist and
	// never saw its final state. Object then carries only namespace, name,
	// UID and the last resourceVersion seen (like client-go's
	// cache.DeletedFinalStateUnknown).
	FinalStateUnknown bool
	// Watched marks a Deleted external trigger that carries the object of
	// the watch's Deleted event merged with it: Object is then a delete the
	// watch delivered (which its watcher holds until the reconcile settles
	// it, unless a later delete of the object replaced it), not the
	// caller's snapshot. reconcile.MergeEvents sets it; watch events need
	// no mark, and callers leave it false.
	Watched bool
}
