package envtest

import (
	"context"
	"sync"
	"testing"
	"time"

	"github.com/opkit/opkit/reconcile"
)

// Runner is what [Run] runs: a *reconcile.Controller[T], a
// *reconcile.Operator, a *reconcile.Group, or anything else that runs until
// its context ends.
type Runner interface {
	Run(ctx context.Context) error
}

// RunTimeout bounds Run's wait for readiness, and the cleanup's for Run
// to return once its context ended.
const RunTimeout = time.Minute

// Run runs r in a goroutine until t ends: t's cleanup cancels its context,
// waits for Run to return and fails t if it returned an error (or did not
// return within RunTimeout). A Run that returns before the test ends
// fails t at once with its error.
//
// When r reports readiness, Run returns once r is ready, so that what the
// test does next is seen: a *reconcile.Controller[T] once Check passes
// (its watches listed, its Lease elector healthy), a *reconcile.Operator
// or *reconcile.Group once every component is ready. It fails t if r is
// not ready within RunTimeout, with r's last reason. Other Runners are
// only started.
func Run(t testing.TB, r Runner) {
	t.Helper()
	ready := readiness(r)
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	var (
		mu       sync.Mutex
		finished bool // the test is done with r: the goroutine reports nothing
		reported bool // the goroutine reported an early return
	)
	go func() { // owned by Run; the cleanup waits for it
		err := r.Run(ctx)
		mu.Lock()
		if !finished && ctx.Err() == nil {
			reported = true
			t.Errorf("envtest: %T.Run returned before the test ended: %v", r, err)
		}
		mu.Unlock()
		done <- err
	}()
	t.Cleanup(func() {
		cancel()
		select {
		case err := <-done:
			mu.Lock()
			finished = true
			mu.Unlock()
			if err != nil && !reported {
				t.Errorf("envtest: %T.Run: %v", r, err)
			}
		case <-time.After(RunTimeout):
			mu.Lock()
			finished = true
			mu.Unlock()
			t.Errorf("envtest: %T.Run did not return within %v of its context's end", r, RunTimeout)
		}
	})
	if ready == nil {
		return
	}
	deadline := time.Now().Add(RunTimeout)
	tick := time.NewTicker(50 * time.Millisecond)
	defer tick.Stop()
	for {
		err := ready()
		if err == nil {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("envtest: %T not ready within %v: %v", r, RunTimeout, err)
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
