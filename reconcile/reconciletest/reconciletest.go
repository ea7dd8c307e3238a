// Package reconciletest runs a [reconcile.Reconciler] synchronously against
// client-go's fake clients, so operator authors can unit-test their
// reconcile logic without a cluster:
//
//	h := reconciletest.New[*Widget](t, widgets, seed) // the objects to start with
//	r, key := newReconciler(h.Dynamic), opkit.KeyOf(seed)
//	c := h.ReconcileKey(ctx, r, key) // c.Result, c.Err, c.Writes()
//	w := h.Get(key)                  // the object afterwards
//	h.AssertConverged(ctx, r, key)   // a second call writes nothing
//
// Change changes objects as a user would, and Fail makes API calls fail.
//
// A Harness has two fake clients over one store: client-go's typed fake
// clientset (fake.NewClientset, with server-side apply) holds the objects
// of built-in resources (ConfigMaps, Deployments, ...), and the dynamic
// fake reaches the same objects, so a reconciler may use either (the
// [reconcile.Applier] and the other opkit helpers use the dynamic one);
// objects of other resources (T's, other custom resources) live in the
// dynamic fake alone. Unlike the API server, the fakes do not validate
// objects, bump metadata.generation or collect garbage: [Harness.Change]
// bumps the generation as the API server would.
//
// A Harness starts no goroutines; it is meant for one test at a time.
package reconciletest

import (
	"context"
	"fmt"
	"maps"
	"path"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"

	"k8s.io/apimachinery/pkg/api/equality"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/schema"
	dynfake "k8s.io/client-go/dynamic/fake"
	"k8s.io/client-go/kubernetes/fake"
	k8stesting "k8s.io/client-go/testing"

	"github.com/opkit/opkit"
	"github.com/opkit/opkit/internal/typed"
	"github.com/opkit/opkit/reconcile"
)

// Harness holds the fake clients a reconciler under test is built with, and
// calls it.
type Harness[T opkit.Object] struct {
	// Dynamic is the fake dynamic client: it holds the seeded objects of
	// T's resource and of other custom resources, and reaches the objects
	// of built-in resources in Clientset. Build the reconciler under test
	// with it (and with the opkit helpers: reconcile.NewFinalizer,
	// reconcile.NewStatus, reconcile.NewApplier).
	Dynamic *dynfake.FakeDynamicClient
	// Clientset is client-go's typed fake clientset, with server-side
	// apply; it holds the seeded objects of built-in resources.
	Clientset *fake.Clientset
	// Resource is the resource T is bound to.
	Resource opkit.Resource

	t      testing.TB
	client *typed.Client[T]
	// resources are those of the dynamic fake's own store.
	resources []schema.GroupVersionResource
	mu        sync.Mutex
	events    []string            // the Events created through the fake, in order
	actions   []k8stesting.Action // the calls of both clients, in order
}

// New returns a harness whose fakes hold objs: objects of T's resource
// and of any other resource (typed objects with their TypeMeta set, or
// *unstructured.Unstructured). Objects of res may leave TypeMeta empty;
// one without a generation gets generation 1, as the API server gives
// it. Resources other than res and the built-in ones are found by the
// usual plural guess from their kind (Gadget → gadgets).
func New[T opkit.Object](t testing.TB, res opkit.Resource, objs ...opkit.Object) *Harness[T] {
	t.Helper()
	if err := res.Validate(); err != nil {
		t.Fatalf("reconciletest: %v", err)
	}
	cs := fake.NewClientset()
	seed, listKinds := sortSeeds[T](t, res, cs, objs)
	own := slices.Collect(maps.Keys(listKinds))
	for gvr, gvk := range builtins {
		listKinds[gvr] = gvk.Kind + "List" // listed from the clientset's store
	}
	dyn := dynfake.NewSimpleDynamicClientWithCustomListKinds(runtime.NewScheme(), listKinds, seed...)
	h := &Harness[T]{Dynamic: dyn, Clientset: cs, Resource: res, t: t, client: typed.New[T](dyn, res), resources: own}
	// The dynamic client reaches built-in objects in the clientset's store.
	dyn.PrependReactor("*", "*", h.builtin)
	dyn.PrependWatchReactor("*", watchBuiltins(cs))
	dyn.PrependReactor("create", reconcile.EventsResource.Resource, h.noteEvent)
	dyn.PrependReactor("*", "*", h.record)
	cs.PrependReactor("*", "*", h.record)
	return h
}

