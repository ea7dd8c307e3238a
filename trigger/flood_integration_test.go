//go:build integration

package trigger_test

import (
	"context"
	"crypto/rand"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	authzv1 "k8s.io/api/authorization/v1"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/dynamic"
	"k8s.io/client-go/kubernetes"

	"github.com/opkit/opkit"
	"github.com/opkit/opkit/internal/floodtest"
	"github.com/opkit/opkit/internal/testcluster"
	"github.com/opkit/opkit/reconcile"
	"github.com/opkit/opkit/trigger"
	"github.com/opkit/opkit/watcher"
)

// The budgets issue 33 asks for, as the bounds of the crowd floods'
// reviews (to be confirmed with the handler's names and defaults): new
// tokens' TokenReviews, globally; a caller's SubjectAccessReviews.
const (
	reviewBudgetPerSecond = 20
	reviewBudgetBurst     = 40
	authzBudgetPerSecond  = 5
	authzBudgetBurst      = 10
)

const (
	floodPhase   = 8 * time.Second // each flood's length; shorter than floodBackoff
	floodWorkers = 64
	// The crowd floods of issue 33: crowd ServiceAccounts allowed to
	// trigger, one connection each; garbage tokens from that many
	// loopback addresses; one token on nameConns connections triggering
	// random names.
	crowd     = 64
	addresses = 1000
	nameConns = 128
	// The paced crowd of issue 33: pacedCallers of the crowd's
	// ServiceAccounts, each pacing pacedRate triggers a second (together
	// twice the trigger budget's 5 a second, each within its half) of
	// pacedObjects ConfigMaps nothing else triggers, so that each trigger
	// needs a token of the budget. The phase is measured once the crowd
	// has kept its pace for pacedSettle, longer than the budget's memory
	// of what a caller asked for: its steady state.
	pacedCallers = 4
	pacedRate    = 2.5
	pacedObjects = 100
	pacedSettle  = 12 * time.Second
	// The authenticator's address gate, set explicitly (they are its
	// defaults) so that the garbage-token bound below refers to them.
	floodMaxAuthFailures = 10
	floodBackoff         = 10 * time.Second
	// Addresses: the floods come from attacker, the client that must be
	// served from wellBehaved (the authenticator counts failed
	// authentications by address). Linux routes all of 127.0.0.0/8 to
	// the loopback interface.
	attacker    = "127.0.0.3"
	wellBehaved = "127.0.0.2"
	// The crowd floods come from crowdFrom (the identities) and namesFrom
	// (random names), the garbage from many addresses from addresses
	// addresses from firstAddress up, and the neighbour flood from
	// wellBehaved.
	crowdFrom    = "127.0.0.4"
	namesFrom    = "127.0.0.5"
	firstAddress = "127.0.1.0"
)

