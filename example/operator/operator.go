// Package operator assembles the demo operator from opkit's parts: the
// DemoEntity controller (queue, watcher, workers, leader election), the HTTP
// trigger endpoint, the NATS JetStream trigger consumer, Prometheus metrics
// and the health endpoints, run together as one reconcile.Group.
//
// Run owns every goroutine it starts (through the group) and returns only
// after all of them have returned, including the embedded NATS server when
// it started one.
package operator

import (
	"cmp"
	"context"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"encoding/hex"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"net/url"
	"os"
	"strconv"
	"strings"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"
	"github.com/prometheus/client_golang/prometheus/promhttp"
	"k8s.io/apimachinery/pkg/util/validation"
	"k8s.io/client-go/dynamic"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/clientcmd"

	"github.com/opkit/opkit"
	demov1 "github.com/opkit/opkit/example/api/v1"
	"github.com/opkit/opkit/example/metrics"
	"github.com/opkit/opkit/example/natsbroker"
	"github.com/opkit/opkit/example/reconciler"
	"github.com/opkit/opkit/leader"
	"github.com/opkit/opkit/reconcile"
	"github.com/opkit/opkit/trigger"
	"github.com/opkit/opkit/watcher"
)

// Names shared by the operator, its manifests and its callers.
const (
	// ControllerName is the reporting controller of the operator's Events.
	ControllerName = "demo.opkit.dev/demo-operator"
	// DefaultLeaderElectionID is the name of the Lease.
	DefaultLeaderElectionID = "opkit-demo-leader"
	// DefaultNATSListen is where the embedded NATS server listens: the
	// port NATS clients (and "demo-operator trigger --via nats") try first.
	DefaultNATSListen = "127.0.0.1:4222"
	// TriggerAudience is the token audience the trigger endpoint accepts.
	TriggerAudience = trigger.DefaultAudience
	// TriggerVerb and TriggerSubresource are what a caller must be allowed
	// on demoentities to trigger a reconcile (the opkit-demo-trigger
	// ClusterRole grants it): "create demoentities/reconcile".
	TriggerVerb        = "create"
	TriggerSubresource = "reconcile"
)

// Options are the operator's settings: one per command-line flag, except
// the leader election timings, which only programs embedding the operator
// set (the demo's tests shorten them).
type Options struct {
	// Kubeconfig is a kubeconfig file; empty means in-cluster, then the
	// default loading rules ($KUBECONFIG, ~/.kube/config).
	Kubeconfig string
	// Namespace limits the watch to one namespace; empty means all.
	Namespace string
	// LeaderElect turns leader election on.
	LeaderElect bool
	// LeaderElectionID is the Lease name; LeaderElectionNamespace its
	// namespace (empty: the pod's namespace, else "default").
	LeaderElectionID, LeaderElectionNamespace string
	// Identity names this replica (Lease holder, status.reconciledBy,
	// Event instance); empty means hostname plus random suffix.
	Identity string
	// Concurrency is the number of reconcile workers.
	Concurrency int
	// Shards, above 1, shares the work over the replicas (needs
	// LeaderElect): the DemoEntities are split into Shards by UID, each
	// held through its own Lease (LeaderElectionID-i), and each replica
	// holds a fair share. 0 and 1 mean one leader does all the work.
	Shards int
	// Listen addresses.
	TriggerBindAddress, MetricsBindAddress, HealthProbeBindAddress string
	// NATSURL is the NATS server; empty starts an embedded JetStream
	// server (single replica only), storing in NATSStoreDir (empty: a
	// temporary directory).
	NATSURL, NATSStoreDir string
	// NATSListen is the embedded server's host:port (":port" listens on
	// every interface); empty means DefaultNATSListen, port 0 a free port.
	NATSListen string
	// InsecureSkipTriggerAuth serves the trigger endpoint without
	// TokenReview/SubjectAccessReview.
	InsecureSkipTriggerAuth bool
	// TriggerCertFile and TriggerKeyFile, when both set, make the trigger
	// endpoint speak HTTPS only, reloading the pair when the files change.
	// TriggerCAFile holds the CA the replicas' serving certificates chain
	// to, for triggers a follower forwards (empty: the system's roots).
	TriggerCertFile, TriggerKeyFile, TriggerCAFile string
	// TriggerAdvertiseURL is the base URL of this replica's trigger
	// endpoint, which it publishes on the Leases it holds, for the other
	// replicas to forward triggers to; empty: as reconcile.TriggerEndpoint
	// derives it (http(s)://$POD_IP:port when POD_IP is set).
	TriggerAdvertiseURL string
	// LeaseDuration, RenewDeadline and RetryPeriod tune leader election;
	// zero means the leader package's defaults (15s, 10s, 2s).
	LeaseDuration, RenewDeadline, RetryPeriod time.Duration
}

