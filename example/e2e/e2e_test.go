//go:build integration

package e2e

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"os"
	"path/filepath"
	"sort"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
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
	"github.com/opkit/opkit/example/natsbroker"
	"github.com/opkit/opkit/example/operator"
	"github.com/opkit/opkit/example/reconciler"
	"github.com/opkit/opkit/reconcile/envtest"
)

// natsServer is the nats-server hack/controlplane.sh builds beside the
// control plane (make test and make demo run it).
var natsServer = filepath.Join(envtest.DefaultBinDir(), "nats-server")

// TestMain checks for nats-server, then envtest checks for the control
// plane, with the garbage collector and the sharding gate these tests use.
func TestMain(m *testing.M) {
	if _, err := os.Stat(natsServer); err != nil {
		fmt.Fprintf(os.Stderr, "e2e: no nats-server (%v): run hack/controlplane.sh build (make test does)\n", err)
		os.Exit(1)
	}
	envtest.Main(m, envtest.Options{ControllerManager: true, ShardedListAndWatch: true})
}

const entities = 50

// fired is one trigger sent to the operator.
type fired struct {
	name, reason, via string
	at                time.Time
}

type env struct {
	t        *testing.T
	cp       *envtest.Environment // the control plane
	ns       string
	kube     kubernetes.Interface
	dyn      dynamic.Interface
	replicas map[string]*harness.Replica
	token    string
	nc       *nats.Conn

	mu    sync.Mutex
	fired []fired
}

func (e *env) entities() dynamic.ResourceInterface {
	return e.dyn.Resource(demov1.Resource.GroupVersionResource).Namespace(e.ns)
}

func (e *env) get(ctx context.Context, name string) (*demov1.DemoEntity, error) {
	u, err := e.entities().Get(ctx, name, metav1.GetOptions{})
	if err != nil {
		return nil, err
	}
	obj := &demov1.DemoEntity{}
	return obj, runtime.DefaultUnstructuredConverter.FromUnstructured(u.Object, obj)
}

func (e *env) record(f fired) {
	e.mu.Lock()
	e.fired = append(e.fired, f)
	e.mu.Unlock()
}

// triggerHTTP posts a trigger, following 503 answers to the leader they
// name (or to the other replica while no leader is known), until 202.
func (e *env) triggerHTTP(ctx context.Context, name, reason string) error {
	f := fired{name: name, reason: reason, via: "http", at: time.Now()}
	body, _ := json.Marshal(map[string]string{"reason": reason})
	var last string
	err := harness.Poll(ctx, 90*time.Second, func() (bool, error) {
		for _, r := range e.replicas {
			if r.Exited() {
				continue
			}
			req, _ := http.NewRequestWithContext(ctx, http.MethodPost, r.TriggerURL+"/reconcile/"+e.ns+"/"+name, bytes.NewReader(body))
			req.Header.Set("Content-Type", "application/json")
			req.Header.Set("Authorization", "Bearer "+e.token)
			resp, err := http.DefaultClient.Do(req)
			if err != nil {
				last = err.Error()
				continue
			}
			resp.Body.Close()
			switch resp.StatusCode {
			case http.StatusAccepted:
				return true, nil
			case http.StatusServiceUnavailable:
				last = fmt.Sprintf("503 from %s (leader %q)", r.Identity, resp.Header.Get("X-Opkit-Leader"))
			case http.StatusTooManyRequests: // the trigger budget is spent: later, as a pipeline would
				last = fmt.Sprintf("429 from %s (Retry-After %s)", r.Identity, resp.Header.Get("Retry-After"))
			default:
				return false, harness.Fatal(fmt.Errorf("trigger %s via %s: %s", name, r.Identity, resp.Status))
			}
		}
		return false, nil
	})
	if err != nil {
		return fmt.Errorf("trigger %s: %w (last: %s)", name, err, last)
	}
	e.record(f)
	return nil
}

func (e *env) triggerNATS(ctx context.Context, name, reason string) error {
	f := fired{name: name, reason: reason, via: "nats", at: time.Now()}
	if _, err := natsbroker.Publish(ctx, e.nc, "", natsbroker.Pointer{Namespace: e.ns, Name: name, Reason: reason}); err != nil {
		return err
	}
	e.record(f)
	return nil
}

