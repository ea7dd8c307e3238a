package convergencebench

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"net/http"
	"sync"
	"testing"
	"time"

	"github.com/go-logr/logr"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	kruntime "k8s.io/apimachinery/pkg/runtime"
	corev1ac "k8s.io/client-go/applyconfigurations/core/v1"
	"k8s.io/client-go/dynamic"
	"k8s.io/client-go/kubernetes"
	clientgoscheme "k8s.io/client-go/kubernetes/scheme"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/clientcmd"
	"k8s.io/client-go/util/flowcontrol"
	"sigs.k8s.io/controller-runtime/pkg/builder"
	crcache "sigs.k8s.io/controller-runtime/pkg/cache"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/client/config"
	"sigs.k8s.io/controller-runtime/pkg/controller"
	"sigs.k8s.io/controller-runtime/pkg/manager"
	metricsserver "sigs.k8s.io/controller-runtime/pkg/metrics/server"
	"sigs.k8s.io/controller-runtime/pkg/predicate"
	crreconcile "sigs.k8s.io/controller-runtime/pkg/reconcile"

	"github.com/opkit/opkit"
	"github.com/opkit/opkit/bench/internal/traffic"
	"github.com/opkit/opkit/internal/testcluster"
	"github.com/opkit/opkit/leader"
	"github.com/opkit/opkit/reconcile"
	"github.com/opkit/opkit/watcher"
)

// sdk starts replicas of one SDK's controller.
type sdk struct {
	name  string // the prefix of its metrics
	start func(b *testing.B, r *replica, cfg *rest.Config, ns string)
	// defaults loads a kubeconfig as the SDK's docs tell a user to: the
	// client configuration of the setting limits=defaults.
	defaults func(kubeconfig string) (*rest.Config, error)
}

var sdks = []sdk{{"opkit", startOpkit, opkitDefaults}, {"cr", startControllerRuntime, crDefaults}}

// opkitDefaults is what opkit's README and example operator do: the
// kubeconfig loaded by client-go (no QPS or Burst), then
// reconcile.WithClientDefaults (no client-side limit once an answer shows
// the API server has Priority and Fairness, 100 a second until then), one
// rest.Config for every client.
func opkitDefaults(kubeconfig string) (*rest.Config, error) {
	cfg, err := clientcmd.BuildConfigFromFlags("", kubeconfig)
	if err != nil {
		return nil, err
	}
	return reconcile.WithClientDefaults(cfg), nil
}

// crDefaults is controller-runtime's ctrl.GetConfig with --kubeconfig:
// since the kubeconfig sets no QPS, it sets QPS -1, no client-side limit
// (v0.25.2, pkg/client/config); the manager leaves QPS and Burst as they
// are.
func crDefaults(kubeconfig string) (*rest.Config, error) {
	if err := flag.Set(config.KubeconfigFlagName, kubeconfig); err != nil {
		return nil, err
	}
	return config.GetConfig()
}

// replica is one running instance of an SDK's controller, with leader
// election: every client it has is built from one rest.Config whose
// transport goes through its kill switch and its request counter (in that
// order: a killed request is not sent, so not counted).
type replica struct {
	id       string
	kill     traffic.Switch
	requests traffic.Counter
	rec      recorder
	acquired chan time.Time // when its first term started
	cancel   context.CancelFunc
	done     chan error // what its Run or Start returned
}

// newReplica starts a replica of s with identity id on ns, its clients
// limited to l.
func newReplica(b *testing.B, s sdk, c *testcluster.Cluster, l limits, ns, id string) *replica {
	r := &replica{id: id, acquired: make(chan time.Time, 1), done: make(chan error, 1)}
	cfg := c.Config()
	if l.defaults {
		var err error
		if cfg, err = s.defaults(c.Kubeconfig()); err != nil {
			b.Fatal(err)
		}
	} else {
		cfg.QPS, cfg.Burst = l.qps, l.burst
	}
	if l.shared {
		cfg.RateLimiter = flowcontrol.NewTokenBucketRateLimiter(l.qps, l.burst)
	}
	cfg.UserAgent = "convergence-bench/" + s.name + "/" + id
	// Around whatever the SDK's defaults wrapped (opkit's watch for the
	// Priority and Fairness header).
	cfg.Wrap(func(rt http.RoundTripper) http.RoundTripper { return r.kill.Wrap(r.requests.Wrap(rt)) })
	s.start(b, r, cfg, ns)
	return r
}

// termStarted notes the start of a term: the replica holds the Lease.
func (r *replica) termStarted() {
	select {
	case r.acquired <- time.Now():
	default:
	}
}