// Validate reports options that cannot work.
func (o *Options) Validate() error {
	var errs []error
	if o.Concurrency < 1 {
		errs = append(errs, fmt.Errorf("--concurrency must be at least 1, got %d", o.Concurrency))
	}
	for _, a := range []struct{ flag, addr string }{
		{"--trigger-bind-address", o.TriggerBindAddress},
		{"--metrics-bind-address", o.MetricsBindAddress},
		{"--health-probe-bind-address", o.HealthProbeBindAddress},
	} {
		if a.addr == "0" { // "0" disables the endpoint
			continue
		}
		if _, _, err := net.SplitHostPort(a.addr); err != nil {
			errs = append(errs, fmt.Errorf("%s %q: want host:port or :port (or 0 to disable): %v", a.flag, a.addr, err))
		}
	}
	for _, n := range []struct{ flag, ns string }{
		{"--namespace", o.Namespace},
		{"--leader-election-namespace", o.LeaderElectionNamespace},
	} {
		if n.ns == "" {
			continue
		}
		if msgs := validation.IsDNS1123Label(n.ns); len(msgs) > 0 {
			errs = append(errs, fmt.Errorf("%s %q is not a namespace name: %s", n.flag, n.ns, strings.Join(msgs, "; ")))
		}
	}
	if (o.TriggerCertFile == "") != (o.TriggerKeyFile == "") {
		errs = append(errs, errors.New("--trigger-cert-file and --trigger-key-file must be given together"))
	}
	switch {
	case o.Shards < 0 || o.Shards > opkit.MaxShards:
		errs = append(errs, fmt.Errorf("--shards %d: want 1 to %d", o.Shards, opkit.MaxShards))
	case o.Shards > 1 && !o.LeaderElect:
		errs = append(errs, errors.New("--shards needs --leader-elect: each shard is held through a Lease"))
	case o.Shards > 1 && (len(o.LeaderElectionID) > 40 || len(validation.IsDNS1123Label(o.LeaderElectionID)) > 0):
		errs = append(errs, fmt.Errorf("--leader-election-id %q: with --shards, a DNS label of at most 40 characters (it prefixes the shards' Leases)", o.LeaderElectionID))
	}
	if o.LeaderElect && o.LeaderElectionID == "" {
		errs = append(errs, errors.New("--leader-election-id must not be empty with --leader-elect"))
	} else if msgs := validation.IsDNS1123Subdomain(o.LeaderElectionID); o.LeaderElect && len(msgs) > 0 {
		errs = append(errs, fmt.Errorf("--leader-election-id %q is not a Lease name: %s", o.LeaderElectionID, strings.Join(msgs, "; ")))
	}
	if o.NATSURL != "" {
		for _, member := range strings.Split(o.NATSURL, ",") {
			if u, err := url.Parse(strings.TrimSpace(member)); err != nil || u.Scheme == "" || u.Host == "" || u.Opaque != "" {
				errs = append(errs, fmt.Errorf("--nats-url %q: want URLs such as nats://host:4222, comma-separated", redactURLs(o.NATSURL)))
				break
			}
		}
		if o.NATSStoreDir != "" || o.NATSListen != "" {
			errs = append(errs, errors.New("--nats-store-dir and --nats-listen apply to the embedded server only, not with --nats-url"))
		}
	}
	if _, _, err := o.natsListen(); err != nil {
		errs = append(errs, err)
	}
	return errors.Join(errs...)
}