func (e *env) leader(ctx context.Context, not string) string {
	e.t.Helper()
	var id string
	err := harness.Poll(ctx, 60*time.Second, func() (bool, error) {
		h, err := harness.LeaseHolder(ctx, e.kube)
		id = h
		return err == nil && h != "" && h != not && e.replicas[h] != nil && !e.replicas[h].Exited(), err
	})
	if err != nil {
		e.t.Fatalf("no leader other than %q: %v", not, err)
	}
	return id
}

// reflected reports whether every trigger fired so far for name shows in
// its status.lastTrigger at or after the trigger's time.
func (e *env) reflected(obj *demov1.DemoEntity) (bool, string) {
	e.mu.Lock()
	defer e.mu.Unlock()
	lt := obj.Status.LastTrigger
	for _, f := range e.fired {
		if f.name != obj.Name {
			continue
		}
		if lt == nil || lt.At.Time.Before(f.at.Truncate(time.Microsecond)) {
			return false, fmt.Sprintf("%s trigger %q at %s not reflected (lastTrigger %+v)", f.via, f.reason, f.at.Format(time.RFC3339Nano), lt)
		}
	}
	return true, ""
}

// converged checks one entity: ConfigMap matches the spec, status observed
// the generation, Ready is True, and every trigger is reflected.
func (e *env) converged(ctx context.Context, name string) (bool, string) {
	obj, err := e.get(ctx, name)
	if err != nil {
		return false, err.Error()
	}
	if obj.Status.ObservedGeneration != obj.Generation {
		return false, fmt.Sprintf("%s: observedGeneration %d, generation %d", name, obj.Status.ObservedGeneration, obj.Generation)
	}
	if c := meta.FindStatusCondition(obj.Status.Conditions, demov1.ConditionReady); c == nil || c.Status != metav1.ConditionTrue || c.ObservedGeneration != obj.Generation {
		return false, fmt.Sprintf("%s: Ready = %+v", name, c)
	}
	cm, err := e.kube.CoreV1().ConfigMaps(e.ns).Get(ctx, reconciler.ConfigMapName(name), metav1.GetOptions{})
	if err != nil {
		return false, err.Error()
	}
	if cm.Data["message"] != obj.Spec.Message || cm.Data["replicas"] != fmt.Sprint(obj.Spec.ReplicaCount()) {
		return false, fmt.Sprintf("%s: ConfigMap %v, spec %q/%d", name, cm.Data, obj.Spec.Message, obj.Spec.ReplicaCount())
	}
	if ref := metav1.GetControllerOf(cm); ref == nil || ref.UID != obj.UID {
		return false, fmt.Sprintf("%s: ConfigMap not controlled by the entity: %+v", name, ref)
	}
	return e.reflected(obj)
}

func (e *env) waitConverged(ctx context.Context, names []string) {
	e.t.Helper()
	var why string
	err := harness.Poll(ctx, 120*time.Second, func() (bool, error) {
		for _, n := range names {
			if ok, w := e.converged(ctx, n); !ok {
				why = w
				return false, nil
			}
		}
		return true, nil
	})
	if err != nil {
		for id, r := range e.replicas {
			e.t.Logf("--- %s log tail:\n%s", id, r.Tail(30))
		}
		e.t.Fatalf("not converged: %s (%v)", why, err)
	}
}

func name(i int) string { return fmt.Sprintf("entity-%02d", i) }

// create creates n entities, name(i) with i % mod replicas, waits until
// they converged, and returns their names.
func (e *env) create(ctx context.Context, n, mod int) []string {
	e.t.Helper()
	var names []string
	for i := range n {
		names = append(names, name(i))
		u := &unstructured.Unstructured{Object: map[string]any{
			"apiVersion": demov1.APIVersion, "kind": demov1.Kind,
			"metadata": map[string]any{"name": name(i), "namespace": e.ns},
			"spec":     map[string]any{"message": fmt.Sprintf("message %d", i), "replicas": int64(i % mod)},
		}}
		if _, err := e.entities().Create(ctx, u, metav1.CreateOptions{}); err != nil {
			e.t.Fatal(err)
		}
	}
	e.waitConverged(ctx, names)
	return names
}

