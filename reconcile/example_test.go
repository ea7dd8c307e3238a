package reconcile_test

import (
	"context"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"time"

	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/schema"
	dynfake "k8s.io/client-go/dynamic/fake"
	kfake "k8s.io/client-go/kubernetes/fake"

	"github.com/opkit/opkit"
	"github.com/opkit/opkit/internal/typed"
	"github.com/opkit/opkit/leader"
	"github.com/opkit/opkit/reconcile"
	"github.com/opkit/opkit/trigger"
)

// exampleCluster is a fake API server holding one Widget.
func exampleCluster() *dynfake.FakeDynamicClient {
	u, _ := typed.ToUnstructured(widget("blue"))
	return dynfake.NewSimpleDynamicClientWithCustomListKinds(runtime.NewScheme(),
		map[schema.GroupVersionResource]string{widgets.GroupVersionResource: "WidgetList", reconcile.EventsResource: "EventList"}, u)
}

func ExampleNewController() {
	seen := make(chan string)
	ctrl, err := reconcile.NewController(reconcile.Config[*Widget]{
		Name:     "test.opkit.dev/widgets",
		Resource: widgets, // binds *Widget to widgets.test.opkit.dev/v1, namespaced
		Dynamic:  exampleCluster(),
		Reconciler: reconcile.Func[*Widget](func(ctx context.Context, req reconcile.Request[*Widget]) (reconcile.Result, error) {
			seen <- fmt.Sprintf("%s %s from %s %v, size %d", req.Type, req.Key, req.Sources, req.Reasons, req.Object.Spec.Size)
			return reconcile.Done(), nil
		}),
		Logger: slog.New(slog.DiscardHandler),
	})
	if err != nil {
		fmt.Println(err)
		return
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error)
	go func() { done <- ctrl.Run(ctx) }()

	fmt.Println(<-seen) // from the initial list

	// An external trigger: a reconcile ahead of any backlog. Submit is
	// Enqueue with a reason.
	o, err := ctrl.Trigger().Submit(ctx, trigger.Request[*Widget]{Object: widget("blue"), Type: opkit.Modified, Source: opkit.Operator, Reason: "deployed"})
	fmt.Println("scheduled:", o.Accepted(), err)
	fmt.Println(<-seen)

	cancel()
	fmt.Println("stopped:", <-done)
	// Output:
	// Added ns/blue from APIServer [], size 1
	// scheduled: true <nil>
	// Modified ns/blue from Operator [deployed], size 1
	// stopped: <nil>
}

// A sharded deployment: every replica runs the same controller; the
// objects are split into shards by UID, and the replicas share the
// shards. Here one replica, which holds both.
func ExampleConfig_shards() {
	seen := make(chan string)
	s, err := reconcile.NewController(reconcile.Config[*Widget]{
		Name:     "test.opkit.dev/widgets",
		Resource: widgets,
		Dynamic:  exampleCluster(),
		Reconciler: reconcile.Func[*Widget](func(ctx context.Context, req reconcile.Request[*Widget]) (reconcile.Result, error) {
			seen <- fmt.Sprintf("%s %s", req.Type, req.Key)
			return reconcile.Done(), nil
		}),
		Shards:      opkit.Shards{Count: 2},
		Concurrency: 2, // per replica, over the shards it holds
		// Shard i's Lease is widgets-i; the replicas count each other
		// through member Leases labelled leader.opkit.dev/group=widgets.
		Leader: &leader.Config{Client: kfake.NewClientset(), Namespace: "ops", Name: "widgets", Identity: "replica-a",
			LeaseDuration: 3 * time.Second, RenewDeadline: 2 * time.Second, RetryPeriod: 200 * time.Millisecond, ClockSkew: 500 * time.Millisecond},
		Logger: slog.New(slog.DiscardHandler),
	})
	if err != nil {
		fmt.Println(err)
		return
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error)
	go func() { done <- s.Run(ctx) }()

	fmt.Println(<-seen) // by the controller of blue's shard, once this replica holds it
	for s.Held() < 2 {
		time.Sleep(10 * time.Millisecond)
	}
	fmt.Printf("holds %d of 2 shards\n", s.Held())

	cancel()
	fmt.Println("stopped:", <-done)
	// Output:
	// Added ns/blue
	// holds 2 of 2 shards
	// stopped: <nil>
}

func ExampleGroup() {
	g := reconcile.NewGroup(reconcile.GroupConfig{Logger: slog.New(slog.DiscardHandler)})
	started := make(chan struct{})
	g.Add(
		reconcile.Runnable{Name: "controller", Run: func(ctx context.Context) error {
			close(started)
			<-ctx.Done()
			return nil
		}, Ready: func() error { return fmt.Errorf("not synced") }},
		reconcile.Runnable{Name: "trigger-http", Run: func(ctx context.Context) error {
			<-ctx.Done()
			return nil
		}},
	)
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error)
	go func() { done <- g.Run(ctx) }()
	<-started

	mux := http.NewServeMux()
	mux.Handle("GET /readyz", g.ReadyzHandler())
	rr := httptest.NewRecorder()
	mux.ServeHTTP(rr, httptest.NewRequest("GET", "/readyz", nil))
	body, _ := io.ReadAll(rr.Body)
	fmt.Print(rr.Code, "\n", string(body))

	cancel()
	fmt.Println("stopped:", <-done)
	// Output:
	// 503
	// fail controller: not synced
	// ok trigger-http
	// stopped: <nil>
}
