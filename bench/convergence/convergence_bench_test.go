package convergencebench

import (
	"context"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"math/rand/v2"
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
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/dynamic"
	"k8s.io/client-go/kubernetes"
	"k8s.io/klog/v2"
	crlog "sigs.k8s.io/controller-runtime/pkg/log"

	"github.com/opkit/opkit/bench/internal/fixture"
	"github.com/opkit/opkit/bench/internal/stats"
	"github.com/opkit/opkit/bench/internal/traffic"
	"github.com/opkit/opkit/internal/testcluster"
)

const (
	// objects is the figure: the Widgets each SDK reconciles.
	objects = 1000
	// changed is how many of them change while no one leads, in the
	// second failover.
	changed = 50
	// workers is both SDKs' worker count (opkit's default Concurrency).
	workers = 4
	// The leader election durations of both SDKs, shorter than the
	// defaults (15s/10s/2s) to keep the run short; valid for both.
	leaseDuration = 6 * time.Second
	renewDeadline = 4 * time.Second
	retryPeriod   = time.Second
	leaseName     = "convergence"
	// settle is how long a new follower runs before the leader is killed:
	// it is campaigning (opkit: its Lease watch is open; controller-
	// runtime: it has polled).
	settle = 2 * time.Second
	// drivers is the goroutines that create and patch the Widgets, as
	// fast as the API server takes them.
	drivers = 8
	// phaseTimeout bounds every wait for convergence.
	phaseTimeout = 5 * time.Minute
)

// limits is a client request limit both SDKs' clients are built with
// (rest.Config QPS and Burst; QPS -1 is none). Every client built from a
// rest.Config has a token bucket of its own (controller-runtime builds one
// for each resource type it reads or writes, and one for each informer),
// unless shared: then every client of a replica draws from one bucket
// (rest.Config.RateLimiter). With defaults the benchmark sets no limit:
// each SDK loads the control plane's kubeconfig the way its docs tell a
// user to (sdk.defaults).
type limits struct {
	name     string
	qps      float32
	burst    int
	shared   bool
	defaults bool
}

var (
	settings = []limits{
		{name: "limits=50-100", qps: 50, burst: 100},
		{name: "limits=1000-2000", qps: 1000, burst: 2000},
		// Each SDK as a user gets it, next to the same run with no
		// client-side limit at all (the API server's bound).
		{name: "limits=defaults", defaults: true},
		{name: "limits=off", qps: -1},
	}
	// sharedSetting runs with -convergence.shared: it takes about as long
	// as limits=50-100, so it is not in the default run.
	sharedSetting = limits{name: "limits=50-100-shared", qps: 50, burst: 100, shared: true}
	shared        = flag.Bool("convergence.shared", false, "also run "+sharedSetting.name+": each replica's clients share one token bucket of 50 requests a second, burst 100")
)

var discard = slog.New(slog.NewTextHandler(io.Discard, nil))

// env is the process-wide fixture: the control plane and the benchmark's
// own clients (unthrottled), whose requests are counted so that they can
// be told from the SDKs' in the API server's figures.
var env struct {
	fixture.Cluster
	requests traffic.Counter
	dyn      dynamic.Interface
	kube     *kubernetes.Clientset
}

func TestMain(m *testing.M) {
	// client-go and controller-runtime log the requests a killed replica
	// fails; a line in the middle of a result line would keep benchstat
	// from reading it.
	klog.SetLogger(logr.Discard())
	crlog.SetLogger(logr.Discard())
	code := m.Run()
	env.Stop()
	os.Exit(code)
}

func populate(ctx context.Context, c *testcluster.Cluster) error {
	cfg := c.Config()
	cfg.QPS, cfg.Burst = -1, 0
	cfg.UserAgent = "convergence-bench/driver"
	cfg.WrapTransport = env.requests.Wrap
	var err error
	if env.dyn, err = dynamic.NewForConfig(cfg); err != nil {
		return err
	}
	if env.kube, err = kubernetes.NewForConfig(cfg); err != nil {
		return err
	}
	return c.InstallCRD(ctx, testcluster.CRD{Resource: widgets.GroupVersionResource, Kind: widgets.Kind, Namespaced: true})
}