// setup starts a control plane (with kube-controller-manager's garbage
// collector when gc is set), builds the operator, installs example/config,
// starts nats-server and a fresh namespace whose ServiceAccount "ci" may
// trigger (e.token is its token); start runs a replica as the operator's
// ServiceAccount (only the RBAC in config/rbac lets it work) until the
// test ends.
func setup(t *testing.T, gc bool) (e *env, start func(id string, args ...string) *harness.Replica) {
	ctx := context.Background()
	c := envtest.Start(t, envtest.Options{ControllerManager: gc, ShardedListAndWatch: true})
	e = &env{t: t, cp: c, kube: kubernetes.NewForConfigOrDie(c.Config()), dyn: dynamic.NewForConfigOrDie(c.Config()), replicas: map[string]*harness.Replica{}}
	dir := t.TempDir()

	moduleDir, err := filepath.Abs("..")
	if err != nil {
		t.Fatal(err)
	}
	bin, err := harness.Build(ctx, moduleDir, dir)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := harness.Install(ctx, e.dyn); err != nil {
		t.Fatal(err)
	}
	natsProc, natsURL, err := harness.StartNATS(natsServer, dir)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { natsProc.Stop(10 * time.Second) })
	if e.nc, err = nats.Connect(natsURL); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(e.nc.Close)
	tok, err := c.ServiceAccountToken(ctx, config.Namespace, config.ServiceAccount, "")
	if err != nil {
		t.Fatal(err)
	}
	kubeconfig := filepath.Join(dir, "operator.kubeconfig")
	if err := harness.WriteKubeconfig(kubeconfig, c.Config(), tok); err != nil {
		t.Fatal(err)
	}
	e.ns = c.Namespace(t)
	if err := harness.GrantTrigger(ctx, e.kube, e.ns, "ci"); err != nil {
		t.Fatal(err)
	}
	if e.token, err = c.ServiceAccountToken(ctx, e.ns, "ci", operator.TriggerAudience); err != nil {
		t.Fatal(err)
	}
	return e, func(id string, args ...string) *harness.Replica {
		t.Helper()
		r, err := harness.StartReplica(harness.ReplicaConfig{Bin: bin, Kubeconfig: kubeconfig, NATSURL: natsURL, Dir: dir, Identity: id, Args: args})
		if err != nil {
			t.Fatal(err)
		}
		e.replicas[id] = r
		t.Cleanup(func() {
			if r.Exited() {
				return
			}
			if err := r.Stop(30 * time.Second); err != nil {
				t.Errorf("%s: %v\n%s", id, err, r.Tail(20))
			}
		})
		return r
	}
}