// natsListen returns the embedded NATS server's host and port from
// NATSListen (default DefaultNATSListen; an empty host means every
// interface, as for the other listen addresses).
func (o *Options) natsListen() (host string, port int, err error) {
	addr := cmp.Or(o.NATSListen, DefaultNATSListen)
	host, p, err := net.SplitHostPort(addr)
	if err != nil {
		return "", 0, fmt.Errorf("--nats-listen %q: want host:port: %v", addr, err)
	}
	n, err := strconv.ParseUint(p, 10, 16)
	if err != nil {
		return "", 0, fmt.Errorf("--nats-listen %q: bad port", addr)
	}
	if host == "" {
		host = "0.0.0.0"
	}
	return host, int(n), nil
}

// RESTConfig loads the client configuration: --kubeconfig if given, else
// in-cluster, else the default loading rules.
func RESTConfig(kubeconfig string) (*rest.Config, error) {
	if kubeconfig != "" {
		return clientcmd.BuildConfigFromFlags("", kubeconfig)
	}
	if cfg, err := rest.InClusterConfig(); err == nil {
		return cfg, nil
	}
	rules := clientcmd.NewDefaultClientConfigLoadingRules()
	return clientcmd.NewNonInteractiveDeferredLoadingClientConfig(rules, &clientcmd.ConfigOverrides{}).ClientConfig()
}

// defaultIdentity is the hostname plus 8 random hex digits.
func defaultIdentity() string {
	host, _ := os.Hostname()
	if host == "" {
		host = "demo-operator"
	}
	b := make([]byte, 4)
	_, _ = rand.Read(b)
	return host + "_" + hex.EncodeToString(b)
}

// podNamespace is the namespace of the pod this runs in, or "".
func podNamespace() string {
	b, err := os.ReadFile("/var/run/secrets/kubernetes.io/serviceaccount/namespace")
	if err != nil {
		return ""
	}
	return strings.TrimSpace(string(b))
}

// Deps are the operator's connections to the outside, injectable for tests.
type Deps struct {
	// Dynamic and Kube talk to the API server (required).
	Dynamic dynamic.Interface
	Kube    kubernetes.Interface
	// Broker delivers NATS (or other) trigger messages; nil means no
	// message consumer.
	Broker trigger.Broker
	// Registry receives the metrics (required).
	Registry prometheus.Registerer
	// Gatherer serves /metrics; nil means no metrics endpoint.
	Gatherer prometheus.Gatherer
	// Logger; nil means slog.Default().
	Logger *slog.Logger
}

// Operator is the assembled operator, not yet running: opkit's
// reconcile.Operator (Run, Group, TriggerHandler) over the DemoEntity
// controller and the consumer.
type Operator struct {
	*reconcile.Operator
	// Controller is the DemoEntity controller (all its shards).
	Controller *reconcile.Controller[*demov1.DemoEntity]
	// Consumer is the message consumer, nil without a Broker.
	Consumer *trigger.Consumer[*demov1.DemoEntity]
}

// withDefaults fills in the identity and the Lease namespace.
func (o Options) withDefaults() Options {
	if o.Identity == "" {
		o.Identity = defaultIdentity()
	}
	if o.LeaderElectionNamespace == "" {
		if o.LeaderElectionNamespace = podNamespace(); o.LeaderElectionNamespace == "" {
			o.LeaderElectionNamespace = "default"
		}
	}
	return o
}

// forwardClient is the client of forwarded triggers, trusting caFile's
// certificates (empty: the system's roots).
func forwardClient(caFile string) (*http.Client, error) {
	tr := http.DefaultTransport.(*http.Transport).Clone()
	tr.MaxIdleConnsPerHost = 64
	if caFile != "" {
		pem, err := os.ReadFile(caFile)
		if err != nil {
			return nil, fmt.Errorf("--trigger-ca-file: %w", err)
		}
		pool := x509.NewCertPool()
		if !pool.AppendCertsFromPEM(pem) {
			return nil, fmt.Errorf("--trigger-ca-file %s holds no PEM certificate", caFile)
		}
		tr.TLSClientConfig = &tls.Config{RootCAs: pool, MinVersion: tls.VersionTLS12}
	}
	return &http.Client{Transport: tr}, nil
}

