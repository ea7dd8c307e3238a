package leader_test

import (
	"context"
	"fmt"
	"io"
	"log/slog"

	"k8s.io/client-go/kubernetes/fake"

	"github.com/opkit/opkit/leader"
)

// A replica campaigns for a Lease and, while it leads, runs the
// controller's leadership-scoped work (watcher and workers) under the
// term's context. In a real operator Client is a clientset built from the
// rest.Config, Gate is the controller's queue, and ctx ends on SIGTERM.
func ExampleElector_Run() {
	ctx, shutdown := context.WithCancel(context.Background())
	el, err := leader.New(leader.Config{
		Client:    fake.NewClientset(),
		Namespace: "ops",
		Name:      "memcached-operator",
		Identity:  "pod-a",
		Logger:    slog.New(slog.NewTextHandler(io.Discard, nil)),
	})
	if err != nil {
		panic(err)
	}
	err = el.Run(ctx, func(ctx context.Context) error {
		term, _ := leader.TermFrom(ctx)
		fmt.Printf("leading: term %d as %s\n", term.Number, term.Identity)
		shutdown() // here: pretend SIGTERM arrived
		<-ctx.Done()
		fmt.Println("term over: stop reconciling")
		return nil
	})
	fmt.Printf("Run returned %v; holder after release: %q\n", err, el.Leader())
	// Output:
	// leading: term 0 as pod-a
	// term over: stop reconciling
	// Run returned <nil>; holder after release: ""
}
