//go:build integration

package watcher_test

import (
	"bytes"
	"context"
	"fmt"
	"log/slog"
	"sync"
	"testing"
	"time"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/client-go/dynamic"
	"k8s.io/client-go/rest"

	"github.com/opkit/opkit/internal/testcluster"
)

func TestMain(m *testing.M) { testcluster.Main(m) }

var crdGVR = schema.GroupVersionResource{Group: "apiextensions.k8s.io", Version: "v1", Resource: "customresourcedefinitions"}

// dyn returns a dynamic client for cfg without client-side throttling, so
// tests that write thousands of objects are not slowed to 5 per second.
func dyn(t testing.TB, cfg *rest.Config) *dynamic.DynamicClient {
	t.Helper()
	cfg.QPS, cfg.Burst = -1, 0
	d, err := dynamic.NewForConfig(cfg)
	if err != nil {
		t.Fatal(err)
	}
	return d
}

// installWidgets installs the widgets CRD (spec and status free-form, with a
// status subresource so generation tracks spec changes) and waits until it
// is served.
func installWidgets(t testing.TB, cfg *rest.Config) {
	t.Helper()
	d := dyn(t, cfg)
	free := map[string]any{"type": "object", "x-kubernetes-preserve-unknown-fields": true}
	crd := &unstructured.Unstructured{Object: map[string]any{
		"apiVersion": "apiextensions.k8s.io/v1",
		"kind":       "CustomResourceDefinition",
		"metadata":   map[string]any{"name": "widgets." + widgets.Group},
		"spec": map[string]any{
			"group": widgets.Group,
			"scope": "Namespaced",
			"names": map[string]any{"plural": "widgets", "singular": "widget", "kind": "Widget", "listKind": "WidgetList"},
			"versions": []any{map[string]any{
				"name": "v1", "served": true, "storage": true,
				"subresources": map[string]any{"status": map[string]any{}},
				"schema": map[string]any{"openAPIV3Schema": map[string]any{
					"type":       "object",
					"properties": map[string]any{"spec": free, "status": free},
				}},
			}},
		},
	}}
	ctx := context.Background()
	if _, err := d.Resource(crdGVR).Create(ctx, crd, metav1.CreateOptions{}); err != nil && !apierrors.IsAlreadyExists(err) {
		t.Fatalf("create CRD: %v", err)
	}
	eventually(t, time.Minute, "widgets served", func() error {
		_, err := d.Resource(widgets.GroupVersionResource).Namespace("default").List(ctx, metav1.ListOptions{Limit: 1})
		return err
	})
}

// eventually polls f until it returns nil or the deadline passes.
func eventually(t testing.TB, within time.Duration, what string, f func() error) {
	t.Helper()
	deadline := time.Now().Add(within)
	var err error
	for {
		if err = f(); err == nil {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("%s: not within %v: %v", what, within, err)
		}
		time.Sleep(100 * time.Millisecond)
	}
}

func newWidget(ns, name string, size int) *unstructured.Unstructured {
	return &unstructured.Unstructured{Object: map[string]any{
		"apiVersion": "test.opkit.dev/v1",
		"kind":       "Widget",
		"metadata":   map[string]any{"namespace": ns, "name": name},
		"spec":       map[string]any{"size": int64(size)},
	}}
}

// parallel runs f(i) for i in [0, n) on a few goroutines and fails t on
// the first error.
func parallel(t testing.TB, n int, f func(i int) error) {
	t.Helper()
	var (
		wg   sync.WaitGroup
		mu   sync.Mutex
		errs []error
		next = make(chan int)
	)
	for range 8 {
		wg.Go(func() {
			for i := range next {
				if err := f(i); err != nil {
					mu.Lock()
					errs = append(errs, fmt.Errorf("item %d: %w", i, err))
					mu.Unlock()
				}
			}
		})
	}
	for i := range n {
		next <- i
	}
	close(next)
	wg.Wait()
	if len(errs) > 0 {
		t.Fatalf("%d errors, first: %v", len(errs), errs[0])
	}
}

// all returns every record so far without removing them.
func (r *recorder) all() []record {
	r.mu.Lock()
	defer r.mu.Unlock()
	return append([]record(nil), r.records...)
}

// logBuffer is a concurrency-safe buffer behind a slog text handler.
type logBuffer struct {
	mu  sync.Mutex
	buf bytes.Buffer
}

func (b *logBuffer) Write(p []byte) (int, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.Write(p)
}

func (b *logBuffer) String() string {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.String()
}

func (b *logBuffer) logger() *slog.Logger {
	return slog.New(slog.NewTextHandler(b, &slog.HandlerOptions{Level: slog.LevelDebug}))
}
