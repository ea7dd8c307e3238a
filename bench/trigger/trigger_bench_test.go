package triggerbench

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"os"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/go-logr/logr"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/dynamic"
	dynfake "k8s.io/client-go/dynamic/fake"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/util/workqueue"
	crcontroller "sigs.k8s.io/controller-runtime/pkg/controller"
	"sigs.k8s.io/controller-runtime/pkg/controller/priorityqueue"
	"sigs.k8s.io/controller-runtime/pkg/event"
	crhandler "sigs.k8s.io/controller-runtime/pkg/handler"
	crlog "sigs.k8s.io/controller-runtime/pkg/log"
	crreconcile "sigs.k8s.io/controller-runtime/pkg/reconcile"
	"sigs.k8s.io/controller-runtime/pkg/source"

	"github.com/opkit/opkit"
	"github.com/opkit/opkit/bench/internal/fixture"
	"github.com/opkit/opkit/bench/internal/stats"
	"github.com/opkit/opkit/internal/testcluster"
	"github.com/opkit/opkit/queue"
	"github.com/opkit/opkit/reconcile"
	"github.com/opkit/opkit/trigger"
	"github.com/opkit/opkit/watcher"
)

const (
	namespace = "trigger-bench"
	// targets is the number of real ConfigMaps the triggers point at (opkit
	// re-fetches each one). Trigger i goes to target i%targets; a target is
	// triggered again only after its previous trigger reached the
	// reconciler, so with -benchtime=2000x every trigger has its own key.
	targets = 2000
	// backlogSize is the number of entries queued before the triggers.
	backlogSize = 100_000
	// workers is the reconcile concurrency of both controllers (opkit's
	// default, reconcile.Config.Concurrency's). opkit also runs its default
	// reserved worker (one, which takes only trigger-priority entries and
	// so none of the backlog).
	workers = 4
	// backlogWork is what the reconciler spends on one backlog entry: a
	// short wait standing for a cheap reconcile's one round trip. It keeps
	// the workers busy (about 7,000 entries/s with 4 workers, so 100,000
	// entries last well over ten seconds) without burning the CPU that the
	// API server on the same machine needs.
	backlogWork = 500 * time.Microsecond
	// drainDeadline bounds the wait for the last trigger to be reconciled.
	drainDeadline = 5 * time.Minute
)

// gap paces the triggers: trigger i is fired at start + i*gap (or as soon
// as the previous fire returned, if that is later: the HTTP path is
// sequential). Every contender gets the same open-loop schedule.
var gap = flag.Duration("trigger.gap", 2*time.Millisecond, "interval between two triggers")

var configMaps = opkit.Resource{
	GroupVersionResource: schema.GroupVersionResource{Version: "v1", Resource: "configmaps"},
	Kind:                 "ConfigMap",
	Namespaced:           true,
}

var discard = slog.New(slog.NewTextHandler(io.Discard, nil))

func targetName(i int) string  { return fmt.Sprintf("target-%04d", i) }
func backlogName(i int) string { return fmt.Sprintf("backlog-%06d", i) }

// env is the process-wide fixture: the control plane, the target objects
// and the prebuilt backlog entries.
var env struct {
	fixture.Cluster
	client dynamic.Interface
	kube   kubernetes.Interface // for the Leases of BenchmarkTriggerOutcome

	targetObjs  []*corev1.ConfigMap              // what Enqueue is handed
	targetMeta  []*metav1.PartialObjectMetadata  // what a GenericEvent carries
	backlog     []opkit.Cause[*corev1.ConfigMap] // opkit's backlog payloads
	backlogObjs []unstructured.Unstructured      // what opkit's watch lists besides the targets
	backlogReq  []crreconcile.Request            // controller-runtime's
}

func TestMain(m *testing.M) {
	crlog.SetLogger(logr.Discard())
	code := m.Run()
	env.Stop()
	os.Exit(code)
}

