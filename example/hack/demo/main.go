// Command demo runs the reference operator end to end on a local control
// plane and narrates what happens; `make demo` (example/hack/demo.sh) runs
// it. It starts etcd + kube-apiserver (internal/testcluster), applies
// example/config, starts one nats-server and two operator replicas with
// leader election, creates DemoEntities, fires an HTTP and a NATS trigger,
// kills the leader, shows the other replica take over; then three
// replicas share the work (--shards 8), a trigger is forwarded to the
// holder of its object's shard, and a replica is killed; finally it stops
// every process it started.
package main

import (
	"context"
	"flag"
	"fmt"
	"io"
	"maps"
	"net/http"
	"os"
	"os/exec"
	"os/signal"
	"path/filepath"
	"slices"
	"strings"
	"syscall"
	"text/tabwriter"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/client-go/dynamic"
	"k8s.io/client-go/kubernetes"

	"github.com/opkit/opkit"
	demov1 "github.com/opkit/opkit/example/api/v1"
	"github.com/opkit/opkit/example/config"
	"github.com/opkit/opkit/example/internal/harness"
	"github.com/opkit/opkit/example/operator"
	"github.com/opkit/opkit/example/reconciler"
	"github.com/opkit/opkit/internal/testcluster"
)

const ns = "demo"

var start = time.Now()

func step(format string, args ...any) {
	fmt.Printf("\n[%5.1fs] %s\n", time.Since(start).Seconds(), fmt.Sprintf(format, args...))
}

func info(format string, args ...any) { fmt.Printf("         %s\n", fmt.Sprintf(format, args...)) }

func main() {
	moduleDir := flag.String("module", ".", "directory of the example module (to build demo-operator)")
	keep := flag.Bool("keep-logs", false, "keep the work directory with the processes' logs")
	flag.Parse()
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	d := &demo{moduleDir: *moduleDir}
	err := d.run(ctx)
	d.cleanup()
	if err != nil && *keep {
		fmt.Printf("logs kept in %s\n", d.dir)
	} else if d.dir != "" {
		os.RemoveAll(d.dir)
	}
	if err != nil {
		fmt.Fprintf(os.Stderr, "\ndemo FAILED after %.1fs: %v\n", time.Since(start).Seconds(), err)
		os.Exit(1)
	}
	fmt.Printf("\n==> demo finished in %.1fs; every process it started has exited\n", time.Since(start).Seconds())
}

type demo struct {
	moduleDir  string
	dir        string
	cluster    *testcluster.Cluster
	kube       kubernetes.Interface
	dyn        dynamic.Interface
	bin        string
	kubeconfig string
	nats       *harness.Process
	natsURL    string
	replicas   map[string]*harness.Replica
	pids       []int
}

// cleanup stops everything started, in reverse order, and checks that no
// child process is left.
func (d *demo) cleanup() {
	for _, r := range d.replicas {
		if !r.Exited() {
			_ = r.Stop(20 * time.Second)
		}
	}
	if d.nats != nil {
		_ = d.nats.Stop(10 * time.Second)
	}
	if d.cluster != nil {
		if err := d.cluster.Stop(); err != nil {
			fmt.Fprintln(os.Stderr, "stopping the control plane:", err)
		}
	}
	for _, pid := range d.pids {
		if err := syscall.Kill(pid, 0); err == nil {
			fmt.Fprintf(os.Stderr, "process %d is still running; killing it\n", pid)
			_ = syscall.Kill(pid, syscall.SIGKILL)
		}
	}
}

