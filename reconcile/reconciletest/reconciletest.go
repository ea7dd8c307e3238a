// Package reconciletest runs a [reconcile.Reconciler] synchronously against
// client-go's fake clients, so operator authors can unit-test their
// reconcile logic without a cluster: seed objects, call the reconciler with
// a request, then inspect the result, the objects afterwards and the API
// calls it made, and check that a second call changes nothing.
//
// A Harness starts no goroutines; it is meant for one test at a time.
package reconciletest

import (
	"context"
	"fmt"
	"path"
	"slices"
	"strings"
	"sync"
	"testing"

	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/schema"
	dynfake "k8s.io/client-go/dynamic/fake"
	k8stesting "k8s.io/client-go/testing"

	"github.com/opkit/opkit"
	"github.com/opkit/opkit/internal/typed"
	"github.com/opkit/opkit/reconcile"
)

// Harness holds the fake clients a reconciler under test is built with, and
// calls it.
type Harness[T opkit.Object] struct {
	// Dynamic is the fake dynamic client holding every seeded object. Build
	// the reconciler under test with it (and with the opkit helpers:
	// reconcile.NewFinalizer, reconcile.NewStatus).
	Dynamic *dynfake.FakeDynamicClient
	// Resource is the resource T is bound to.
	Resource opkit.Resource

	t      testing.TB
	client *typed.Client[T]
	mu     sync.Mutex
	events []string // the Events created through the fake, in order
}

// New returns a harness whose fake dynamic client holds objs: objects of
// T's resource and of any other resource (typed objects with their
// TypeMeta set, or *unstructured.Unstructured). Objects of res may leave
// TypeMeta empty. Resources other than res are found by the usual plural
// guess from their kind (ConfigMap → configmaps).
func New[T opkit.Object](t testing.TB, res opkit.Resource, objs ...opkit.Object) *Harness[T] {
	t.Helper()
	if err := res.Validate(); err != nil {
		t.Fatalf("reconciletest: %v", err)
	}
	listKinds := map[schema.GroupVersionResource]string{
		res.GroupVersionResource: res.Kind + "List",
		reconcile.EventsResource: "EventList", // for reconcile.Recorder
	}
	var seed []runtime.Object
	for _, o := range objs {
		u, err := typed.ToUnstructured(o)
		if err != nil {
			t.Fatalf("reconciletest: seed %T: %v", o, err)
		}
		if u.GetKind() == "" {
			if _, ok := o.(T); !ok {
				t.Fatalf("reconciletest: seed %T %s has no apiVersion/kind", o, u.GetName())
			}
			u.SetGroupVersionKind(res.GroupVersionKind())
		}
		if gvk := u.GroupVersionKind(); gvk != res.GroupVersionKind() {
			gvr, _ := meta.UnsafeGuessKindToResource(gvk)
			listKinds[gvr] = gvk.Kind + "List"
		}
		seed = append(seed, u)
	}
	dyn := dynfake.NewSimpleDynamicClientWithCustomListKinds(runtime.NewScheme(), listKinds, seed...)
	h := &Harness[T]{Dynamic: dyn, Resource: res, t: t, client: typed.New[T](dyn, res)}
	// Note every Event created, in order (the fake lists by name), and let
	// the default reactor store it.
	dyn.PrependReactor("create", reconcile.EventsResource.Resource, func(a k8stesting.Action) (bool, runtime.Object, error) {
		if c, ok := a.(k8stesting.CreateAction); ok && a.GetResource() == reconcile.EventsResource {
			if u, ok := c.GetObject().(*unstructured.Unstructured); ok {
				typ, _, _ := unstructured.NestedString(u.Object, "type")
				reason, _, _ := unstructured.NestedString(u.Object, "reason")
				note, _, _ := unstructured.NestedString(u.Object, "note")
				h.mu.Lock()
				h.events = append(h.events, fmt.Sprintf("%s %s: %s", typ, reason, note))
				h.mu.Unlock()
			}
		}
		return false, nil, nil
	})
	return h
}

// Get returns the object stored under key, or fails the test.
func (h *Harness[T]) Get(key opkit.Key) T {
	h.t.Helper()
	obj, err := h.client.Get(context.Background(), key)
	if err != nil {
		h.t.Fatalf("reconciletest: get %s: %v", key, err)
	}
	return obj
}

// Exists reports whether an object is stored under key.
func (h *Harness[T]) Exists(key opkit.Key) bool {
	_, err := h.client.Get(context.Background(), key)
	return err == nil
}

// Request builds the request the controller would hand the reconciler for
// an event of type typ from the watch stream: the object as stored now
// (Added/Modified) or the stored object as last known state (Deleted; the
// object is then removed from the fake, as the API server would have).
func (h *Harness[T]) Request(key opkit.Key, typ opkit.Type) reconcile.Request[T] {
	h.t.Helper()
	obj := h.Get(key)
	if typ == opkit.Deleted {
		if err := h.client.Dynamic(key.Namespace).Delete(context.Background(), key.Name, metav1.DeleteOptions{}); err != nil {
			h.t.Fatalf("reconciletest: delete %s: %v", key, err)
		}
		h.Dynamic.ClearActions()
	}
	return reconcile.Request[T]{Key: key, Object: obj, Type: typ, Sources: opkit.Sources(opkit.APIServer)}
}

