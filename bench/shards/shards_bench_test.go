package shardsbench

import (
	"context"
	"flag"
	"fmt"
	"log/slog"
	"os"
	"strconv"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/go-logr/logr"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/dynamic"
	"k8s.io/client-go/kubernetes"
	"k8s.io/klog/v2"

	"github.com/opkit/opkit"
	"github.com/opkit/opkit/bench/internal/fixture"
	"github.com/opkit/opkit/bench/internal/stats"
	"github.com/opkit/opkit/bench/internal/traffic"
	"github.com/opkit/opkit/internal/testcluster"
	"github.com/opkit/opkit/internal/typed"
	"github.com/opkit/opkit/leader"
	"github.com/opkit/opkit/reconcile"
	"github.com/opkit/opkit/watcher"
)

// objectCount is the Widgets changed in each run (the figure,
// 2,000, by default).
var objectCount = flag.Int("shards.objects", 2000, "Widgets changed in each run")

const (
	shards  = 8
	workers = 2                      // per replica
	work    = 200 * time.Millisecond // one reconcile's stand-in for real work
	timeout = 10 * time.Minute
)

// Widget is the benchmark's custom resource.
type Widget struct {
	metav1.TypeMeta   `json:",inline"`
	metav1.ObjectMeta `json:"metadata,omitempty"`
	Spec              struct {
		Size int64 `json:"size"`
	} `json:"spec,omitempty"`
	Status struct {
		ObservedGeneration int64 `json:"observedGeneration,omitempty"`
	} `json:"status,omitempty"`
}

var widgets = opkit.Resource{
	GroupVersionResource: schema.GroupVersionResource{Group: "bench.opkit.dev", Version: "v1", Resource: "widgets"},
	Kind:                 "Widget",
	Namespaced:           true,
}

var (
	gated   fixture.Cluster
	ungated = fixture.Cluster{Options: testcluster.Options{DisableShardedListAndWatch: true}}
	discard = slog.New(slog.DiscardHandler)
	nsSeq   atomic.Int64
)

func TestMain(m *testing.M) {
	klog.SetLogger(logr.Discard())
	code := m.Run()
	gated.Stop()
	ungated.Stop()
	os.Exit(code)
}

func install(ctx context.Context, c *testcluster.Cluster) error {
	return c.InstallCRD(ctx, testcluster.CRD{Resource: widgets.GroupVersionResource, Kind: widgets.Kind, Namespaced: true})
}

// BenchmarkShardedConvergence reports, per run: s-converge, the seconds
// from the first spec change to the last object's new generation
// reconciled; MB/replica, what each replica received from the API server
// meanwhile (mean); apiserver-cores, the API server's CPU seconds per
// second meanwhile. Run it with -benchtime 1x.
func BenchmarkShardedConvergence(b *testing.B) {
	for _, tc := range []struct {
		name     string
		cluster  *fixture.Cluster
		replicas int
	}{
		{"server-side/replicas=1", &gated, 1},
		{"server-side/replicas=2", &gated, 2},
		{"server-side/replicas=4", &gated, 4},
		{"client-side/replicas=4", &ungated, 4},
	} {
		b.Run(tc.name, func(b *testing.B) {
			b.StopTimer() // the control plane's start on first use is no part of it
			c := tc.cluster.Get(b, install)
			for range b.N {
				run(b, c, tc.replicas)
			}
		})
	}
}

// ledger records, per UID, the newest generation a replica reconciled.
type ledger struct {
	mu  sync.Mutex
	gen map[types.UID]int64
}

func (l *ledger) done(uid types.UID, gen int64) {
	l.mu.Lock()
	l.gen[uid] = max(l.gen[uid], gen)
	l.mu.Unlock()
}

// atLeast counts the UIDs whose reconciled generation is at least gen.
func (l *ledger) atLeast(gen int64) int {
	l.mu.Lock()
	defer l.mu.Unlock()
	n := 0
	for _, g := range l.gen {
		if g >= gen {
			n++
		}
	}
	return n
}

type shardReplica struct {
	s     *reconcile.Controller[*Widget]
	bytes traffic.Bytes
	stop  func()
}