func (d *demo) run(ctx context.Context) error {
	fmt.Println("==> opkit demo: the reference operator (example/) on a local control plane")
	var err error
	if d.dir, err = os.MkdirTemp("", "opkit-demo-"); err != nil {
		return err
	}
	if err := testcluster.CheckBinaries(testcluster.DefaultBinDir()); err != nil {
		return err
	}

	step("building demo-operator (go build ./cmd/demo-operator)")
	buildDone := make(chan error, 1)
	go func() {
		var err error
		d.bin, err = harness.Build(ctx, d.moduleDir, d.dir)
		buildDone <- err
	}()

	step("starting the control plane: etcd %s + kube-apiserver %s (RBAC on) + kube-controller-manager (garbage collector, namespaces, service accounts)", testcluster.EtcdVersion, testcluster.KubernetesVersion)
	d.cluster, err = testcluster.New(ctx, testcluster.Options{ControllerManager: true})
	if err != nil {
		return err
	}
	admin := d.cluster.Config()
	info("API server %s ready in %.1fs", admin.Host, d.cluster.StartupDuration().Seconds())
	d.kube = kubernetes.NewForConfigOrDie(admin)
	d.dyn = dynamic.NewForConfigOrDie(admin)

	step("applying example/config (the kustomize layout) with server-side apply")
	objs, err := harness.Install(ctx, d.dyn)
	if err != nil {
		return err
	}
	info("%s", strings.Join(objs, ", "))
	info("(the Deployment's pods never start here: there is no scheduler or kubelet; the two replicas run as local processes instead)")

	step("starting nats-server %s with JetStream (shared by both replicas)", testcluster.NATSVersion)
	d.nats, d.natsURL, err = harness.StartNATS(filepath.Join(d.cluster.BinDir(), "nats-server"), d.dir)
	if err != nil {
		return err
	}
	d.pids = append(d.pids, d.nats.Pid())
	info("listening at %s", d.natsURL)

	if err := <-buildDone; err != nil {
		return err
	}
	step("the replicas run as ServiceAccount %s/%s, so only the RBAC of config/rbac lets them work", config.Namespace, config.ServiceAccount)
	token, err := harness.Token(ctx, d.kube, config.Namespace, config.ServiceAccount, "")
	if err != nil {
		return err
	}
	kubeconfig := filepath.Join(d.dir, "operator.kubeconfig")
	if err := harness.WriteKubeconfig(kubeconfig, admin, token); err != nil {
		return err
	}
	d.kubeconfig = kubeconfig

	d.replicas = map[string]*harness.Replica{}
	for _, id := range []string{"replica-1", "replica-2"} {
		r, err := harness.StartReplica(harness.ReplicaConfig{Bin: d.bin, Kubeconfig: kubeconfig, NATSURL: d.natsURL, Dir: d.dir, Identity: id})
		if err != nil {
			return err
		}
		d.replicas[id] = r
		d.pids = append(d.pids, r.Pid())
		info("started %s (pid %d): trigger %s, %s, health %s", id, r.Pid(), r.TriggerURL, r.MetricsURL, r.HealthURL)
	}
	leaderID, err := d.waitLeader(ctx, "", 30*time.Second)
	if err != nil {
		return err
	}
	leader := d.replicas[leaderID]
	var follower *harness.Replica
	for id, r := range d.replicas {
		if id != leaderID {
			follower = r
		}
	}
	info("%s holds Lease %s/%s; %s stands by", leaderID, config.Namespace, operator.DefaultLeaderElectionID, follower.Identity)

	step("creating namespace %q and three DemoEntities", ns)
	if _, err := d.kube.CoreV1().Namespaces().Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: ns}}, metav1.CreateOptions{}); err != nil && !apierrors.IsAlreadyExists(err) {
		return err
	}
	entities := []struct {
		name, msg string
		replicas  int64
	}{{"hello", "Hello from opkit", 2}, {"world", "Reconciled from the outside", 1}, {"lorem", "Ipsum dolor sit amet", 0}}
	for _, e := range entities {
		u := &unstructured.Unstructured{Object: map[string]any{
			"apiVersion": demov1.APIVersion, "kind": demov1.Kind,
			"metadata": map[string]any{"name": e.name, "namespace": ns},
			"spec":     map[string]any{"message": e.msg, "replicas": e.replicas},
		}}
		if _, err := d.entities().Create(ctx, u, metav1.CreateOptions{}); err != nil {
			return err
		}
	}
	for _, e := range entities {
		if err := d.waitReconciled(ctx, e.name, func(x *demov1.DemoEntity) bool { return true }); err != nil {
			return err
		}
	}
	if err := d.table(ctx, "hello", "world", "lorem"); err != nil {
		return err
	}

	step("drift: editing ConfigMap world-demo by hand (the controller Owns ConfigMaps)")
	cms := d.kube.CoreV1().ConfigMaps(ns)
	cm, err := cms.Get(ctx, "world-demo", metav1.GetOptions{})
	if err != nil {
		return err
	}
	want := cm.Data["message"]
	cm.Data["message"] = "edited by hand"
	if _, err := cms.Update(ctx, cm, metav1.UpdateOptions{}); err != nil {
		return err
	}
	edited := time.Now()
	if err := harness.Poll(ctx, 30*time.Second, func() (bool, error) {
		cm, err := cms.Get(ctx, "world-demo", metav1.GetOptions{})
		return err == nil && cm.Data["message"] == want, nil
	}); err != nil {
		return fmt.Errorf("world-demo was not repaired: %w", err)
	}
	info("world-demo's message is %q again %.2fs later: the edit reconciled world, whose apply put it back", want, time.Since(edited).Seconds())

	step("HTTP trigger, as a CI pipeline would fire it")
	if err := harness.GrantTrigger(ctx, d.kube, ns, "ci-deployer"); err != nil {
		return err
	}
	tok, err := harness.Token(ctx, d.kube, ns, "ci-deployer", operator.TriggerAudience)
	if err != nil {
		return err
	}
	tokenFile := filepath.Join(d.dir, "ci-deployer.token")
	if err := os.WriteFile(tokenFile, []byte(tok), 0o600); err != nil {
		return err
	}
	info("ServiceAccount %s/ci-deployer is bound to ClusterRole %s; its token has audience %q", ns, config.TriggerClusterRole, operator.TriggerAudience)
	before := time.Now()
	if out, ok := d.cli(ctx, "trigger", "--namespace", ns, "hello", "--via", "http", "--url", follower.TriggerURL, "--token-file", tokenFile, "--reason", "deployed build 42", "--wait", "10s"); !ok {
		return fmt.Errorf("trigger via the follower failed: %s", out)
	}
	info("(sent to the follower %s, which forwarded it to the leader %s, the one that reconciled it; --wait printed its outcome)", follower.Identity, leaderID)
	if err := d.waitReconciled(ctx, "hello", triggeredAfter(before, "deployed build 42")); err != nil {
		return err
	}
	apiTok, err := harness.Token(ctx, d.kube, ns, "ci-deployer", "")
	if err != nil {
		return err
	}
	code := d.post(leader.TriggerURL+"/reconcile/"+ns+"/hello", apiTok)
	info("the same ServiceAccount's token for the API server's own audience: %d (refused: tokens are not replayable across audiences)", code)
	code = d.post(leader.TriggerURL+"/reconcile/"+ns+"/hello", "")
	info("no token at all: %d", code)

	step("durable trigger: the annotation reconcile.opkit.dev/requestedAt, then waiting for status.lastHandledReconcileAt")
	requested := time.Now().UTC().Format(time.RFC3339Nano)
	info("$ kubectl annotate --overwrite demoentity/world -n %s reconcile.opkit.dev/requestedAt=%s", ns, requested)
	patch := fmt.Appendf(nil, `{"metadata":{"annotations":{"reconcile.opkit.dev/requestedAt":%q}}}`, requested)
	if _, err := d.entities().Patch(ctx, "world", "application/merge-patch+json", patch, metav1.PatchOptions{}); err != nil {
		return err
	}
	info("$ kubectl wait demoentity/world -n %s --for=jsonpath='{.status.lastHandledReconcileAt}'=%s", ns, requested)
	if err := d.waitReconciled(ctx, "world", func(x *demov1.DemoEntity) bool { return x.Status.LastHandledReconcileAt == requested }); err != nil {
		return err
	}
	info("handled: needs only RBAC on the DemoEntity, and survives leader changes and restarts")

	step("NATS trigger: a message {namespace, name, reason} on subject demo.reconcile")
	before = time.Now()
	if out, ok := d.cli(ctx, "trigger", "--namespace", ns, "world", "--via", "nats", "--nats-url", d.natsURL, "--reason", "order 7 shipped"); !ok {
		return fmt.Errorf("trigger via NATS failed: %s", out)
	}
	if err := d.waitReconciled(ctx, "world", triggeredAfter(before, "order 7 shipped")); err != nil {
		return err
	}
	if err := d.table(ctx, "hello", "world", "lorem"); err != nil {
		return err
	}

	step("readiness and metrics of the leader")
	d.show(leader.HealthURL+"/readyz", nil)
	d.show(leader.MetricsURL, []string{"opkit_leader_is_leader ", "opkit_trigger_http_requests_total{", "opkit_trigger_consumer_acked_total{", "opkit_reconcile_duration_seconds_count{", "opkit_queue_adds_total{"})

	step("killing the leader %s with SIGKILL (no chance to release the Lease)", leaderID)
	killed := time.Now()
	leader.Kill()
	newLeader, err := d.waitLeader(ctx, leaderID, 60*time.Second)
	if err != nil {
		return err
	}
	info("%s acquired the Lease %.1fs after the kill (a crashed leader cannot release it: it expires 15s after its last renewal)", newLeader, time.Since(killed).Seconds())

	step("changing hello (message and replicas) and deleting lorem")
	if _, err := d.entities().Patch(ctx, "hello", "application/merge-patch+json", []byte(`{"spec":{"message":"Hello again, after a failover","replicas":3}}`), metav1.PatchOptions{}); err != nil {
		return err
	}
	if err := d.entities().Delete(ctx, "lorem", metav1.DeleteOptions{}); err != nil {
		return err
	}
	if err := d.waitReconciled(ctx, "hello", func(x *demov1.DemoEntity) bool {
		return x.Status.ObservedGeneration == 2 && x.Status.ReconciledBy == newLeader
	}); err != nil {
		return err
	}
	if err := harness.Poll(ctx, 30*time.Second, func() (bool, error) {
		_, err := d.entities().Get(ctx, "lorem", metav1.GetOptions{})
		return apierrors.IsNotFound(err), nil
	}); err != nil {
		return fmt.Errorf("lorem was not deleted: %w", err)
	}
	if err := d.table(ctx, "hello", "world"); err != nil {
		return err
	}
	if err := harness.Poll(ctx, 60*time.Second, func() (bool, error) {
		_, err := cms.Get(ctx, "lorem-demo", metav1.GetOptions{})
		return apierrors.IsNotFound(err), nil
	}); err != nil {
		return fmt.Errorf("lorem-demo was not garbage-collected: %w", err)
	}
	info("lorem is gone (its finalizer recorded an Event), and the garbage collector deleted its ConfigMap lorem-demo, which it controlled")
	evs, err := d.kube.EventsV1().Events(ns).List(ctx, metav1.ListOptions{})
	if err != nil {
		return err
	}
	for _, e := range evs.Items {
		info("Event on %s/%s: %s %s — %s (by %s)", e.Regarding.Kind, e.Regarding.Name, e.Type, e.Reason, e.Note, e.ReportingInstance)
	}

	step("stopping %s", newLeader)
	if err := d.replicas[newLeader].Stop(30 * time.Second); err != nil {
		return fmt.Errorf("%s did not stop cleanly: %w", newLeader, err)
	}
	holder, _ := harness.LeaseHolder(ctx, d.kube)
	info("%s exited cleanly and released the Lease (holder now %q)", newLeader, holder)
	return d.sharded(ctx, tokenFile)
}

