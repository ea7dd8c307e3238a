package reconcile_test

import (
	"context"
	"sync"
	"sync/atomic"
	"testing"
	"testing/synctest"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/client-go/dynamic"

	"github.com/opkit/opkit"
	"github.com/opkit/opkit/queue"
	"github.com/opkit/opkit/reconcile"
)

// hangingGets wraps a dynamic client so that Get blocks until its context
// ends while hang is set: an API server that accepts the request and never
// answers. Everything else goes to the wrapped client.
type hangingGets struct {
	dynamic.Interface
	hang *atomic.Bool
}

func (h hangingGets) Resource(gvr schema.GroupVersionResource) dynamic.NamespaceableResourceInterface {
	return hangingResource{h.Interface.Resource(gvr), h.hang}
}

type hangingResource struct {
	dynamic.NamespaceableResourceInterface
	hang *atomic.Bool
}

func (r hangingResource) Namespace(ns string) dynamic.ResourceInterface {
	return hangingNamespaced{r.NamespaceableResourceInterface.Namespace(ns), r.hang}
}

type hangingNamespaced struct {
	dynamic.ResourceInterface
	hang *atomic.Bool
}

func (r hangingNamespaced) Get(ctx context.Context, name string, opts metav1.GetOptions, sub ...string) (*unstructured.Unstructured, error) {
	if r.hang.Load() {
		<-ctx.Done()
		return nil, ctx.Err()
	}
	return r.ResourceInterface.Get(ctx, name, opts, sub...)
}

func TestControllerRefetchIsBoundedByTheReconcileTimeout(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		var hang atomic.Bool
		rec := &recorder{}
		fake := newFakeDynamic(t, widget("a"))
		e := start(t, rec, func(c *reconcile.Config[*Widget]) {
			c.Dynamic = hangingGets{fake, &hang}
			c.Timeout = 3 * time.Second
			c.Backoff = queue.Backoff{Base: time.Second, Cap: time.Second, Jitter: -1}
		}, widget("a"))
		_ = e
		synctest.Wait()
		if n := len(rec.snapshot()); n != 1 {
			t.Fatalf("%d calls after the initial list, want 1", n)
		}

		// A trigger of a key-only copy is read for its turn; the API
		// server now hangs.
		hang.Store(true)
		started := time.Now()
		keyOnly := widget("a", func(w *Widget) { w.ResourceVersion = "" })
		if ok, err := e.ctrl.Trigger().Enqueue(context.Background(), keyOnly, opkit.Modified, opkit.Operator, 0, 0); !ok || err != nil {
			t.Fatalf("Enqueue = %v, %v", ok, err)
		}
		// The read gives up at the timeout and the request is retried
		// (backoff 1s); the API server answers again by then.
		time.Sleep(3*time.Second + time.Millisecond)
		synctest.Wait()
		if got := e.metrics.get("retry"); got != 1 {
			t.Fatalf("%d retries %v after the hanging re-fetch started; want 1 (the re-fetch bounded by Timeout)", got, time.Since(started))
		}
		hang.Store(false)
		time.Sleep(2 * time.Second)
		synctest.Wait()
		calls := rec.snapshot()
		if len(calls) != 2 || calls[1].retries != 1 {
			t.Fatalf("calls %+v; want the object reconciled on the trigger's first retry", calls)
		}
	})
}

// outcomes counts trigger.Metrics calls.
type outcomes struct {
	noTriggerMetrics
	mu       sync.Mutex
	enqueued map[queue.Outcome]int
	rejected int
}

func (o *outcomes) Enqueued(out queue.Outcome) {
	o.mu.Lock()
	defer o.mu.Unlock()
	if o.enqueued == nil {
		o.enqueued = map[queue.Outcome]int{}
	}
	o.enqueued[out]++
}

func (o *outcomes) Rejected() { o.mu.Lock(); o.rejected++; o.mu.Unlock() }

func TestControllerTriggerFeedsTriggerMetrics(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		m := &outcomes{}
		e := start(t, &recorder{}, func(c *reconcile.Config[*Widget]) { c.TriggerMetrics = m }, widget("a"))
		synctest.Wait()
		if ok, err := e.ctrl.Trigger().Enqueue(context.Background(), widget("a"), opkit.Modified, opkit.Operator, 0, 0); !ok || err != nil {
			t.Fatalf("Enqueue = %v, %v", ok, err)
		}
		if _, err := e.ctrl.Trigger().Enqueue(context.Background(), widget("a"), opkit.Modified, opkit.APIServer, 0, 0); err == nil {
			t.Fatal("Enqueue with source APIServer: want an error")
		}
		synctest.Wait()
		m.mu.Lock()
		defer m.mu.Unlock()
		if m.enqueued[queue.Queued] != 1 || m.rejected != 1 {
			t.Fatalf("enqueued %v, rejected %d; want 1 Queued and 1 rejected", m.enqueued, m.rejected)
		}
	})
}