// setup starts the control plane and creates the targets, once per process.
func setup(b *testing.B) dynamic.Interface {
	b.Helper()
	env.Get(b, func(ctx context.Context, c *testcluster.Cluster) error { return populate(ctx, b, c) })
	return env.client
}

func populate(ctx context.Context, b *testing.B, c *testcluster.Cluster) error {
	cfg := c.Config()
	// No client-side throttling: client-go's default (5 QPS) would make
	// the re-fetches wait on the client's own rate limiter.
	cfg.QPS, cfg.Burst = -1, 0
	cfg.WrapTransport = func(rt http.RoundTripper) http.RoundTripper { return timedGets{rt} }
	d, err := dynamic.NewForConfig(cfg)
	if err != nil {
		return err
	}
	env.client = d
	if env.kube, err = kubernetes.NewForConfig(cfg); err != nil {
		return err
	}
	nsGVR := schema.GroupVersionResource{Version: "v1", Resource: "namespaces"}
	ns := &unstructured.Unstructured{Object: map[string]any{"apiVersion": "v1", "kind": "Namespace", "metadata": map[string]any{"name": namespace}}}
	if _, err := d.Resource(nsGVR).Create(ctx, ns, metav1.CreateOptions{}); err != nil {
		return err
	}
	res := d.Resource(configMaps.GroupVersionResource).Namespace(namespace)
	start := time.Now()
	var (
		wg    sync.WaitGroup
		next  atomic.Int64
		first atomic.Value
	)
	for range 8 {
		wg.Go(func() {
			for i := int(next.Add(1)) - 1; i < targets; i = int(next.Add(1)) - 1 {
				u := &unstructured.Unstructured{Object: map[string]any{
					"apiVersion": "v1", "kind": "ConfigMap",
					"metadata": map[string]any{"namespace": namespace, "name": targetName(i)},
					"data":     map[string]any{"index": strconv.Itoa(i)},
				}}
				if _, err := res.Create(ctx, u, metav1.CreateOptions{}); err != nil && !apierrors.IsAlreadyExists(err) {
					first.CompareAndSwap(nil, err)
					return
				}
			}
		})
	}
	wg.Wait()
	if err, _ := first.Load().(error); err != nil {
		return err
	}
	b.Logf("created %d target ConfigMaps in %v", targets, time.Since(start).Round(time.Millisecond))

	for i := range targets {
		meta := metav1.ObjectMeta{Namespace: namespace, Name: targetName(i)}
		env.targetObjs = append(env.targetObjs, &corev1.ConfigMap{
			TypeMeta: metav1.TypeMeta{APIVersion: "v1", Kind: "ConfigMap"}, ObjectMeta: meta,
		})
		env.targetMeta = append(env.targetMeta, &metav1.PartialObjectMetadata{
			TypeMeta: metav1.TypeMeta{APIVersion: "v1", Kind: "ConfigMap"}, ObjectMeta: meta,
		})
	}
	for i := range backlogSize {
		name := backlogName(i)
		meta := metav1.ObjectMeta{Namespace: namespace, Name: name, UID: types.UID("backlog-uid-" + name), ResourceVersion: backlogRV}
		env.backlogObjs = append(env.backlogObjs, unstructured.Unstructured{Object: map[string]any{
			"apiVersion": "v1", "kind": "ConfigMap",
			"metadata": map[string]any{"namespace": namespace, "name": name, "uid": string(meta.UID), "resourceVersion": backlogRV},
		}})
		env.backlog = append(env.backlog, opkit.Cause[*corev1.ConfigMap]{
			Object:  &corev1.ConfigMap{TypeMeta: metav1.TypeMeta{APIVersion: "v1", Kind: "ConfigMap"}, ObjectMeta: meta},
			Sources: opkit.Sources(opkit.APIServer),
		})
		env.backlogReq = append(env.backlogReq, crreconcile.Request{NamespacedName: types.NamespacedName{Namespace: namespace, Name: name}})
	}
	return nil
}

// backlogRV is the resourceVersion of every backlog object.
const backlogRV = "1"

