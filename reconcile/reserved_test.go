package reconcile_test

import (
	"context"
	"errors"
	"fmt"
	"sync/atomic"
	"testing"
	"testing/synctest"
	"time"

	"github.com/opkit/opkit"
	"github.com/opkit/opkit/reconcile"
)

// backlogScenario runs a controller over a backlog of 6 widgets whose
// reconciles (source APIServer) block until the test ends, plus "t",
// whose watch reconcile returns at once. Once every worker that takes the
// backlog is stuck in it, the test triggers "t" and reports the trigger's
// reconciles that started while the backlog was still blocked, and how
// many backlog reconciles had started. failFirst makes the first triggered
// reconcile fail, so that its retry shows.
func backlogScenario(t *testing.T, mod func(*reconcile.Config[*Widget]), failFirst bool) (triggered []call, backlogStarted int64) {
	t.Helper()
	release := make(chan struct{})
	var started atomic.Int64
	var failed atomic.Bool
	rec := &recorder{do: func(ctx context.Context, _ int, req reconcile.Request[*Widget]) (reconcile.Result, error) {
		switch {
		case req.Key.Name == "t" && req.Sources != apiServer: // the trigger, or its retry
			if failFirst && !failed.Swap(true) {
				return reconcile.Done(), errors.New("transient")
			}
		case req.Key.Name != "t":
			started.Add(1)
			select {
			case <-release:
			case <-ctx.Done():
			}
		}
		return reconcile.Done(), nil
	}}
	objs := []*Widget{widget("t")}
	for i := range 6 {
		objs = append(objs, widget(fmt.Sprintf("b%d", i)))
	}
	e := start(t, rec, mod, objs...)
	t.Cleanup(func() { close(release) }) // runs before start's cleanup stops the controller
	synctest.Wait()
	if ok, err := e.ctrl.Trigger().Enqueue(context.Background(), widget("t"), opkit.Modified, opkit.Operator, 0, 0); !ok || err != nil {
		t.Fatalf("Enqueue = %v, %v", ok, err)
	}
	synctest.Wait()
	if failFirst {
		time.Sleep(time.Minute) // past the retry's backoff (1s in these tests)
		synctest.Wait()
	}
	for _, c := range rec.snapshot() {
		if c.req.Key.Name == "t" && c.req.Sources != apiServer {
			triggered = append(triggered, c)
		}
	}
	return triggered, started.Load()
}

func TestReservedWorkerReconcilesATriggerWhileEveryWorkerIsBusyWithTheBacklog(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		at := time.Now()
		triggered, backlog := backlogScenario(t, func(c *reconcile.Config[*Widget]) { c.Concurrency = 2 }, false)
		if backlog != 2 {
			t.Fatalf("%d backlog reconciles started, want 2 (one per normal worker; the reserved one takes none)", backlog)
		}
		if len(triggered) != 1 || !triggered[0].at.Equal(at) || triggered[0].req.Key.Name != "t" {
			t.Fatalf("triggered reconciles %+v; want one of t at once, while the backlog blocks both workers", triggered)
		}
	})
}

func TestRetryOfATriggerAlsoUsesTheReservedWorker(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		triggered, backlog := backlogScenario(t, func(c *reconcile.Config[*Widget]) { c.Concurrency = 2; c.ReservedWorkers = 1 }, true)
		if backlog != 2 {
			t.Fatalf("%d backlog reconciles started, want 2", backlog)
		}
		if len(triggered) != 2 || triggered[1].retries != 1 {
			t.Fatalf("triggered reconciles %+v; want the failed one and its retry, while the backlog blocks both workers", triggered)
		}
	})
}

func TestWithoutReservedWorkersATriggerWaitsForTheBacklog(t *testing.T) {
	for name, mod := range map[string]func(*reconcile.Config[*Widget]){
		"negative":      func(c *reconcile.Config[*Widget]) { c.Concurrency = 2; c.ReservedWorkers = -1 },
		"concurrency 1": func(c *reconcile.Config[*Widget]) { c.Concurrency = 1 }, // default: none
	} {
		t.Run(name, func(t *testing.T) {
			synctest.Test(t, func(t *testing.T) {
				triggered, _ := backlogScenario(t, mod, false)
				if len(triggered) != 0 {
					t.Fatalf("triggered reconciles %+v; without a reserved worker the trigger waits for a worker", triggered)
				}
			})
		})
	}
}