// Assemble builds every component from o and d; it starts nothing and
// binds no port. Addresses set to "0" leave out their HTTP server (the
// trigger endpoint is still built: Operator.TriggerHandler).
func Assemble(o Options, d Deps) (*Operator, error) {
	if err := o.Validate(); err != nil {
		return nil, err
	}
	if d.Dynamic == nil || d.Kube == nil || d.Registry == nil {
		return nil, errors.New("operator: Deps.Dynamic, Deps.Kube and Deps.Registry are required")
	}
	o = o.withDefaults()
	logger := cmp.Or(d.Logger, slog.Default())
	m, err := metrics.New(d.Registry)
	if err != nil {
		return nil, err
	}
	ctrl, err := newController(o, d, m, logger)
	if err != nil {
		return nil, err
	}
	op := &Operator{Controller: ctrl}
	ocfg := reconcile.OperatorConfig{Controllers: []reconcile.Part{ctrl}, Logger: logger}
	if ocfg.Triggers, err = triggerEndpoint(o, d.Kube, m, logger); err != nil {
		return nil, err
	}
	// The message consumer, on every replica: it pauses while this replica
	// works on no shard, so triggers wait in the stream for one that does;
	// a replica that works on some hands back (nacks) the messages of the
	// others, for their holders.
	if d.Broker != nil {
		op.Consumer, err = trigger.NewConsumer(trigger.ConsumerConfig[*demov1.DemoEntity]{
			Broker: d.Broker, Trigger: ctrl.Trigger(),
			// A message is acknowledged once its reconcile succeeded (or
			// failed for good): a leader that dies first leaves it to the
			// next. Each waits in a handler meanwhile, hence 16.
			AckAfterReconcile: true, Concurrency: 16, LagInterval: 5 * time.Second,
			Metrics: m.Trigger(), Logger: logger,
		})
		if err != nil {
			return nil, err
		}
		// No Ready: a broker outage must not take a replica out of its
		// Service, or the HTTP trigger would go down with the bus. The
		// consumer's own check is the "nats-broker" component of
		// opkit_component_ready, and in its logs and metrics.
		ocfg.Components = append(ocfg.Components, reconcile.Runnable{Name: "nats-consumer", Run: op.Consumer.Run})
	}
	if o.MetricsBindAddress != "0" && d.Gatherer != nil {
		mux := http.NewServeMux()
		mux.Handle("GET /metrics", promhttp.HandlerFor(d.Gatherer, promhttp.HandlerOpts{}))
		ocfg.Components = append(ocfg.Components, httpRunnable("metrics", o.MetricsBindAddress, mux))
	}
	if o.HealthProbeBindAddress != "0" {
		ocfg.HealthAddr = o.HealthProbeBindAddress
	}
	if op.Operator, err = reconcile.NewOperator(ocfg); err != nil {
		return nil, err
	}
	return op, registerState(d.Registry, op)
}

// newController builds the DemoEntity controller: leader election (and
// with o.Shards above 1 the shards' Leases) when o.LeaderElect is set.
func newController(o Options, d Deps, m *metrics.Metrics, logger *slog.Logger) (*reconcile.Controller[*demov1.DemoEntity], error) {
	rec, err := reconcile.NewRecorder(reconcile.RecorderConfig{Dynamic: d.Dynamic, Controller: ControllerName, Instance: o.Identity, Resource: demov1.Resource})
	if err != nil {
		return nil, err
	}
	r, err := reconciler.New(reconciler.Config{Dynamic: d.Dynamic, Recorder: rec, Identity: o.Identity, Logger: logger})
	if err != nil {
		return nil, err
	}
	cfg := reconcile.Config[*demov1.DemoEntity]{
		Name: ControllerName, Resource: demov1.Resource, Dynamic: d.Dynamic, Reconciler: r,
		Concurrency: o.Concurrency, Shards: opkit.Shards{Count: o.Shards},
		// An edited or deleted ConfigMap reconciles its entity, which puts
		// it back.
		Owns: []opkit.Resource{reconciler.ConfigMaps},
		// Our own status and finalizer writes (through reconcile.Status
		// and reconcile.Finalizer) cause no reconcile, without being told.
		Watch:   watcher.Config[*demov1.DemoEntity]{Namespace: o.Namespace, Metrics: m.Watcher()},
		Metrics: m.Controller(), QueueMetrics: m.Queue(), TriggerMetrics: m.Trigger(), Logger: logger,
	}
	if o.LeaderElect {
		cfg.Leader = &leader.Config{Client: d.Kube, Namespace: o.LeaderElectionNamespace, Name: o.LeaderElectionID, Identity: o.Identity,
			LeaseDuration: o.LeaseDuration, RenewDeadline: o.RenewDeadline, RetryPeriod: o.RetryPeriod, Metrics: m.Leader(), Logger: logger}
	}
	return reconcile.NewController(cfg)
}