// withBacklog wraps client so that a list of ConfigMaps in the bench's
// namespace also returns the backlog objects, which exist nowhere else (a
// hundred thousand real ones would cost the API server minutes to create).
// opkit's watch then sees them as it sees the targets, and a backlog entry
// carrying the state the watch saw is reconciled without a read, as a
// watch event is: the backlog costs the workers a reconcile each, as
// controller-runtime's does.
func withBacklog(client dynamic.Interface) dynamic.Interface { return backlogClient{client} }

type backlogClient struct{ dynamic.Interface }

func (c backlogClient) Resource(gvr schema.GroupVersionResource) dynamic.NamespaceableResourceInterface {
	return backlogResource{c.Interface.Resource(gvr)}
}

type backlogResource struct {
	dynamic.NamespaceableResourceInterface
}

func (r backlogResource) Namespace(ns string) dynamic.ResourceInterface {
	return backlogList{r.NamespaceableResourceInterface.Namespace(ns), ns}
}

type backlogList struct {
	dynamic.ResourceInterface
	ns string
}

// List appends the backlog to the last page of a list of the namespace.
func (l backlogList) List(ctx context.Context, opts metav1.ListOptions) (*unstructured.UnstructuredList, error) {
	list, err := l.ResourceInterface.List(ctx, opts)
	if err == nil && l.ns == namespace && list.GetContinue() == "" && opts.LabelSelector == "" && opts.FieldSelector == "" {
		list.Items = append(list.Items, env.backlogObjs...)
	}
	return list, err
}

// gets records the duration of every GET of a single ConfigMap (the
// re-fetches of the HTTP handler and of opkit's workers), so that the
// report can tell the API server's share of the latency.
var gets durations

// timedGets times the requests that gets records; lists and watches pass
// through untimed.
type timedGets struct{ next http.RoundTripper }

func (t timedGets) RoundTrip(r *http.Request) (*http.Response, error) {
	if r.Method != http.MethodGet || r.URL.RawQuery != "" || !strings.Contains(r.URL.Path, "/configmaps/") {
		return t.next.RoundTrip(r)
	}
	start := time.Now()
	resp, err := t.next.RoundTrip(r)
	gets.add(time.Since(start))
	return resp, err
}

// durations is a concurrent collector of durations.
type durations struct {
	mu sync.Mutex
	d  []time.Duration
}

func (c *durations) add(d time.Duration) {
	c.mu.Lock()
	c.d = append(c.d, d)
	c.mu.Unlock()
}

func (c *durations) reset() {
	c.mu.Lock()
	c.d = nil
	c.mu.Unlock()
}

// sorted returns what was collected, sorted.
func (c *durations) sorted() []time.Duration {
	c.mu.Lock()
	d := slices.Clone(c.d)
	c.mu.Unlock()
	slices.Sort(d)
	return d
}

// report reports the p50 and p99 of what was collected as <prefix>-p50-ns
// and <prefix>-p99-ns.
func (c *durations) report(b *testing.B, prefix string) {
	d := c.sorted()
	b.ReportMetric(float64(stats.Percentile(d, 0.50)), prefix+"-p50-ns")
	b.ReportMetric(float64(stats.Percentile(d, 0.99)), prefix+"-p99-ns")
}

// tracker pairs every fired trigger with the first reconcile of its target
// that starts after it.
type tracker struct {
	base time.Time
	// fired[s] is the time (since base, +1 so that 0 means "none") at which
	// the trigger now outstanding for target s was fired.
	fired []atomic.Int64
	mu    sync.Mutex
	lat   []time.Duration
	n     atomic.Int64 // len(lat)
	// listed counts reconciles of targets not caused by a trigger (opkit's
	// initial list).
	listed atomic.Int64
	// busyBacklog makes a backlog reconcile take backlogWork; it is off
	// while opkit's initial list (which lists the backlog objects too) is
	// drained.
	busyBacklog atomic.Bool
}

func newTracker() *tracker {
	return &tracker{base: time.Now(), fired: make([]atomic.Int64, targets)}
}

func (t *tracker) now() int64 { return int64(time.Since(t.base)) + 1 }

