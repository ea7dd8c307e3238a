package envtest

import (
	"context"
	"testing"
	"time"

	"k8s.io/apimachinery/pkg/util/wait"

	"github.com/opkit/opkit/reconcile"
)

// Runner is what [Run] runs: a *reconcile.Controller[T], a
// *reconcile.Operator, a *reconcile.Group, or anything else that runs until
// its context ends.
type Runner interface {
	Run(ctx context.Context) error
}

// Timeout bounds Run's wait for readiness and the cleanup's for Run to
// return once its context ended, and Eventually's wait.
const Timeout = time.Minute

// Run runs r in a goroutine until t ends: t's cleanup cancels its context,
// waits for Run to return and fails t if it returned an error (or did not
// return within Timeout). A Run that returns before the test ends
// fails t at once with its error.
//
// When r reports readiness, Run returns once r is ready, so that what the
// test does next is seen: a *reconcile.Controller[T] once Check passes
// (its watches listed, its Lease elector healthy), a *reconcile.Operator
// or *reconcile.Group once every component is ready. It fails t if r is
// not ready within Timeout, with r's last reason. Other Runners are
// only started.
func Run(t testing.TB, r Runner) {
	t.Helper()
	ready := readiness(r)
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	// early says that r.Run returned before the cleanup cancelled ctx, and
	// that the goroutine reported it. It is written before the send on done
	// and read after the receive. Once ctx is cancelled the goroutine
	// reports nothing: the test may be over.
	var early bool
	go func() { // owned by Run; the cleanup waits for it
		err := r.Run(ctx)
		if ctx.Err() == nil {
			early = true
			t.Errorf("envtest: %T.Run returned before the test ended: %v", r, err)
		}
		done <- err
	}()
	t.Cleanup(func() {
		cancel()
		select {
		case err := <-done:
			if err != nil && !early {
				t.Errorf("envtest: %T.Run: %v", r, err)
			}
		case <-time.After(Timeout):
			t.Errorf("envtest: %T.Run did not return within %v of its context's end", r, Timeout)
		}
	})
	if ready == nil {
		return
	}
	deadline := time.Now().Add(Timeout)
	tick := time.NewTicker(50 * time.Millisecond)
	defer tick.Stop()
	for {
		err := ready()
		if err == nil {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("envtest: %T not ready within %v: %v", r, Timeout, err)
		}
		select {
		case err := <-done:
			done <- err // for the cleanup
			t.FailNow() // the goroutine reported the early return

		case <-tick.C:
		}
	}
}

// readiness returns r's readiness check, or nil.
func readiness(r Runner) func() error {
	switch r := r.(type) {
	case *reconcile.Operator:
		return r.Group().Ready
	case *reconcile.Group:
		return r.Ready
	case interface{ Check() error }: // *reconcile.Controller[T]
		return r.Check
	}
	return nil
}

// Eventually calls cond every 100ms until it returns nil, and fails t with
// cond's last error if that takes longer than Timeout: a test waits so for
// what a controller does (a child created, a status written). cond's
// context ends with the wait.
func Eventually(t testing.TB, what string, cond func(ctx context.Context) error) {
	t.Helper()
	var last error
	err := wait.PollUntilContextTimeout(context.Background(), 100*time.Millisecond, Timeout, true, func(ctx context.Context) (bool, error) {
		err := cond(ctx)
		if last == nil || ctx.Err() == nil {
			last = err // not the error of a call the deadline cut short
		}
		return err == nil, nil
	})
	if err != nil {
		t.Fatalf("envtest: %s: not within %v: %v", what, Timeout, last)
	}
}
