//go:build integration

package watcher_test

import (
	"context"
	"fmt"
	"sync"
	"testing"
	"time"

	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/client-go/dynamic"
	"k8s.io/client-go/rest"

	"github.com/opkit/opkit/internal/testcluster"
)

func TestMain(m *testing.M) { testcluster.Main(m) }

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

// installWidgets installs the widgets CRD and waits until every running
// API server serves it.
func installWidgets(t testing.TB, c *testcluster.Cluster) {
	t.Helper()
	crd := testcluster.CRD{Resource: widgets.GroupVersionResource, Kind: widgets.Kind, Namespaced: true}
	if err := c.InstallCRD(context.Background(), crd); err != nil {
		t.Fatal(err)
	}
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