// fire marks the trigger for target s as fired now; call it just before
// the trigger call.
func (t *tracker) fire(s int) { t.fired[s].Store(t.now()) }

// busy reports whether target s still has a trigger outstanding.
func (t *tracker) busy(s int) bool { return t.fired[s].Load() != 0 }

// reconciled is the shared reconciler logic of every contender. now was
// taken at the reconciler's first line; triggered says whether the request
// came from a trigger (always true for controller-runtime's channel: it has
// no watch).
func (t *tracker) reconciled(name string, now int64, triggered bool) {
	if strings.HasPrefix(name, "backlog-") {
		if t.busyBacklog.Load() {
			time.Sleep(backlogWork)
		}
		return
	}
	s, err := strconv.Atoi(strings.TrimPrefix(name, "target-"))
	if err != nil || s < 0 || s >= targets {
		return
	}
	if !triggered {
		t.listed.Add(1)
		return
	}
	f := t.fired[s].Swap(0)
	if f == 0 {
		return // a reconcile not caused by a trigger we are waiting for
	}
	t.mu.Lock()
	t.lat = append(t.lat, time.Duration(now-f))
	t.mu.Unlock()
	t.n.Add(1)
}

// wait waits until n triggers have been reconciled.
func (t *tracker) wait(n int) error {
	deadline := time.Now().Add(drainDeadline)
	for t.n.Load() < int64(n) {
		if time.Now().After(deadline) {
			return fmt.Errorf("only %d of %d triggers reached the reconciler within %v", t.n.Load(), n, drainDeadline)
		}
		time.Sleep(time.Millisecond)
	}
	return nil
}

// load is the state of the queue when the triggers are fired.
type load int

const (
	idle          load = iota
	watchBacklog       // 100,000 entries at watch priority
	relistBacklog      // 100,000 entries at initial-list/relist priority
)

func (l load) String() string {
	return [...]string{"idle", "backlog-watch", "backlog-relist"}[l]
}

// contender is one trigger path under test, started for one sub-benchmark.
type contender struct {
	// fill queues the backlog (at the priority load asks for).
	fill func(l load)
	// fire sends the trigger for target s; it is timed from just before.
	fire func(b *testing.B, s int)
	// queued returns the number of entries waiting in the queue.
	queued func() int
	// report, if set, reports the contender's own metrics at the end.
	report func(b *testing.B)
	stop   func()
}

// waits records how long trigger entries waited in opkit's queue (from the
// add to the hand-out to a worker), through the queue's Metrics hook.
type waits struct {
	prio int
	durations
}

func (w *waits) Added(int, bool)       {}
func (w *waits) Dropped(queue.Outcome) {}
func (w *waits) Depth(int, int)        {}
func (w *waits) Worked(time.Duration)  {}
func (w *waits) Waited(p int, d time.Duration) {
	if p == w.prio {
		w.add(d)
	}
}

// measure fires one trigger per b.Loop iteration, paced by gap, behind the
// load, then waits for all of them to reach the reconciler and reports
// their latency.
func measure(b *testing.B, tr *tracker, c contender, l load) {
	defer c.stop()
	if l != idle {
		start := time.Now()
		tr.busyBacklog.Store(true)
		c.fill(l)
		b.Logf("queued %d backlog entries in %v", backlogSize, time.Since(start).Round(time.Millisecond))
	}
	gets.reset()
	begin := time.Now()
	n := 0
	for b.Loop() {
		if d := time.Until(begin.Add(time.Duration(n) * *gap)); d > 0 {
			time.Sleep(d)
		}
		s := n % targets
		for tr.busy(s) { // only when b.N > targets
			time.Sleep(100 * time.Microsecond)
		}
		tr.fire(s)
		c.fire(b, s)
		n++
	}
	left := c.queued()
	firing := time.Since(begin)
	if err := tr.wait(n); err != nil {
		b.Fatal(err)
	}
	b.StopTimer()
	tr.mu.Lock()
	lat := slices.Clone(tr.lat)
	tr.mu.Unlock()
	slices.Sort(lat)
	b.ReportMetric(0, "ns/op") // the pacing, not a result
	b.ReportMetric(float64(stats.Percentile(lat, 0.50)), "p50-ns")
	b.ReportMetric(float64(stats.Percentile(lat, 0.99)), "p99-ns")
	if c.report != nil {
		c.report(b)
	}
	if l != idle {
		// The backlog must still be there when the last trigger is fired,
		// or the triggers were not measured behind it.
		b.ReportMetric(float64(left), "backlog-left")
		if left == 0 {
			b.Errorf("the backlog was drained before the last trigger was fired (%v of firing): not measured behind a backlog", firing.Round(time.Millisecond))
		}
	}
}