func TestTwoReplicasFiftyEntitiesTriggersAndFailover(t *testing.T) {
	ctx := context.Background()
	// A garbage collector: the ConfigMaps of deleted entities go with them.
	e, start := setup(t, true)
	for _, id := range []string{"replica-a", "replica-b"} {
		start(id, "--concurrency=8")
	}
	first := e.leader(ctx, "")
	t.Logf("leader: %s", first)

	// A name longer than a label value is refused by the CRD: the operator
	// labels the ConfigMap it keeps with the entity's name.
	long := &unstructured.Unstructured{Object: map[string]any{
		"apiVersion": demov1.APIVersion, "kind": demov1.Kind,
		"metadata": map[string]any{"name": strings.Repeat("n", 64), "namespace": e.ns},
		"spec":     map[string]any{"message": "too long a name"},
	}}
	if _, err := e.entities().Create(ctx, long, metav1.CreateOptions{}); !apierrors.IsInvalid(err) {
		t.Fatalf("creating an entity with a 64-character name: %v, want 422 Invalid", err)
	}

	names := e.create(ctx, entities, 11)

	// Phase A: one trigger per entity, half over HTTP, half over NATS.
	for i := range entities {
		var err error
		if i%2 == 0 {
			err = e.triggerHTTP(ctx, name(i), fmt.Sprintf("phase A http %d", i))
		} else {
			err = e.triggerNATS(ctx, name(i), fmt.Sprintf("phase A nats %d", i))
		}
		if err != nil {
			t.Fatal(err)
		}
	}
	e.waitConverged(ctx, names)
	checkReasons(t, e, ctx, names, "phase A")

	// The endpoint's authentication against the real API server: a token
	// for the API server's audience is refused (401), and so is a caller
	// without the trigger permission (403).
	leaderURL := e.replicas[first].TriggerURL + "/reconcile/" + e.ns + "/" + name(0)
	apiTok, err := e.cp.ServiceAccountToken(ctx, e.ns, "ci", "")
	if err != nil {
		t.Fatal(err)
	}
	if code := post(t, leaderURL, apiTok); code != http.StatusUnauthorized {
		t.Errorf("API-audience token: %d, want 401", code)
	}
	intruder, err := e.cp.ServiceAccountToken(ctx, e.ns, "intruder", operator.TriggerAudience) // a new ServiceAccount
	if err != nil {
		t.Fatal(err)
	}
	if code := post(t, leaderURL, intruder); code != http.StatusForbidden {
		t.Errorf("token of a ServiceAccount without the trigger role: %d, want 403", code)
	}

	// Phase A's NATS triggers all went to the leader: the follower's
	// consumer pauses while its queue's intake is suspended, so it took
	// no message from the shared durable consumer (none bounced off it).
	for name, r := range e.replicas {
		if name == first {
			continue
		}
		m := scrape(t, r.MetricsURL)
		if v := m["opkit_trigger_consumer_received_total"]; v != 0 {
			t.Errorf("follower %s received %v NATS messages, want none", name, v)
		}
	}

	// Kill the leader and, while the survivor waits for the Lease to
	// expire, change specs and fire more triggers: the follower answers
	// HTTP with 503 (retried by the caller) and takes no NATS message, so
	// they wait in the stream for the next leader and none is lost.
	e.replicas[first].Kill()
	t.Logf("killed %s", first)
	for i := range entities {
		if i%5 == 0 {
			patch := fmt.Sprintf(`{"spec":{"message":"changed after failover %d","replicas":%d}}`, i, (i+3)%11)
			if _, err := e.entities().Patch(ctx, name(i), "application/merge-patch+json", []byte(patch), metav1.PatchOptions{}); err != nil {
				t.Fatal(err)
			}
		}
	}
	var wg sync.WaitGroup
	errs := make(chan error, entities)
	for i := range entities {
		if i%2 == 1 {
			wg.Add(1)
			go func() { // HTTP callers retry until the new leader answers
				defer wg.Done()
				errs <- e.triggerHTTP(ctx, name(i), fmt.Sprintf("phase B http %d", i))
			}()
		} else if err := e.triggerNATS(ctx, name(i), fmt.Sprintf("phase B nats %d", i)); err != nil {
			t.Fatal(err)
		}
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		if err != nil {
			t.Fatal(err)
		}
	}
	second := e.leader(ctx, first)
	t.Logf("new leader: %s", second)
	e.waitConverged(ctx, names)
	checkReasons(t, e, ctx, names, "phase B")
	// While it was a follower the survivor refused HTTP triggers (503);
	// the NATS triggers of phase B waited for it to lead (checked above by
	// their reasons).
	m := scrape(t, e.replicas[second].MetricsURL)
	if v := m["opkit_trigger_consumer_received_total"]; v == 0 {
		t.Errorf("%s received no NATS message after taking over; metrics: %v", second, m)
	}
	if v := m[`opkit_trigger_http_requests_total{code="503",reason="ServiceUnavailable"}`]; v == 0 {
		t.Errorf("%s never answered 503 while following; metrics: %v", second, m)
	}
	for i := 0; i < entities; i += 5 {
		obj, _ := e.get(ctx, name(i))
		if obj.Generation != 2 || obj.Status.ReconciledBy != second {
			t.Errorf("%s: generation %d reconciled by %q, want 2 by %s", name(i), obj.Generation, obj.Status.ReconciledBy, second)
		}
	}

	// Deleting entities runs their finalizer (an Event), then the garbage
	// collector removes their ConfigMaps.
	deleted := names[entities-5:]
	for _, n := range deleted {
		if err := e.entities().Delete(ctx, n, metav1.DeleteOptions{}); err != nil {
			t.Fatal(err)
		}
	}
	err = harness.Poll(ctx, 60*time.Second, func() (bool, error) {
		for _, n := range deleted {
			if _, err := e.entities().Get(ctx, n, metav1.GetOptions{}); !apierrors.IsNotFound(err) {
				return false, nil
			}
			if _, err := e.kube.CoreV1().ConfigMaps(e.ns).Get(ctx, reconciler.ConfigMapName(n), metav1.GetOptions{}); !apierrors.IsNotFound(err) {
				return false, nil
			}
		}
		return true, nil
	})
	if err != nil {
		t.Fatalf("deleted entities or their ConfigMaps remain: %v", err)
	}
	evs, err := e.kube.EventsV1().Events(e.ns).List(ctx, metav1.ListOptions{})
	if err != nil {
		t.Fatal(err)
	}
	finalized := map[string]bool{}
	for _, ev := range evs.Items {
		if ev.Reason == reconciler.EventFinalized {
			finalized[ev.Regarding.Name] = true
		}
	}
	for _, n := range deleted {
		if !finalized[n] {
			t.Errorf("no %s Event for %s", reconciler.EventFinalized, n)
		}
	}
	e.waitConverged(ctx, names[:entities-5])

	// The NATS dead letter is empty: no trigger was given up on.
	js := dlqCount(t, e.nc)
	if js != 0 {
		t.Errorf("%d dead-lettered triggers, want 0", js)
	}
	t.Logf("%d triggers fired (HTTP and NATS), all reflected", len(e.fired))
}