// shards is the demo's --shards.
const shards = 8

// sharded shows three replicas sharing the work (--shards), a trigger
// forwarded to the holder of its object's shard, and a replica killed.
func (d *demo) sharded(ctx context.Context, tokenFile string) error {
	step("sharding: three replicas share the work, each holding some of %d shards (demo-operator --shards %d)", shards, shards)
	var ids []string
	for _, id := range []string{"shard-a", "shard-b", "shard-c"} {
		r, err := harness.StartReplica(harness.ReplicaConfig{Bin: d.bin, Kubeconfig: d.kubeconfig, NATSURL: d.natsURL, Dir: d.dir, Identity: id,
			Args: []string{fmt.Sprintf("--shards=%d", shards)}})
		if err != nil {
			return err
		}
		d.replicas[id] = r
		d.pids = append(d.pids, r.Pid())
		ids = append(ids, id)
		info("started %s (pid %d): trigger %s", id, r.Pid(), r.TriggerURL)
	}
	holders, err := harness.WaitShared(ctx, d.kube, shards, ids, 60*time.Second)
	if err != nil {
		return err
	}
	info("the Leases %s-0 ... %s-%d: %s", operator.DefaultLeaderElectionID, operator.DefaultLeaderElectionID, shards-1, shareLine(holders))

	step("creating twelve DemoEntities item-00 ... item-11: each is reconciled by the holder of its UID's shard")
	var names []string
	for i := range 12 {
		name := fmt.Sprintf("item-%02d", i)
		names = append(names, name)
		u := &unstructured.Unstructured{Object: map[string]any{
			"apiVersion": demov1.APIVersion, "kind": demov1.Kind,
			"metadata": map[string]any{"name": name, "namespace": ns},
			"spec":     map[string]any{"message": "shared work", "replicas": int64(1)},
		}}
		if _, err := d.entities().Create(ctx, u, metav1.CreateOptions{}); err != nil {
			return err
		}
	}
	if err := d.waitAll(ctx, names, func(e *demov1.DemoEntity) bool { return holders[opkit.ShardOf(e.UID, shards)] == e.Status.ReconciledBy }); err != nil {
		return err
	}
	if err := d.byReplica(ctx, names); err != nil {
		return err
	}

	// A trigger for an object whose shard another replica holds.
	e, err := d.get(ctx, names[0])
	if err != nil {
		return err
	}
	owner := holders[opkit.ShardOf(e.UID, shards)]
	via := ids[(slices.Index(ids, owner)+1)%len(ids)]
	step("HTTP trigger for %s (shard %d, held by %s), sent to %s", e.Name, opkit.ShardOf(e.UID, shards), owner, via)
	before := time.Now()
	if out, ok := d.cli(ctx, "trigger", "--namespace", ns, e.Name, "--via", "http", "--url", d.replicas[via].TriggerURL, "--token-file", tokenFile, "--reason", "deployed build 43", "--wait", "10s"); !ok {
		return fmt.Errorf("trigger via %s failed: %s", via, out)
	}
	if err := d.waitReconciled(ctx, e.Name, triggeredAfter(before, "deployed build 43")); err != nil {
		return err
	}
	info("(%s read the object, found its shard held by %s and forwarded the trigger there; the outcome names the replica that ran it)", via, owner)

	victim := ids[1]
	step("killing %s with SIGKILL: its shards are taken over once their Leases expire", victim)
	killed := time.Now()
	d.replicas[victim].Kill()
	survivors := slices.DeleteFunc(slices.Clone(ids), func(id string) bool { return id == victim })
	if holders, err = harness.WaitShared(ctx, d.kube, shards, survivors, 90*time.Second); err != nil {
		return err
	}
	info("%.1fs after the kill: %s", time.Since(killed).Seconds(), shareLine(holders))

	step("changing every item: the two survivors reconcile all twelve")
	for _, n := range names {
		if _, err := d.entities().Patch(ctx, n, "application/merge-patch+json", []byte(`{"spec":{"message":"after the kill"}}`), metav1.PatchOptions{}); err != nil {
			return err
		}
	}
	if err := d.waitAll(ctx, names, func(e *demov1.DemoEntity) bool {
		return e.Spec.Message == "after the kill" && holders[opkit.ShardOf(e.UID, shards)] == e.Status.ReconciledBy
	}); err != nil {
		return err
	}
	if err := d.byReplica(ctx, names); err != nil {
		return err
	}

	step("stopping %s: each releases its shards' Leases and deletes its member Lease", strings.Join(survivors, " and "))
	for _, id := range survivors {
		if err := d.replicas[id].Stop(30 * time.Second); err != nil {
			return fmt.Errorf("%s did not stop cleanly: %w", id, err)
		}
	}
	held, err := harness.ShardHolders(ctx, d.kube, shards)
	if err != nil {
		return err
	}
	info("shard holders now: %q", held)
	step("stopping nats-server and the control plane")
	return nil
}