// sortSeeds sorts New's objs between the fakes: it adds the objects of
// built-in resources to cs's store, and returns the others, to seed the
// dynamic fake with, and the list kinds of the resources of the dynamic
// fake's own store (res's and the Events' among them). A T without a kind
// gets res's, an object of res without a generation gets 1; an object
// that is neither a T nor has a kind fails the test.
func sortSeeds[T opkit.Object](t testing.TB, res opkit.Resource, cs *fake.Clientset, objs []opkit.Object) ([]runtime.Object, map[schema.GroupVersionResource]string) {
	t.Helper()
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
		gvk := u.GroupVersionKind()
		gvr, _ := meta.UnsafeGuessKindToResource(gvk)
		switch {
		case gvk == res.GroupVersionKind():
			if u.GetGeneration() == 0 {
				u.SetGeneration(1)
			}
			seed = append(seed, u)
		case builtins[gvr] == gvk:
			obj, err := toTyped(u)
			if err == nil {
				err = cs.Tracker().Add(obj)
			}
			if err != nil {
				t.Fatalf("reconciletest: seed %s %s: %v", gvk.Kind, opkit.KeyOf(u), err)
			}
		default:
			listKinds[gvr] = gvk.Kind + "List"
			seed = append(seed, u)
		}
	}
	return seed, listKinds
}

// noteEvent is the dynamic client's reactor for creates of Events: it
// notes every Event created, in order (the fake lists by name), and lets
// the default reactor store it.
func (h *Harness[T]) noteEvent(a k8stesting.Action) (bool, runtime.Object, error) {
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
}

// record is the reactor New puts in front of both clients' others: it
// records their calls, in the order they are made, and lets the next
// reactor serve them.
func (h *Harness[T]) record(a k8stesting.Action) (bool, runtime.Object, error) {
	h.mu.Lock()
	h.actions = append(h.actions, a.DeepCopy())
	h.mu.Unlock()
	return false, nil, nil
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
		key := opkit.Key{Namespace: a.GetNamespace(), Name: actionName(a)}
		out = append(out, strings.TrimSpace(fmt.Sprintf("%s %s %s", a.GetVerb(), res, key)))
	}
	return out
}

// Reconcile calls r with req on the test's goroutine and records what it
// did. The API calls recorded are only those made during the call. After
// the call, as the API server would have: an object the call created
// (a create, or an apply of a new object) without a generation has
// generation 1, and objects being deleted whose last finalizer was
// removed are deleted from the fake.
func (h *Harness[T]) Reconcile(ctx context.Context, r reconcile.Reconciler[T], req reconcile.Request[T]) Call {
	h.t.Helper()
	h.takeActions()
	res, err := r.Reconcile(ctx, req)
	c := Call{Result: res, Err: err, Actions: h.takeActions()}
	h.firstGenerations(c.Actions)
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
	h.takeActions()
}

// takeActions returns the calls recorded since the last take.
func (h *Harness[T]) takeActions() []k8stesting.Action {
	h.mu.Lock()
	defer h.mu.Unlock()
	out := h.actions
	h.actions = nil
	return out
}

// Change stores obj, an object of any resource the harness holds, as a
// user's write would leave it: its resourceVersion goes up by one, and
// its metadata.generation too when anything but its metadata and status
// differs from the stored object (as the API server does for resources
// with a status subresource); its generation and resourceVersion as
// given are ignored. It fails the test when obj is not stored.
func (h *Harness[T]) Change(obj opkit.Object) {
	h.t.Helper()
	u, err := typed.ToUnstructured(obj)
	if err != nil {
		h.t.Fatalf("reconciletest: change %T: %v", obj, err)
	}
	if _, ok := obj.(T); ok && u.GetKind() == "" {
		u.SetGroupVersionKind(h.Resource.GroupVersionKind())
	}
	gvr, ns := h.resourceOf(u), u.GetNamespace()
	ri := h.Dynamic.Resource(gvr).Namespace(ns)
	stored, err := ri.Get(context.Background(), u.GetName(), metav1.GetOptions{})
	if err != nil {
		h.t.Fatalf("reconciletest: change %s %s: %v", gvr.Resource, opkit.KeyOf(u), err)
	}
	rv, _ := strconv.ParseInt(stored.GetResourceVersion(), 10, 64)
	u.SetResourceVersion(strconv.FormatInt(rv+1, 10))
	u.SetGeneration(stored.GetGeneration())
	if !equality.Semantic.DeepEqual(withoutMetaAndStatus(u), withoutMetaAndStatus(stored)) {
		u.SetGeneration(stored.GetGeneration() + 1)
	}
	if err := h.store(gvr, u); err != nil {
		h.t.Fatalf("reconciletest: change %s %s: %v", gvr.Resource, opkit.KeyOf(u), err)
	}
}

// Delete removes the object of resource res under key, as a user's
// delete of an object without finalizers would. It fails the test when
// there is no such object.
func (h *Harness[T]) Delete(res opkit.Resource, key opkit.Key) {
	h.t.Helper()
	if err := h.tracker(res.GroupVersionResource).Delete(res.GroupVersionResource, key.Namespace, key.Name); err != nil {
		h.t.Fatalf("reconciletest: delete %s %s: %v", res.Resource, key, err)
	}
}