// checkReasons asserts that each entity's last trigger is the last one
// fired for it (the status names its source and reason).
func checkReasons(t *testing.T, e *env, ctx context.Context, names []string, phase string) {
	t.Helper()
	for _, b := range e.unreflected(t, ctx, names) {
		t.Errorf("%s: %s", phase, b)
	}
}

// waitReasons waits until each entity's last trigger is the last one
// fired for it: a trigger handed back by a replica without the shard
// reaches its holder a DroppedDelay later, after the change made with it
// may have been reconciled already.
func waitReasons(t *testing.T, e *env, ctx context.Context, names []string, phase string) {
	t.Helper()
	var bad []string
	if err := harness.Poll(ctx, 120*time.Second, func() (bool, error) {
		bad = e.unreflected(t, ctx, names)
		return len(bad) == 0, nil
	}); err != nil {
		t.Fatalf("%s: %v: %s", phase, err, strings.Join(bad, "; "))
	}
}

// unreflected lists the entities whose status does not name the last
// trigger fired for them.
func (e *env) unreflected(t *testing.T, ctx context.Context, names []string) []string {
	t.Helper()
	last := map[string]fired{}
	e.mu.Lock()
	for _, f := range e.fired {
		last[f.name] = f
	}
	e.mu.Unlock()
	var bad []string
	for _, n := range names {
		obj, err := e.get(ctx, n)
		if err != nil {
			t.Fatal(err)
		}
		lt, f := obj.Status.LastTrigger, last[n]
		if lt == nil || lt.Source != demov1.SourceOperator || lt.Reason != f.reason {
			bad = append(bad, fmt.Sprintf("%s: lastTrigger %+v, last fired %q", n, lt, f.reason))
		}
	}
	sort.Strings(bad)
	return bad
}

func dlqCount(t *testing.T, nc *nats.Conn) uint64 {
	t.Helper()
	js, err := nc.JetStream()
	if err != nil {
		t.Fatal(err)
	}
	info, err := js.StreamInfo(natsbroker.DefaultDeadLetterStream)
	if err != nil {
		t.Fatal(err)
	}
	return info.State.Msgs
}

func post(t *testing.T, url, token string) int { return postReason(t, url, token, "") }

// scrape returns the samples of a Prometheus text endpoint by series.
func scrape(t *testing.T, url string) map[string]float64 {
	t.Helper()
	resp, err := http.Get(url)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	out := map[string]float64{}
	sc := bufio.NewScanner(resp.Body)
	sc.Buffer(make([]byte, 64<<10), 1<<20)
	for sc.Scan() {
		line := sc.Text()
		if strings.HasPrefix(line, "#") {
			continue
		}
		i := strings.LastIndexByte(line, ' ')
		if i < 0 {
			continue
		}
		v, err := strconv.ParseFloat(line[i+1:], 64)
		if err == nil {
			out[line[:i]] = v
		}
	}
	return out
}

