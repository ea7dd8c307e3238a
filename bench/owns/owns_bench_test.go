package ownsbench

import (
	"context"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"os"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/go-logr/logr"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	kruntime "k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/dynamic"
	"k8s.io/client-go/kubernetes"
	clientgoscheme "k8s.io/client-go/kubernetes/scheme"
	"k8s.io/klog/v2"
	"sigs.k8s.io/controller-runtime/pkg/builder"
	crcache "sigs.k8s.io/controller-runtime/pkg/cache"
	crconfig "sigs.k8s.io/controller-runtime/pkg/config"
	crcontroller "sigs.k8s.io/controller-runtime/pkg/controller"
	crlog "sigs.k8s.io/controller-runtime/pkg/log"
	"sigs.k8s.io/controller-runtime/pkg/manager"
	metricsserver "sigs.k8s.io/controller-runtime/pkg/metrics/server"
	crreconcile "sigs.k8s.io/controller-runtime/pkg/reconcile"

	"github.com/opkit/opkit"
	"github.com/opkit/opkit/bench/internal/fixture"
	"github.com/opkit/opkit/bench/internal/stats"
	"github.com/opkit/opkit/internal/testcluster"
	"github.com/opkit/opkit/queue"
	"github.com/opkit/opkit/reconcile"
	"github.com/opkit/opkit/watcher"
)

const (
	// namespace holds the owners and their children; baselineNS the same
	// number of owners and no child, for the baseline of the memory
	// measurement.
	namespace, baselineNS = "owned", "owners-only"
	// owners is the number of Gadgets in each namespace; the children are
	// spread over them round-robin.
	owners = 250
	// workers is every contender's worker count (opkit: Concurrency, no
	// reserved worker; controller-runtime: MaxConcurrentReconciles).
	workers = 4
	// qps and burst are every contender's client rate: high enough that
	// client-side throttling is not what is measured.
	qps, burst = 1000, 2000
	// changes children are patched and deletions deleted per contender
	// and run, one every pace; each of another owner (changes of the
	// first owners, deletions of the next ones).
	changes, deletions = 100, 50
	pace               = 50 * time.Millisecond
	// quiet is how long no reconcile must start for a contender to count
	// as settled; settleWithin bounds every wait.
	quiet        = time.Second
	settleWithin = 2 * time.Minute
)

var children = flag.Int("owns.children", 5000, "owned ConfigMaps, spread over the owners")

// The owners are Gadgets (fixture.Gadgets), their children ConfigMaps.
var configMaps = opkit.Resource{GroupVersionResource: corev1.SchemeGroupVersion.WithResource("configmaps"), Kind: "ConfigMap", Namespaced: true}

var discard = slog.New(slog.NewTextHandler(io.Discard, nil))

// env is the process-wide fixture: the control plane, its objects and
// the benchmark's own unthrottled client.
var env struct {
	fixture.Cluster
	kube   *kubernetes.Clientset
	scheme *kruntime.Scheme
	// owners' UIDs in namespace, by name, for the children's references.
	uids map[string]types.UID
}

func TestMain(m *testing.M) {
	// controller-runtime and client-go log through logr and klog; a
	// line in the middle of a result line would keep benchstat from
	// reading it.
	crlog.SetLogger(logr.Discard())
	klog.SetLogger(logr.Discard())
	code := m.Run()
	env.Stop()
	os.Exit(code)
}

func ownerName(i int) string { return fmt.Sprintf("owner-%03d", i) }
func childName(i int) string { return fmt.Sprintf("child-%05d", i) }

