// Package typed reads and writes one resource as the user's Go type T over a
// dynamic client, so opkit needs no generated clientsets and no scheme.
//
// A Client holds no goroutines and no state beyond its configuration; it is
// safe for concurrent use. Gone, Class and Timeout tell an API server's
// failures apart.
package typed

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"reflect"
	"strings"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/dynamic"

	"github.com/opkit/opkit"
)

// Client reads and writes objects of one resource as T (a pointer type).
type Client[T opkit.Object] struct {
	dyn dynamic.Interface
	res opkit.Resource
}

// New returns a client for res. It panics if T is not a pointer to a struct
// (a programming error).
func New[T opkit.Object](dyn dynamic.Interface, res opkit.Resource) *Client[T] {
	NewObject[T]() // fail fast on a bad T
	return &Client[T]{dyn: dyn, res: res}
}

// Resource returns the resource the client is bound to.
func (c *Client[T]) Resource() opkit.Resource { return c.res }

// Dynamic returns the namespaced (or cluster) dynamic resource interface.
func (c *Client[T]) Dynamic(namespace string) dynamic.ResourceInterface {
	r := c.dyn.Resource(c.res.GroupVersionResource)
	if c.res.Namespaced {
		return r.Namespace(namespace)
	}
	return r
}

// Get fetches one object. API errors are returned unchanged so that
// apierrors.IsNotFound and friends work on them.
func (c *Client[T]) Get(ctx context.Context, key opkit.Key) (T, error) {
	u, err := c.Dynamic(key.Namespace).Get(ctx, key.Name, metav1.GetOptions{})
	if err != nil {
		var zero T
		return zero, err
	}
	return FromUnstructured[T](u)
}

// Gone reports whether err says that the object named name does not exist:
// a NotFound status that names it, which is how the API server (and
// client-go's fake clients) answer for a missing object. A NotFound that
// names no object is the API server saying that it does not serve the
// resource at all: a CRD not installed yet or being reinstalled, a version
// no longer served, a wrong resource in the configuration. That is an error
// to retry, not a reason to forget a request, so Gone is false for it,
// and for a 404 whose body was not a Status at all (client-go marks it
// UnexpectedServerResponse; a typed clientset names the object in it).
func Gone(err error, name string) bool {
	var s apierrors.APIStatus
	if !apierrors.IsNotFound(err) || !errors.As(err, &s) ||
		apierrors.HasStatusCause(err, metav1.CauseTypeUnexpectedServerResponse) {
		return false
	}
	d := s.Status().Details
	return d != nil && d.Name == name
}

// Explain returns err, saying what it means when it is a NotFound for
// res that is not about the object named name (see Gone). The result still
// wraps err.
func Explain(err error, res opkit.Resource, name string) error {
	if err == nil || Gone(err, name) || !apierrors.IsNotFound(err) {
		return err
	}
	gv := res.GroupVersion().String()
	return fmt.Errorf("the API server does not serve %s in %s (CRD not installed or version not served?): %w", res.Resource, gv, err)
}

// Patch applies a patch and returns the object the server returned.
func (c *Client[T]) Patch(ctx context.Context, key opkit.Key, pt types.PatchType, data []byte, subresources ...string) (T, error) {
	u, err := c.Dynamic(key.Namespace).Patch(ctx, key.Name, pt, data, metav1.PatchOptions{}, subresources...)
	if err != nil {
		var zero T
		return zero, err
	}
	return FromUnstructured[T](u)
}

// UpdateStatus writes obj's status subresource (optimistic concurrency on
// obj's resourceVersion) and returns the object the server returned.
func (c *Client[T]) UpdateStatus(ctx context.Context, obj T) (T, error) {
	return c.update(ctx, obj, "status")
}

// Update writes obj (optimistic concurrency on its resourceVersion).
func (c *Client[T]) Update(ctx context.Context, obj T) (T, error) {
	return c.update(ctx, obj)
}

func (c *Client[T]) update(ctx context.Context, obj T, subresources ...string) (T, error) {
	var zero T
	u, err := ToUnstructured(obj)
	if err != nil {
		return zero, err
	}
	c.setGVK(u)
	out, err := c.Dynamic(obj.GetNamespace()).Update(ctx, u, metav1.UpdateOptions{}, subresources...)
	if err != nil {
		return zero, err
	}
	return FromUnstructured[T](out)
}

func (c *Client[T]) setGVK(u *unstructured.Unstructured) {
	if u.GetAPIVersion() == "" || u.GetKind() == "" {
		u.SetGroupVersionKind(c.res.GroupVersionKind())
	}
}

// NewObject allocates a new zero value of the struct T points to.
// It panics if T is not a pointer to a struct.
func NewObject[T opkit.Object]() T {
	t := reflect.TypeFor[T]()
	if t.Kind() != reflect.Pointer || t.Elem().Kind() != reflect.Struct {
		panic(fmt.Sprintf("typed: %v is not a pointer to a struct", t))
	}
	return reflect.New(t.Elem()).Interface().(T)
}

// FromUnstructured converts u into a new T.
func FromUnstructured[T opkit.Object](u *unstructured.Unstructured) (T, error) {
	obj := NewObject[T]()
	if err := runtime.DefaultUnstructuredConverter.FromUnstructured(u.Object, obj); err != nil {
		var zero T
		return zero, fmt.Errorf("typed: decode %s %s/%s: %w", u.GetKind(), u.GetNamespace(), u.GetName(), err)
	}
	return obj, nil
}

// ToUnstructured converts obj into its unstructured form.
func ToUnstructured(obj opkit.Object) (*unstructured.Unstructured, error) {
	m, err := runtime.DefaultUnstructuredConverter.ToUnstructured(obj)
	if err != nil {
		return nil, fmt.Errorf("typed: encode %s/%s: %w", obj.GetNamespace(), obj.GetName(), err)
	}
	return &unstructured.Unstructured{Object: m}, nil
}

// Tombstone returns a T that carries only the identity of an object whose
// final state is unknown: namespace, name, UID and resourceVersion.
func Tombstone[T opkit.Object](key opkit.Key, uid types.UID, resourceVersion string) T {
	obj := NewObject[T]()
	obj.SetNamespace(key.Namespace)
	obj.SetName(key.Name)
	obj.SetUID(uid)
	obj.SetResourceVersion(resourceVersion)
	return obj
}

// JSONFields returns the fields encoding/json reads of the struct t (or a
// pointer to one), by name, with embedded structs without a name inlined;
// nothing for another kind.
func JSONFields(t reflect.Type) map[string]reflect.Type {
	for t.Kind() == reflect.Pointer {
		t = t.Elem()
	}
	out := map[string]reflect.Type{}
	if t.Kind() != reflect.Struct {
		return out
	}
	for f := range t.Fields() {
		name, _, _ := strings.Cut(f.Tag.Get("json"), ",")
		embedded := f.Type
		for embedded.Kind() == reflect.Pointer {
			embedded = embedded.Elem()
		}
		switch {
		case name == "-" || !f.IsExported() && !f.Anonymous:
		case f.Anonymous && name == "" && embedded.Kind() == reflect.Struct:
			maps.Copy(out, JSONFields(embedded))
		case name == "":
			out[f.Name] = f.Type
		default:
			out[name] = f.Type
		}
	}
	return out
}