// shareLine says which replica holds which shards.
func shareLine(holders []string) string {
	by := map[string][]string{}
	for i, h := range holders {
		by[h] = append(by[h], fmt.Sprint(i))
	}
	var parts []string
	for _, h := range slices.Sorted(maps.Keys(by)) {
		parts = append(parts, fmt.Sprintf("%s holds %s", h, strings.Join(by[h], ",")))
	}
	return strings.Join(parts, "; ")
}

// waitAll waits until every one of names is reconciled and ok holds.
func (d *demo) waitAll(ctx context.Context, names []string, ok func(*demov1.DemoEntity) bool) error {
	for _, n := range names {
		if err := d.waitReconciled(ctx, n, ok); err != nil {
			return err
		}
	}
	return nil
}

// byReplica prints how many of names each replica reconciled last.
func (d *demo) byReplica(ctx context.Context, names []string) error {
	by := map[string][]string{}
	for _, n := range names {
		e, err := d.get(ctx, n)
		if err != nil {
			return err
		}
		by[e.Status.ReconciledBy] = append(by[e.Status.ReconciledBy], n)
	}
	for _, r := range slices.Sorted(maps.Keys(by)) {
		info("%s reconciled %d: %s", r, len(by[r]), strings.Join(by[r], " "))
	}
	return nil
}