// TestFloodsAgainstTheAPIServer runs the floods of issue 22 against the
// SDK's handler (trigger.NewHandler served by trigger.NewServer) in front
// of a real controller, with real TokenReviews and SubjectAccessReviews,
// and asserts outcomes and counts, never durations:
//
//   - a flood of valid triggers leaves the watch's reconciles at least half
//     of their idle throughput in the same run, and a change made during
//     it is reconciled;
//   - a flood of slow bodies leaves a well-behaved client served;
//   - a flood of garbage tokens leaves a well-behaved client served and
//     costs a bounded number of TokenReviews;
//   - bad UTF-8 in the body's reason is refused, and nothing is queued;
//   - the crowd floods of issue 33 (4 identities each pacing 2.5 valid
//     triggers a second of objects nothing else triggers; valid triggers
//     from 64 identities, one connection each; garbage tokens from 1,000
//     addresses; one token on 128 connections triggering random names;
//     garbage tokens from the well-behaved client's own address) leave
//     the well-behaved client,
//     which sends a trigger a second, all its triggers answered and at
//     least 99 % of them accepted; the garbage from many addresses costs
//     at most the global budget of TokenReviews, and the random names at
//     most the caller's budget of SubjectAccessReviews.
//
// The controller's client has a budget of 50 requests a second (burst
// 100), and its reconciler makes two GETs through it, so the watch's
// reconciles are bounded by that budget, which the triggers' reads share;
// a driver updates the ConfigMaps at about 50 a second throughout, so the
// queue always holds watch work.
func TestFloodsAgainstTheAPIServer(t *testing.T) {
	c := testcluster.Shared(t)
	ns := c.Namespace(t)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Minute)
	defer cancel()
	unthrottled := func() *kubernetes.Clientset {
		cfg := c.Config()
		cfg.QPS, cfg.Burst = -1, 0
		k, err := kubernetes.NewForConfig(cfg)
		if err != nil {
			t.Fatal(err)
		}
		return k
	}
	kube := unthrottled() // setup and the driver

	// 198 ConfigMaps the driver updates, 8 only the pipeline triggers, one
	// changed once during the valid-trigger flood, one for the bad-UTF-8
	// trigger.
	var driven []string
	for i := range 198 {
		driven = append(driven, fmt.Sprintf("cm-%03d", i))
	}
	const target, quiet = "target", "quiet"
	var own []string // the pipeline's: nothing else changes or triggers them
	for i := range 8 {
		own = append(own, fmt.Sprintf("own-%d", i))
	}
	var pipe []string // the pipeline's in the crowd floods, one each second
	for i := range 5 * int(floodPhase/time.Second) {
		pipe = append(pipe, fmt.Sprintf("pipe-%02d", i))
	}
	var paced []string // the paced crowd's: nothing else changes or triggers them
	for i := range pacedObjects {
		paced = append(paced, fmt.Sprintf("paced-%03d", i))
	}
	objects := slices.Concat(driven, own, pipe, paced, []string{target, quiet})
	for _, name := range objects {
		if _, err := kube.CoreV1().ConfigMaps(ns).Create(ctx, &corev1.ConfigMap{ObjectMeta: metav1.ObjectMeta{Name: name}, Data: map[string]string{"v": "initial"}}, metav1.CreateOptions{}); err != nil {
			t.Fatal(err)
		}
	}

	// RBAC: the deployer (whose token floods), the pipeline (the
	// well-behaved client) and the crowd may update (so trigger)
	// ConfigMaps.
	var crowdSAs, crowdTokens []string // the 64 of the many identities, then the paced four
	for i := range crowd + pacedCallers {
		crowdSAs = append(crowdSAs, fmt.Sprintf("crowd-%02d", i))
	}
	grantTrigger(ctx, t, kube, ns, slices.Concat([]string{"deployer", "pipeline"}, crowdSAs)...)
	for _, sa := range crowdSAs {
		tok, err := c.ServiceAccountToken(ctx, ns, sa, trigger.DefaultAudience)
		if err != nil {
			t.Fatal(err)
		}
		crowdTokens = append(crowdTokens, tok)
	}
	token, err := c.ServiceAccountToken(ctx, ns, "deployer", trigger.DefaultAudience)
	if err != nil {
		t.Fatal(err)
	}
	pipelineToken, err := c.ServiceAccountToken(ctx, ns, "pipeline", trigger.DefaultAudience)
	if err != nil {
		t.Fatal(err)
	}
	// RBAC grants reach the authorizer asynchronously: poll for it here,
	// so that the handler (which caches a denial for 5s) never sees one.
	for _, sa := range slices.Concat([]string{"deployer", "pipeline"}, crowdSAs) {
		waitFor(t, time.Minute, "the RBAC grant of "+sa, func() bool {
			sar, err := kube.AuthorizationV1().SubjectAccessReviews().Create(ctx, &authzv1.SubjectAccessReview{Spec: authzv1.SubjectAccessReviewSpec{
				User:               "system:serviceaccount:" + ns + ":" + sa,
				Groups:             []string{"system:serviceaccounts", "system:serviceaccounts:" + ns, "system:authenticated"},
				ResourceAttributes: &authzv1.ResourceAttributes{Namespace: ns, Verb: "update", Resource: "configmaps", Name: quiet},
			}}, metav1.CreateOptions{})
			return err == nil && sar.Status.Allowed
		})
	}

	// The controller, over a client with a request budget.
	ccfg := c.Config()
	ccfg.QPS, ccfg.Burst = 50, 100
	dyn, err := dynamic.NewForConfig(ccfg)
	if err != nil {
		t.Fatal(err)
	}
	cms := dyn.Resource(configMaps.GroupVersionResource).Namespace(ns)
	var watchReconciles atomic.Int64
	var mu sync.Mutex
	seen := map[string]string{} // the last data value reconciled, by name
	var quietReasons [][]string // the reasons of every reconcile of quiet
	lastSeen := func(name string) string { mu.Lock(); defer mu.Unlock(); return seen[name] }
	rec := reconcile.Func[*corev1.ConfigMap](func(ctx context.Context, req reconcile.Request[*corev1.ConfigMap]) (reconcile.Result, error) {
		for range 2 {
			if _, err := cms.Get(ctx, req.Key.Name, metav1.GetOptions{}); err != nil {
				return reconcile.Done(), err
			}
		}
		if req.Sources.Has(opkit.APIServer) {
			watchReconciles.Add(1)
		}
		mu.Lock()
		defer mu.Unlock()
		if req.Object != nil {
			seen[req.Key.Name] = req.Object.Data["v"]
		}
		if req.Key.Name == quiet {
			quietReasons = append(quietReasons, slices.Clone(req.Reasons))
		}
		return reconcile.Done(), nil
	})
	ctrl, err := reconcile.NewController(reconcile.Config[*corev1.ConfigMap]{
		Name: "test.opkit.dev/flood", Resource: configMaps, Dynamic: dyn, Reconciler: rec,
		// Enough workers that the budget, not the API server's latency
		// on a busy machine, bounds the reconciles.
		Concurrency: 16,
		Watch:       watcher.Config[*corev1.ConfigMap]{Namespace: ns},
		NoEvents:    true, Logger: discard,
	})
	if err != nil {
		t.Fatal(err)
	}
	runCtx, stopRun := context.WithCancel(ctx)
	ran := make(chan error, 1)
	go func() { ran <- ctrl.Run(runCtx) }()
	t.Cleanup(func() {
		stopRun()
		if err := <-ran; err != nil {
			t.Errorf("controller: %v", err)
		}
	})

	// The endpoint, on a loopback listener that counts connections by
	// client address.
	reviews := &floodtest.Reviews{Client: unthrottled()}
	reviews.Known(slices.Concat([]string{token, pipelineToken}, crowdTokens)...)
	auth, err := trigger.NewKubeAuthenticator(trigger.KubeAuthConfig{Client: reviews, MaxAuthFailures: floodMaxAuthFailures, AuthFailureBackoff: floodBackoff})
	if err != nil {
		t.Fatal(err)
	}
	h, err := trigger.NewHandler(ctrl.Trigger(), trigger.HandlerConfig{Authenticator: auth, Logger: discard})
	if err != nil {
		t.Fatal(err)
	}
	srv, err := trigger.NewServer(trigger.ServerConfig{Handler: h, Logger: discard})
	if err != nil {
		t.Fatal(err)
	}
	inner, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	ln := &acceptCounter{Listener: inner, from: map[string]int{}}
	serveCtx, stopServe := context.WithCancel(ctx)
	served := make(chan error, 1)
	go func() { served <- srv.Serve(serveCtx, ln) }()
	t.Cleanup(func() {
		stopServe()
		if err := <-served; err != nil {
			t.Errorf("server: %v", err)
		}
	})
	base := "http://" + inner.Addr().String()

	// The well-behaved client.
	good := floodtest.NewClient(wellBehaved, 4)
	t.Cleanup(good.CloseIdleConnections)
	send := func(name, body string) (int, []byte) {
		t.Helper()
		var r io.Reader
		if body != "" {
			r = strings.NewReader(body)
		}
		req, err := http.NewRequestWithContext(ctx, http.MethodPost, base+"/reconcile/"+ns+"/"+name, r)
		if err != nil {
			t.Fatal(err)
		}
		req.Header.Set("Authorization", "Bearer "+pipelineToken)
		if body != "" {
			req.Header.Set("Content-Type", "application/json")
		}
		resp, err := good.Do(req)
		if err != nil {
			t.Fatalf("trigger %s: %v", name, err)
		}
		defer resp.Body.Close()
		b, _ := io.ReadAll(resp.Body)
		return resp.StatusCode, b
	}
	// triggers sends a trigger of each of names, one every 300ms, and
	// fails the test for each that does not get 202.
	triggers := func(phase string, names []string) {
		tick := time.NewTicker(300 * time.Millisecond)
		defer tick.Stop()
		for i, name := range names {
			if code, body := send(name, ""); code != http.StatusAccepted {
				t.Errorf("%s: the well-behaved client's trigger %d (%s) got %d %s, want 202", phase, i, name, code, body)
			}
			<-tick.C
		}
	}
	floodCfg := floodtest.Config{URL: base, Namespace: ns, Names: append(slices.Clone(driven), target), Token: token, Workers: floodWorkers, LocalIP: attacker}

	// The initial list reconciled, all of it (its GETs spend the client's
	// burst: from here on the budget bounds every phase alike), before
	// the driver starts: list entries wait below the driver's watch
	// events and would stay queued, and a trigger of an object nothing
	// else triggers (own, pipe, paced) would join its entry for free
	// rather than take a token of the trigger budget and read it.
	q := ctrl.Queues()[0]
	waitFor(t, 2*time.Minute, "the initial list reconciled", func() bool {
		return watchReconciles.Load() >= int64(len(objects)) && q.Len() == 0
	})
	// The driver: about 50 updates a second, round-robin, for the whole
	// test.
	var updates atomic.Int64
	driverCtx, stopDriver := context.WithCancel(ctx)
	driverDone := make(chan struct{})
	go func() {
		defer close(driverDone)
		floodtest.Drive(driverCtx, kube.CoreV1().ConfigMaps(ns), driven, 20*time.Millisecond, &updates)
	}()
	t.Cleanup(func() { stopDriver(); <-driverDone })
	waitFor(t, time.Minute, "the driver's changes queued", func() bool { return q.Len() >= 32 })
	if code, body := send(driven[0], ""); code != http.StatusAccepted {
		t.Fatalf("a first trigger: %d %s", code, body)
	}

	// Idle.
	w0, u0 := watchReconciles.Load(), updates.Load()
	time.Sleep(floodPhase) // the phase itself
	idle := watchReconciles.Load() - w0
	t.Logf("idle: %d watch reconciles in %v (%d updates)", idle, floodPhase, updates.Load()-u0)
	if idle == 0 {
		t.Fatal("no watch reconciles while idle: nothing to compare the floods with")
	}

	// Valid triggers from 64 goroutines with the deployer's token;
	// meanwhile the target changes, and the change must be reconciled
	// while the flood goes on, and the pipeline's triggers of objects
	// nothing else asks for (each a read: no entry waits for them) are
	// accepted, as a caller asking for less goes first.
	r0 := reviews.Counts()
	w0, u0 = watchReconciles.Load(), updates.Load()
	stopValid := startFlood(t, ctx, func(ctx context.Context) floodtest.Result { return floodtest.Valid(ctx, floodCfg) })
	pipelineDone := make(chan struct{})
	go func() {
		defer close(pipelineDone)
		time.Sleep(time.Second) // the flood under way
		triggers("valid-trigger flood", own)
	}()
	value := fmt.Sprintf("changed-%d", time.Now().UnixNano())
	if _, err := kube.CoreV1().ConfigMaps(ns).Patch(ctx, target, types.MergePatchType, fmt.Appendf(nil, `{"data":{"v":%q}}`, value), metav1.PatchOptions{}); err != nil {
		t.Fatal(err)
	}
	start := time.Now()
	phaseEnd := time.NewTimer(floodPhase)
	flooded, changeSeen := int64(-1), time.Duration(0)
	waitFor(t, 2*time.Minute, "the target's change reconciled during the valid-trigger flood", func() bool {
		select {
		case <-phaseEnd.C:
			flooded = watchReconciles.Load() - w0
		default:
		}
		if changeSeen == 0 && lastSeen(target) == value {
			changeSeen = time.Since(start)
		}
		return changeSeen > 0 && flooded >= 0
	})
	<-pipelineDone
	res := stopValid()
	rv := reviews.Counts().Sub(r0)
	t.Logf("valid-trigger flood: %d watch reconciles in %v (idle: %d), %d updates; change reconciled after %v; answers %v, %d errors; %d TokenReviews, %d SubjectAccessReviews",
		flooded, floodPhase, idle, updates.Load()-u0, changeSeen.Round(time.Millisecond), res.Codes, res.Errors, rv.TokenReviews, rv.SubjectAccessReviews)
	if res.Codes[http.StatusAccepted] == 0 {
		t.Errorf("the valid-trigger flood got no 202 at all: %v", res.Codes)
	}
	if 2*flooded < idle {
		t.Errorf("watch reconciles during the valid-trigger flood: %d, want at least half of the idle phase's %d", flooded, idle)
	}

	// Slow bodies from 200 connections, once the trigger budget (5/s,
	// burst 20) has refilled after the flood spent it.
	time.Sleep(5 * time.Second) // the refill, a deliberate pause
	a0 := ln.accepted(attacker)
	stopSlow := startFlood(t, ctx, func(ctx context.Context) floodtest.Result { return floodtest.SlowBodies(ctx, floodCfg, 200) })
	start = time.Now()
	waitFor(t, time.Minute, "200 slow connections", func() bool { return ln.accepted(attacker)-a0 >= 200 })
	triggers("slow-body flood", driven[:10])
	time.Sleep(time.Until(start.Add(floodPhase))) // the rest of the phase
	res = stopSlow()
	t.Logf("slow-body flood: %d connections, answers %v, %d without an answer", ln.accepted(attacker)-a0, res.Codes, res.Errors)
	if res.Codes[http.StatusRequestTimeout] == 0 || len(res.Codes) != 1 {
		t.Errorf("the slow bodies got %v, want only 408s", res.Codes)
	}

	// Garbage tokens from 64 goroutines. Once the address has failed
	// MaxAuthFailures times its new tokens are refused before any review
	// (a probe from the address with a garbage token of its own, one at
	// a time, tells), and once the reviews it started are over, the
	// well-behaved client is served.
	// (Before, a request of its that needs a review may find all
	// KubeAuthConfig.MaxReviews taken: 429, by design.)
	g0 := reviews.Counts().Garbage
	start = time.Now()
	stopGarbage := startFlood(t, ctx, func(ctx context.Context) floodtest.Result { return floodtest.GarbageTokens(ctx, floodCfg) })
	// The phase ends on time, whatever the well-behaved client is doing,
	// so that it stays within one AuthFailureBackoff.
	ended := time.AfterFunc(floodPhase, func() { stopGarbage() })
	defer ended.Stop()
	probe := floodtest.NewClient(attacker, 1)
	t.Cleanup(probe.CloseIdleConnections)
	waitFor(t, time.Minute, "the attacker's address refused before any review", func() bool {
		req, err := http.NewRequestWithContext(ctx, http.MethodPost, base+"/reconcile/"+ns+"/"+quiet, nil)
		if err != nil {
			return false
		}
		req.Header.Set("Authorization", "Bearer "+rand.Text())
		resp, err := probe.Do(req)
		if err != nil {
			return false
		}
		defer resp.Body.Close()
		var st trigger.Status
		return json.NewDecoder(resp.Body).Decode(&st) == nil && st.Code == http.StatusTooManyRequests && strings.Contains(st.Message, "failed authentications")
	})
	lockedOut := time.Since(start)
	waitFor(t, time.Minute, "the garbage-token flood's reviews over", func() bool { return reviews.Counts().InFlight == 0 })
	triggers("garbage-token flood", driven[:10])
	if took := time.Since(start); took > floodPhase {
		t.Logf("the well-behaved client's triggers ended %v after the garbage-token flood began: the last came after it", took.Round(time.Millisecond))
	}
	time.Sleep(time.Until(start.Add(floodPhase))) // the rest of the phase
	res = stopGarbage()

	// Bad UTF-8 in the body's reason: 400, and nothing queued. A valid
	// trigger of the same object after it is reconciled with its own
	// reason only; the refused one would have been reconciled before or
	// with it.
	mu.Lock()
	mark := len(quietReasons)
	mu.Unlock()
	code, body := send(quiet, "{\"reason\": \"bad \xff byte\"}")
	var st trigger.Status
	if err := json.Unmarshal(body, &st); err != nil || code != http.StatusBadRequest || st.Reason != metav1.StatusReasonBadRequest {
		t.Errorf("bad UTF-8 in the body's reason: %d %s (%v), want 400 BadRequest", code, body, err)
	}
	if code, body := send(quiet, `{"reason": "after-bad-utf8"}`); code != http.StatusAccepted {
		t.Fatalf("a valid trigger after the bad one: %d %s", code, body)
	}
	waitFor(t, time.Minute, "the valid trigger after the bad one reconciled", func() bool {
		mu.Lock()
		defer mu.Unlock()
		return slices.ContainsFunc(quietReasons[mark:], func(r []string) bool { return slices.Contains(r, "after-bad-utf8") })
	})
	mu.Lock()
	for _, r := range quietReasons[mark:] {
		if !slices.Equal(r, []string{"after-bad-utf8"}) {
			t.Errorf("a reconcile of %s after the bad trigger has reasons %q, want only the valid trigger's", quiet, r)
		}
	}
	mu.Unlock()

	// The garbage-token flood's TokenReviews, counted after the phase
	// after it, so that a review still running when it ended is in.
	// Every request that passed the address check before the check
	// refused the address may still be reviewed: MaxAuthFailures, plus at
	// most one for each worker's request in flight (each has one at a
	// time; the probe is one more) when the count was reached. (Not
	// MaxAuthFailures + KubeAuthConfig.MaxReviews: requests past the
	// check are not bounded by MaxReviews.)
	garbage, bound := reviews.Counts().Garbage-g0, int64(floodMaxAuthFailures+floodWorkers+1)
	t.Logf("garbage-token flood: refused before any review after %v; answers %v, %d errors; %d TokenReviews (bound %d; MaxAuthFailures + MaxReviews would be %d)",
		lockedOut.Round(time.Millisecond), res.Codes, res.Errors, garbage, bound, floodMaxAuthFailures+16)
	if garbage > bound {
		t.Errorf("the garbage-token flood from one address cost %d TokenReviews within one AuthFailureBackoff, want at most %d", garbage, bound)
	}

	// The crowd floods of issue 33, each beside the well-behaved client,
	// which sends a trigger a second from its own address with its own
	// token, each of another of its ConfigMaps (pipe), and must have all
	// answered and at least 99 % accepted. The neighbour flood comes last:
	// it leaves the well-behaved client's address refused for a while.
	// post sends a trigger of name and returns the answer's code (0: none)
	// and, for a refusal, its message.
	post := func(name string) (int, string) {
		req, err := http.NewRequestWithContext(ctx, http.MethodPost, base+"/reconcile/"+ns+"/"+name, nil)
		if err != nil {
			return 0, err.Error()
		}
		req.Header.Set("Authorization", "Bearer "+pipelineToken)
		resp, err := good.Do(req)
		if err != nil {
			return 0, err.Error()
		}
		defer resp.Body.Close()
		var st trigger.Status
		if resp.StatusCode/100 != 2 {
			_ = json.NewDecoder(resp.Body).Decode(&st)
		}
		_, _ = io.Copy(io.Discard, resp.Body)
		return resp.StatusCode, st.Message
	}
	next := 0
	// crowdPhase runs flood for settle, then for floodPhase beside the
	// well-behaved client's triggers, each in its own goroutine (a slow
	// answer delays no later one), and returns once the flood has stopped
	// and its reviews are over: what the flood got (settle included), the
	// reviews sent from the phase's start, and the time until then.
	crowdPhase := func(phase string, flood func(context.Context, floodtest.Config) floodtest.Result, cfg floodtest.Config, settle time.Duration) (floodtest.Result, floodtest.ReviewCounts, time.Duration) {
		stop := startFlood(t, ctx, func(ctx context.Context) floodtest.Result { return flood(ctx, cfg) })
		time.Sleep(settle)
		r0, w0 := reviews.Counts(), watchReconciles.Load()
		start := time.Now()
		var wg sync.WaitGroup
		codes, messages := make([]int, int(floodPhase/time.Second)), make([]string, int(floodPhase/time.Second))
		for i := range codes {
			time.Sleep(time.Until(start.Add(time.Duration(i) * time.Second)))
			name := pipe[next%len(pipe)]
			next++
			wg.Go(func() { codes[i], messages[i] = post(name) })
		}
		time.Sleep(time.Until(start.Add(floodPhase)))
		flooded := watchReconciles.Load() - w0
		res := stop()
		wg.Wait()
		waitFor(t, time.Minute, phase+": its reviews over", func() bool { return reviews.Counts().InFlight == 0 })
		rv, elapsed := reviews.Counts().Sub(r0), time.Since(start)
		byCode, refusals, accepted := map[int]int{}, map[string]int{}, 0
		for i, code := range codes {
			byCode[code]++
			if code/100 == 2 {
				accepted++
			} else {
				refusals[fmt.Sprintf("%d %s", code, messages[i])]++
			}
		}
		t.Logf("%s: the well-behaved client's %d triggers got %v, refusals %v; %d watch reconciles in %v (idle: %d); the flood's answers %v, %d errors; %d TokenReviews (%d of unknown tokens), %d SubjectAccessReviews in %v",
			phase, len(codes), byCode, refusals, flooded, floodPhase, idle, res.Codes, res.Errors, rv.TokenReviews, rv.Garbage, rv.SubjectAccessReviews, elapsed.Round(time.Millisecond))
		if byCode[0] > 0 || 100*accepted < 99*len(codes) {
			t.Errorf("%s: the well-behaved client got %d of its %d triggers accepted (%.1f %%), %d unanswered (answers %v), want all answered and at least 99 %% accepted",
				phase, accepted, len(codes), 100*float64(accepted)/float64(len(codes)), byCode[0], byCode)
		}
		if res.Answered() == 0 {
			t.Errorf("%s: the flood got no answer (%d errors)", phase, res.Errors)
		}
		return res, rv, elapsed
	}
	crowdCfg := floodCfg
	crowdCfg.Token, crowdCfg.LocalIP = "", ""

	// Valid triggers from 4 identities, each paced at 2.5 a second, of
	// objects no entry waits for: each needs a token of the trigger
	// budget, the crowd twice its rate, each caller within half of it.
	// The well-behaved client, asking for less than any of them, goes
	// first. Its four identities are not among the 64 of the next flood:
	// callers that asked little and come back flooding take a few tokens
	// before their demand catches up (a limit the budget's unit tests
	// pin), which this phase is not about. It must have contended for the
	// budget (some 429), or it tested nothing. Then the trigger budget's
	// refill.
	cfg := crowdCfg
	cfg.Tokens, cfg.LocalIP, cfg.Names, cfg.Pace = crowdTokens[crowd:], crowdFrom, paced, pacedRate
	res, _, _ = crowdPhase("paced-crowd flood", floodtest.ManyIdentities, cfg, pacedSettle)
	if res.Codes[http.StatusAccepted] == 0 || res.Codes[http.StatusTooManyRequests] == 0 {
		t.Errorf("paced-crowd flood: the crowd got %v, want some 202s and some 429s (it asks for twice the trigger budget)", res.Codes)
	}
	time.Sleep(5 * time.Second) // the refill, a deliberate pause

	// Valid triggers from 64 identities, one connection each; then the
	// trigger budget's refill.
	cfg = crowdCfg
	cfg.Tokens, cfg.LocalIP = crowdTokens[:crowd], crowdFrom
	crowdPhase("many-identities flood", floodtest.ManyIdentities, cfg, 0)
	time.Sleep(5 * time.Second) // the refill, a deliberate pause

	// Garbage tokens from 1,000 addresses, 64 goroutines: whatever the
	// number of addresses, the reviews of tokens not seen before are
	// bounded by the global budget.
	cfg = crowdCfg
	cfg.LocalIPs = floodtest.Loopback(firstAddress, addresses)
	_, rv, elapsed := crowdPhase("many-addresses garbage flood", floodtest.GarbageFromAddresses, cfg, 0)
	if bound := reviewBudgetBurst + int64(reviewBudgetPerSecond*elapsed.Seconds()); rv.Garbage > bound {
		t.Errorf("the garbage flood from %d addresses cost %d TokenReviews of unknown tokens in %v (%.0f a second), want at most %d (the global budget: %d + %d a second)",
			addresses, rv.Garbage, elapsed.Round(time.Millisecond), float64(rv.Garbage)/elapsed.Seconds(), bound, reviewBudgetBurst, reviewBudgetPerSecond)
	}

	// One token on 128 connections, random names no object has: the
	// caller's SubjectAccessReviews are bounded by its budget (the
	// well-behaved client's, one a trigger at most, apart); then the
	// trigger budget's refill.
	cfg = crowdCfg
	cfg.Token, cfg.Workers, cfg.LocalIP = token, nameConns, namesFrom
	_, rv, elapsed = crowdPhase("random-names flood", floodtest.RandomNames, cfg, 0)
	if bound := authzBudgetBurst + int64(authzBudgetPerSecond*elapsed.Seconds()) + int64(floodPhase/time.Second); rv.SubjectAccessReviews > bound {
		t.Errorf("the random-names flood of one token cost %d SubjectAccessReviews in %v (%.0f a second), want at most %d (the caller's budget: %d + %d a second, and the well-behaved client's %d)",
			rv.SubjectAccessReviews, elapsed.Round(time.Millisecond), float64(rv.SubjectAccessReviews)/elapsed.Seconds(), bound, authzBudgetBurst, authzBudgetPerSecond, int(floodPhase/time.Second))
	}
	time.Sleep(5 * time.Second) // the refill, a deliberate pause

	// Garbage tokens from the well-behaved client's own address (a NAT):
	// the client, with its valid token, is still served.
	cfg = crowdCfg
	cfg.LocalIP = wellBehaved
	crowdPhase("neighbour flood", floodtest.GarbageTokens, cfg, 0)
}

// startFlood runs flood in a goroutine until stop is called (or the test
// ends) and returns stop, which returns the flood's result once its
// goroutines have all finished; it may be called more than once.
func startFlood(t *testing.T, ctx context.Context, flood func(context.Context) floodtest.Result) (stop func() floodtest.Result) {
	ctx, cancel := context.WithCancel(ctx)
	done := make(chan floodtest.Result, 1)
	go func() { done <- flood(ctx) }()
	stop = sync.OnceValue(func() floodtest.Result { cancel(); return <-done })
	t.Cleanup(func() { stop() })
	return stop
}

// waitFor polls cond until it holds, failing t after within.
func waitFor(t *testing.T, within time.Duration, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(within)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("%s: not within %v", what, within)
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// acceptCounter counts the connections it accepts by client address.
type acceptCounter struct {
	net.Listener
	mu   sync.Mutex
	from map[string]int
}

func (l *acceptCounter) Accept() (net.Conn, error) {
	c, err := l.Listener.Accept()
	if err == nil {
		host, _, _ := net.SplitHostPort(c.RemoteAddr().String())
		l.mu.Lock()
		l.from[host]++
		l.mu.Unlock()
	}
	return c, err
}

func (l *acceptCounter) accepted(host string) int {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.from[host]
}
