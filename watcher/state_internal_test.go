package watcher

import (
	"fmt"
	"testing"

	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
)

// The tracker interns namespaces; those no tracked key uses any more are
// dropped by a later list, those in use stay interned.
func TestNamespacesOfObjectsLongGoneAreNotKept(t *testing.T) {
	tr := newTracker()
	tr.epoch = 1
	meta := func(ns, uid string) meta {
		return readMeta(&unstructured.Unstructured{Object: map[string]any{"metadata": map[string]any{
			"namespace": ns, "name": "x", "uid": uid, "resourceVersion": "1"}}}, nil, nil)
	}
	kept := meta("kept", "k")
	tr.store(kept, true, entry{}, false)
	for i := range 1000 { // a namespace per CI run, each gone again
		m := meta(fmt.Sprintf("ci-%d", i), fmt.Sprint(i))
		tr.store(m, true, entry{}, false)
		tr.hold(m.key, m.uid, "2")
		tr.settle(m.key, m.uid, "2")
	}
	tr.pruneNamespaces() // as a list's end does
	if n := tr.count(); n != 1 {
		t.Fatalf("tracked %d, want 1", n)
	}
	if n := len(tr.namespaces); n != 1 {
		t.Errorf("%d namespaces interned, want 1 (the one in use)", n)
	}
	e, ok := tr.get(kept.key)
	if !ok || e.uid != "k" {
		t.Fatalf("the object in the namespace in use: %v %v", e, ok)
	}
	for k := range tr.entries {
		if ns, ok := tr.namespaces[k.Namespace]; !ok || ns != k.Namespace {
			t.Errorf("namespace %q of a tracked key is not interned", k.Namespace)
		}
	}
}
