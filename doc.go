// Package opkit is a small, framework-free SDK for Kubernetes operators that
// makes external reconciliation triggers first-class; this root package holds
// only the vocabulary its subpackages share ([Type], [Source], [Sources],
// [Key], [Object], [Resource], [Cause]) and owns no goroutine.
//
// An operator reconciles custom resources. The Kubernetes watch stream drives
// most reconciles, but outsiders need to ask for one too: a CI/CD pipeline
// that just deployed, an event-bus consumer, an admin endpoint during an
// incident. In opkit such a trigger learns whether it was scheduled or
// dropped (this replica is not the leader, or is in a leadership
// transition), so it can react (HTTP 503, message redelivery) instead of
// being lost.
//
// opkit depends on k8s.io/client-go (with the k8s.io/api and
// k8s.io/apimachinery it brings) and golang.org/x/sync, and on nothing
// else.
//
// # Packages
//
//   - [github.com/opkit/opkit/queue]: a keyed, deduplicating priority/delay
//     work queue with a suspendable intake; one per controller. What it holds
//     for a key merges as a join, so the order of adds cannot matter. It
//     imports nothing of opkit's and owns no goroutine.
//   - [github.com/opkit/opkit/watcher]: a raw list+watch loop (no informer)
//     that adds the key of every change to the queue, records every delete
//     with its final state in a ledger until it is settled, relists with a
//     diff after 410 Gone, and keeps a few hundred bytes per live object
//     instead of the object.
//   - [github.com/opkit/opkit/leader]: Lease-based leader election that
//     drives the queue's intake gate: suspended at start, resumed for a
//     term, suspended first when a term ends.
//   - [github.com/opkit/opkit/trigger]: external triggers of source
//     [Operator]: Enqueue, the HTTP endpoint POST /reconcile/{namespace}/{name},
//     and a message-bus consumer that never acknowledges a dropped trigger.
//   - [github.com/opkit/opkit/reconcile]: the Reconciler contract and the
//     controller that wires them; helpers for finalizers, status and Events;
//     a runnable group for the whole process. Its subpackage reconciletest
//     runs a reconciler against client-go's fake clients, for unit tests.
//
// watcher, leader and trigger depend on the queue's small interfaces
// (queue.Adder, queue.Gate), never on each other; reconcile wires them.
//
// # How a request flows
//
// The queue holds keys, each with a [Cause]: who asked, why, and the newest
// state of the object that came along. The watcher's goroutine adds the key
// of every change (a delete goes to its ledger first); a trigger (the HTTP
// handler's goroutine, the consumer's, or your code) reads the object and
// adds its key at a priority above the watch stream's. A worker goroutine,
// owned by the controller's Run, takes a key (no other worker gets it until
// it is done) and reconciles its unsettled deletes, oldest first, then the
// object that has the name now, as the watch last saw it or as read from
// the API server. Each package is crossed once.
//
// With leader election, only the replica holding the Lease runs the watcher
// and the workers; on every other replica the queue's intake is suspended and
// Enqueue returns false. The HTTP endpoint forwards such a trigger to the
// leader (or answers 503 with its identity when none answers); the consumer
// takes no message there, so triggers wait in the broker for the leader.
//
// # A minimal operator
//
// A custom resource is a plain Go struct, bound to its resource by an
// [Resource] value: no code generation, no scheme.
//
//	type Widget struct {
//		metav1.TypeMeta   `json:",inline"`
//		metav1.ObjectMeta `json:"metadata,omitempty"`
//		Spec              struct {
//			Size int `json:"size"`
//		} `json:"spec"`
//	}
//
//	var widgets = opkit.Resource{
//		GroupVersionResource: schema.GroupVersionResource{Group: "example.com", Version: "v1", Resource: "widgets"},
//		Kind:                 "Widget",
//		Namespaced:           true,
//	}
//
//	func main() {
//		cfg, err := rest.InClusterConfig()
//		if err != nil {
//			log.Fatal(err)
//		}
//		ctrl, err := reconcile.NewController(reconcile.Config[*Widget]{
//			Name:     "example.com/widgets",
//			Resource: widgets,
//			Dynamic:  dynamic.NewForConfigOrDie(cfg),
//			Reconciler: reconcile.Func[*Widget](func(ctx context.Context, req reconcile.Request[*Widget]) (reconcile.Result, error) {
//				slog.InfoContext(ctx, "reconcile", "key", req.Key, "type", req.Type, "sources", req.Sources)
//				return reconcile.Done(), nil
//			}),
//		})
//		if err != nil {
//			log.Fatal(err)
//		}
//		ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
//		defer stop()
//		if err := ctrl.Run(ctx); err != nil {
//			log.Fatal(err)
//		}
//	}
//
// Add Config.Leader (a *leader.Config) for leader election, and run the
// controller in a reconcile.Operator for the HTTP trigger endpoint (any
// replica accepts a trigger and forwards it to the one that works on the
// object), other components and health endpoints, stopped in the right
// order; Config.Shards shares the work over the replicas.
//
// # Children
//
// An operator that creates objects (children) states each one and lets a
// reconcile.Applier write it: server-side apply, one request, with a
// controller reference to its owner. Config.Owns lists the children's
// resources: a child changed or deleted (by hand, say) reconciles its
// owner, whose apply puts it back; the garbage collector deletes the
// children with their owner. Config.Watches relates any other resource
// by a mapping of your own.
//
//	func (s *sizer) Reconcile(ctx context.Context, req reconcile.Request[*Widget]) (reconcile.Result, error) {
//		if req.Type == opkit.Deleted || req.Object.DeletionTimestamp != nil {
//			return reconcile.Done(), nil // the garbage collector deletes the child
//		}
//		child := corev1ac.ConfigMap(req.Object.Name+"-size", "").
//			WithData(map[string]string{"size": strconv.Itoa(req.Object.Spec.Size)})
//		_, err := s.apply.Apply(ctx, req.Object, configMaps, child)
//		return reconcile.Done(), err
//	}
//
//	ctrl, err := reconcile.NewController(reconcile.Config[*Widget]{
//		Name: "example.com/widgets", Resource: widgets, Dynamic: dyn, Reconciler: r,
//		Owns: []opkit.Resource{configMaps},
//	})
//
// What a reconcile costs: the object comes with its key when the watch
// has the latest state (no request), or is read (a GET) after a trigger
// joined a waiting entry, a child's change, a retry or the operator's own
// write the watch has not delivered yet; each apply, status write or
// finalizer change is one request; reading a child is a GET (there is no
// cache).
//
// reconcile/reconciletest tests the reconciler without a cluster, on
// client-go's fakes (the typed clientset with server-side apply, and the
// dynamic client, over one store):
//
//	h := reconciletest.New[*Widget](t, widgets, w)
//	r, _ := newSizer(h.Dynamic)
//	fmt.Println(h.ReconcileKey(ctx, r, key).Writes()) // [patch configmaps shop/blue-size]
//	h.AssertConverged(ctx, r, key)                   // a second reconcile changes nothing
//
// The repository's example_owns_test.go has both, whole and runnable.
//
// # The reference operator
//
// The example/ directory of the repository (its own Go module) is a complete
// operator built on opkit: a DemoEntity CRD reconciled into an owned
// ConfigMap with a finalizer and status, triggers over HTTP (TokenReview and
// SubjectAccessReview) and NATS JetStream, leader election, Prometheus
// metrics, health endpoints, manifests and a Dockerfile. `make demo` runs it
// end to end on a local control plane built from source.
package opkit
