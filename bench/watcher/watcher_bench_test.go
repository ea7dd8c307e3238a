package watcherbench

import (
	"context"
	"fmt"
	"io"
	"log/slog"
	"os"
	"runtime"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	kruntime "k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/watch"
	"k8s.io/client-go/dynamic"
	"k8s.io/client-go/dynamic/dynamicinformer"
	"k8s.io/client-go/tools/cache"

	"github.com/opkit/opkit"
	"github.com/opkit/opkit/bench/internal/fixture"
	"github.com/opkit/opkit/bench/internal/stats"
	"github.com/opkit/opkit/internal/testcluster"
	"github.com/opkit/opkit/queue"
	"github.com/opkit/opkit/watcher"
)

// objects is the number of custom objects every sync reads.
const objects = 10_000

const namespace = "bench"

var env struct {
	fixture.Cluster
	client dynamic.Interface
}

func TestMain(m *testing.M) {
	code := m.Run()
	env.Stop()
	os.Exit(code)
}

// setup starts the control plane and creates the objects, once per process.
func setup(b *testing.B) dynamic.Interface {
	b.Helper()
	env.Get(b, func(ctx context.Context, c *testcluster.Cluster) error { return populate(ctx, b, c) })
	return env.client
}

func populate(ctx context.Context, b *testing.B, c *testcluster.Cluster) error {
	cfg := c.Config()
	cfg.QPS, cfg.Burst = -1, 0 // no client-side throttling, for both contenders
	d, err := dynamic.NewForConfig(cfg)
	if err != nil {
		return err
	}
	env.client = d
	if err := c.InstallCRD(ctx, fixture.GadgetCRD); err != nil {
		return err
	}
	nsGVR := schema.GroupVersionResource{Version: "v1", Resource: "namespaces"}
	ns := &unstructured.Unstructured{Object: map[string]any{"apiVersion": "v1", "kind": "Namespace", "metadata": map[string]any{"name": namespace}}}
	if _, err := d.Resource(nsGVR).Create(ctx, ns, metav1.CreateOptions{}); err != nil {
		return err
	}
	res := d.Resource(fixture.Gadgets.GroupVersionResource).Namespace(namespace)

	start := time.Now()
	data := strings.Repeat("0123456789abcdef", 40) // 640 bytes; the rest is metadata
	if err := fixture.Parallel(objects, 8, func(i int) error {
		u := &unstructured.Unstructured{Object: map[string]any{
			"apiVersion": "bench.opkit.dev/v1",
			"kind":       "Gadget",
			"metadata": map[string]any{
				"namespace": namespace, "name": fmt.Sprintf("gadget-%05d", i),
				"labels": map[string]any{"app": "bench", "shard": fmt.Sprint(i % 16)},
			},
			"spec": map[string]any{"size": int64(i), "data": data},
		}}
		if _, err := res.Create(ctx, u, metav1.CreateOptions{}); err != nil && !apierrors.IsAlreadyExists(err) {
			return err
		}
		return nil
	}); err != nil {
		return err
	}
	one, err := res.Get(ctx, "gadget-00000", metav1.GetOptions{})
	if err != nil {
		return err
	}
	raw, _ := one.MarshalJSON()
	b.Logf("created %d gadgets of %d bytes (JSON, with managedFields) in %v", objects, len(raw), time.Since(start).Round(time.Millisecond))
	return nil
}

// counter is the queue for the opkit watcher: it counts entries and keeps
// none, so the heap measured is the watcher's own (a real queue holds
// pending entries until workers take them, whatever the watcher).
type counter struct{ n atomic.Int64 }

func (c *counter) Add(opkit.Key, opkit.Cause[*fixture.Gadget], queue.AddOptions) queue.Outcome {
	c.n.Add(1)
	return queue.Queued
}

var discard = slog.New(slog.NewTextHandler(io.Discard, nil))

// measure runs sync b.N times; sync returns once synced and a stop func.
// It reports the time per sync (ns/op) and the heap retained per object.
func measure(b *testing.B, sync func() (stop func(), count int64)) {
	var retained float64
	b.ResetTimer()
	for range b.N {
		b.StopTimer()
		base := stats.LiveHeap()
		b.StartTimer()
		stop, count := sync()
		b.StopTimer()
		after := stats.LiveHeap()
		if count != objects {
			b.Fatalf("synced %d objects, want %d", count, objects)
		}
		retained += (float64(after) - float64(base)) / objects
		stop()
		b.StartTimer()
	}
	b.ReportMetric(retained/float64(b.N), "heapB/obj")
}

// stripManagedFields is the informer transform that drops managedFields
// from every object before the informer stores it.
func stripManagedFields(obj any) (any, error) {
	if m, ok := obj.(metav1.Object); ok {
		m.SetManagedFields(nil)
	}
	return obj, nil
}

// toGadget converts an object read through the dynamic client into the
// Gadget the opkit watcher decodes into, with the same converter. It clears
// TypeMeta, as the decoders of generated clientsets and of
// controller-runtime's informers do (runtime.WithoutVersionDecoder).
func toGadget(u *unstructured.Unstructured) (*fixture.Gadget, error) {
	g := &fixture.Gadget{}
	if err := kruntime.DefaultUnstructuredConverter.FromUnstructured(u.Object, g); err != nil {
		return nil, err
	}
	g.TypeMeta = metav1.TypeMeta{}
	return g, nil
}

