package reconciletest

// The built-in resources: the dynamic fake serves them from the clientset's store.

import (
	"strings"

	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/watch"
	"k8s.io/client-go/kubernetes/fake"
	clientgoscheme "k8s.io/client-go/kubernetes/scheme"
	k8stesting "k8s.io/client-go/testing"
)

// builtins maps the resources client-go's scheme knows to their kinds.
var builtins = func() map[schema.GroupVersionResource]schema.GroupVersionKind {
	m := map[schema.GroupVersionResource]schema.GroupVersionKind{}
	for gvk := range clientgoscheme.Scheme.AllKnownTypes() {
		if gvk.Version == runtime.APIVersionInternal || strings.HasSuffix(gvk.Kind, "List") {
			continue
		}
		gvr, _ := meta.UnsafeGuessKindToResource(gvk)
		m[gvr] = gvk
	}
	return m
}()

// watchBuiltins returns the dynamic client's watch reactor: a watch of a
// built-in resource watches cs's store, whose objects it hands out
// unstructured.
func watchBuiltins(cs *fake.Clientset) k8stesting.WatchReactionFunc {
	return func(a k8stesting.Action) (bool, watch.Interface, error) {
		gvk, ok := builtins[a.GetResource()]
		if !ok {
			return false, nil, nil
		}
		var opts metav1.ListOptions
		if w, ok := a.(k8stesting.WatchActionImpl); ok {
			opts = w.ListOptions
		}
		w, err := cs.Tracker().Watch(a.GetResource(), a.GetNamespace(), opts)
		if err != nil {
			return true, nil, err
		}
		return true, watch.Filter(w, func(e watch.Event) (watch.Event, bool) {
			if u, err := toUnstructured(e.Object, gvk); err == nil {
				e.Object = u
			}
			return e, true
		}), nil
	}
}

// builtin serves a call of the dynamic client to a built-in resource
// from the clientset's store, converting between unstructured and typed
// objects.
func (h *Harness[T]) builtin(a k8stesting.Action) (bool, runtime.Object, error) {
	gvk, ok := builtins[a.GetResource()]
	if !ok {
		return false, nil, nil
	}
	var err error
	switch act := a.(type) {
	case k8stesting.CreateActionImpl:
		act.Object, err = toTyped(act.Object)
		a = act
	case k8stesting.UpdateActionImpl:
		act.Object, err = toTyped(act.Object)
		a = act
	}
	if err != nil {
		return true, nil, err
	}
	handled, obj, err := k8stesting.ObjectReaction(h.Clientset.Tracker())(a)
	if err != nil || obj == nil {
		return handled, obj, err
	}
	if meta.IsListType(obj) {
		items, err := meta.ExtractList(obj)
		if err != nil {
			return true, nil, err
		}
		out := &unstructured.UnstructuredList{}
		out.SetGroupVersionKind(gvk.GroupVersion().WithKind(gvk.Kind + "List"))
		for _, item := range items {
			u, err := toUnstructured(item, gvk)
			if err != nil {
				return true, nil, err
			}
			out.Items = append(out.Items, *u)
		}
		return true, out, nil
	}
	u, err := toUnstructured(obj, gvk)
	return true, u, err
}

// toTyped converts an object of a built-in kind to its client-go type.
func toTyped(obj runtime.Object) (runtime.Object, error) {
	u, ok := obj.(*unstructured.Unstructured)
	if !ok {
		return obj, nil
	}
	out, err := clientgoscheme.Scheme.New(u.GroupVersionKind())
	if err == nil {
		err = runtime.DefaultUnstructuredConverter.FromUnstructured(u.Object, out)
	}
	return out, err
}

// toUnstructured converts obj to an unstructured object of kind gvk.
func toUnstructured(obj runtime.Object, gvk schema.GroupVersionKind) (*unstructured.Unstructured, error) {
	m, err := runtime.DefaultUnstructuredConverter.ToUnstructured(obj)
	if err != nil {
		return nil, err
	}
	u := &unstructured.Unstructured{Object: m}
	u.SetGroupVersionKind(gvk)
	return u, nil
}
