package floodsbench

import (
	"bytes"
	"context"
	"encoding/json"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"os"
	"os/exec"
	"slices"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/go-logr/logr"
	authzv1 "k8s.io/api/authorization/v1"
	corev1 "k8s.io/api/core/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/client-go/dynamic"
	"k8s.io/client-go/kubernetes"
	"k8s.io/klog/v2"

	"github.com/opkit/opkit"
	"github.com/opkit/opkit/bench/internal/fixture"
	"github.com/opkit/opkit/bench/internal/stats"
	"github.com/opkit/opkit/internal/floodtest"
	"github.com/opkit/opkit/internal/testcluster"
	"github.com/opkit/opkit/reconcile"
	"github.com/opkit/opkit/trigger"
	"github.com/opkit/opkit/watcher"
)

const (
	namespace = "trigger-floods"
	// The identities of the valid floods and of the well-behaved client:
	// a caller asking for less than another goes first.
	flooder, pipeline = "deployer", "pipeline"
	// crowd is the number of ServiceAccounts of the many-identities
	// flood, each allowed to trigger like the flooder.
	crowd = 64
	// driven is the number of ConfigMaps the driver changes and the
	// floods trigger; clientObjects the number of those that only the
	// well-behaved client triggers, each once in a run (phases of
	// perPhase triggers).
	driven        = 198
	clientObjects = phases * perPhase
	// phaseLength is the length of every phase. The next phase starts
	// once the flood has stopped and the well-behaved client's triggers
	// are answered, and after the valid-trigger flood a refill later.
	phaseLength = 8 * time.Second
	// refill is the pause after the valid-trigger flood, which spends the
	// trigger budget (trigger.Config.Rate's defaults: 5/s, a burst of 20):
	// the next phase starts with it full.
	refill = 5 * time.Second
	// backoff is the pause after a garbage flood from the well-behaved
	// client's address: the authenticator's AuthFailureBackoff (10s) and a
	// second, so that the next phase finds the address refused no more.
	backoff = 11 * time.Second
	// pace is the well-behaved client's interval: a trigger a second
	// (issue 33), under its share of the trigger budget (half of the
	// default Rate), so that idle it is never refused; perPhase of them
	// in a phase.
	pace     = time.Second
	perPhase = int(phaseLength / pace)
	// floodWorkers is the goroutines of the valid and garbage-token
	// floods (one request at a time each); slowConns the connections of
	// the slow-body flood.
	floodWorkers = 64
	slowConns    = 200
	// addresses is the number of source addresses of the garbage flood
	// from many addresses; nameConns, the connections of the
	// random-names flood.
	addresses = 1000
	nameConns = 128
	// The paced crowd: pacedCallers of the crowd's ServiceAccounts, each
	// pacing pacedRate triggers a second (floodtest.Config.Pace; together
	// twice the trigger budget, each within half of it) of pacedObjects
	// ConfigMaps nothing else triggers, so that each trigger needs a
	// token of the budget; measured after settle, longer than the
	// budget's memory of what a caller asked for.
	pacedCallers = 4
	pacedRate    = 2.5
	pacedObjects = 100
	settle       = 12 * time.Second
	// workers is the controller's: enough that the budget, not the API
	// server's latency on a busy machine, bounds the reconciles.
	workers = 16
	// drive is the driver's interval between two updates: about 50 a
	// second, twice what the controller's request budget lets it
	// reconcile, so that the queue always holds watch work.
	drive = 20 * time.Millisecond
	// Addresses: the floods of issue 22 come from attacker, the
	// well-behaved client from wellBehaved (the handler counts failed
	// authentications by address); the many identities from crowdFrom,
	// the random names from namesFrom, the garbage from many addresses
	// from addresses of them from firstAddress up, and the neighbour
	// flood from wellBehaved. Linux routes all of 127.0.0.0/8 to the
	// loopback interface.
	attacker     = "127.0.0.3"
	wellBehaved  = "127.0.0.2"
	crowdFrom    = "127.0.0.4"
	namesFrom    = "127.0.0.5"
	firstAddress = "127.0.1.0"
)

// capRate is the total rate of the capped crowd floods (issue 33: at
// 2,000 requests a second, the watch keeps at least half of its idle
// throughput).
var capRate = flag.Float64("floodrate", 2000, "the total requests a second of the capped floods")