// typedInformer returns a SharedIndexInformer of *Gadget over the dynamic
// client: what a typed informer or controller-runtime's cache holds for a
// Go type. It lists and watches as dynamicinformer does (same options, same
// WatchList semantics, same namespace index) and converts every object but
// an Error event's status into a *Gadget before the informer sees it.
func typedInformer(client dynamic.Interface) cache.SharedIndexInformer {
	res := client.Resource(fixture.Gadgets.GroupVersionResource).Namespace(namespace)
	lw := &cache.ListWatch{
		ListWithContextFunc: func(ctx context.Context, o metav1.ListOptions) (kruntime.Object, error) {
			ul, err := res.List(ctx, o)
			if err != nil {
				return nil, err
			}
			l := &fixture.GadgetList{Items: make([]fixture.Gadget, len(ul.Items))}
			l.ResourceVersion, l.Continue = ul.GetResourceVersion(), ul.GetContinue()
			l.RemainingItemCount = ul.GetRemainingItemCount()
			for i := range ul.Items {
				g, err := toGadget(&ul.Items[i])
				if err != nil {
					return nil, err
				}
				l.Items[i] = *g
			}
			return l, nil
		},
		WatchFuncWithContext: func(ctx context.Context, o metav1.ListOptions) (watch.Interface, error) {
			w, err := res.Watch(ctx, o)
			if err != nil {
				return nil, err
			}
			return watch.Filter(w, func(e watch.Event) (watch.Event, bool) {
				if u, ok := e.Object.(*unstructured.Unstructured); ok && e.Type != watch.Error {
					g, err := toGadget(u)
					if err != nil {
						return watch.Event{Type: watch.Error, Object: &metav1.Status{
							Status: metav1.StatusFailure, Message: err.Error(),
						}}, true
					}
					e.Object = g
				}
				return e, true
			}), nil
		},
	}
	return cache.NewSharedIndexInformerWithOptions(
		cache.ToListWatcherWithWatchListSemantics(lw, client),
		&fixture.Gadget{},
		cache.SharedIndexInformerOptions{
			Indexers:          cache.Indexers{cache.NamespaceIndex: cache.MetaNamespaceIndexFunc},
			ObjectDescription: fixture.Gadgets.GroupVersionResource.String(),
		},
	)
}

func BenchmarkInitialSync(b *testing.B) {
	client := setup(b)

	b.Run("impl=opkit", func(b *testing.B) {
		measure(b, func() (func(), int64) {
			q := &counter{}
			synced := make(chan struct{})
			w, err := watcher.New(watcher.Config[*fixture.Gadget]{
				Client: client, Resource: fixture.Gadgets, Namespace: namespace, Queue: q, Logger: discard,
				OnSync: func(e watcher.SyncEvent) {
					if e.Phase == watcher.SyncFinished && e.Initial {
						close(synced)
					}
				},
			})
			if err != nil {
				b.Fatal(err)
			}
			ctx, cancel := context.WithCancel(context.Background())
			done := make(chan error, 1)
			go func() { done <- w.Run(ctx) }()
			<-synced
			return func() {
				runtime.KeepAlive(w)
				cancel()
				<-done
			}, q.n.Load()
		})
	})

	for _, strip := range []bool{false, true} {
		name := "impl=informer"
		if strip {
			// What controller-runtime's cache does when told to
			// (Options.DefaultTransform = TransformStripManagedFields;
			// it keeps managedFields by default).
			name = "impl=informer-stripped"
		}
		b.Run(name, func(b *testing.B) {
			measure(b, func() (func(), int64) {
				factory := dynamicinformer.NewFilteredDynamicSharedInformerFactory(client, 0, namespace, nil)
				inf := factory.ForResource(fixture.Gadgets.GroupVersionResource).Informer()
				if strip {
					inf.SetTransform(stripManagedFields)
				}
				stop := make(chan struct{})
				n := syncCounted(inf, func() { factory.Start(stop) })
				return func() {
					runtime.KeepAlive(inf)
					close(stop)
					factory.Shutdown()
				}, n
			})
		})
	}

	// The same Go type the opkit watcher decodes into, in a typed informer
	// with managedFields stripped: what a Go user of a typed informer or of
	// controller-runtime's cache keeps once it strips them.
	b.Run("impl=informer-typed-stripped", func(b *testing.B) {
		measure(b, func() (func(), int64) {
			inf := typedInformer(client)
			if err := inf.SetTransform(stripManagedFields); err != nil {
				b.Fatal(err)
			}
			stop := make(chan struct{})
			ran := make(chan struct{})
			n := syncCounted(inf, func() {
				go func() {
					defer close(ran)
					inf.Run(stop)
				}()
			})
			return func() {
				runtime.KeepAlive(inf)
				close(stop)
				<-ran
			}, n
		})
	})
}

// syncCounted adds a handler counting inf's Adds, starts inf with start,
// and returns once it has synced and its handler has seen every object
// (handlers run asynchronously), with the count.
func syncCounted(inf cache.SharedIndexInformer, start func()) int64 {
	var n atomic.Int64
	inf.AddEventHandler(cache.ResourceEventHandlerFuncs{AddFunc: func(any) { n.Add(1) }})
	start()
	for !inf.HasSynced() {
		time.Sleep(time.Millisecond)
	}
	for n.Load() < objects {
		time.Sleep(time.Millisecond)
	}
	return n.Load()
}