func (d *demo) entities() dynamic.ResourceInterface {
	return d.dyn.Resource(demov1.Resource.GroupVersionResource).Namespace(ns)
}

func (d *demo) get(ctx context.Context, name string) (*demov1.DemoEntity, error) {
	u, err := d.entities().Get(ctx, name, metav1.GetOptions{})
	if err != nil {
		return nil, err
	}
	e := &demov1.DemoEntity{}
	return e, runtime.DefaultUnstructuredConverter.FromUnstructured(u.Object, e)
}

// waitReconciled waits until name's status reflects its generation, its
// ConfigMap matches and ok holds.
func (d *demo) waitReconciled(ctx context.Context, name string, ok func(*demov1.DemoEntity) bool) error {
	err := harness.Poll(ctx, 60*time.Second, func() (bool, error) {
		e, err := d.get(ctx, name)
		if err != nil {
			return false, err
		}
		if e.Status.ObservedGeneration != e.Generation || !ok(e) {
			return false, nil
		}
		cm, err := d.kube.CoreV1().ConfigMaps(ns).Get(ctx, reconciler.ConfigMapName(name), metav1.GetOptions{})
		if err != nil {
			return false, err
		}
		return cm.Data["message"] == e.Spec.Message && cm.Data["replicas"] == fmt.Sprint(e.Spec.ReplicaCount()), nil
	})
	if err != nil {
		return fmt.Errorf("%s not reconciled: %w", name, err)
	}
	return nil
}