// waitAcquired returns when the replica's first term started.
func (r *replica) waitAcquired(b *testing.B, timeout time.Duration) time.Time {
	select {
	case t := <-r.acquired:
		return t
	case err := <-r.done:
		b.Fatalf("replica %s stopped before it led: %v", r.id, err)
	case <-time.After(timeout):
		b.Fatalf("replica %s did not lead within %v", r.id, timeout)
	}
	return time.Time{}
}

// crash makes the replica's every request fail, then cancels it: a process
// that died, which releases nothing. It returns at once; join waits for
// the replica to be gone.
func (r *replica) crash() {
	r.kill.Kill()
	r.cancel()
}

// stop cancels the replica (an orderly shutdown) and waits for it.
func (r *replica) stop(b *testing.B) {
	r.cancel()
	r.join(b, false)
}

// join waits for a cancelled replica to return; a crashed one may return
// an error (its last requests failed).
func (r *replica) join(b *testing.B, crashed bool) {
	select {
	case err := <-r.done:
		if err != nil && !crashed && !errors.Is(err, context.Canceled) {
			b.Errorf("replica %s: %v", r.id, err)
		}
		r.done <- err // for a second join
	case <-time.After(time.Minute):
		b.Fatalf("replica %s did not stop within a minute", r.id)
	}
}

// recorder counts a replica's reconciles, by object, as they end
// (successful or not).
type recorder struct {
	mu    sync.Mutex
	names map[string]struct{}
	total int64
	full  time.Time // when every object's reconcile had ended once
}

func (c *recorder) reconciled(name string) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.names == nil {
		c.names = map[string]struct{}{}
	}
	c.total++
	c.names[name] = struct{}{}
	if len(c.names) == objects && c.full.IsZero() {
		c.full = time.Now()
	}
}

// state returns the reconciles so far, the objects reconciled and when
// every object had been.
func (c *recorder) state() (total int64, distinct int, full time.Time) {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.total, len(c.names), c.full
}

