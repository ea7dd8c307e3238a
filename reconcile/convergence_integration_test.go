//go:build integration

package reconcile_test

import (
	"context"
	"fmt"
	"log/slog"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/dynamic"
	"k8s.io/client-go/kubernetes"

	"github.com/opkit/opkit"
	"github.com/opkit/opkit/internal/logsink"
	"github.com/opkit/opkit/internal/testcluster"
	"github.com/opkit/opkit/internal/typed"
	"github.com/opkit/opkit/leader"
	"github.com/opkit/opkit/reconcile"
	"github.com/opkit/opkit/watcher"
)

// sizes is a reconciler that records the spec size it reconciled last per
// name, and the order in which names were reconciled.
type sizes struct {
	mu    sync.Mutex
	last  map[string]int
	order []string
}

func (s *sizes) Reconcile(_ context.Context, req reconcile.Request[*Widget]) (reconcile.Result, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if req.Object != nil && req.Type != opkit.Deleted {
		s.last[req.Key.Name] = req.Object.Spec.Size
		s.order = append(s.order, req.Key.Name)
	}
	return reconcile.Done(), nil
}

func (s *sizes) of(name string) int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.last[name]
}

// An API server restarted ten times in a row: after each restart a change
// is reconciled, and the controller (watcher and elector) comes back by
// its normal backoff, never by the slow path for lasting permission errors
// (nothing is logged at ERROR). Durations are logged, not asserted.
func TestIntegrationTenAPIServerRestartsEachFollowedByAReconciledChange(t *testing.T) {
	c, dyn, kube, ns := privateWidgets(t, testcluster.Options{})
	ctx := context.Background()
	logs := &logsink.Buffer{}
	rec := &sizes{last: map[string]int{}}
	ctrl := runController(t, reconcile.Config[*Widget]{
		Name: "test.opkit.dev/restarts", Resource: widgets, Dynamic: dyn, Reconciler: rec, NoEvents: true,
		Leader: &leader.Config{Client: kube, Namespace: ns, Name: "restarts", Identity: "me",
			LeaseDuration: 6 * time.Second, RenewDeadline: 4 * time.Second, RetryPeriod: time.Second},
		Logger: slog.New(slog.NewTextHandler(logs, &slog.HandlerOptions{Level: slog.LevelInfo})),
		Watch:  watcher.Config[*Widget]{Namespace: ns},
	})
	create(t, dyn, ns, "w", 0)
	eventually(t, time.Minute, "the first reconcile", func() error {
		if rec.of("w") != 0 || ctrl.Check() != nil {
			return fmt.Errorf("not yet (Check: %v)", ctrl.Check())
		}
		return nil
	})
	res := dyn.Resource(widgets.GroupVersionResource).Namespace(ns)
	for i := 1; i <= 10; i++ {
		if err := c.StopAPIServer(0); err != nil {
			t.Fatal(err)
		}
		if err := c.StartAPIServer(0); err != nil {
			t.Fatal(err)
		}
		restarted := time.Now()
		patch := fmt.Appendf(nil, `{"spec":{"size":%d}}`, i)
		eventually(t, time.Minute, "the patch after restart", func() error {
			_, err := res.Patch(ctx, "w", types.MergePatchType, patch, metav1.PatchOptions{})
			return err
		})
		eventually(t, 2*time.Minute, fmt.Sprintf("the change after restart %d reconciled", i), func() error {
			if got := rec.of("w"); got != i {
				return fmt.Errorf("reconciled size %d", got)
			}
			return nil
		})
		t.Logf("restart %d: the change reconciled %v after the API server was ready", i, time.Since(restarted).Round(10*time.Millisecond))
	}
	for _, line := range strings.Split(logs.String(), "\n") {
		if strings.Contains(line, "level=ERROR") {
			t.Errorf("logged at ERROR (the slow path for lasting failures, or a false alarm): %s", line)
		}
	}
}