// triggerEndpoint is the HTTP trigger endpoint, on every replica: one
// that does not work on an object forwards its trigger to the replica
// that does (its Lease says where), so a Service in front of every
// replica answers.
func triggerEndpoint(o Options, kube kubernetes.Interface, m *metrics.Metrics, logger *slog.Logger) (*reconcile.TriggerEndpoint, error) {
	forward, err := forwardClient(o.TriggerCAFile)
	if err != nil {
		return nil, err
	}
	t := &reconcile.TriggerEndpoint{
		Server:       trigger.ServerConfig{Addr: o.TriggerBindAddress, CertFile: o.TriggerCertFile, KeyFile: o.TriggerKeyFile, Logger: logger},
		Handler:      trigger.HandlerConfig{InsecureSkipAuth: o.InsecureSkipTriggerAuth, ForwardClient: forward, Metrics: m.Trigger(), Logger: logger},
		AdvertiseURL: o.TriggerAdvertiseURL,
		NoServer:     o.TriggerBindAddress == "0",
	}
	if o.InsecureSkipTriggerAuth {
		logger.Warn("the trigger endpoint is running WITHOUT authentication (--insecure-skip-trigger-auth)")
		return t, nil
	}
	t.Handler.Authenticator, err = trigger.NewKubeAuthenticator(trigger.KubeAuthConfig{
		Client: kube, Audiences: []string{TriggerAudience}, Verb: TriggerVerb, Subresource: TriggerSubresource,
	})
	return t, err
}

// registerState registers the components' readiness (the consumer's
// broker among them) and the queue's state as metrics.
func registerState(reg prometheus.Registerer, op *Operator) error {
	consumer := op.Consumer
	if err := reg.Register(metrics.Components(func() []reconcile.ComponentStatus {
		st := op.Group().Check()
		if consumer != nil {
			st = append(st, reconcile.ComponentStatus{Name: "nats-broker", Err: consumer.Check()})
		}
		return st
	})); err != nil {
		return err
	}
	return reg.Register(metrics.QueueStats(op.Controller.QueueStats))
}

// Run runs the operator until ctx ends or a component fails: it connects
// to the API server and NATS (starting an embedded JetStream server when
// o.NATSURL is empty), assembles the components and runs them. logger nil
// means slog.Default().
func Run(ctx context.Context, o Options, logger *slog.Logger) error {
	if err := o.Validate(); err != nil {
		return err
	}
	if logger == nil {
		logger = slog.Default()
	}
	o = o.withDefaults()
	logger = logger.With("identity", o.Identity)

	restCfg, err := RESTConfig(o.Kubeconfig)
	if err != nil {
		return fmt.Errorf("kubeconfig: %w", err)
	}
	// No client-side limit on an API server with Priority and Fairness, a
	// guard otherwise: not client-go's 5 a second.
	restCfg = reconcile.WithClientDefaults(restCfg)
	restCfg.UserAgent = "opkit-demo-operator/" + o.Identity
	dyn, err := dynamic.NewForConfig(restCfg)
	if err != nil {
		return err
	}
	kube, err := kubernetes.NewForConfig(restCfg)
	if err != nil {
		return err
	}

	natsURL := o.NATSURL
	if natsURL == "" {
		host, port, err := o.natsListen()
		if err != nil {
			return err
		}
		embedded, err := natsbroker.StartEmbedded(natsbroker.EmbeddedConfig{Host: host, Port: port, StoreDir: o.NATSStoreDir})
		if err != nil {
			return err
		}
		defer embedded.Shutdown()
		natsURL = embedded.URL()
		logger.Info("started an embedded NATS JetStream server (single replica only)", "url", natsURL)
	}
	openCtx, cancel := context.WithTimeout(ctx, 30*time.Second)
	// An external server may be down when a replica starts: the operator
	// runs anyway (reconciles, HTTP triggers) and the consumer connects
	// when it can.
	broker, err := natsbroker.Open(openCtx, natsbroker.Config{URL: natsURL, Name: "opkit-demo-operator/" + o.Identity, Logger: logger,
		StartDisconnected: o.NATSURL != ""})
	cancel()
	if err != nil {
		// The error may quote the URL (a *url.Error does): say only what
		// went wrong, with the URLs redacted.
		return fmt.Errorf("nats %s: %s", redactURLs(natsURL), redactIn(err.Error(), natsURL))
	}
	defer broker.Close()

	reg := prometheus.NewRegistry()
	reg.MustRegister(collectors.NewGoCollector(), collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}))
	op, err := Assemble(o, Deps{Dynamic: dyn, Kube: kube, Broker: broker, Registry: reg, Gatherer: reg, Logger: logger})
	if err != nil {
		return err
	}
	logger.Info("demo operator starting",
		"namespace", orAll(o.Namespace), "leaderElect", o.LeaderElect,
		"lease", o.LeaderElectionNamespace+"/"+o.LeaderElectionID,
		"trigger", o.TriggerBindAddress, "metrics", o.MetricsBindAddress, "health", o.HealthProbeBindAddress, "nats", redactURLs(natsURL))
	err = op.Run(ctx)
	logger.Info("demo operator stopped", "error", err)
	return err
}