// startOpkit runs opkit's controller: the reconcile takes the Widget as
// the controller hands it over (req.Object), states the child and has a
// reconcile.Applier write it (one server-side apply, as example/reconciler
// does; opkit keeps no cache to read the child from), and writes
// status.observedGeneration with reconcile.Status (an update of the status
// subresource, written only when it changes).
func startOpkit(b *testing.B, r *replica, cfg *rest.Config, ns string) {
	dyn, err := dynamic.NewForConfig(cfg)
	if err != nil {
		b.Fatal(err)
	}
	kube, err := kubernetes.NewForConfig(cfg)
	if err != nil {
		b.Fatal(err)
	}
	status, err := reconcile.NewStatus[*Widget](reconcile.StatusConfig{Dynamic: dyn, Resource: widgets})
	if err != nil {
		b.Fatal(err)
	}
	apply, err := reconcile.NewApplier(reconcile.ApplyConfig{Dynamic: dyn, FieldManager: "bench.opkit.dev/convergence", Owner: widgets})
	if err != nil {
		b.Fatal(err)
	}
	ctrl, err := reconcile.NewController(reconcile.Config[*Widget]{
		Name:     "bench.opkit.dev/convergence",
		Resource: widgets,
		Dynamic:  dyn,
		Reconciler: reconcile.Func[*Widget](func(ctx context.Context, req reconcile.Request[*Widget]) (reconcile.Result, error) {
			if req.Type == opkit.Deleted || req.Object == nil {
				return reconcile.Done(), nil
			}
			w := req.Object
			defer r.rec.reconciled(w.Name)
			if _, err := apply.Apply(ctx, w, opkit.Resource{GroupVersionResource: configMaps, Kind: "ConfigMap", Namespaced: true},
				corev1ac.ConfigMap(childName(w), "").WithData(childData(w))); err != nil {
				return reconcile.Done(), err
			}
			_, err := status.Update(ctx, w, func(*Widget) error { return nil }) // observedGeneration is the helper's
			return reconcile.Done(), err
		}),
		// The same workers as controller-runtime's: no reserved worker
		// (it would take only triggers, which this benchmark sends none of).
		Concurrency: workers, ReservedWorkers: -1,
		// A status write does not reconcile again (controller-runtime:
		// GenerationChangedPredicate).
		Watch: watcher.Config[*Widget]{Namespace: ns, SkipStatusOnly: true},
		Leader: &leader.Config{Client: kube, Namespace: ns, Name: leaseName, Identity: r.id,
			LeaseDuration: leaseDuration, RenewDeadline: renewDeadline, RetryPeriod: retryPeriod},
		NoEvents: true, // controller-runtime's controller records none either
		Logger:   discard,
	})
	if err != nil {
		b.Fatal(err)
	}
	if err := ctrl.AddTermWork(reconcile.Runnable{Name: "term-start", Run: func(ctx context.Context) error {
		r.termStarted()
		<-ctx.Done()
		return nil
	}}); err != nil {
		b.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	r.cancel = cancel
	go func() { r.done <- ctrl.Run(ctx) }()
}

func toUnstructured(cm *corev1.ConfigMap) (*unstructured.Unstructured, error) {
	m, err := kruntime.DefaultUnstructuredConverter.ToUnstructured(cm)
	if err != nil {
		return nil, err
	}
	u := &unstructured.Unstructured{Object: m}
	u.SetAPIVersion("v1")
	u.SetKind("ConfigMap")
	return u, nil
}

// scheme is controller-runtime's: client-go's types and Widget.
var scheme = func() *kruntime.Scheme {
	s := kruntime.NewScheme()
	if err := clientgoscheme.AddToScheme(s); err != nil {
		panic(err)
	}
	gv := widgets.GroupVersion()
	s.AddKnownTypes(gv, &Widget{}, &WidgetList{})
	metav1.AddToGroupVersion(s, gv)
	return s
}()

// startControllerRuntime runs a controller-runtime manager with its
// defaults except where the benchmark needs the same setting as opkit's
// (worker count, leader election durations, the namespace) or a second
// manager in the process (no metrics or probe listener, no name
// validation): the reconcile gets the Widget through the manager's client
// (from its informer cache), gets the child the same way (the cache starts
// a ConfigMap informer on the first Get) and creates or updates it when it
// differs, and writes status.observedGeneration with Status().Update (a
// PUT of the status subresource, with the resourceVersion read, as
// kubebuilder's scaffold does) when it changes. GenerationChangedPredicate
// keeps a status write from reconciling again.
func startControllerRuntime(b *testing.B, r *replica, cfg *rest.Config, ns string) {
	mgr, err := manager.New(cfg, manager.Options{
		Scheme:                        scheme,
		Cache:                         crcache.Options{DefaultNamespaces: map[string]crcache.Config{ns: {}}},
		Metrics:                       metricsserver.Options{BindAddress: "0"},
		HealthProbeBindAddress:        "0",
		LeaderElection:                true,
		LeaderElectionNamespace:       ns,
		LeaderElectionID:              leaseName,
		LeaderElectionReleaseOnCancel: false, // a killed process releases nothing
		LeaseDuration:                 new(leaseDuration),
		RenewDeadline:                 new(renewDeadline),
		RetryPeriod:                   new(retryPeriod),
		Logger:                        logr.Discard(),
	})
	if err != nil {
		b.Fatal(err)
	}
	c := mgr.GetClient()
	err = builder.ControllerManagedBy(mgr).
		For(&Widget{}, builder.WithPredicates(predicate.GenerationChangedPredicate{})).
		Named("convergence").
		WithOptions(controller.Options{MaxConcurrentReconciles: workers, SkipNameValidation: new(true)}).
		Complete(crreconcile.Func(func(ctx context.Context, req crreconcile.Request) (crreconcile.Result, error) {
			var w Widget
			if err := c.Get(ctx, req.NamespacedName, &w); err != nil {
				return crreconcile.Result{}, client.IgnoreNotFound(err)
			}
			defer r.rec.reconciled(w.Name)
			if err := ensureChildCR(ctx, c, &w); err != nil {
				return crreconcile.Result{}, err
			}
			if w.Status.ObservedGeneration == w.Generation {
				return crreconcile.Result{}, nil
			}
			w.Status.ObservedGeneration = w.Generation
			return crreconcile.Result{}, c.Status().Update(ctx, &w)
		}))
	if err != nil {
		b.Fatal(err)
	}
	// A runnable without NeedLeaderElection runs only while leading.
	if err := mgr.Add(manager.RunnableFunc(func(ctx context.Context) error {
		r.termStarted()
		<-ctx.Done()
		return nil
	})); err != nil {
		b.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	r.cancel = cancel
	go func() { r.done <- mgr.Start(ctx) }()
}

// ensureChildCR is the child's create-or-update through controller-
// runtime's client: a GET (from its cache), then a CREATE or, when it
// differs, an UPDATE.
func ensureChildCR(ctx context.Context, c client.Client, w *Widget) error {
	var cm corev1.ConfigMap
	err := c.Get(ctx, client.ObjectKey{Namespace: w.Namespace, Name: childName(w)}, &cm)
	if apierrors.IsNotFound(err) {
		return c.Create(ctx, newChild(w))
	}
	if err != nil {
		return fmt.Errorf("get child: %w", err)
	}
	if childUpToDate(&cm, w) {
		return nil
	}
	shapeChild(&cm, w)
	return c.Update(ctx, &cm)
}