// Three replicas of the operator built from example/, run with
// --shards 8 as the operator's ServiceAccount (the sharding Role in
// config/rbac must be enough): they share the shards fairly, every
// entity is reconciled by the holder of its UID's shard, an HTTP trigger
// sent to any replica is served by that holder (forwarded with the
// caller's token, authenticated and authorized on both), NATS triggers
// reach the holders through the shared stream, and after a replica is
// killed the two others take its shards, reconcile every change and
// serve every trigger, none dead-lettered.
func TestThreeShardedReplicasShareTheWorkAndSurviveAKill(t *testing.T) {
	ctx := context.Background()
	const shards, n = 8, 24
	e, start := setup(t, false)
	ids := []string{"shard-a", "shard-b", "shard-c"}
	for _, id := range ids {
		start(id, fmt.Sprintf("--shards=%d", shards))
	}
	holders := func(live ...string) []string {
		t.Helper()
		hs, err := harness.WaitShared(ctx, e.kube, shards, live, 90*time.Second)
		if err != nil {
			t.Fatal(err)
		}
		return hs
	}
	hs := holders(ids...)
	t.Logf("shard holders: %q", hs)

	names := e.create(ctx, n, 3)
	byHolder := func(hs []string) {
		t.Helper()
		for _, n := range names {
			obj, err := e.get(ctx, n)
			if err != nil {
				t.Fatal(err)
			}
			if want := hs[opkit.ShardOf(obj.UID, shards)]; obj.Status.ReconciledBy != want {
				t.Errorf("%s reconciled by %q, want %s, the holder of shard %d", n, obj.Status.ReconciledBy, want, opkit.ShardOf(obj.UID, shards))
			}
		}
	}
	byHolder(hs)

	// HTTP triggers to every replica in turn, NATS triggers to the stream.
	for i, n := range names {
		via := e.replicas[ids[i%len(ids)]]
		reason := fmt.Sprintf("http %d via %s", i, via.Identity)
		// 429 when the caller's share of the trigger budget is spent: later,
		// as a pipeline would.
		// The time is taken before the post: the reconcile may write its
		// status before the 202 reaches this goroutine.
		at, code := time.Now(), 0
		if err := harness.Poll(ctx, 90*time.Second, func() (bool, error) {
			code = postReason(t, via.TriggerURL+"/reconcile/"+e.ns+"/"+n, e.token, reason)
			return code != http.StatusTooManyRequests, nil
		}); err != nil || code != http.StatusAccepted {
			t.Fatalf("trigger of %s via %s: %d %v, want 202", n, via.Identity, code, err)
		}
		e.record(fired{name: n, reason: reason, via: "http", at: at})
	}
	e.waitConverged(ctx, names)
	waitReasons(t, e, ctx, names, "HTTP through every replica")
	for i, n := range names {
		if err := e.triggerNATS(ctx, n, fmt.Sprintf("nats %d", i)); err != nil {
			t.Fatal(err)
		}
	}
	e.waitConverged(ctx, names)
	waitReasons(t, e, ctx, names, "NATS")
	byHolder(hs)

	// A replica dies; the two others take its shards, then every change
	// and trigger is served by the new holders.
	e.replicas[ids[1]].Kill()
	t.Logf("killed %s", ids[1])
	hs = holders(ids[0], ids[2])
	t.Logf("shard holders after the kill: %q", hs)
	for i, n := range names {
		patch := fmt.Sprintf(`{"spec":{"message":"after the kill %d"}}`, i)
		if _, err := e.entities().Patch(ctx, n, "application/merge-patch+json", []byte(patch), metav1.PatchOptions{}); err != nil {
			t.Fatal(err)
		}
		if i%2 == 0 {
			err := e.triggerHTTP(ctx, n, fmt.Sprintf("after the kill, http %d", i))
			if err != nil {
				t.Fatal(err)
			}
		} else if err := e.triggerNATS(ctx, n, fmt.Sprintf("after the kill, nats %d", i)); err != nil {
			t.Fatal(err)
		}
	}
	e.waitConverged(ctx, names)
	waitReasons(t, e, ctx, names, "after the kill")
	byHolder(hs)
	if dl := dlqCount(t, e.nc); dl != 0 {
		t.Errorf("%d dead-lettered triggers, want 0", dl)
	}
	forwarded := 0.0
	for _, id := range []string{ids[0], ids[2]} {
		forwarded += scrape(t, e.replicas[id].MetricsURL)[`opkit_trigger_http_requests_total{code="202",reason="Forwarded"}`]
	}
	if forwarded == 0 {
		t.Errorf("no trigger was forwarded to a shard's holder")
	}
}

// postReason posts a trigger, with reason in a JSON body unless it is
// empty, and returns the status code.
func postReason(t *testing.T, url, token, reason string) int {
	t.Helper()
	req, _ := http.NewRequest(http.MethodPost, url, nil)
	if reason != "" {
		body, _ := json.Marshal(map[string]string{"reason": reason})
		req, _ = http.NewRequest(http.MethodPost, url, bytes.NewReader(body))
		req.Header.Set("Content-Type", "application/json")
	}
	req.Header.Set("Authorization", "Bearer "+token)
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	return resp.StatusCode
}