// resourceOf returns the resource of u: the harness's for objects of T's
// kind, else the usual plural guess from its kind.
func (h *Harness[T]) resourceOf(u *unstructured.Unstructured) schema.GroupVersionResource {
	if u.GroupVersionKind() == h.Resource.GroupVersionKind() {
		return h.Resource.GroupVersionResource
	}
	gvr, _ := meta.UnsafeGuessKindToResource(u.GroupVersionKind())
	return gvr
}

// tracker returns the store that holds the objects of gvr: the
// clientset's for a built-in resource, else the dynamic fake's.
func (h *Harness[T]) tracker(gvr schema.GroupVersionResource) k8stesting.ObjectTracker {
	if _, ok := builtins[gvr]; ok {
		return h.Clientset.Tracker()
	}
	return h.Dynamic.Tracker()
}

// store writes u into the store that holds its resource.
func (h *Harness[T]) store(gvr schema.GroupVersionResource, u *unstructured.Unstructured) error {
	if _, ok := builtins[gvr]; !ok {
		return h.Dynamic.Tracker().Update(gvr, u, u.GetNamespace())
	}
	obj, err := toTyped(u)
	if err != nil {
		return err
	}
	return h.Clientset.Tracker().Update(gvr, obj, u.GetNamespace())
}

// withoutMetaAndStatus returns u's content but its metadata and status.
func withoutMetaAndStatus(u *unstructured.Unstructured) map[string]any {
	m := maps.Clone(u.Object)
	delete(m, "metadata")
	delete(m, "status")
	return m
}

// ReconcileKey fetches the object under key and reconciles it as a
// Modified request from the watch stream.
func (h *Harness[T]) ReconcileKey(ctx context.Context, r reconcile.Reconciler[T], key opkit.Key) Call {
	h.t.Helper()
	return h.Reconcile(ctx, r, h.Request(key, opkit.Modified))
}

// AssertConverged reconciles the object under key again (freshly fetched,
// as a Modified request) and fails the test if that call changed any
// stored object (its resourceVersion and managed fields aside: a
// server-side apply of what is there already changes nothing) or
// returned an error: a converged reconciler is idempotent.
func (h *Harness[T]) AssertConverged(ctx context.Context, r reconcile.Reconciler[T], key opkit.Key) Call {
	h.t.Helper()
	before := h.snapshot()
	c := h.ReconcileKey(ctx, r, key)
	if c.Err != nil {
		h.t.Errorf("reconciletest: %s not converged: second reconcile failed: %v", key, c.Err)
	}
	after := h.snapshot()
	for k, v := range after {
		if w, ok := before[k]; !ok || !equality.Semantic.DeepEqual(v, w) {
			h.t.Errorf("reconciletest: %s not converged: second reconcile changed %s (writes %q)", key, k, c.Writes())
		}
	}
	for k := range before {
		if _, ok := after[k]; !ok {
			h.t.Errorf("reconciletest: %s not converged: second reconcile deleted %s", key, k)
		}
	}
	return c
}

// snapshot returns every stored object but its resourceVersion and
// managed fields, by "resource namespace/name".
func (h *Harness[T]) snapshot() map[string]map[string]any {
	out := map[string]map[string]any{}
	add := func(gvr schema.GroupVersionResource, obj runtime.Object) {
		u, err := toUnstructured(obj, schema.GroupVersionKind{})
		if err != nil {
			h.t.Fatalf("reconciletest: snapshot: %v", err)
		}
		unstructured.RemoveNestedField(u.Object, "metadata", "resourceVersion")
		unstructured.RemoveNestedField(u.Object, "metadata", "managedFields")
		out[gvr.Resource+" "+opkit.KeyOf(u).String()] = u.Object
	}
	for gvr := range builtins {
		list, err := h.Clientset.Tracker().List(gvr, builtins[gvr], "")
		if err != nil {
			continue // a kind the tracker cannot list: none stored
		}
		items, _ := meta.ExtractList(list)
		for _, o := range items {
			add(gvr, o)
		}
	}
	for _, gvr := range h.resources {
		list, err := h.Dynamic.Resource(gvr).List(context.Background(), metav1.ListOptions{})
		if err != nil {
			h.t.Fatalf("reconciletest: snapshot %s: %v", gvr.Resource, err)
		}
		for i := range list.Items {
			add(gvr, &list.Items[i])
		}
	}
	h.takeActions()
	return out
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

// actionName returns the name of the object a call is about ("" for a
// list).
func actionName(a k8stesting.Action) string {
	switch a := a.(type) {
	case interface{ GetName() string }: // get, patch, delete
		return a.GetName()
	case interface{ GetObject() runtime.Object }: // create, update
		if o, err := meta.Accessor(a.GetObject()); err == nil {
			return o.GetName()
		}
	}
	return ""
}