// iterations counts each setting's runs in this process: the SDKs take
// turns at going first, and the second failover picks its objects with
// the run's number as the seed.
var (
	iterations = map[string]int{}
	nsSeq      atomic.Int64
)

// BenchmarkConvergence runs, for each client request limit, opkit's
// controller and controller-runtime's one after the other (which goes
// first alternates from run to run), each on a namespace of its own with
// its own Widgets, and reports for each (prefix opkit- or cr-) the figures
// the package doc lists. One iteration is the whole run of both; run it with
// -benchtime 1x and -count for several.
func BenchmarkConvergence(b *testing.B) {
	c := env.Get(b, populate)
	settings := settings
	if *shared {
		settings = append(slices.Clone(settings), sharedSetting)
	}
	for _, l := range settings {
		b.Run(l.name, func(b *testing.B) {
			samples := map[string][]float64{}
			for b.Loop() {
				n := iterations[l.name]
				iterations[l.name]++
				order := slices.Clone(sdks)
				if n%2 == 1 {
					slices.Reverse(order)
				}
				for _, s := range order {
					for k, v := range runSDK(b, c, l, s, uint64(n)) {
						samples[s.name+"-"+k] = append(samples[s.name+"-"+k], v)
					}
				}
			}
			b.ReportMetric(0, "ns/op") // the phases' length, not a result
			for name, xs := range samples {
				b.ReportMetric(median(xs), name)
			}
		})
	}
}

// runSDK is one SDK's whole run on a fresh namespace: the creation of the
// objects, the throughput pass, and the two failovers.
func runSDK(b *testing.B, c *testcluster.Cluster, l limits, s sdk, seed uint64) map[string]float64 {
	ctx := context.Background()
	ns := fmt.Sprintf("conv-%s-%d", s.name, nsSeq.Add(1))
	load := loadAverage()
	if _, err := env.kube.CoreV1().Namespaces().Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: ns}}, metav1.CreateOptions{}); err != nil {
		b.Fatal(err)
	}
	tr, err := startTracker(env.dyn, ns)
	if err != nil {
		b.Fatal(err)
	}
	var live []*replica
	defer func() {
		for _, r := range live {
			r.cancel()
			r.join(b, true)
		}
		tr.close()
		cleanup(b, ns)
	}()
	start := func(id string) *replica {
		r := newReplica(b, s, c, l, ns, id)
		live = append(live, r)
		return r
	}
	names := make([]string, objects)
	for i := range names {
		names[i] = fmt.Sprintf("widget-%04d", i)
	}
	m := map[string]float64{}
	var summary strings.Builder
	fmt.Fprintf(&summary, "%s %s on %s (load average before: %s)", s.name, l.name, ns, load)

	// The leader for the creation and the throughput pass.
	a := start("a")
	a.waitAcquired(b, 30*time.Second)
	time.Sleep(settle) // its watch is open: its list is not in the creation's window

	// Creation: every object is new, every reconcile creates a child.
	w := openWindow(b, a)
	t0 := time.Now()
	targets := drive(b, names, func(ctx context.Context, i int, name string) (*unstructured.Unstructured, error) {
		return env.dyn.Resource(widgets.GroupVersionResource).Namespace(ns).Create(ctx, &unstructured.Unstructured{Object: map[string]any{
			"apiVersion": widgets.GroupVersion().String(), "kind": widgets.Kind,
			"metadata": map[string]any{"name": name, "namespace": ns},
			"spec":     map[string]any{"size": int64(i)},
		}}, metav1.CreateOptions{})
	})
	last := caughtUp(b, tr, targets, "creation")
	m["create-s"] = last.Sub(t0).Seconds()
	fmt.Fprintf(&summary, "\n  creation: %.2fs", m["create-s"])
	quiesce(b, a)
	m["req/obj-create"], m["srv-req/obj-create"] = w.close(b, a, objects, &summary)
	verify(b, ns)

	// Throughput: every object's spec changes at once.
	w = openWindow(b, a)
	cpu := startCPU(b, c)
	t0 = time.Now()
	targets = bump(b, ns, names, 1_000_000)
	last = caughtUp(b, tr, targets, "throughput pass")
	pass := last.Sub(t0)
	server, process, cores := cpu.used(b)
	m["apiserver-cores"], m["apiserver-ms/obj"], m["process-ms/obj"] = cores, server*1000/objects, process*1000/objects
	m["pass-s"], m["obj/s"] = pass.Seconds(), objects/pass.Seconds()
	fmt.Fprintf(&summary, "\n  throughput pass: %.2fs, %.0f objects/s, API server %.2f cores, CPU per object: API server %.2f ms, this process %.2f ms",
		m["pass-s"], m["obj/s"], cores, m["apiserver-ms/obj"], m["process-ms/obj"])
	quiesce(b, a)
	m["req/obj-update"], m["srv-req/obj-update"] = w.close(b, a, objects, &summary)
	verify(b, ns)

	// First failover: the leader dies, every object changes before the
	// follower takes over.
	f := start("f")
	time.Sleep(settle)
	_, b1, takeover := failover(b, tr, a, f, ns, names, 2_000_000)
	m["b1-s"], m["takeover-s"] = b1.Seconds(), takeover.Seconds()
	fmt.Fprintf(&summary, "\n  failover, all %d changed: takeover %.2fs, all caught up %.2fs after it; new leader's requests %v",
		objects, takeover.Seconds(), b1.Seconds(), f.requests.Counts().Filter(reconcileTraffic))
	verify(b, ns)

	// Second failover: 50 objects, chosen at random, change.
	g := start("g")
	time.Sleep(settle)
	rng := rand.New(rand.NewPCG(seed, 20))
	picked := make([]string, changed)
	for i, j := range rng.Perm(objects)[:changed] {
		picked[i] = names[j]
	}
	acquired, b2, takeover := failover(b, tr, f, g, ns, picked, 3_000_000)
	full := waitFull(b, g)
	m["b2-s"], m["b2-pass-s"], m["b2/b1"] = b2.Seconds(), full.Sub(acquired).Seconds(), b2.Seconds()/b1.Seconds()
	fmt.Fprintf(&summary, "\n  failover, %d changed: takeover %.2fs, the %d caught up %.2fs after it, every object reconciled %.2fs after it; new leader's requests %v",
		changed, takeover.Seconds(), changed, b2.Seconds(), m["b2-pass-s"], g.requests.Counts().Filter(reconcileTraffic))
	verify(b, ns)
	b.Log(summary.String())
	return m
}

