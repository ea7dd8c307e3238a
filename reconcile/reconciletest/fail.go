package reconciletest

// Fail, and Reconcile's fix-ups of what the fakes leave undone.

import (
	"context"
	"strings"
	"sync"

	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	k8stesting "k8s.io/client-go/testing"
)

// Fail makes the next times calls (every call when times is negative)
// with verb ("get", "create", "update", "patch", "delete", "list"; "*"
// for all) on resource, through either client, fail with err, before
// they reach the store. resource is a plural ("configmaps"), which
// matches the resource itself and not its subresources, a plural with a
// subresource ("websites/status"), which matches only that subresource,
// or "*" for every resource and subresource. clear ends the failures
// (those with a negative times included).
func (h *Harness[T]) Fail(verb, resource string, times int, err error) (clear func()) {
	var mu sync.Mutex
	plural, sub, _ := strings.Cut(resource, "/")
	fail := func(a k8stesting.Action) (bool, runtime.Object, error) {
		mu.Lock()
		defer mu.Unlock()
		if times == 0 || resource != "*" && a.GetSubresource() != sub {
			return false, nil, nil
		}
		times--
		return true, nil, err
	}
	h.Dynamic.PrependReactor(verb, plural, fail)
	h.Clientset.PrependReactor(verb, plural, fail)
	return func() {
		mu.Lock()
		defer mu.Unlock()
		times = 0
	}
}

// firstGenerations gives generation 1 to the objects that creates and
// patches (an apply may create) among actions left without one: the
// fakes do not set it.
func (h *Harness[T]) firstGenerations(actions []k8stesting.Action) {
	for _, a := range actions {
		if a.GetVerb() != "create" && a.GetVerb() != "patch" || a.GetSubresource() != "" {
			continue
		}
		tracker := h.tracker(a.GetResource())
		name := actionName(a)
		obj, err := tracker.Get(a.GetResource(), a.GetNamespace(), name)
		if err != nil {
			continue // created and gone, or an error the call saw
		}
		if m, err := meta.Accessor(obj); err == nil && m.GetGeneration() == 0 {
			m.SetGeneration(1)
			if err := tracker.Update(a.GetResource(), obj, a.GetNamespace()); err != nil {
				h.t.Fatalf("reconciletest: generation of %s %s/%s: %v", a.GetResource().Resource, a.GetNamespace(), name, err)
			}
		}
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
	h.takeActions()
}