func triggeredAfter(t time.Time, reason string) func(*demov1.DemoEntity) bool {
	return func(e *demov1.DemoEntity) bool {
		lt := e.Status.LastTrigger
		return lt != nil && lt.Source == demov1.SourceOperator && lt.Reason == reason && !lt.At.Time.Before(t.Truncate(time.Microsecond))
	}
}

func (d *demo) waitLeader(ctx context.Context, not string, timeout time.Duration) (string, error) {
	var id string
	err := harness.Poll(ctx, timeout, func() (bool, error) {
		h, err := harness.LeaseHolder(ctx, d.kube)
		if err != nil {
			return false, err
		}
		id = h
		return h != "" && h != not && d.replicas[h] != nil, nil
	})
	if err != nil {
		return "", fmt.Errorf("no new leader: %w", err)
	}
	return id, nil
}

// table prints entities with their ConfigMaps and status.
func (d *demo) table(ctx context.Context, names ...string) error {
	w := tabwriter.NewWriter(os.Stdout, 0, 0, 2, ' ', 0)
	fmt.Fprintln(w, "         ENTITY\tGEN/OBSERVED\tCONFIGMAP DATA\tREADY\tRECONCILED BY\tLAST TRIGGER")
	for _, n := range names {
		e, err := d.get(ctx, n)
		if err != nil {
			return err
		}
		cm, err := d.kube.CoreV1().ConfigMaps(ns).Get(ctx, reconciler.ConfigMapName(n), metav1.GetOptions{})
		if err != nil {
			return err
		}
		ready := "?"
		if c := meta.FindStatusCondition(e.Status.Conditions, demov1.ConditionReady); c != nil {
			ready = string(c.Status)
		}
		trig := "-"
		if lt := e.Status.LastTrigger; lt != nil {
			trig = fmt.Sprintf("%s %q at %s", lt.Source, lt.Reason, lt.At.Format("15:04:05.000"))
		}
		fmt.Fprintf(w, "         %s\t%d/%d\t%s: message=%q replicas=%s\t%s\t%s\t%s\n", n, e.Generation, e.Status.ObservedGeneration,
			cm.Name, cm.Data["message"], cm.Data["replicas"], ready, e.Status.ReconciledBy, trig)
	}
	return w.Flush()
}

