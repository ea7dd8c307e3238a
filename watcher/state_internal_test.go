package watcher

import (
	"context"
	"fmt"
	"log/slog"
	"testing"
	"testing/synctest"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/types"
	dynfake "k8s.io/client-go/dynamic/fake"

	"github.com/opkit/opkit"
	"github.com/opkit/opkit/queue"
)

// The tracker interns namespaces; those no tracked key uses any more are
// dropped by a later list, those in use stay interned.
func TestNamespacesOfObjectsLongGoneAreNotKept(t *testing.T) {
	gvr := schema.GroupVersionResource{Version: "v1", Resource: "configmaps"}
	tr, err := New(Config[*corev1.ConfigMap]{
		Client:   dynfake.NewSimpleDynamicClient(runtime.NewScheme()),
		Resource: opkit.Resource{GroupVersionResource: gvr, Kind: "ConfigMap", Namespaced: true},
		Queue:    queueFunc{},
		Logger:   slog.New(slog.DiscardHandler),
	})
	if err != nil {
		t.Fatal(err)
	}
	tr.epoch = 1
	meta := func(ns, uid string) (opkit.Key, entry) {
		return tr.readMeta(&unstructured.Unstructured{Object: map[string]any{"metadata": map[string]any{
			"namespace": ns, "name": "x", "uid": uid, "resourceVersion": "1"}}})
	}
	kept, keptEntry := meta("kept", "k")
	tr.store(kept, keptEntry, entry{})
	for i := range 1000 { // a namespace per CI run, each gone again
		k, e := meta(fmt.Sprintf("ci-%d", i), fmt.Sprint(i))
		tr.store(k, e, entry{})
		e.rv = "2"
		tr.gone(k, e, nil)
		tr.Settle(k, types.UID(e.uid), "2")
	}
	tr.pruneNamespaces() // as a list's end does
	if n := len(tr.entries) + tr.nRecords; n != 1 {
		t.Fatalf("tracked %d, want 1", n)
	}
	if n := len(tr.interned.namespaces); n != 1 {
		t.Errorf("%d namespaces interned, want 1 (the one in use)", n)
	}
	e, ok := tr.get(kept)
	if !ok || e.uid != "k" {
		t.Fatalf("the object in the namespace in use: %v %v", e, ok)
	}
	for k := range tr.entries {
		if ns, ok := tr.interned.namespaces[k.Namespace]; !ok || ns != k.Namespace {
			t.Errorf("namespace %q of a tracked key is not interned", k.Namespace)
		}
	}
}

// queueFunc is a queue.Adder that accepts every entry.
type queueFunc struct{}

func (queueFunc) Add(opkit.Key, opkit.Cause[*corev1.ConfigMap], queue.AddOptions) queue.Outcome {
	return queue.Queued
}

// The end of a list is what drops the namespaces no key uses any more:
// namespaces that came and went with watch events stay interned until the
// next list, which prunes them.
func TestTheEndOfAListPrunesNamespaces(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		gvr := schema.GroupVersionResource{Version: "v1", Resource: "configmaps"}
		cm := func(ns string) *unstructured.Unstructured {
			return &unstructured.Unstructured{Object: map[string]any{"apiVersion": "v1", "kind": "ConfigMap",
				"metadata": map[string]any{"namespace": ns, "name": "x", "uid": "u-" + ns}}}
		}
		c := dynfake.NewSimpleDynamicClientWithCustomListKinds(runtime.NewScheme(),
			map[schema.GroupVersionResource]string{gvr: "ConfigMapList"}, cm("kept"))
		w, err := New(Config[*corev1.ConfigMap]{
			Client:   c,
			Resource: opkit.Resource{GroupVersionResource: gvr, Kind: "ConfigMap", Namespaced: true},
			Queue:    queueFunc{},
			Logger:   slog.New(slog.DiscardHandler),
		})
		if err != nil {
			t.Fatal(err)
		}
		run := func(during func()) {
			ctx, cancel := context.WithCancel(context.Background())
			done := make(chan struct{})
			go func() { w.Run(ctx); close(done) }()
			synctest.Wait()
			during()
			synctest.Wait()
			cancel()
			<-done // the tracker is Run's: read it once Run has returned
		}
		run(func() { // a namespace per CI run, each gone again, seen by the watch only
			for i := range 100 {
				ns := fmt.Sprintf("ci-%d", i)
				if err := c.Tracker().Create(gvr, cm(ns), ns); err != nil {
					t.Fatal(err)
				}
				if err := c.Tracker().Delete(gvr, ns, "x"); err != nil {
					t.Fatal(err)
				}
				synctest.Wait() // the fake watch buffers only so many events
				k := opkit.Key{Namespace: ns, Name: "x"}
				for _, d := range w.Deletes(k) { // as a controller settles them
					w.Settle(k, d.Object.GetUID(), d.Object.GetResourceVersion())
				}
			}
		})
		if n := len(w.interned.namespaces); n != 101 {
			t.Fatalf("%d namespaces interned after the watch, want 101 (not pruned yet)", n)
		}
		run(func() {}) // the next Run's list
		if n := len(w.interned.namespaces); n != 1 {
			t.Errorf("%d namespaces interned after a list, want 1 (the one in use)", n)
		}
	})
}
