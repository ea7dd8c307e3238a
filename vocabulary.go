package opkit

import (
	"fmt"
	"math"
	"slices"
	"strings"

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
	// Deleted: the object is gone (or a trigger asked for a teardown); the
	// request carries its final state.
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

// Sources is a set of [Source] values. A Source is its own bit:
// Sources(APIServer) is the set that holds only APIServer.
type Sources uint8

// Has reports whether src is in s.
func (s Sources) Has(src Source) bool { return src.Valid() && s&Sources(src) != 0 }

// String returns the members joined by "|", or "none".
func (s Sources) String() string {
	var names []string
	for _, src := range []Source{APIServer, Operator} {
		if s.Has(src) {
			names = append(names, src.String())
		}
	}
	if len(names) == 0 {
		return "none"
	}
	return strings.Join(names, "|")
}

// MaxReasons is how many distinct reasons a [Cause] keeps.
const MaxReasons = 8

// Cause is what the queue holds for a key besides the key: why it needs a
// reconcile. The watcher and the triggers add one per change or request;
// the causes of one key merge with [Cause.Merge], a join (commutative,
// associative, idempotent), so the order in which they arrive cannot
// matter. A Cause never says that an object was deleted: deletes come from
// the watcher's record of unsettled deletes (package watcher).
type Cause[T Object] struct {
	// Object is the newest state of the object that came with the causes
	// (a watch event's object, or one a trigger read), by resourceVersion;
	// nil if none did. The controller reconciles it without another read
	// when it is the latest state its watch has seen.
	Object T
	// Sources says who asked: APIServer for the watch, Operator for
	// triggers. It is empty for a controller's own retry or requeue.
	Sources Sources
	// Reasons are the distinct reasons triggers gave, sorted. At most
	// MaxReasons are kept: beyond, the ones that sort first.
	Reasons []string
	// Related names the related resources (owned children, or anything
	// a controller watches beside its objects) whose objects changed, as
	// "configmaps" or "deployments.apps", sorted.
	Related []string
	// Added says the object appeared: it was created, or listed by a
	// watcher's first list, or a trigger of type Added asked.
	Added bool
	// Teardown says a trigger asked for a Deleted reconcile of the object
	// (see trigger.Trigger.Enqueue).
	Teardown bool
	// Retries seeds the key's retry count: the controller takes the
	// highest of this and its own count for the key.
	Retries int
	// Ticket is the highest number of the tracked triggers merged in
	// (package trigger: a caller waiting for the outcome); the turn that
	// takes the entry reports its outcome for every ticket of the key up
	// to it. Zero: none.
	Ticket uint64
}

// Merge joins o into c: the newer object (by resourceVersion: a longer
// decimal string is a larger number, equal lengths compare as strings, and
// equal resourceVersions are taken for the same state), the union of the
// sources, of the reasons and of the related resources, Added and
// Teardown or-ed, the highest Retries and Ticket.
func (c *Cause[T]) Merge(o Cause[T]) {
	if !isNil(o.Object) && (isNil(c.Object) || NewerResourceVersion(o.Object.GetResourceVersion(), c.Object.GetResourceVersion())) {
		c.Object = o.Object
	}
	c.Sources |= o.Sources
	c.Reasons = unionReasons(c.Reasons, o.Reasons)
	c.Related = union(c.Related, o.Related, math.MaxInt)
	c.Added = c.Added || o.Added
	c.Teardown = c.Teardown || o.Teardown
	c.Retries = max(c.Retries, o.Retries)
	c.Ticket = max(c.Ticket, o.Ticket)
}

// NewerResourceVersion reports whether resourceVersion a is later than b.
// etcd's resourceVersions are decimal numbers without leading zeros: a
// longer one is larger, equal lengths compare as strings. For any other
// strings the order is still total, so Cause.Merge stays a join.
func NewerResourceVersion(a, b string) bool {
	if len(a) != len(b) {
		return len(a) > len(b)
	}
	return a > b
}

// unionReasons returns the sorted union of a and b (each sorted and
// distinct), at most MaxReasons long; a itself when b adds nothing. It
// never writes to a or b.
func unionReasons(a, b []string) []string { return union(a, b, MaxReasons) }

// union returns the sorted union of a and b (each sorted and distinct),
// at most limit long; a itself when b adds nothing. It never writes to a
// or b.
func union(a, b []string, limit int) []string {
	if len(b) == 0 {
		return a
	}
	out := slices.Compact(slices.Sorted(slices.Values(slices.Concat(a, b))))
	if out = out[:min(len(out), limit)]; slices.Equal(out, a) {
		return a
	}
	return out
}

// ReasonsOf returns reasons as a Cause holds them: sorted, distinct, empty
// ones dropped, at most MaxReasons.
func ReasonsOf(reasons ...string) []string {
	return unionReasons(nil, slices.DeleteFunc(slices.Clone(reasons), func(r string) bool { return r == "" }))
}

// isNil reports whether obj is a nil T (T is a pointer type).
func isNil[T Object](obj T) bool {
	var zero T
	return any(obj) == any(zero)
}