var configMaps = opkit.Resource{
	GroupVersionResource: schema.GroupVersionResource{Version: "v1", Resource: "configmaps"},
	Kind:                 "ConfigMap",
	Namespaced:           true,
}

var discard = slog.New(slog.NewTextHandler(io.Discard, nil))

// env is the process-wide fixture: the control plane, its objects, the
// unthrottled clients and the well-behaved client's token.
var env struct {
	fixture.Cluster
	kube    *kubernetes.Clientset // setup and the driver
	reviews *kubernetes.Clientset // the handler's TokenReviews and SubjectAccessReviews
	driven  []string              // the driver's and the floods' ConfigMaps
	own     []string              // the well-behaved client's
	paced   []string              // the paced crowd's
	token   string                // the flooder's
	// pipelineToken is the well-behaved client's; crowdTokens, those of
	// the many-identities flood, then the paced crowd's (crowdSAs).
	pipelineToken string
	crowdTokens   []string
}

func TestMain(m *testing.M) {
	// client-go logs (through klog, to stderr) the GETs that stopping a
	// run's controller cancels; a line in the middle of a result line
	// would keep benchstat from reading it.
	klog.SetLogger(logr.Discard())
	if os.Getenv(childEnv) != "" {
		os.Exit(floodChild())
	}
	code := m.Run()
	env.Stop()
	os.Exit(code)
}

// populate creates the namespace, the ConfigMaps and the ServiceAccounts
// allowed to trigger them (update on configmaps, the handler's default
// SubjectAccessReview), and waits until the API server's authorizer
// allows it.
func populate(ctx context.Context, c *testcluster.Cluster) error {
	ctx, cancel := context.WithTimeout(ctx, 2*time.Minute)
	defer cancel()
	cfg := c.Config()
	cfg.QPS, cfg.Burst = -1, 0
	var err error
	if env.kube, err = kubernetes.NewForConfig(cfg); err != nil {
		return err
	}
	if env.reviews, err = kubernetes.NewForConfig(cfg); err != nil {
		return err
	}
	kube := env.kube
	if _, err := kube.CoreV1().Namespaces().Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: namespace}}, metav1.CreateOptions{}); err != nil {
		return err
	}
	for i := range driven {
		env.driven = append(env.driven, fmt.Sprintf("driven-%03d", i))
	}
	for i := range clientObjects {
		env.own = append(env.own, fmt.Sprintf("client-%03d", i))
	}
	for i := range pacedObjects {
		env.paced = append(env.paced, fmt.Sprintf("paced-%03d", i))
	}
	for _, name := range slices.Concat(env.driven, env.own, env.paced) {
		if _, err := kube.CoreV1().ConfigMaps(namespace).Create(ctx, &corev1.ConfigMap{ObjectMeta: metav1.ObjectMeta{Name: name}, Data: map[string]string{"v": "initial"}}, metav1.CreateOptions{}); err != nil {
			return err
		}
	}
	if _, err := kube.RbacV1().Roles(namespace).Create(ctx, &rbacv1.Role{
		ObjectMeta: metav1.ObjectMeta{Name: "trigger-configmaps"},
		Rules:      []rbacv1.PolicyRule{{APIGroups: []string{""}, Resources: []string{"configmaps"}, Verbs: []string{"update"}}},
	}, metav1.CreateOptions{}); err != nil {
		return err
	}
	var subjects []rbacv1.Subject
	for _, sa := range slices.Concat([]string{flooder, pipeline}, crowdSAs()) {
		subjects = append(subjects, rbacv1.Subject{Kind: rbacv1.ServiceAccountKind, Name: sa, Namespace: namespace})
	}
	if _, err := kube.RbacV1().RoleBindings(namespace).Create(ctx, &rbacv1.RoleBinding{
		ObjectMeta: metav1.ObjectMeta{Name: "trigger-configmaps"},
		RoleRef:    rbacv1.RoleRef{APIGroup: rbacv1.GroupName, Kind: "Role", Name: "trigger-configmaps"},
		Subjects:   subjects,
	}, metav1.CreateOptions{}); err != nil {
		return err
	}
	if env.token, err = c.ServiceAccountToken(ctx, namespace, flooder, trigger.DefaultAudience); err != nil {
		return err
	}
	if env.pipelineToken, err = c.ServiceAccountToken(ctx, namespace, pipeline, trigger.DefaultAudience); err != nil {
		return err
	}
	for _, sa := range crowdSAs() {
		tok, err := c.ServiceAccountToken(ctx, namespace, sa, trigger.DefaultAudience)
		if err != nil {
			return err
		}
		env.crowdTokens = append(env.crowdTokens, tok)
	}
	// RBAC grants reach the authorizer asynchronously; the handler
	// caches a denial for 5s, so it must never see one.
	for _, sa := range slices.Concat([]string{flooder, pipeline}, crowdSAs()) {
		for {
			sar, err := kube.AuthorizationV1().SubjectAccessReviews().Create(ctx, &authzv1.SubjectAccessReview{Spec: authzv1.SubjectAccessReviewSpec{
				User:               "system:serviceaccount:" + namespace + ":" + sa,
				Groups:             []string{"system:serviceaccounts", "system:serviceaccounts:" + namespace, "system:authenticated"},
				ResourceAttributes: &authzv1.ResourceAttributes{Namespace: namespace, Verb: "update", Resource: "configmaps", Name: env.own[0]},
			}}, metav1.CreateOptions{})
			if err == nil && sar.Status.Allowed {
				break
			}
			select {
			case <-ctx.Done():
				return fmt.Errorf("the RBAC grant of %s never reached the authorizer: %w", sa, ctx.Err())
			case <-time.After(50 * time.Millisecond):
			}
		}
	}
	return nil
}

