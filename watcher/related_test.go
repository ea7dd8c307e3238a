package watcher_test

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"
	"sync"
	"testing"
	"testing/synctest"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/types"
	dynfake "k8s.io/client-go/dynamic/fake"

	"github.com/opkit/opkit"
	"github.com/opkit/opkit/queue"
	"github.com/opkit/opkit/watcher"
)

var configMaps = opkit.Resource{GroupVersionResource: corev1.SchemeGroupVersion.WithResource("configmaps"), Kind: "ConfigMap", Namespaced: true}

// child builds a ConfigMap in ns; refs are "Kind/name" owner references,
// the first of them the controller.
func child(ns, name, rv string, refs ...string) *unstructured.Unstructured {
	u := &unstructured.Unstructured{}
	u.SetAPIVersion("v1")
	u.SetKind("ConfigMap")
	u.SetNamespace(ns)
	u.SetName(name)
	u.SetUID(types.UID("uid-" + name))
	u.SetResourceVersion(rv)
	var owners []metav1.OwnerReference
	for i, r := range refs {
		kind, owner, _ := strings.Cut(r, "/")
		controller := i == 0
		owners = append(owners, metav1.OwnerReference{APIVersion: "test.opkit.dev/v1", Kind: kind, Name: owner, UID: types.UID("uid-" + owner), Controller: &controller})
	}
	u.SetOwnerReferences(owners)
	return u
}

func newRelatedFake(objs ...runtime.Object) *dynfake.FakeDynamicClient {
	return dynfake.NewSimpleDynamicClientWithCustomListKinds(runtime.NewScheme(), map[schema.GroupVersionResource]string{
		widgets.GroupVersionResource:    "WidgetList",
		configMaps.GroupVersionResource: "ConfigMapList",
	}, objs...)
}

// adds is a fake queue that keeps every key added, with its cause.
type adds struct {
	mu   sync.Mutex
	keys []string
}

func (a *adds) Add(key opkit.Key, c opkit.Cause[*Widget], opts queue.AddOptions) queue.Outcome {
	a.mu.Lock()
	defer a.mu.Unlock()
	if c.Sources != opkit.Sources(opkit.APIServer) || c.Object != nil || c.Added || !slices.Equal(c.Related, []string{"configmaps"}) || opts.Priority != 0 {
		panic(fmt.Sprintf("related add %v %+v %+v: want only source APIServer and Related [configmaps], at the watch's priority", key, c, opts))
	}
	a.keys = append(a.keys, key.String())
	return queue.Queued
}

func (a *adds) take() []string {
	a.mu.Lock()
	defer a.mu.Unlock()
	out := a.keys
	a.keys = nil
	return out
}

func runRelated(t *testing.T, c *dynfake.FakeDynamicClient, q *adds, m watcher.MapFunc) *watcher.Related[*Widget] {
	t.Helper()
	r, err := watcher.NewRelated(watcher.RelatedConfig[*Widget]{Client: c, Resource: configMaps, Map: m, Queue: q, Logger: discard})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- r.Run(ctx) }()
	t.Cleanup(func() {
		cancel()
		if err := <-done; err != nil {
			t.Error(err)
		}
	})
	synctest.Wait()
	return r
}

// Owned children: the first list only learns who owns what; a change, a
// new child, a deleted child each reconcile the owner named by the
// controller reference, and nothing else.
func TestOwnedChildrenReconcileTheirOwner(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		c := newRelatedFake(child("ns", "a-cm", "1", "Widget/a"), child("ns", "b-cm", "2", "Widget/b"),
			child("ns", "lone", "3"), child("ns", "foreign", "4", "Gadget/g", "Widget/a"))
		q := &adds{}
		r := runRelated(t, c, q, watcher.OwnedBy(widgets))
		if got := q.take(); len(got) != 0 {
			t.Fatalf("the first list added %v, want nothing: a term's own list reconciles every owner", got)
		}
		if keys, ok := r.Keys(opkit.Key{Namespace: "ns", Name: "a-cm"}); !ok || !slices.Equal(keys, []opkit.Key{{Namespace: "ns", Name: "a"}}) {
			t.Fatalf("Keys(a-cm) = %v, %v; want [ns/a]", keys, ok)
		}

		res := c.Resource(configMaps.GroupVersionResource).Namespace("ns")
		mustDo(t)(res.Update(ctx, child("ns", "a-cm", "5", "Widget/a"), metav1.UpdateOptions{}))    // drift
		mustDo(t)(res.Create(ctx, child("ns", "c-cm", "6", "Widget/c"), metav1.CreateOptions{}))    // a new child
		mustDo(t)(res.Update(ctx, child("ns", "lone", "7"), metav1.UpdateOptions{}))                // owned by nobody
		mustDo(t)(res.Update(ctx, child("ns", "foreign", "8", "Gadget/g"), metav1.UpdateOptions{})) // another kind's
		if err := res.Delete(ctx, "b-cm", metav1.DeleteOptions{}); err != nil {
			t.Fatal(err)
		}
		synctest.Wait()
		if got, want := q.take(), []string{"ns/a", "ns/c", "ns/b"}; !slices.Equal(got, want) {
			t.Fatalf("added %v, want %v", got, want)
		}
	})
}