// cli runs the demo-operator binary (the trigger subcommand) and prints
// the command line and its output.
func (d *demo) cli(ctx context.Context, args ...string) (string, bool) {
	shown := make([]string, len(args))
	for i, a := range args {
		shown[i] = a
		if strings.HasPrefix(a, "http://") || strings.HasPrefix(a, "nats://") || strings.HasSuffix(a, ".token") || strings.Contains(a, " ") {
			shown[i] = fmt.Sprintf("%q", a)
		}
	}
	info("$ demo-operator %s", strings.Join(shown, " "))
	out, err := exec.CommandContext(ctx, d.bin, args...).CombinedOutput()
	for _, l := range strings.Split(strings.TrimSpace(string(out)), "\n") {
		info("  %s", l)
	}
	return string(out), err == nil
}

func (d *demo) post(url, token string) int {
	req, _ := http.NewRequest(http.MethodPost, url, nil)
	if token != "" {
		req.Header.Set("Authorization", "Bearer "+token)
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return 0
	}
	resp.Body.Close()
	return resp.StatusCode
}

// show prints a URL's body, or only its lines with the given prefixes.
func (d *demo) show(url string, prefixes []string) {
	resp, err := http.Get(url)
	if err != nil {
		info("GET %s: %v", url, err)
		return
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	info("GET %s -> %s", url, resp.Status)
	for _, l := range strings.Split(strings.TrimSpace(string(b)), "\n") {
		if prefixes == nil || hasAnyPrefix(l, prefixes) {
			info("  %s", l)
		}
	}
}

func hasAnyPrefix(s string, ps []string) bool {
	for _, p := range ps {
		if strings.HasPrefix(s, p) {
			return true
		}
	}
	return false
}