func run(b *testing.B, c *testcluster.Cluster, replicas int) {
	b.StopTimer()
	objects := *objectCount
	ctx := context.Background()
	admin := c.Config()
	admin.QPS, admin.Burst = -1, 0
	kube := kubernetes.NewForConfigOrDie(admin)
	dyn := dynamic.NewForConfigOrDie(admin)
	ns := fmt.Sprintf("shards-%d", nsSeq.Add(1))
	if _, err := kube.CoreV1().Namespaces().Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: ns}}, metav1.CreateOptions{}); err != nil {
		b.Fatal(err)
	}
	defer func() { _ = kube.CoreV1().Namespaces().Delete(context.Background(), ns, metav1.DeleteOptions{}) }()

	// Up-to-date Widgets: status.observedGeneration is their generation,
	// so a term's first pass reconciles each at once, without the work.
	client := typed.New[*Widget](dyn, widgets)
	if err := fixture.Parallel(objects, 8, func(i int) error {
		w := &Widget{TypeMeta: metav1.TypeMeta{APIVersion: "bench.opkit.dev/v1", Kind: "Widget"}, ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: "w" + strconv.Itoa(i)}}
		w.Spec.Size = 1
		u, err := typed.ToUnstructured(w)
		if err != nil {
			return err
		}
		out, err := dyn.Resource(widgets.GroupVersionResource).Namespace(ns).Create(ctx, u, metav1.CreateOptions{})
		if err != nil {
			return err
		}
		w, err = typed.FromUnstructured[*Widget](out)
		if err != nil {
			return err
		}
		w.Status.ObservedGeneration = w.Generation
		_, err = client.UpdateStatus(ctx, w)
		return err
	}); err != nil {
		b.Fatal(err)
	}

	l := &ledger{gen: map[types.UID]int64{}}
	var rs []*shardReplica
	for i := range replicas {
		rs = append(rs, startReplica(b, c, ns, fmt.Sprintf("r%d", i), l))
	}
	defer func() {
		for _, r := range rs {
			r.stop()
		}
	}()
	waitFor(b, "the shards spread and every object seen", func() error {
		for i, r := range rs {
			if held, share := r.s.Balancer().Held(), r.s.Balancer().Share(); held == 0 || held > share || r.s.Balancer().Members() != replicas {
				return fmt.Errorf("replica %d holds %d, share %d, counts %d members", i, held, share, r.s.Balancer().Members())
			}
		}
		if n := l.atLeast(1); n < objects {
			return fmt.Errorf("%d of %d objects seen", n, objects)
		}
		return nil
	})

	for _, r := range rs {
		r.bytes.Reset()
	}
	cpu0 := cpuSeconds(b, c.APIServerPID(0))
	b.StartTimer()
	start := time.Now()
	if err := fixture.Parallel(objects, 8, func(i int) error {
		_, err := dyn.Resource(widgets.GroupVersionResource).Namespace(ns).Patch(ctx, "w"+strconv.Itoa(i), types.MergePatchType, []byte(`{"spec":{"size":2}}`), metav1.PatchOptions{})
		return err
	}); err != nil {
		b.Fatal(err)
	}
	waitFor(b, "every change reconciled", func() error {
		if n := l.atLeast(2); n < objects {
			return fmt.Errorf("%d of %d", n, objects)
		}
		return nil
	})
	took := time.Since(start)
	b.StopTimer()
	cpu := cpuSeconds(b, c.APIServerPID(0)) - cpu0
	var total int64
	for _, r := range rs {
		total += r.bytes.Load()
	}
	b.ReportMetric(took.Seconds(), "s-converge")
	b.ReportMetric(float64(total)/float64(replicas)/1e6, "MB/replica")
	b.ReportMetric(cpu/took.Seconds(), "apiserver-cores")
}

func startReplica(b *testing.B, c *testcluster.Cluster, ns, id string, l *ledger) *shardReplica {
	r := &shardReplica{}
	cfg := c.Config()
	cfg.QPS, cfg.Burst = 1000, 2000 // requests are not this benchmark's bound
	cfg.WrapTransport = r.bytes.Wrap
	dyn := dynamic.NewForConfigOrDie(cfg)
	kube := kubernetes.NewForConfigOrDie(cfg)
	status, err := reconcile.NewStatus[*Widget](reconcile.StatusConfig{Dynamic: dyn, Resource: widgets})
	if err != nil {
		b.Fatal(err)
	}
	s, err := reconcile.NewController(reconcile.Config[*Widget]{
		Name: "bench.opkit.dev/shards", Resource: widgets, Dynamic: dyn,
		Reconciler: reconcile.Func[*Widget](func(ctx context.Context, req reconcile.Request[*Widget]) (reconcile.Result, error) {
			w := req.Object
			if req.Type == opkit.Deleted || w == nil {
				return reconcile.Done(), nil
			}
			if w.Status.ObservedGeneration < w.Generation {
				select {
				case <-time.After(work):
				case <-ctx.Done():
					return reconcile.Done(), ctx.Err()
				}
				if _, err := status.Update(ctx, w, func(*Widget) error { return nil }); err != nil {
					return reconcile.Done(), err
				}
			}
			l.done(w.UID, w.Generation)
			return reconcile.Done(), nil
		}),
		Concurrency: workers, ReservedWorkers: -1, NoEvents: true, Logger: discard,
		Watch: watcher.Config[*Widget]{Namespace: ns, SkipStatusOnly: true},
		Leader: &leader.Config{Client: kube, Namespace: ns, Name: "shards", Identity: id,
			LeaseDuration: 6 * time.Second, RenewDeadline: 4 * time.Second, RetryPeriod: time.Second},
		Shards: opkit.Shards{Count: shards},
	})
	if err != nil {
		b.Fatal(err)
	}
	r.s = s
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- s.Run(ctx) }()
	r.stop = func() {
		cancel()
		if err := <-done; err != nil {
			b.Errorf("replica %s: %v", id, err)
		}
	}
	return r
}

func waitFor(b *testing.B, what string, f func() error) {
	b.Helper()
	deadline := time.Now().Add(timeout)
	for {
		err := f()
		if err == nil {
			return
		}
		if time.Now().After(deadline) {
			b.Fatalf("%s: not within %v: %v", what, timeout, err)
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// cpuSeconds is the user and system CPU time of process pid so far.
func cpuSeconds(b *testing.B, pid int) float64 {
	s, err := stats.CPUSeconds(pid)
	if err != nil {
		b.Fatal(err)
	}
	return s
}