// child is the i-th child: three small data keys, three labels and a
// controller reference to its owner, ownerName(i % owners).
func child(name string, i int) *corev1.ConfigMap {
	owner := ownerName(i % owners)
	yes := true
	return &corev1.ConfigMap{
		ObjectMeta: metav1.ObjectMeta{
			Name: name, Namespace: namespace,
			Labels: map[string]string{"app.kubernetes.io/name": "gadget", "app.kubernetes.io/instance": owner, "app.kubernetes.io/managed-by": "owns-bench"},
			OwnerReferences: []metav1.OwnerReference{{APIVersion: fixture.GadgetGV.String(), Kind: fixture.Gadgets.Kind, Name: owner, UID: env.uids[owner],
				Controller: &yes, BlockOwnerDeletion: &yes}},
		},
		Data: map[string]string{
			"endpoint": fmt.Sprintf("http://%s.%s.svc:8080", owner, namespace),
			"replicas": fmt.Sprint(1 + i%5),
			"mode":     "active",
		},
	}
}

// populate installs the CRD and creates, in namespace, the owners and
// their children and, in baselineNS, the same owners alone.
func populate(ctx context.Context, b *testing.B, c *testcluster.Cluster) error {
	if *children < owners {
		return fmt.Errorf("-owns.children=%d: at least one per owner (%d) is needed", *children, owners)
	}
	cfg := c.Config()
	cfg.QPS, cfg.Burst = -1, 0 // the benchmark's own changes are never throttled
	var err error
	if env.kube, err = kubernetes.NewForConfig(cfg); err != nil {
		return err
	}
	dyn, err := dynamic.NewForConfig(cfg)
	if err != nil {
		return err
	}
	env.scheme = kruntime.NewScheme()
	if err := clientgoscheme.AddToScheme(env.scheme); err != nil {
		return err
	}
	fixture.AddGadgets(env.scheme)
	if err := c.InstallCRD(ctx, fixture.GadgetCRD); err != nil {
		return err
	}
	env.uids = map[string]types.UID{}
	for _, ns := range []string{namespace, baselineNS} {
		if _, err := env.kube.CoreV1().Namespaces().Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: ns}}, metav1.CreateOptions{}); err != nil {
			return err
		}
		res := dyn.Resource(fixture.Gadgets.GroupVersionResource).Namespace(ns)
		for i := range owners {
			w, err := kruntime.DefaultUnstructuredConverter.ToUnstructured(&fixture.Gadget{
				TypeMeta:   metav1.TypeMeta{APIVersion: fixture.GadgetGV.String(), Kind: fixture.Gadgets.Kind},
				ObjectMeta: metav1.ObjectMeta{Name: ownerName(i)},
				Spec:       fixture.GadgetSpec{Size: i},
			})
			if err != nil {
				return err
			}
			u, err := res.Create(ctx, &unstructured.Unstructured{Object: w}, metav1.CreateOptions{})
			if err != nil {
				return err
			}
			if ns == namespace {
				env.uids[u.GetName()] = u.GetUID()
			}
		}
	}
	start := time.Now()
	if err := fixture.Parallel(*children, 8, func(i int) error {
		_, err := env.kube.CoreV1().ConfigMaps(namespace).Create(ctx, child(childName(i), i), metav1.CreateOptions{})
		return err
	}); err != nil {
		return err
	}
	one, err := dyn.Resource(configMaps.GroupVersionResource).Namespace(namespace).Get(ctx, childName(0), metav1.GetOptions{})
	if err != nil {
		return err
	}
	raw, _ := one.MarshalJSON()
	b.Logf("created %d owners in each of 2 namespaces and %d children of %d bytes (JSON, with managedFields) in %v",
		owners, *children, len(raw), time.Since(start).Round(time.Millisecond))
	return nil
}

// tracker is what one contender's reconciler reports to: every reconcile
// start, by owner, and for the owners the benchmark armed, the time from
// the arming (just before the child's change is sent) to the owner's
// next reconcile start.
type tracker struct {
	reconciles atomic.Int64
	mu         sync.Mutex
	seen       map[string]bool      // owners reconciled at least once
	armed      map[string]time.Time // owners waiting for a reconcile
	latencies  []time.Duration
	stray      int // reconciles of owners not armed, while some were
	// While measuring is set, opkit's owner GETs (the re-read before a
	// reconcile: its related watch carries no object) and its queue waits,
	// to tell where its latency goes.
	measuring   atomic.Bool
	gets, waits []time.Duration
}