// endpoint is one run's system under test: a controller over the
// ConfigMaps, its trigger endpoint on loopback, and the driver.
type endpoint struct {
	url     string
	queued  func() int         // the entries waiting in the controller's queue
	reviews *floodtest.Reviews // the handler's, counted
	// watched counts the reconciles whose Sources include
	// opkit.APIServer; updates, the driver's.
	watched, updates atomic.Int64
	stop             func()
}

// start starts the endpoint and returns once the controller's initial
// list has been reconciled and then the driver's changes fill its queue.
// The initial list has spent the burst of the controller's request
// budget, so from then on the budget bounds every phase alike.
func start(b *testing.B, c *testcluster.Cluster) *endpoint {
	b.Helper()
	// The controller's client has a budget of 50 requests a second
	// (burst 100), and the reconciler makes two GETs through it: the
	// watch's reconciles share that budget with the triggers' reads.
	cfg := c.Config()
	cfg.QPS, cfg.Burst = 50, 100
	dyn, err := dynamic.NewForConfig(cfg)
	if err != nil {
		b.Fatal(err)
	}
	cms := dyn.Resource(configMaps.GroupVersionResource).Namespace(namespace)
	e := &endpoint{}
	ctrl, err := reconcile.NewController(reconcile.Config[*corev1.ConfigMap]{
		Name: "floods-bench", Resource: configMaps, Dynamic: dyn,
		Reconciler: reconcile.Func[*corev1.ConfigMap](func(ctx context.Context, req reconcile.Request[*corev1.ConfigMap]) (reconcile.Result, error) {
			for range 2 {
				if _, err := cms.Get(ctx, req.Key.Name, metav1.GetOptions{}); err != nil {
					return reconcile.Done(), err
				}
			}
			if req.Sources.Has(opkit.APIServer) {
				e.watched.Add(1)
			}
			return reconcile.Done(), nil
		}),
		Concurrency: workers,
		Watch:       watcher.Config[*corev1.ConfigMap]{Namespace: namespace},
		NoEvents:    true,
		Logger:      discard,
	})
	if err != nil {
		b.Fatal(err)
	}
	// The handler with its defaults: the Kubernetes-native authenticator
	// (TokenReview, SubjectAccessReview), MaxAuthFailures 10 within 10s,
	// and the controller's trigger budget (5/s, burst 20).
	// Its reviews are counted.
	e.reviews = &floodtest.Reviews{Client: env.reviews}
	e.reviews.Known(slices.Concat([]string{env.token, env.pipelineToken}, env.crowdTokens)...)
	h, err := trigger.NewHandler(ctrl.Trigger(), trigger.HandlerConfig{Reviews: e.reviews, Logger: discard})
	if err != nil {
		b.Fatal(err)
	}
	srv, err := trigger.NewServer(trigger.ServerConfig{Handler: h, Logger: discard})
	if err != nil {
		b.Fatal(err)
	}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		b.Fatal(err)
	}
	e.url = "http://" + ln.Addr().String()

	ctx, cancel := context.WithCancel(context.Background())
	ran, served := make(chan error, 1), make(chan error, 1)
	go func() { ran <- ctrl.Run(ctx) }()
	go func() { served <- srv.Serve(ctx, ln) }()
	var driver sync.WaitGroup
	e.stop = func() {
		cancel()
		driver.Wait()
		if err := <-served; err != nil {
			b.Errorf("server: %v", err)
		}
		if err := <-ran; err != nil {
			b.Errorf("controller: %v", err)
		}
	}
	q := ctrl.Queues()[0]
	e.queued = q.Len
	// The initial list is reconciled before the driver starts: its
	// entries wait at list priority, below the driver's watch events, and
	// would stay queued, so that a trigger of one of the well-behaved
	// client's objects would join its entry and read nothing.
	e.await(b, "the initial list reconciled", func() bool {
		return e.watched.Load() >= int64(driven+clientObjects+pacedObjects) && q.Len() == 0 && ctrl.Check() == nil
	})
	driver.Go(func() { e.drive(ctx) })
	e.await(b, "the driver's changes queued", func() bool { return q.Len() >= 2*workers })
	return e
}