// failover kills the leader (its requests fail from then on, so it writes
// nothing more and releases nothing), then changes the spec of the named
// objects (see bump), and returns when the follower acquired the Lease, the time from
// then to the moment every named object had caught up, and the takeover
// (from the kill to the acquisition). The leader is killed before the
// changes so that it reconciles none of them, however fast it is.
func failover(b *testing.B, tr *tracker, old, next *replica, ns string, names []string, base int64) (acquired time.Time, caught, takeover time.Duration) {
	kill := time.Now()
	old.crash()
	targets := bump(b, ns, names, base)
	acquired = next.waitAcquired(b, 30*time.Second)
	last := caughtUp(b, tr, targets, "failover of "+old.id+" to "+next.id)
	old.join(b, true)
	return acquired, last.Sub(acquired), acquired.Sub(kill)
}

// drive runs op on every name from drivers goroutines and returns the
// generation each object has after it; it fails b on the first error.
func drive(b *testing.B, names []string, op func(ctx context.Context, i int, name string) (*unstructured.Unstructured, error)) map[string]int64 {
	ctx := context.Background()
	var (
		wg    sync.WaitGroup
		mu    sync.Mutex
		next  atomic.Int64
		first error
	)
	gens := make(map[string]int64, len(names))
	for range drivers {
		wg.Go(func() {
			for i := int(next.Add(1)) - 1; i < len(names); i = int(next.Add(1)) - 1 {
				u, err := op(ctx, i, names[i])
				mu.Lock()
				if err != nil && first == nil {
					first = fmt.Errorf("%s: %w", names[i], err)
				}
				if err == nil {
					gens[names[i]] = u.GetGeneration()
				}
				mu.Unlock()
				if err != nil {
					return
				}
			}
		})
	}
	wg.Wait()
	if first != nil {
		b.Fatal(first)
	}
	return gens
}