func (t *tracker) note(to *[]time.Duration, d time.Duration) {
	if !t.measuring.Load() {
		return
	}
	t.mu.Lock()
	*to = append(*to, d)
	t.mu.Unlock()
}

// queueMetrics is opkit's queue.Metrics that notes the queue waits.
type queueMetrics struct{ tr *tracker }

func (queueMetrics) Added(int, bool)                 {}
func (queueMetrics) Dropped(queue.Outcome)           {}
func (queueMetrics) Depth(int, int)                  {}
func (m queueMetrics) Waited(_ int, d time.Duration) { m.tr.note(&m.tr.waits, d) }
func (queueMetrics) Worked(time.Duration)            {}

// roundTripper is a transport that notes its GETs of a Gadget (an owner).
type roundTripper struct {
	next http.RoundTripper
	tr   *tracker
}

func (r roundTripper) RoundTrip(req *http.Request) (*http.Response, error) {
	start := time.Now()
	resp, err := r.next.RoundTrip(req)
	if req.Method == http.MethodGet && strings.Contains(req.URL.Path, "/"+fixture.Gadgets.Resource+"/") {
		r.tr.note(&r.tr.gets, time.Since(start))
	}
	return resp, err
}

func newTracker() *tracker {
	return &tracker{seen: map[string]bool{}, armed: map[string]time.Time{}}
}

// reconciled is the reconciler's first line.
func (t *tracker) reconciled(owner string) {
	now := time.Now()
	t.reconciles.Add(1)
	t.mu.Lock()
	defer t.mu.Unlock()
	t.seen[owner] = true
	if t0, ok := t.armed[owner]; ok {
		t.latencies = append(t.latencies, now.Sub(t0))
		delete(t.armed, owner)
	} else if len(t.armed) > 0 {
		t.stray++
	}
}

// arm starts owner's clock; the change follows at once.
func (t *tracker) arm(owner string) {
	t.mu.Lock()
	t.armed[owner] = time.Now()
	t.mu.Unlock()
}

// take returns the latencies measured since the last take, sorted, and
// how many owners are still armed.
func (t *tracker) take() (sorted []time.Duration, waiting int) {
	t.mu.Lock()
	defer t.mu.Unlock()
	sorted = slices.Sorted(slices.Values(t.latencies))
	t.latencies = nil
	return sorted, len(t.armed)
}

func (t *tracker) owners() int {
	t.mu.Lock()
	defer t.mu.Unlock()
	return len(t.seen)
}

// contender is one SDK's controller over the Gadgets of a namespace that
// owns their ConfigMaps.
type contender struct {
	name  string // the metrics' prefix
	start func(b *testing.B, c *testcluster.Cluster, ns string, tr *tracker) running
}

// running is a started contender: idle reports that nothing is queued
// and every watch is healthy, as far as the SDK tells; stop stops it and
// waits until it has (once: later calls return at once).
type running struct {
	idle func() bool
	stop func()
}

// startOpkit runs a reconcile.Controller over the Gadgets of ns with
// Config.Owns the ConfigMaps: a watcher.Related with OwnedBy(fixture.Gadgets).
func startOpkit(b *testing.B, c *testcluster.Cluster, ns string, tr *tracker) running {
	b.Helper()
	cfg := c.Config()
	cfg.QPS, cfg.Burst = qps, burst
	cfg.WrapTransport = func(rt http.RoundTripper) http.RoundTripper { return roundTripper{next: rt, tr: tr} }
	dyn, err := dynamic.NewForConfig(cfg)
	if err != nil {
		b.Fatal(err)
	}
	ctrl, err := reconcile.NewController(reconcile.Config[*fixture.Gadget]{
		Name: "bench.opkit.dev/owns", Resource: fixture.Gadgets, Dynamic: dyn,
		Reconciler: reconcile.Func[*fixture.Gadget](func(_ context.Context, req reconcile.Request[*fixture.Gadget]) (reconcile.Result, error) {
			tr.reconciled(req.Key.Name)
			return reconcile.Done(), nil
		}),
		Concurrency: workers, ReservedWorkers: -1,
		Owns:         []opkit.Resource{configMaps},
		Watch:        watcher.Config[*fixture.Gadget]{Namespace: ns},
		NoEvents:     true,
		Logger:       discard,
		QueueMetrics: queueMetrics{tr},
	})
	if err != nil {
		b.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- ctrl.Run(ctx) }()
	return running{
		idle: func() bool { return ctrl.Queues()[0].Len() == 0 && ctrl.Check() == nil },
		stop: sync.OnceFunc(func() {
			cancel()
			if err := <-done; err != nil {
				b.Errorf("opkit: %v", err)
			}
		}),
	}
}