// BenchmarkTriggerLatency reports p50-ns and p99-ns of the time from just
// before a trigger is fired to the first line of the reconcile it causes.
func BenchmarkTriggerLatency(b *testing.B) {
	client := setup(b)
	for _, impl := range []string{"opkit-enqueue", "opkit-enqueue-fakeapi", "opkit-http", "controller-runtime-channel"} {
		for _, l := range []load{idle, watchBacklog, relistBacklog} {
			b.Run(fmt.Sprintf("impl=%s/load=%s", impl, l), func(b *testing.B) {
				tr := newTracker()
				var c contender
				switch impl {
				case "opkit-enqueue":
					c = startOpkit(b, withBacklog(client), tr, false)
				case "opkit-enqueue-fakeapi":
					c = startOpkit(b, withBacklog(fakeAPI(b)), tr, false)
				case "opkit-http":
					c = startOpkit(b, withBacklog(client), tr, true)
				default:
					c = startControllerRuntime(b, tr)
				}
				measure(b, tr, c, l)
			})
		}
	}
}

// fakeAPI returns client-go's dynamic fake holding the target ConfigMaps:
// opkit's path without the network and the API server (the worker's
// re-fetch reads the fake's in-memory tracker), the closest to what
// controller-runtime's channel path does.
func fakeAPI(b *testing.B) dynamic.Interface {
	b.Helper()
	seed := make([]runtime.Object, 0, targets)
	for i := range targets {
		seed = append(seed, &unstructured.Unstructured{Object: map[string]any{
			"apiVersion": "v1", "kind": "ConfigMap",
			"metadata": map[string]any{"namespace": namespace, "name": targetName(i)},
			"data":     map[string]any{"index": strconv.Itoa(i)},
		}})
	}
	return dynfake.NewSimpleDynamicClientWithCustomListKinds(runtime.NewScheme(),
		map[schema.GroupVersionResource]string{configMaps.GroupVersionResource: "ConfigMapList"}, seed...)
}

// opkitConfig is the controller every opkit contender runs over the
// targets' namespace: the shared reconciler logic (tr), the default worker
// count and reserved worker, no trigger budget, a watch that lists the
// backlog objects too when client is wrapped by withBacklog.
func opkitConfig(client dynamic.Interface, tr *tracker) reconcile.Config[*corev1.ConfigMap] {
	return reconcile.Config[*corev1.ConfigMap]{
		Name:     "trigger-bench",
		Resource: configMaps,
		Dynamic:  client,
		Reconciler: reconcile.Func[*corev1.ConfigMap](func(ctx context.Context, req reconcile.Request[*corev1.ConfigMap]) (reconcile.Result, error) {
			now := tr.now()
			tr.reconciled(req.Key.Name, now, req.Sources.Has(opkit.Operator))
			return reconcile.Done(), nil
		}),
		Concurrency: workers,
		// Latency, not flood protection, is measured: one trigger every
		// 2ms would spend the default trigger budget (5/s) at once.
		TriggerRate: -1,
		// The watch lists the backlog objects too (withBacklog), so a
		// backlog entry is reconciled from the state it carries.
		Watch:    watcher.Config[*corev1.ConfigMap]{Namespace: namespace},
		NoEvents: true,
		Logger:   discard,
	}
}