// bump sets spec.size of the named objects to a new value (base plus the
// object's index), a merge patch each.
func bump(b *testing.B, ns string, names []string, base int64) map[string]int64 {
	res := env.dyn.Resource(widgets.GroupVersionResource).Namespace(ns)
	return drive(b, names, func(ctx context.Context, i int, name string) (*unstructured.Unstructured, error) {
		patch := fmt.Appendf(nil, `{"spec":{"size":%d}}`, base+int64(i))
		return res.Patch(ctx, name, types.MergePatchType, patch, metav1.PatchOptions{})
	})
}

// caughtUp waits until every object of targets has caught up and returns
// when the last one did; it fails b after phaseTimeout.
func caughtUp(b *testing.B, tr *tracker, targets map[string]int64, what string) time.Time {
	last, err := tr.caughtUp(targets, phaseTimeout)
	if err != nil {
		b.Fatalf("%s: %v", what, err)
	}
	return last
}

// quiesce waits until r has made no reconcile for half a second, so that
// the requests of a phase's last reconciles fall into its window.
func quiesce(b *testing.B, r *replica) {
	deadline := time.Now().Add(time.Minute)
	last, _, _ := r.rec.state()
	since := time.Now()
	for time.Since(since) < 500*time.Millisecond {
		if time.Now().After(deadline) {
			b.Fatalf("replica %s still reconciling after a minute", r.id)
		}
		time.Sleep(50 * time.Millisecond)
		if n, _, _ := r.rec.state(); n != last {
			last, since = n, time.Now()
		}
	}
}

