// Command demo-operator is opkit's reference operator: it keeps a ConfigMap
// for every DemoEntity, with leader election, an HTTP and a NATS trigger,
// Prometheus metrics and health endpoints.
//
//	demo-operator [flags]                               run the operator
//	demo-operator trigger --namespace NS NAME [flags]   ask it to reconcile one entity
//
// Run "demo-operator --help" or "demo-operator trigger --help" for the flags.
// Invalid flags print a message and exit with status 2.
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"os"
	"os/signal"
	"syscall"

	"github.com/opkit/opkit/example/operator"
)

func main() {
	os.Exit(run(os.Args[1:], os.Stdout, os.Stderr))
}

// errUsage marks a command-line error (exit status 2); the message has
// already been printed.
var errUsage = errors.New("usage error")

// run is main without the process: it returns the exit status.
func run(args []string, stdout, stderr io.Writer) int {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	if len(args) > 0 && args[0] == "trigger" {
		return runTrigger(ctx, args[1:], stdout, stderr)
	}
	opts, err := parseOperatorFlags(args, stderr)
	if errors.Is(err, flag.ErrHelp) {
		return 0
	}
	if err != nil {
		return 2
	}
	logger := slog.New(slog.NewTextHandler(stderr, &slog.HandlerOptions{Level: slog.LevelInfo}))
	if err := operator.Run(ctx, opts, logger); err != nil {
		fmt.Fprintln(stderr, "demo-operator:", err)
		return 1
	}
	return 0
}

// parseOperatorFlags parses the operator's flags (controller-runtime's
// names) and validates them. On a usage error it prints the message and
// the usage to stderr and returns an error wrapping errUsage (or
// flag.ErrHelp for --help).
func parseOperatorFlags(args []string, stderr io.Writer) (operator.Options, error) {
	var o operator.Options
	fs := flag.NewFlagSet("demo-operator", flag.ContinueOnError)
	fs.SetOutput(stderr)
	fs.Usage = func() {
		fmt.Fprintf(stderr, `Usage: demo-operator [flags]
       demo-operator trigger --namespace NS NAME [--reason R] [--via http|nats] ...

Runs the opkit demo operator: one ConfigMap "<name>-demo" per DemoEntity
(demoentities.demo.opkit.dev/v1), with leader election, an HTTP trigger
endpoint (POST /reconcile/{namespace}/{name}), a NATS JetStream trigger
consumer (subject demo.reconcile), /metrics, /healthz and /readyz.

Flags:
`)
		fs.PrintDefaults()
	}
	fs.StringVar(&o.Kubeconfig, "kubeconfig", "", "path to a kubeconfig file; empty: in-cluster configuration, then $KUBECONFIG or ~/.kube/config")
	fs.StringVar(&o.Namespace, "namespace", "", "watch DemoEntities in this namespace only; empty: all namespaces")
	fs.BoolVar(&o.LeaderElect, "leader-elect", true, "elect one active replica through a Lease; followers stand by and answer triggers with 503 and the leader's identity")
	fs.StringVar(&o.LeaderElectionID, "leader-election-id", operator.DefaultLeaderElectionID, "name of the Lease used for leader election (the Role in config/rbac grants only "+operator.DefaultLeaderElectionID+": change both)")
	fs.StringVar(&o.LeaderElectionNamespace, "leader-election-namespace", "", "namespace of the Lease; empty: the pod's namespace, else \"default\"")
	fs.StringVar(&o.Identity, "identity", "", "this replica's identity (Lease holder, status.reconciledBy); empty: hostname plus a random suffix")
	fs.IntVar(&o.Concurrency, "concurrency", 4, "number of concurrent reconciles (at least 1; per replica with --shards)")
	fs.IntVar(&o.Shards, "shards", 1, "share the work over the replicas: split the DemoEntities into this many shards by UID, each held through its own Lease (<leader-election-id>-i), each replica holding a fair share; 1: one leader does all the work")
	fs.StringVar(&o.TriggerBindAddress, "trigger-bind-address", ":8082", "address of the HTTP trigger endpoint; 0 disables it")
	fs.StringVar(&o.MetricsBindAddress, "metrics-bind-address", ":8080", "address of the Prometheus /metrics endpoint; 0 disables it")
	fs.StringVar(&o.HealthProbeBindAddress, "health-probe-bind-address", ":8081", "address of /healthz and /readyz; 0 disables them")
	fs.StringVar(&o.NATSURL, "nats-url", "", "NATS server URL for the JetStream trigger consumer, e.g. nats://nats:4222; empty: start an embedded JetStream server (for a single replica only)")
	fs.StringVar(&o.NATSStoreDir, "nats-store-dir", "", "JetStream storage directory of the embedded NATS server; empty: a temporary directory")
	fs.StringVar(&o.NATSListen, "nats-listen", "", "host:port of the embedded NATS server (:port: every interface); empty: "+operator.DefaultNATSListen+" (where 'trigger --via nats' connects by default); port 0: a free port")
	fs.StringVar(&o.TriggerCertFile, "trigger-cert-file", "", "PEM certificate (chain) for HTTPS on the trigger endpoint, reloaded when it changes; needs --trigger-key-file; empty: plain HTTP")
	fs.StringVar(&o.TriggerKeyFile, "trigger-key-file", "", "PEM private key for --trigger-cert-file")
	fs.StringVar(&o.TriggerCAFile, "trigger-ca-file", "", "PEM CA of the replicas' serving certificates, for triggers a follower forwards to the leader; empty: the system's roots")
	fs.StringVar(&o.TriggerAdvertiseURL, "trigger-advertise-url", "", "base URL of this replica's trigger endpoint, published on the Lease while it leads; empty: from $POD_IP or --trigger-bind-address")
	fs.BoolVar(&o.InsecureSkipTriggerAuth, "insecure-skip-trigger-auth", false, "INSECURE: serve the HTTP trigger endpoint without TokenReview/SubjectAccessReview (development only)")
	if err := fs.Parse(args); err != nil {
		return o, err
	}
	if fs.NArg() > 0 {
		return o, usageError(fs, stderr, "unexpected argument %q (the only subcommand is \"trigger\")", fs.Arg(0))
	}
	if err := o.Validate(); err != nil {
		return o, usageError(fs, stderr, "%v", err)
	}
	return o, nil
}

// usageError prints msg and a hint and returns errUsage.
func usageError(fs *flag.FlagSet, stderr io.Writer, format string, args ...any) error {
	fmt.Fprintf(stderr, "%s: %s\nRun '%s --help' for usage.\n", fs.Name(), fmt.Sprintf(format, args...), fs.Name())
	return errUsage
}