// run runs ctrl until stop, which returns once Run has returned and fails
// b if Run failed.
func run(b *testing.B, ctrl *reconcile.Controller[*corev1.ConfigMap]) (ctx context.Context, stop func()) {
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- ctrl.Run(ctx) }()
	return ctx, func() {
		cancel()
		if err := <-done; err != nil {
			b.Errorf("controller: %v", err)
		}
	}
}

// awaitListed waits until ctrl (the leader, with leader election) has
// reconciled its initial list, which queues every target once (source
// APIServer): the workers take them all before anything is measured.
func awaitListed(ctrl *reconcile.Controller[*corev1.ConfigMap], tr *tracker) error {
	deadline := time.Now().Add(time.Minute)
	for tr.listed.Load() < targets || ctrl.Queues()[0].Len() > 0 || ctrl.Check() != nil {
		if time.Now().After(deadline) {
			return fmt.Errorf("initial sync not reconciled: %d of %d, queue %d, check %v", tr.listed.Load(), targets, ctrl.Queues()[0].Len(), ctrl.Check())
		}
		time.Sleep(5 * time.Millisecond)
	}
	return nil
}

// fillBacklog queues the backlog entries into q at priority prio.
func fillBacklog(b *testing.B, q *queue.Queue[opkit.Key, opkit.Cause[*corev1.ConfigMap]], prio int) {
	for i := range env.backlog {
		ev := env.backlog[i]
		if out := q.Add(opkit.KeyOf(ev.Object), ev, queue.AddOptions{Priority: prio}); !out.Accepted() {
			b.Fatalf("backlog add dropped: %v", out)
		}
	}
}

// startOpkit runs an opkit controller over the targets' namespace and waits
// until its initial list has been reconciled. With viaHTTP the triggers go
// through the HTTP endpoint, else straight to Trigger.Enqueue.
func startOpkit(b *testing.B, client dynamic.Interface, tr *tracker, viaHTTP bool) contender {
	b.Helper()
	qm := &waits{}
	cfg := opkitConfig(client, tr)
	cfg.QueueMetrics = qm
	ctrl, err := reconcile.NewController(cfg)
	if err != nil {
		b.Fatal(err)
	}
	qm.prio = ctrl.Trigger().Priority()
	ctx, stop := run(b, ctrl)
	if err := awaitListed(ctrl, tr); err != nil {
		stop()
		b.Fatal(err)
	}

	q := ctrl.Queues()[0]
	qm.reset() // the initial list's entries are not triggers, but be sure
	c := contender{
		queued: q.Len,
		// queue: how long triggers waited in the queue, the part of the
		// latency its priorities decide; get: the API server's GETs (one
		// per trigger: the worker's read of an Enqueue trigger, whose
		// key-only object is not the watch's latest state, or the
		// handler's read of an HTTP trigger, whose object the worker then
		// reconciles without reading it again).
		report: func(b *testing.B) {
			qm.report(b, "queue")
			if _, fake := client.(backlogClient).Interface.(*dynfake.FakeDynamicClient); !fake {
				gets.report(b, "get")
			}
		},
		fill: func(l load) {
			prio := 0 // the watcher's default watch priority
			if l == relistBacklog {
				prio = watcher.DefaultListPriority
			}
			fillBacklog(b, q, prio)
		},
		stop: stop,
	}
	if !viaHTTP {
		trig := ctrl.Trigger()
		c.fire = func(b *testing.B, s int) {
			ok, err := trig.Enqueue(ctx, env.targetObjs[s], opkit.Modified, opkit.Operator, 0, 0)
			if err != nil || !ok {
				b.Fatalf("enqueue: %v, %v", ok, err)
			}
		}
		return c
	}

	// Insecure on purpose: authentication (TokenReview and
	// SubjectAccessReview, cached) is not what is measured here.
	h, err := trigger.NewHandler(ctrl.Trigger(), trigger.HandlerConfig{InsecureSkipAuth: true, Logger: discard})
	if err != nil {
		stop()
		b.Fatal(err)
	}
	srv := httptest.NewServer(h)
	hc := srv.Client()
	urls := make([]string, targets)
	for i := range urls {
		urls[i] = srv.URL + "/reconcile/" + namespace + "/" + targetName(i)
	}
	c.fire = func(b *testing.B, s int) {
		resp, err := hc.Post(urls[s], "", nil)
		if err != nil {
			b.Fatal(err)
		}
		_, _ = io.Copy(io.Discard, resp.Body)
		resp.Body.Close()
		if resp.StatusCode != http.StatusAccepted {
			b.Fatalf("POST %s: %s", urls[s], resp.Status)
		}
	}
	c.stop = func() {
		srv.Close()
		stop()
	}
	return c
}