// A term that starts with a mix of objects whose status is up to date and
// objects whose spec changed since their last reconcile (or that were
// never reconciled) reconciles the stale ones first, the longest waiting
// first.
func TestIntegrationATermReconcilesStaleObjectsFirst(t *testing.T) {
	dyn, ns := realCluster(t)
	ctx := context.Background()
	client := typed.New[*Widget](dyn, widgets)
	// Objects 0-9 up to date, 10-14 one generation behind, 15-16 two
	// behind, 17-19 never reconciled; created in an order that mixes
	// them.
	kind := func(i int) string {
		switch {
		case i < 10:
			return "current"
		case i < 15:
			return "behind"
		case i < 17:
			return "further"
		}
		return "new"
	}
	for _, i := range []int{17, 3, 10, 0, 15, 4, 11, 18, 1, 12, 5, 16, 2, 13, 6, 19, 7, 14, 8, 9} {
		name := fmt.Sprintf("%s-%02d", kind(i), i)
		w := create(t, dyn, ns, name, 1)
		if kind(i) == "new" {
			continue
		}
		// Reconciled once, at generation 1...
		w.Status.ObservedGeneration = 1
		if _, err := client.UpdateStatus(ctx, w); err != nil {
			t.Fatal(err)
		}
		// ...then the spec changed (0, 1 or 2 times) without a reconcile.
		bumps := map[string]int{"current": 0, "behind": 1, "further": 2}[kind(i)]
		for b := range bumps {
			patch := fmt.Appendf(nil, `{"spec":{"size":%d}}`, 10+b)
			if _, err := client.Patch(ctx, opkit.KeyOf(w), types.MergePatchType, patch); err != nil {
				t.Fatal(err)
			}
		}
	}
	rec := &sizes{last: map[string]int{}}
	runController(t, reconcile.Config[*Widget]{
		Name: "test.opkit.dev/stale-first", Resource: widgets, Dynamic: dyn, Reconciler: rec, NoEvents: true,
		Concurrency: 1, ReservedWorkers: -1, Logger: quiet, Watch: watcher.Config[*Widget]{Namespace: ns},
	})
	eventually(t, time.Minute, "every object reconciled", func() error {
		rec.mu.Lock()
		defer rec.mu.Unlock()
		if len(rec.last) != 20 {
			return fmt.Errorf("%d of 20", len(rec.last))
		}
		return nil
	})
	rec.mu.Lock()
	order := slices.Clone(rec.order[:20])
	rec.mu.Unlock()
	t.Logf("order: %v", order)
	// Two behind first; then one behind and never reconciled (both one
	// generation of work), in list order; then the up-to-date ones.
	rank := func(name string) int {
		return map[string]int{"further": 0, "behind": 1, "new": 1, "current": 2}[strings.SplitN(name, "-", 2)[0]]
	}
	if !slices.IsSortedFunc(order, func(a, b string) int { return rank(a) - rank(b) }) {
		t.Fatalf("reconciled in the order %v, want the two-behind first, then the one-behind and new, then the up-to-date", order)
	}
}

// privateWidgets starts a private control plane (opts) with the widgets
// CRD served, and returns it with admin clients and a fresh namespace.
func privateWidgets(t *testing.T, opts testcluster.Options) (*testcluster.Cluster, dynamic.Interface, kubernetes.Interface, string) {
	t.Helper()
	c := testcluster.Start(t, opts)
	cfg := c.Config()
	dyn, err := dynamic.NewForConfig(cfg)
	if err != nil {
		t.Fatal(err)
	}
	kube, err := kubernetes.NewForConfig(cfg)
	if err != nil {
		t.Fatal(err)
	}
	if err := c.InstallCRD(context.Background(), testcluster.CRD{Resource: widgets.GroupVersionResource, Kind: widgets.Kind, Namespaced: true}); err != nil {
		t.Fatal(err)
	}
	return c, dyn, kube, c.Namespace(t)
}