// A child whose controller reference moves reaches both owners; a child
// deleted reaches the owner it had, also when the relist after a 410 is
// what finds it gone (there is no object to read an owner from then).
func TestARelatedObjectReachesTheKeysItHadAndHas(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		c := newRelatedFake(child("ns", "x", "1", "Widget/a"), child("ns", "y", "2", "Widget/b"), child("ns", "z", "3", "Widget/c"))
		ws := &watches{}
		ws.installFor(c, "configmaps")
		q := &adds{}
		runRelated(t, c, q, watcher.OwnedBy(widgets))
		moved := child("ns", "x", "4", "Widget/d")
		if err := c.Tracker().Update(configMaps.GroupVersionResource, moved, "ns"); err != nil {
			t.Fatal(err)
		}
		ws.last(t).Modify(moved)
		synctest.Wait()
		if got, want := q.take(), []string{"ns/a", "ns/d"}; !slices.Equal(got, want) {
			t.Fatalf("a moved controller reference added %v, want %v", got, want)
		}
		// While no watch looks: y is deleted, z changes, x stays.
		tr := c.Tracker()
		if err := tr.Delete(configMaps.GroupVersionResource, "ns", "y"); err != nil {
			t.Fatal(err)
		}
		if err := tr.Update(configMaps.GroupVersionResource, child("ns", "z", "9", "Widget/c"), "ns"); err != nil {
			t.Fatal(err)
		}
		ws.last(t).Error(expired)
		synctest.Wait()
		got := q.take()
		slices.Sort(got)
		if want := []string{"ns/b", "ns/c"}; !slices.Equal(got, want) {
			t.Fatalf("the relist added %v, want %v: the vanished child's owner and the changed one's", got, want)
		}
	})
}

// Watches: any mapping, to several keys.
func TestAMappingCanNameSeveralKeys(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		shared := child("ns", "shared-config", "1")
		shared.SetLabels(map[string]string{"used-by": "a.b"})
		c := newRelatedFake(shared)
		q := &adds{}
		byLabel := func(obj *unstructured.Unstructured) []opkit.Key {
			var keys []opkit.Key
			for _, name := range []string{"a", "b"} {
				if obj.GetLabels()["used-by"] != "" {
					keys = append(keys, opkit.Key{Namespace: obj.GetNamespace(), Name: name})
				}
			}
			return keys
		}
		runRelated(t, c, q, byLabel)
		shared = child("ns", "shared-config", "2")
		shared.SetLabels(map[string]string{"used-by": "a.b"})
		res := c.Resource(configMaps.GroupVersionResource).Namespace("ns")
		mustDo(t)(res.Update(ctx, shared, metav1.UpdateOptions{}))
		synctest.Wait()
		if got, want := q.take(), []string{"ns/a", "ns/b"}; !slices.Equal(got, want) {
			t.Fatalf("added %v, want %v, each once", got, want)
		}
	})
}

// NewRelated refuses a config without Map, Client, Queue, a version or a
// resource name, or with a Namespace for a cluster-scoped resource; a
// Kind is not needed.
func TestNewRelatedValidatesItsConfig(t *testing.T) {
	c, q, m := newRelatedFake(), &adds{}, watcher.OwnedBy(widgets)
	r := configMaps
	r.Kind = ""
	if _, err := watcher.NewRelated(watcher.RelatedConfig[*Widget]{Client: c, Resource: r, Map: m, Queue: q}); err != nil {
		t.Fatalf("NewRelated of a valid config without Kind: %v", err)
	}
	noVersion, noName, cluster := r, r, r
	noVersion.Version, noName.Resource, cluster.Namespaced = "", "", false
	// Each config lacks what its error must mention (or, cluster-scoped,
	// has a Namespace).
	for want, cfg := range map[string]watcher.RelatedConfig[*Widget]{
		"Map":            {Client: c, Resource: r, Queue: q},
		"Client":         {Resource: r, Map: m, Queue: q},
		"Queue":          {Client: c, Resource: r, Map: m},
		"version":        {Client: c, Resource: noVersion, Map: m, Queue: q},
		"name":           {Client: c, Resource: noName, Map: m, Queue: q},
		"cluster-scoped": {Client: c, Resource: cluster, Namespace: "ns", Map: m, Queue: q},
	} {
		if _, err := watcher.NewRelated(cfg); !errors.Is(err, watcher.ErrInvalidConfig) || !strings.Contains(err.Error(), want) {
			t.Errorf("NewRelated = %v, want ErrInvalidConfig mentioning %q", err, want)
		}
	}
}