var crSeq atomic.Int64

// startControllerRuntime runs a controller-runtime controller whose only
// trigger source is a source.Channel of GenericEvents, handled by
// EnqueueRequestForObject, with the same worker count and reconciler logic.
// A second source (source.TypedFunc) hands the benchmark the controller's
// queue, so the backlog is added to it directly at the priorities
// controller-runtime's own watch handlers use: 0 for a watch event that
// changed the object (the priority a GenericEvent gets too), LowPriority
// for the initial list and resyncs.
//
// No manager and no cache: a channel source needs neither, and a Kind
// source would stay idle during the measurement anyway.
func startControllerRuntime(b *testing.B, tr *tracker) contender {
	b.Helper()
	c, err := crcontroller.NewTypedUnmanaged(fmt.Sprintf("trigger-bench-%d", crSeq.Add(1)), crcontroller.TypedOptions[crreconcile.Request]{
		Reconciler: crreconcile.Func(func(ctx context.Context, req crreconcile.Request) (crreconcile.Result, error) {
			now := tr.now()
			tr.reconciled(req.Name, now, true)
			return crreconcile.Result{}, nil
		}),
		MaxConcurrentReconciles: workers,
		UsePriorityQueue:        new(true), // the default; explicit for the reader
		SkipNameValidation:      new(true),
	})
	if err != nil {
		b.Fatal(err)
	}
	events := make(chan event.GenericEvent)
	if err := c.Watch(source.Channel(events, &crhandler.EnqueueRequestForObject{})); err != nil {
		b.Fatal(err)
	}
	got := make(chan workqueue.TypedRateLimitingInterface[crreconcile.Request], 1)
	if err := c.Watch(source.TypedFunc[crreconcile.Request](func(_ context.Context, q workqueue.TypedRateLimitingInterface[crreconcile.Request]) error {
		got <- q
		return nil
	})); err != nil {
		b.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- c.Start(ctx) }()
	stop := func() {
		cancel()
		if err := <-done; err != nil && !errors.Is(err, context.Canceled) {
			b.Errorf("controller-runtime: %v", err)
		}
	}
	var q workqueue.TypedRateLimitingInterface[crreconcile.Request]
	select {
	case q = <-got:
	case err := <-done:
		cancel()
		b.Fatalf("controller-runtime stopped: %v", err)
	case <-time.After(time.Minute):
		stop()
		b.Fatal("controller-runtime did not start its sources")
	}
	pq, ok := q.(priorityqueue.PriorityQueue[crreconcile.Request])
	if !ok {
		stop()
		b.Fatalf("controller-runtime's queue is a %T, not its priority queue", q)
	}
	return contender{
		queued: q.Len,
		fill: func(l load) {
			prio := 0
			if l == relistBacklog {
				prio = crhandler.LowPriority
			}
			for i := range env.backlogReq {
				pq.AddWithOpts(priorityqueue.AddOpts{Priority: &prio}, env.backlogReq[i])
			}
			// AddWithOpts only buffers; Len moves the buffer into the
			// queue (under the queue's lock), so that the backlog is
			// really queued before the first trigger, as with opkit.
			q.Len()
		},
		fire: func(b *testing.B, s int) {
			events <- event.GenericEvent{Object: env.targetMeta[s]}
		},
		stop: stop,
	}
}