// Call is what one reconcile returned and did.
type Call struct {
	// Result and Err are what the reconciler returned.
	Result reconcile.Result
	Err    error
	// Actions are the API calls the reconciler made, in order.
	Actions []k8stesting.Action
}

// Writes returns the calls that change state (create, update, patch,
// delete, deletecollection), as "verb resource[/subresource] namespace/name".
func (c Call) Writes() []string {
	var out []string
	for _, a := range c.Actions {
		if !slices.Contains(writeVerbs, a.GetVerb()) {
			continue
		}
		res := path.Join(a.GetResource().Resource, a.GetSubresource())
		out = append(out, strings.TrimSpace(fmt.Sprintf("%s %s %s", a.GetVerb(), res, actionKey(a))))
	}
	return out
}

// Reconcile calls r with req on the test's goroutine and records what it
// did. The API calls recorded are only those made during the call. After
// the call, objects being deleted whose last finalizer was removed are
// deleted from the fake, as the API server would.
func (h *Harness[T]) Reconcile(ctx context.Context, r reconcile.Reconciler[T], req reconcile.Request[T]) Call {
	h.t.Helper()
	h.Dynamic.ClearActions()
	res, err := r.Reconcile(ctx, req)
	c := Call{Result: res, Err: err, Actions: slices.Clone(h.Dynamic.Actions())}
	h.collect()
	return c
}

// MarkDeleting sets metadata.deletionTimestamp on the stored object under
// key, as the API server does when an object that carries finalizers is
// deleted; it fails the test if the object has no finalizer (the server
// would have removed it at once).
func (h *Harness[T]) MarkDeleting(key opkit.Key) {
	h.t.Helper()
	u, err := h.client.Dynamic(key.Namespace).Get(context.Background(), key.Name, metav1.GetOptions{})
	if err != nil {
		h.t.Fatalf("reconciletest: mark %s deleting: %v", key, err)
	}
	if len(u.GetFinalizers()) == 0 {
		h.t.Fatalf("reconciletest: mark %s deleting: it has no finalizers", key)
	}
	now := metav1.Now()
	u.SetDeletionTimestamp(&now)
	if err := h.Dynamic.Tracker().Update(h.Resource.GroupVersionResource, u, key.Namespace); err != nil {
		h.t.Fatalf("reconciletest: mark %s deleting: %v", key, err)
	}
}

// collect removes objects of the resource that are being deleted and carry
// no finalizer any more, as the API server would; the fake does not.
func (h *Harness[T]) collect() {
	list, err := h.Dynamic.Resource(h.Resource.GroupVersionResource).List(context.Background(), metav1.ListOptions{})
	if err != nil {
		h.t.Fatalf("reconciletest: list %s: %v", h.Resource.GroupVersionResource, err)
	}
	for _, u := range list.Items {
		if u.GetDeletionTimestamp() != nil && len(u.GetFinalizers()) == 0 {
			if err := h.Dynamic.Tracker().Delete(h.Resource.GroupVersionResource, u.GetNamespace(), u.GetName()); err != nil {
				h.t.Fatalf("reconciletest: collect %s/%s: %v", u.GetNamespace(), u.GetName(), err)
			}
		}
	}
	h.Dynamic.ClearActions()
}

// ReconcileKey fetches the object under key and reconciles it as a
// Modified request from the watch stream.
func (h *Harness[T]) ReconcileKey(ctx context.Context, r reconcile.Reconciler[T], key opkit.Key) Call {
	h.t.Helper()
	return h.Reconcile(ctx, r, h.Request(key, opkit.Modified))
}

// AssertConverged reconciles the object under key again (freshly fetched,
// as a Modified request) and fails the test if that call wrote anything or
// returned an error: a converged reconciler is idempotent.
func (h *Harness[T]) AssertConverged(ctx context.Context, r reconcile.Reconciler[T], key opkit.Key) Call {
	h.t.Helper()
	c := h.ReconcileKey(ctx, r, key)
	if c.Err != nil {
		h.t.Errorf("reconciletest: %s not converged: second reconcile failed: %v", key, c.Err)
	}
	if w := c.Writes(); len(w) > 0 {
		h.t.Errorf("reconciletest: %s not converged: second reconcile wrote %q", key, w)
	}
	return c
}

// Events returns the Kubernetes Events recorded so far through the fake
// dynamic client (by a [reconcile.Recorder] built on Harness.Dynamic), as
// "Type Reason: Note", in creation order.
func (h *Harness[T]) Events() []string {
	h.mu.Lock()
	defer h.mu.Unlock()
	return slices.Clone(h.events)
}

var writeVerbs = []string{"create", "update", "patch", "delete", "deletecollection"}

func actionKey(a k8stesting.Action) string {
	name := ""
	switch a := a.(type) {
	case interface{ GetName() string }: // get, patch, delete
		name = a.GetName()
	case interface{ GetObject() runtime.Object }: // create, update
		if o, err := meta.Accessor(a.GetObject()); err == nil {
			name = o.GetName()
		}
	}
	return opkit.Key{Namespace: a.GetNamespace(), Name: name}.String()
}