func orAll(ns string) string {
	if ns == "" {
		return "(all namespaces)"
	}
	return ns
}

// httpRunnable serves h on addr until ctx ends.
func httpRunnable(name, addr string, h http.Handler) reconcile.Runnable {
	return reconcile.Runnable{Name: name, Run: func(ctx context.Context) error {
		ln, err := net.Listen("tcp", addr)
		if err != nil {
			return fmt.Errorf("%s: %w", name, err)
		}
		srv := &http.Server{Handler: h, ReadHeaderTimeout: 5 * time.Second, ReadTimeout: 10 * time.Second, WriteTimeout: 30 * time.Second}
		errc := make(chan error, 1)
		go func() { errc <- srv.Serve(ln) }()
		select {
		case err := <-errc:
			return fmt.Errorf("%s: %w", name, err)
		case <-ctx.Done():
		}
		sctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		_ = srv.Shutdown(sctx)
		<-errc
		return nil
	}}
}

// redactURLs returns a NATS server list (comma-separated URLs) fit for
// logs and errors: passwords, and a user without a password (NATS reads it
// as a token), become "xxxxx"; a URL that does not parse is replaced
// whole, since it might hold one.
func redactURLs(list string) string {
	parts := strings.Split(list, ",")
	for i, p := range parts {
		p = strings.TrimSpace(p)
		if !strings.Contains(p, "@") {
			parts[i] = p // no user information: nothing to hide
			continue
		}
		if !strings.Contains(p, "://") {
			p = "nats://" + p // as nats.go reads a member without a scheme
		}
		u, err := url.Parse(p)
		if err != nil || u.Opaque != "" || u.Host == "" || (u.Path != "" && u.Path != "/") || u.RawQuery != "" || u.Fragment != "" {
			// Not scheme://[user[:password]@]host[:port]: a password
			// could sit anywhere in it.
			parts[i] = "<unparsable URL>"
			continue
		}
		if u.User != nil {
			if _, hasPassword := u.User.Password(); !hasPassword {
				u.User = url.User("xxxxx")
			}
		}
		parts[i] = u.Redacted()
	}
	return strings.Join(parts, ",")
}

// redactIn replaces, in text, every member of the NATS server list as
// given (and as nats.go completes it) by its redacted form.
func redactIn(text, list string) string {
	for _, p := range strings.Split(list, ",") {
		p = strings.TrimSpace(p)
		if p == "" {
			continue
		}
		r := redactURLs(p)
		text = strings.ReplaceAll(text, p, r)
		if !strings.Contains(p, "://") {
			text = strings.ReplaceAll(text, "nats://"+p, r)
		}
	}
	return text
}