// waitFull returns when r had reconciled every object once.
func waitFull(b *testing.B, r *replica) time.Time {
	deadline := time.Now().Add(phaseTimeout)
	for {
		_, distinct, full := r.rec.state()
		if !full.IsZero() {
			return full
		}
		if time.Now().After(deadline) {
			b.Fatalf("replica %s reconciled %d of %d objects in %v", r.id, distinct, objects, phaseTimeout)
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// reconcileTraffic keeps the requests the reconciles and the watches that
// feed them make: on Widgets (and their status) and ConfigMaps. (The API
// server counts a watch when it ends, a client when it starts; no watch
// starts or ends within the creation and update windows.) Lease traffic
// is leader election's, not the reconciles'.
func reconcileTraffic(k traffic.Kind) bool {
	return k.Group == widgets.Group && strings.HasPrefix(k.Resource, widgets.Resource) ||
		k.Group == "" && k.Resource == configMaps.Resource
}

// window is the request counts at the start of a phase: the replica's
// (its clients' counter), the benchmark's own, and the API server's.
type window struct {
	replica, driver, server traffic.Counts
	reconciles              int64
}

func openWindow(b *testing.B, r *replica) window {
	server, err := traffic.ServerCounts(context.Background(), env.kube.RESTClient())
	if err != nil {
		b.Fatal(err)
	}
	total, _, _ := r.rec.state()
	return window{replica: r.requests.Counts(), driver: env.requests.Counts(), server: server, reconciles: total}
}

// close returns the requests per object of the phase: as r's clients
// counted them, and as the API server counted them less the benchmark's
// own.
func (w window) close(b *testing.B, r *replica, n int, summary *strings.Builder) (client, server float64) {
	now, err := traffic.ServerCounts(context.Background(), env.kube.RESTClient())
	if err != nil {
		b.Fatal(err)
	}
	rep := r.requests.Counts().Sub(w.replica).Filter(reconcileTraffic)
	srv := now.Sub(w.server).Sub(env.requests.Counts().Sub(w.driver)).Filter(reconcileTraffic)
	total, _, _ := r.rec.state()
	fmt.Fprintf(summary, "; %d reconciles, requests: client %v, API server %v", total-w.reconciles, rep, srv)
	all := func(traffic.Kind) bool { return true }
	return float64(rep.Sum(all)) / float64(n), float64(srv.Sum(all)) / float64(n)
}

// verify checks that every Widget of ns has caught up and has its child
// at its spec, owned by it: a broken reconcile fails the benchmark rather
// than reporting.
func verify(b *testing.B, ns string) {
	ctx := context.Background()
	ws, err := env.dyn.Resource(widgets.GroupVersionResource).Namespace(ns).List(ctx, metav1.ListOptions{})
	if err != nil {
		b.Fatal(err)
	}
	cms, err := env.kube.CoreV1().ConfigMaps(ns).List(ctx, metav1.ListOptions{})
	if err != nil {
		b.Fatal(err)
	}
	children := map[string]*corev1.ConfigMap{}
	for i := range cms.Items {
		children[cms.Items[i].Name] = &cms.Items[i]
	}
	if len(ws.Items) != objects {
		b.Fatalf("%s: %d Widgets, want %d", ns, len(ws.Items), objects)
	}
	for _, u := range ws.Items {
		size, _, _ := unstructured.NestedInt64(u.Object, "spec", "size")
		observed, _, _ := unstructured.NestedInt64(u.Object, "status", "observedGeneration")
		w := &Widget{ObjectMeta: metav1.ObjectMeta{Name: u.GetName(), UID: u.GetUID()}, Spec: WidgetSpec{Size: size}}
		if observed != u.GetGeneration() {
			b.Fatalf("%s/%s: observedGeneration %d, generation %d", ns, w.Name, observed, u.GetGeneration())
		}
		if cm := children[childName(w)]; cm == nil || !childUpToDate(cm, w) {
			b.Fatalf("%s/%s: child missing or not at the spec (size %d): %v", ns, w.Name, size, cm)
		}
	}
}

// cleanup deletes ns's Widgets and ConfigMaps (no garbage collector runs
// here), so that the next runs do not share the API server's cache with
// them. The namespace itself stays (no namespace controller either).
func cleanup(b *testing.B, ns string) {
	ctx := context.Background()
	if err := env.dyn.Resource(widgets.GroupVersionResource).Namespace(ns).DeleteCollection(ctx, metav1.DeleteOptions{}, metav1.ListOptions{}); err != nil {
		b.Errorf("delete the Widgets of %s: %v", ns, err)
	}
	if err := env.kube.CoreV1().ConfigMaps(ns).DeleteCollection(ctx, metav1.DeleteOptions{}, metav1.ListOptions{}); err != nil {
		b.Errorf("delete the ConfigMaps of %s: %v", ns, err)
	}
}

// cpuWindow is the CPU time of the API server and of this process (the
// SDK's replicas, and the benchmark's patching goroutines and watch) at the
// start of a window.
type cpuWindow struct {
	pid             int
	server, process float64
	start           time.Time
}

func startCPU(b *testing.B, c *testcluster.Cluster) cpuWindow {
	w := cpuWindow{pid: c.APIServerPID(0)}
	w.server, w.process = cpuNow(b, w.pid)
	w.start = time.Now()
	return w
}

// used returns the CPU time, in seconds, the API server and this process
// used since the window's start, and the API server's over the wall time
// since then: the cores it used.
func (w cpuWindow) used(b *testing.B) (server, process, serverCores float64) {
	s, p := cpuNow(b, w.pid)
	server, process = s-w.server, p-w.process
	return server, process, server / time.Since(w.start).Seconds()
}

func cpuNow(b *testing.B, pid int) (server, process float64) {
	server, err := stats.CPUSeconds(pid)
	if err == nil {
		process, err = stats.CPUSeconds(os.Getpid())
	}
	if err != nil {
		b.Fatal(err)
	}
	return server, process
}

// loadAverage is the 1, 5 and 15-minute load averages, for the log.
func loadAverage() string {
	raw, err := os.ReadFile("/proc/loadavg")
	if err != nil {
		return "unknown"
	}
	f := strings.Fields(string(raw))
	return strings.Join(f[:min(3, len(f))], " ")
}

func median(xs []float64) float64 {
	s := slices.Sorted(slices.Values(xs))
	n := len(s)
	return (s[(n-1)/2] + s[n/2]) / 2
}