// await polls cond until it holds; after two minutes it stops e and fails
// b.
func (e *endpoint) await(b *testing.B, what string, cond func() bool) {
	deadline := time.Now().Add(2 * time.Minute)
	for !cond() {
		if time.Now().After(deadline) {
			e.stop()
			b.Fatalf("%s: not within two minutes (%d watch reconciles)", what, e.watched.Load())
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// drive updates the ConfigMaps round-robin, one every drive, until ctx
// ends.
func (e *endpoint) drive(ctx context.Context) {
	floodtest.Drive(ctx, env.kube.CoreV1().ConfigMaps(namespace), env.driven, drive, &e.updates)
}

// crowdSAs are the ServiceAccounts of the many-identities flood, then
// those of the paced crowd: not among them, so that neither phase brings
// history into the other's trigger budget.
func crowdSAs() []string {
	var sas []string
	for i := range crowd + pacedCallers {
		sas = append(sas, fmt.Sprintf("crowd-%02d", i))
	}
	return sas
}

// answer is what the well-behaved client got for one trigger: the status
// code (0: no answer), the message of a refusal, and the time from the
// request to the answer's end.
type answer struct {
	code    int
	message string
	took    time.Duration
}

// send POSTs a trigger of name with the ServiceAccount's token and waits
// for the whole answer.
func send(ctx context.Context, hc *http.Client, url, name string) answer {
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, url+"/reconcile/"+namespace+"/"+name, nil)
	if err != nil {
		return answer{}
	}
	req.Header.Set("Authorization", "Bearer "+env.pipelineToken)
	start := time.Now()
	resp, err := hc.Do(req)
	if err != nil {
		return answer{took: time.Since(start)}
	}
	defer resp.Body.Close()
	var st trigger.Status
	if resp.StatusCode != http.StatusAccepted {
		_ = json.NewDecoder(resp.Body).Decode(&st)
	}
	_, _ = io.Copy(io.Discard, resp.Body)
	return answer{code: resp.StatusCode, message: st.Message, took: time.Since(start)}
}

// phase is one part of a run: the well-behaved client beside the flood
// named flood (a key of floods; "": none, the idle phase), from the
// addresses and with the tokens setup gives it and capped at capRate if
// capped, started settle before the phase, then pause before the next
// phase.
type phase struct {
	name   string
	flood  string
	setup  func(*floodtest.Config)
	capped bool
	settle time.Duration
	pause  time.Duration
}

// phases is the number of phases of a run, as runPhases lists them.
const phases = 13

// runPhases are a run's phases, in order: idle, the floods of issue 22,
// the paced crowd, the crowd floods of issue 33 at full rate, then capped.
func runPhases() []phase {
	from := func(ip string) func(*floodtest.Config) { return func(c *floodtest.Config) { c.LocalIP = ip } }
	identities := func(c *floodtest.Config) { c.Tokens, c.LocalIP = env.crowdTokens[:crowd], crowdFrom }
	many := func(c *floodtest.Config) { c.LocalIPs = floodtest.Loopback(firstAddress, addresses) }
	names := func(c *floodtest.Config) { c.Workers, c.LocalIP = nameConns, namesFrom }
	paced := func(c *floodtest.Config) {
		c.Tokens, c.LocalIP, c.Names, c.Pace = env.crowdTokens[crowd:], crowdFrom, env.paced, pacedRate
	}
	ps := []phase{
		{name: "idle"},
		{name: "valid", flood: "valid", setup: from(attacker), pause: refill},
		{name: "slow", flood: "slow", setup: from(attacker)},
		{name: "garbage", flood: "garbage", setup: from(attacker)},
		// Its four identities are not among the 64 (crowdSAs).
		{name: "paced", flood: "identities", setup: paced, settle: settle, pause: refill},
	}
	for _, capped := range []bool{false, true} {
		suffix := map[bool]string{true: "-capped"}[capped]
		ps = append(ps,
			phase{name: "identities" + suffix, flood: "identities", setup: identities, capped: capped, pause: refill},
			phase{name: "addresses" + suffix, flood: "addresses", setup: many, capped: capped},
			phase{name: "names" + suffix, flood: "names", setup: names, capped: capped, pause: refill},
			phase{name: "neighbour" + suffix, flood: "garbage", setup: from(wellBehaved), capped: capped, pause: backoff},
		)
	}
	return ps
}

// floods are the floods a phase may run, by name.
var floods = map[string]func(context.Context, floodtest.Config) floodtest.Result{
	"valid": floodtest.Valid,
	"slow": func(ctx context.Context, cfg floodtest.Config) floodtest.Result {
		return floodtest.SlowBodies(ctx, cfg, slowConns)
	},
	"garbage":    floodtest.GarbageTokens,
	"identities": floodtest.ManyIdentities,
	"addresses":  floodtest.GarbageFromAddresses,
	"names":      floodtest.RandomNames,
}

// childEnv, set in a process's environment, makes it a flood child: the
// floods run in a process of their own, so that this one's CPU time is
// the operator's (the controller's, the endpoint's, the driver's and the
// well-behaved client's).
const childEnv = "OPKIT_FLOODS_CHILD"

// order is what a flood child runs: a flood of floods with its Config.
type order struct {
	Flood  string
	Config floodtest.Config
}

// floodChild runs the flood of the order it reads from its standard
// input until that input ends (or ten minutes pass), then writes the
// flood's Result to its standard output as JSON. It returns the
// process's exit code.
func floodChild() int {
	var o order
	if err := json.NewDecoder(os.Stdin).Decode(&o); err != nil || floods[o.Flood] == nil {
		fmt.Fprintf(os.Stderr, "flood child: order %+v: %v\n", o, err)
		return 2
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Minute)
	defer cancel()
	go func() { _, _ = io.Copy(io.Discard, os.Stdin); cancel() }() // stop: the parent closed it, or is gone
	if err := json.NewEncoder(os.Stdout).Encode(floods[o.Flood](ctx, o.Config)); err != nil {
		fmt.Fprintf(os.Stderr, "flood child: %v\n", err)
		return 1
	}
	return 0
}

// startChild starts a flood child on o; stop ends it and returns what the
// flood saw and the child's CPU time.
func startChild(o order) (stop func() (floodtest.Result, time.Duration, error), err error) {
	exe, err := os.Executable()
	if err != nil {
		return nil, err
	}
	cmd := exec.Command(exe, "-test.run=^$")
	cmd.Env = append(os.Environ(), childEnv+"=1")
	var out, errs bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &errs
	in, err := cmd.StdinPipe()
	if err != nil {
		return nil, err
	}
	if err := cmd.Start(); err != nil {
		return nil, err
	}
	if err := json.NewEncoder(in).Encode(o); err != nil {
		in.Close()
		_ = cmd.Wait()
		return nil, fmt.Errorf("flood child: %w (%s)", err, errs.Bytes())
	}
	return func() (floodtest.Result, time.Duration, error) {
		in.Close()
		err := cmd.Wait()
		var res floodtest.Result
		if err == nil {
			err = json.Unmarshal(out.Bytes(), &res)
		}
		if err != nil {
			return res, 0, fmt.Errorf("flood child: %w (%s)", err, errs.Bytes())
		}
		return res, cmd.ProcessState.UserTime() + cmd.ProcessState.SystemTime(), nil
	}, nil
}

// cpuTime is this process's CPU time so far, user and system.
func cpuTime() time.Duration {
	var ru syscall.Rusage
	if err := syscall.Getrusage(syscall.RUSAGE_SELF, &ru); err != nil {
		return 0
	}
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}

// tally is what the phase of that name measured, summed over the runs.
type tally struct {
	sent, ok   int
	latencies  []time.Duration // of the answered triggers
	reconciles int64           // watch reconciles
	elapsed    time.Duration
	flooding   time.Duration          // the flood's, settle included
	reviews    floodtest.ReviewCounts // sent from the phase's start to its end
	cpu        time.Duration          // this process's (the operator's)
	floodCPU   time.Duration          // the flood child's
	flooded    int                    // the flood's requests answered, settle included
}

// measure runs p: it starts the flood in a child process (settle before
// the phase), sends perPhase
// triggers from the well-behaved client, one every pace from the phase's
// start, each to the next of its own ConfigMaps (*next counts them) and
// each in its own goroutine, so that a slow answer delays no later
// trigger; it counts the watch reconciles, the reviews and this process's
// CPU time until the phase's end, then stops the flood and waits for the
// answers (a trigger belongs to the phase it was sent in). It fails b
// when the phase measured nothing: no answer to the well-behaved client,
// no watch reconcile, or no answer to the flood.
func measure(b *testing.B, ctx context.Context, e *endpoint, p phase, hc *http.Client, next *int, t *tally) {
	var (
		res      floodtest.Result
		floodCPU time.Duration
	)
	stopFlood := func() {}
	if p.flood != "" {
		cfg := floodtest.Config{URL: e.url, Namespace: namespace, Names: env.driven, Token: env.token, Workers: floodWorkers}
		p.setup(&cfg)
		if p.capped {
			cfg.Rate = *capRate
		}
		stop, err := startChild(order{Flood: p.flood, Config: cfg})
		if err != nil {
			b.Fatalf("%s: %v", p.name, err)
		}
		stopFlood = sync.OnceFunc(func() {
			if res, floodCPU, err = stop(); err != nil {
				b.Errorf("%s: %v", p.name, err)
			}
		})
		defer stopFlood() // on a failure too
	}
	started := time.Now()
	time.Sleep(p.settle)
	begin, cpu0, r0 := time.Now(), cpuTime(), e.reviews.Counts()
	w0, u0 := e.watched.Load(), e.updates.Load()
	var (
		wg      sync.WaitGroup
		mu      sync.Mutex
		answers []answer
	)
	for i := range perPhase {
		time.Sleep(time.Until(begin.Add(time.Duration(i) * pace)))
		name := env.own[*next%clientObjects]
		*next++
		wg.Go(func() {
			a := send(ctx, hc, e.url, name)
			mu.Lock()
			answers = append(answers, a)
			mu.Unlock()
		})
	}
	time.Sleep(time.Until(begin.Add(phaseLength))) // the rest of the phase
	reconciles, updates, elapsed, queued := e.watched.Load()-w0, e.updates.Load()-u0, time.Since(begin), e.queued()
	cpu, reviews := cpuTime()-cpu0, e.reviews.Counts().Sub(r0)
	stopFlood()
	wg.Wait()

	codes, refusals, ok, errs := map[int]int{}, map[string]int{}, 0, 0
	for _, a := range answers {
		if a.code == 0 {
			errs++
			continue
		}
		codes[a.code]++
		if a.code == http.StatusAccepted {
			ok++
		} else {
			refusals[fmt.Sprintf("%d %s", a.code, a.message)]++
		}
		t.latencies = append(t.latencies, a.took)
	}
	t.sent += len(answers)
	t.ok += ok
	t.reconciles += reconciles
	t.elapsed += elapsed
	t.flooding += begin.Sub(started) + elapsed
	t.reviews.TokenReviews += reviews.TokenReviews
	t.reviews.Garbage += reviews.Garbage
	t.reviews.SubjectAccessReviews += reviews.SubjectAccessReviews
	t.cpu += cpu
	t.floodCPU += floodCPU
	t.flooded += res.Answered()
	b.Logf("%s: well-behaved client: %d triggers, answers %v, %d without, refusals %v; %d watch reconciles in %v (%d updates, %d queued at the end); %d TokenReviews (%d of unknown tokens), %d SubjectAccessReviews; CPU %v here, %v the flood's; flood: answers %v, %d without",
		p.name, len(answers), codes, errs, refusals, reconciles, elapsed.Round(time.Millisecond), updates, queued,
		reviews.TokenReviews, reviews.Garbage, reviews.SubjectAccessReviews, cpu.Round(time.Millisecond), floodCPU.Round(time.Millisecond), res.Codes, res.Errors)
	switch {
	case len(answers) == errs:
		b.Fatalf("%s: none of the well-behaved client's %d triggers was answered: the endpoint is not measured", p.name, len(answers))
	case reconciles == 0:
		b.Fatalf("%s: no watch reconcile in %v: the driver or the controller is not running", p.name, elapsed.Round(time.Millisecond))
	case p.flood != "" && len(res.Codes) == 0:
		b.Fatalf("%s: the flood got no answer (%d errors): are its addresses local?", p.name, res.Errors)
	case p.flood == "" && ok == 0:
		b.Fatalf("%s: no 202 for the well-behaved client (%v): the token or its RBAC grant is broken", p.name, codes)
	}
}

// BenchmarkTriggerFloods reports, for the idle phase and for each flood,
// the well-behaved client's success rate (<phase>-ok-%: the share of its
// triggers answered 202), its p50 and p99 from request to answer
// (<phase>-p50-ms, <phase>-p99-ms, over the answered triggers), the
// watch's reconciles per second (<phase>-watch-rec/s) and their share of
// the idle phase's (<phase>-watch-%idle), the reviews sent to the API
// server per second (<phase>-tokenreviews/s, <phase>-sars/s), the
// operator's CPU (<phase>-cpu-cores: this process's, without the flood's),
// and for a flood its answered requests a second (<phase>-flood-req/s)
// and the operator's CPU time per flood request above its idle CPU
// (<phase>-cpu-us/req; for garbage tokens, what a refusal costs). One
// iteration is a whole phased run: a fresh controller, endpoint and
// driver, then the phases of runPhases, in that order.
func BenchmarkTriggerFloods(b *testing.B) {
	c := env.Get(b, populate)
	ps := runPhases()
	tallies := make([]tally, len(ps))
	hc := floodtest.NewClient(wellBehaved, 4)
	defer hc.CloseIdleConnections()
	ctx := context.Background()
	next := 0
	for b.Loop() {
		func() {
			e := start(b, c)
			defer e.stop()
			// One trigger first, answered 202, so that the idle phase
			// does not pay for the first TokenReview alone.
			if a := send(ctx, hc, e.url, env.driven[0]); a.code != http.StatusAccepted {
				b.Fatalf("a first trigger: %d", a.code)
			}
			for i, p := range ps {
				measure(b, ctx, e, p, hc, &next, &tallies[i])
				time.Sleep(p.pause)
			}
		}()
	}
	b.ReportMetric(0, "ns/op") // the phases' length, not a result
	idle := tallies[0]
	idleRate, idleCPU := float64(idle.reconciles)/idle.elapsed.Seconds(), idle.cpu.Seconds()/idle.elapsed.Seconds()
	for i, p := range ps {
		t := tallies[i]
		lat := slices.Sorted(slices.Values(t.latencies))
		secs := t.elapsed.Seconds()
		b.ReportMetric(100*float64(t.ok)/float64(t.sent), p.name+"-ok-%")
		b.ReportMetric(ms(stats.Percentile(lat, 0.50)), p.name+"-p50-ms")
		b.ReportMetric(ms(stats.Percentile(lat, 0.99)), p.name+"-p99-ms")
		b.ReportMetric(float64(t.reconciles)/secs, p.name+"-watch-rec/s")
		b.ReportMetric(100*float64(t.reconciles)/secs/idleRate, p.name+"-watch-%idle")
		b.ReportMetric(float64(t.reviews.TokenReviews)/secs, p.name+"-tokenreviews/s")
		b.ReportMetric(float64(t.reviews.SubjectAccessReviews)/secs, p.name+"-sars/s")
		b.ReportMetric(t.cpu.Seconds()/secs, p.name+"-cpu-cores")
		if p.flood != "" && t.flooded > 0 {
			rate := float64(t.flooded) / t.flooding.Seconds() // settle included
			b.ReportMetric(rate, p.name+"-flood-req/s")
			if p.flood != "slow" { // its requests are connections that take seconds each
				b.ReportMetric(1e6*(t.cpu.Seconds()-idleCPU*secs)/(rate*secs), p.name+"-cpu-us/req")
			}
		}
	}
}

func ms(d time.Duration) float64 { return float64(d) / float64(time.Millisecond) }
