// Package opkit is a small, framework-free SDK for Kubernetes operators that
// makes external reconciliation triggers first-class; this root package holds
// only the vocabulary its subpackages share ([Type], [Source], [Key],
// [Object], [Resource], [Event]) and owns no goroutine.
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
//   - [github.com/opkit/opkit/queue]: a keyed, deduplicating priority/delay work
//     queue with a suspendable intake; one per controller. It imports nothing
//     of opkit's and owns no goroutine.
//   - [github.com/opkit/opkit/watcher]: a raw list+watch loop (no informer) that
//     turns what the API server says into queue entries of source [APIServer],
//     relists with a diff after 410 Gone, and keeps about 240 bytes per
//     object (key, UID, resourceVersion, generation, a fingerprint) instead
//     of the object. Its Run owns its goroutines.
//   - [github.com/opkit/opkit/leader]: Lease-based leader election whose caller of
//     Run owns the campaign loop and the queue's intake gate: suspended at
//     start, resumed for a term, suspended first when a term ends.
//   - [github.com/opkit/opkit/trigger]: external triggers of source [Operator]:
//     Enqueue, the HTTP endpoint POST /reconcile/{namespace}/{name}, and a
//     message-bus consumer that never acknowledges a dropped trigger.
//   - [github.com/opkit/opkit/reconcile]: the Reconciler contract and the
//     controller that wires one queue, one watcher, optionally a leader
//     elector, a trigger and N workers; helpers for finalizers, status and
//     Events; a runnable group for the whole process.
//   - [github.com/opkit/opkit/reconcile/reconciletest]: runs a reconciler
//     synchronously against client-go's fake clients, for unit tests.
//
// watcher, leader and trigger depend on the queue's small interfaces
// (queue.Adder, queue.Gate), never on each other; reconcile wires them.
//
// # How a request flows
//
// A watch event: the watcher's goroutine decodes the object into your type
// and adds an [Event] under its [Key] to the queue (deduplicated with
// whatever is already pending for that key). A worker goroutine, owned by
// the controller's Run, takes the key from the queue (no other worker gets
// the same key until it is done), re-fetches the object if the entry waited,
// and calls your Reconciler.
//
// An external trigger: an HTTP handler (goroutine of net/http) or the
// consumer's goroutine re-fetches the object from the API server (a trigger
// carries only a pointer, never a snapshot), then calls trigger Enqueue,
// which adds the event at a priority above the watch stream's, so it is
// served ahead of a relist backlog. From there on it is the same path. Each
// package is crossed once.
//
// With leader election, only the replica holding the Lease runs the watcher
// and the workers; on every other replica the queue's intake is suspended and
// Enqueue returns false, which the HTTP endpoint answers with 503 and the
// leader's identity; the consumer takes no message there, so triggers wait
// in the broker for the leader (one that arrives as leadership moves is
// negatively acknowledged, and the broker redelivers it).
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
// Add Config.Leader (a *leader.Config) for leader election, serve
// ctrl.Trigger() through trigger.NewHandler for an HTTP trigger, and run
// everything as one unit with reconcile.Group.
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