var crSeq atomic.Int64

// revision numbers the benchmark's patches.
var revision atomic.Int64

// startControllerRuntime returns the start of a controller-runtime
// manager, its cache limited to the namespace, running one controller
// built with For(&fixture.Gadget{}).Owns(&corev1.ConfigMap{}): a typed
// informer of each. lean makes it the leanest Owns controller-runtime offers:
// Owns(..., builder.OnlyMetadata), a metadata-only informer, and a cache
// that strips managedFields (cache.TransformStripManagedFields).
func startControllerRuntime(lean bool) func(*testing.B, *testcluster.Cluster, string, *tracker) running {
	return func(b *testing.B, c *testcluster.Cluster, ns string, tr *tracker) running {
		b.Helper()
		cfg := c.Config()
		cfg.QPS, cfg.Burst = qps, burst
		copts := crcache.Options{DefaultNamespaces: map[string]crcache.Config{ns: {}}}
		var owns []builder.OwnsOption
		if lean {
			copts.DefaultTransform = crcache.TransformStripManagedFields()
			owns = append(owns, builder.OnlyMetadata)
		}
		mgr, err := manager.New(cfg, manager.Options{
			Scheme:     env.scheme,
			Cache:      copts,
			Metrics:    metricsserver.Options{BindAddress: "0"},
			Controller: crconfig.Controller{SkipNameValidation: new(true)},
			Logger:     logr.Discard(),
		})
		if err != nil {
			b.Fatal(err)
		}
		if err := builder.ControllerManagedBy(mgr).
			Named(fmt.Sprintf("owns-bench-%d", crSeq.Add(1))).
			For(&fixture.Gadget{}).
			Owns(&corev1.ConfigMap{}, owns...).
			WithOptions(crcontroller.Options{MaxConcurrentReconciles: workers}).
			Complete(crreconcile.Func(func(_ context.Context, req crreconcile.Request) (crreconcile.Result, error) {
				tr.reconciled(req.Name)
				return crreconcile.Result{}, nil
			})); err != nil {
			b.Fatal(err)
		}
		ctx, cancel := context.WithCancel(context.Background())
		done := make(chan error, 1)
		go func() { done <- mgr.Start(ctx) }()
		return running{
			// controller-runtime does not show its queue; its workers
			// start once its caches have synced, and settle waits for
			// every owner's reconcile and then for quiet.
			idle: func() bool { return mgr.GetCache().WaitForCacheSync(ctx) },
			stop: sync.OnceFunc(func() {
				cancel()
				if err := <-done; err != nil {
					b.Errorf("controller-runtime: %v", err)
				}
			}),
		}
	}
}

// settle waits until every owner of the namespace has been reconciled,
// r is idle and no reconcile started for quiet; after settleWithin it
// stops r and fails b.
func settle(b *testing.B, name string, tr *tracker, r running) {
	b.Helper()
	deadline := time.Now().Add(settleWithin)
	last, since := tr.reconciles.Load(), time.Now()
	for {
		time.Sleep(50 * time.Millisecond)
		n := tr.reconciles.Load()
		if n != last {
			last, since = n, time.Now()
		}
		if tr.owners() >= owners && r.idle() && time.Since(since) >= quiet {
			return
		}
		if time.Now().After(deadline) {
			r.stop()
			b.Fatalf("%s: not settled within %v: %d of %d owners reconciled, %d reconciles, idle %v",
				name, settleWithin, tr.owners(), owners, n, r.idle())
		}
	}
}

// await waits until no armed owner is left; after settleWithin it stops r
// and fails b.
func await(b *testing.B, name, what string, tr *tracker, r running) []time.Duration {
	b.Helper()
	deadline := time.Now().Add(settleWithin)
	var got []time.Duration
	for {
		lat, waiting := tr.take()
		got = append(got, lat...)
		if waiting == 0 {
			slices.Sort(got)
			return got
		}
		if time.Now().After(deadline) {
			r.stop()
			b.Fatalf("%s: %s: %d owners never reconciled within %v", name, what, waiting, settleWithin)
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// paced calls do(i) for i in [0, n), one every pace from now.
func paced(n int, do func(i int)) {
	begin := time.Now()
	for i := range n {
		time.Sleep(time.Until(begin.Add(time.Duration(i) * pace)))
		do(i)
	}
}

// tally is what one contender measured, over the runs.
type tally struct {
	perChild         []float64 // heap bytes per child, one per run
	change, deletion []time.Duration
	gets, waits      []time.Duration // opkit's only
	warm             bool
}

// run measures one contender: its heap with the owners alone (the
// baseline) and with the owners and their children, then, on the latter,
// the latency of paced child changes and deletions. The first time for
// t (once per call of the benchmark) it starts and stops the contender
// once unmeasured, so that one-time allocations (clients' transports,
// registries) fall in neither measurement.
func (t *tally) run(b *testing.B, c *testcluster.Cluster, ct contender, round int) {
	ctx := context.Background()
	measure := func(ns string, tr *tracker) (grew float64, r running) {
		before := stats.LiveHeap()
		r = ct.start(b, c, ns, tr)
		settle(b, ct.name, tr, r)
		return float64(stats.LiveHeap()) - float64(before), r
	}
	if !t.warm {
		_, r := measure(baselineNS, newTracker())
		r.stop()
		t.warm = true
	}
	base, r := measure(baselineNS, newTracker())
	r.stop()
	tr := newTracker()
	full, r := measure(namespace, tr)
	defer r.stop()
	perChild := (full - base) / float64(*children)
	t.perChild = append(t.perChild, perChild)

	// Changes: a patch of one data key of a child of each of the first
	// owners (another child of them in each round).
	cms := env.kube.CoreV1().ConfigMaps(namespace)
	tr.measuring.Store(true)
	paced(changes, func(i int) {
		owner, name := ownerName(i), childName(i+owners*(round%(*children/owners)))
		tr.arm(owner)
		// A value never written before: a patch that changes nothing
		// makes no event.
		patch := fmt.Appendf(nil, `{"data":{"replicas":"%d"}}`, 10+revision.Add(1))
		if _, err := cms.Patch(ctx, name, types.MergePatchType, patch, metav1.PatchOptions{}); err != nil {
			r.stop()
			b.Fatalf("%s: patch %s: %v", ct.name, name, err)
		}
	})
	change := await(b, ct.name, "changes", tr, r)
	tr.measuring.Store(false)

	// Deletions: children of the next owners, created for the purpose
	// (their creation reconciles the owners too), then deleted paced.
	doomed := func(i int) string { return fmt.Sprintf("doomed-%03d", i) }
	for i := range deletions {
		owner := changes + i
		tr.arm(ownerName(owner))
		if _, err := cms.Create(ctx, child(doomed(i), owner), metav1.CreateOptions{}); err != nil {
			r.stop()
			b.Fatalf("%s: create %s: %v", ct.name, doomed(i), err)
		}
	}
	created := await(b, ct.name, "creations", tr, r)
	settle(b, ct.name, tr, r)
	paced(deletions, func(i int) {
		tr.arm(ownerName(changes + i))
		if err := cms.Delete(ctx, doomed(i), metav1.DeleteOptions{}); err != nil {
			r.stop()
			b.Fatalf("%s: delete %s: %v", ct.name, doomed(i), err)
		}
	})
	deletion := await(b, ct.name, "deletions", tr, r)
	t.change = append(t.change, change...)
	t.deletion = append(t.deletion, deletion...)
	tr.mu.Lock()
	stray := tr.stray
	gets, waits := slices.Sorted(slices.Values(tr.gets)), slices.Sorted(slices.Values(tr.waits))
	tr.mu.Unlock()
	t.gets, t.waits = append(t.gets, gets...), append(t.waits, waits...)
	b.Logf("%s: heap %.0f B with the owners alone, %.0f B with %d children: %.0f B/child; change p50 %v p99 %v; creation p50 %v; deletion p50 %v p99 %v; %d stray reconciles",
		ct.name, base, full, *children, perChild,
		stats.Percentile(change, 0.5), stats.Percentile(change, 0.99), stats.Percentile(created, 0.5),
		stats.Percentile(deletion, 0.5), stats.Percentile(deletion, 0.99), stray)
	if len(gets) > 0 {
		b.Logf("%s: during the changes, %d owner GETs p50 %v p99 %v, %d queue waits p50 %v p99 %v",
			ct.name, len(gets), stats.Percentile(gets, 0.5), stats.Percentile(gets, 0.99),
			len(waits), stats.Percentile(waits, 0.5), stats.Percentile(waits, 0.99))
	}
}

// rounds counts the iterations in the process, over -count too (each
// -benchtime=1x run is one call of the benchmark with one iteration).
var rounds int

// BenchmarkOwnedChildren reports, for opkit's Config.Owns and for
// controller-runtime's Owns (default, and lean: metadata-only, without
// managedFields), the heap per watched child (<name>-B/child) and the
// time from a child's change (<name>-p50-ms, <name>-p99-ms) and deletion
// (<name>-del-p50-ms) to the start of its owner's reconcile, and opkit's
// heap per child as a share of each controller-runtime one's. One
// iteration measures every contender once, one at a time, in an order
// that alternates between iterations.
func BenchmarkOwnedChildren(b *testing.B) {
	c := env.Get(b, func(ctx context.Context, c *testcluster.Cluster) error { return populate(ctx, b, c) })
	contenders := []contender{
		{"opkit", startOpkit},
		{"cr", startControllerRuntime(false)},
		{"cr-lean", startControllerRuntime(true)},
	}
	tallies := make([]tally, len(contenders))
	for b.Loop() {
		order := slices.Clone(contenders)
		if rounds%2 == 1 {
			slices.Reverse(order)
		}
		for _, ct := range order {
			i := slices.IndexFunc(contenders, func(o contender) bool { return o.name == ct.name })
			tallies[i].run(b, c, ct, rounds)
		}
		rounds++
	}
	b.ReportMetric(0, "ns/op") // the runs' length, not a result
	mean := func(xs []float64) float64 {
		var s float64
		for _, x := range xs {
			s += x
		}
		return s / float64(len(xs))
	}
	for i, ct := range contenders {
		t := tallies[i]
		b.ReportMetric(mean(t.perChild), ct.name+"-B/child")
		b.ReportMetric(ms(stats.Percentile(t.change, 0.50)), ct.name+"-p50-ms")
		b.ReportMetric(ms(stats.Percentile(t.change, 0.99)), ct.name+"-p99-ms")
		b.ReportMetric(ms(stats.Percentile(t.deletion, 0.50)), ct.name+"-del-p50-ms")
		if len(t.gets) > 0 {
			b.ReportMetric(ms(stats.Percentile(t.gets, 0.50)), ct.name+"-get-p50-ms")
			b.ReportMetric(ms(stats.Percentile(t.waits, 0.50)), ct.name+"-wait-p50-ms")
		}
		if i > 0 {
			b.ReportMetric(mean(tallies[0].perChild)/mean(t.perChild), "opkit/"+ct.name+"-B")
		}
	}
}

func ms(d time.Duration) float64 { return float64(d) / float64(time.Millisecond) }
