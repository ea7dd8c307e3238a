package triggerbench

import (
	"context"
	"encoding/json"
	"flag"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"slices"
	"sync/atomic"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"

	"github.com/opkit/opkit"
	"github.com/opkit/opkit/bench/internal/stats"
	"github.com/opkit/opkit/leader"
	"github.com/opkit/opkit/reconcile"
	"github.com/opkit/opkit/trigger"
)

// rounds is the number of rounds per load of BenchmarkTriggerOutcome; a
// round is one waited-for trigger direct to the leader, one through the
// follower, and one trivial loopback request on a kept-alive connection
// and one on a fresh connection.
var rounds = flag.Int("outcome.rounds", 1000, "rounds per load in BenchmarkTriggerOutcome")

// waitQuery asks the endpoint to answer with the reconcile's outcome.
const waitQuery = "?wait=30s"

// Identities of the two replicas (and the Outcome's replica).
const (
	leaderID   = "leader"
	followerID = "follower"
)

// leaseSeq names a new Lease for every run, so that no run waits for the
// previous run's Lease.
var leaseSeq atomic.Int64

// replica is one in-process replica of BenchmarkTriggerOutcome: a
// controller with leader election and its trigger endpoint on loopback,
// which publishes its URL on the Lease while it leads and forwards to the
// leader's while it does not.
type replica struct {
	url  string
	ctrl *reconcile.Controller[*corev1.ConfigMap]
	stop func()
}

// startReplica starts a replica campaigning for lease, with the shared
// reconciler logic of tr.
func startReplica(b *testing.B, id, lease string, tr *tracker) (*replica, error) {
	srv := httptest.NewUnstartedServer(nil) // its listener is open: the URL to publish
	url := "http://" + srv.Listener.Addr().String()
	cfg := opkitConfig(withBacklog(env.client), tr)
	cfg.Leader = &leader.Config{Client: env.kube, Namespace: namespace, Name: lease, Identity: id,
		Annotations: map[string]string{reconcile.EndpointAnnotation: url}}
	ctrl, err := reconcile.NewController(cfg)
	if err != nil {
		srv.Close()
		return nil, err
	}
	// Insecure on purpose: a TokenReview and a SubjectAccessReview (the
	// follower's, then the leader's again) are not what is measured.
	h, err := trigger.NewHandler(ctrl.Trigger(), trigger.HandlerConfig{InsecureSkipAuth: true, Logger: discard})
	if err != nil {
		srv.Close()
		return nil, err
	}
	srv.Config.Handler = h
	srv.Start()
	_, stop := run(b, ctrl)
	return &replica{url: url, ctrl: ctrl, stop: func() { srv.Close(); stop() }}, nil
}

// outcomes are the latencies of one load, pooled over the iterations.
type outcomes struct {
	direct, follower           []time.Duration // to the end of the 200
	directStart, followerStart []time.Duration // to the reconciler's first line
	gets                       []time.Duration // the leader's reads of the objects
	keepAlive, fresh           []time.Duration // the loopback requests
}

// outcomeRun is one iteration's leader, follower, loopback server and
// clients.
type outcomeRun struct {
	tr       *tracker
	lead     *replica
	follower *replica
	echo     *httptest.Server
	hc       *http.Client // kept-alive connections: the triggers, and the loopback's kept-alive requests
	fresh    *http.Client // a new connection per request
	n        int          // the triggers sent so far
}

// trigger sends a waited-for trigger of target s to the replica at base
// and returns the time from just before the request to the end of the
// answer, and to the first line of the reconcile that served it. It fails
// b unless the answer is a 200 with a succeeded outcome by the leader
// (and passed on by the follower, when base is the follower's).
func (o *outcomeRun) trigger(b *testing.B, base string, s int) (answer, start time.Duration) {
	url := base + "/reconcile/" + namespace + "/" + targetName(s) + waitQuery
	o.tr.fire(s)
	begin := time.Now()
	resp, err := o.hc.Post(url, "", nil)
	if err != nil {
		b.Fatalf("POST %s: %v", url, err)
	}
	body, err := io.ReadAll(resp.Body)
	answer = time.Since(begin)
	resp.Body.Close()
	if err != nil {
		b.Fatalf("POST %s: reading the answer: %v", url, err)
	}
	if resp.StatusCode != http.StatusOK {
		b.Fatalf("POST %s: %s %s, want 200 with the outcome", url, resp.Status, body)
	}
	var out trigger.Outcome
	if err := json.Unmarshal(body, &out); err != nil || out.State != trigger.Succeeded || out.Replica != leaderID {
		b.Fatalf("POST %s: 200 %s (%v), want a succeeded outcome by %q", url, body, err, leaderID)
	}
	if forwarded := resp.Header.Get("X-Opkit-Forwarded") != ""; forwarded != (base == o.follower.url) {
		b.Fatalf("POST %s: forwarded %v (X-Opkit-Forwarded %q)", url, forwarded, resp.Header.Get("X-Opkit-Forwarded"))
	}
	// The reconcile finished before the answer: the tracker has its start.
	o.n++
	if got := o.tr.n.Load(); got != int64(o.n) {
		b.Fatalf("after %d answered triggers the reconciler saw %d", o.n, got)
	}
	o.tr.mu.Lock()
	start = o.tr.lat[len(o.tr.lat)-1]
	o.tr.mu.Unlock()
	return answer, start
}

// loopback times one trivial request to the loopback server with c.
func (o *outcomeRun) loopback(b *testing.B, c *http.Client) time.Duration {
	begin := time.Now()
	resp, err := c.Post(o.echo.URL, "", nil)
	if err != nil {
		b.Fatalf("loopback: %v", err)
	}
	_, err = io.Copy(io.Discard, resp.Body)
	d := time.Since(begin)
	resp.Body.Close()
	if err != nil || resp.StatusCode != http.StatusNoContent {
		b.Fatalf("loopback: %s (%v)", resp.Status, err)
	}
	return d
}

// measure runs n rounds and adds their latencies to into. The direct and
// the forwarded trigger of a round go to different targets, in turns
// first, so that both see the same machine and the same backlog.
func (o *outcomeRun) measure(b *testing.B, n int, into *outcomes) {
	gets.reset()
	for i := range n {
		paths := []string{o.lead.url, o.follower.url}
		if i%2 == 1 {
			slices.Reverse(paths)
		}
		for j, base := range paths {
			d, s := o.trigger(b, base, (2*i+j)%targets)
			if base == o.lead.url {
				into.direct, into.directStart = append(into.direct, d), append(into.directStart, s)
			} else {
				into.follower, into.followerStart = append(into.follower, d), append(into.followerStart, s)
			}
		}
		into.keepAlive = append(into.keepAlive, o.loopback(b, o.hc))
		into.fresh = append(into.fresh, o.loopback(b, o.fresh))
	}
	into.gets = append(into.gets, gets.sorted()...)
}

// startOutcomeRun starts the leader, waits until it leads and has
// reconciled its initial list, then starts the follower and waits until it
// reads the leader's endpoint from the Lease; stop stops the follower,
// then the leader.
func startOutcomeRun(b *testing.B) (o *outcomeRun, stop func()) {
	b.Helper()
	o = &outcomeRun{tr: newTracker()}
	lease := fmt.Sprintf("trigger-outcome-%d", leaseSeq.Add(1))
	var stops []func()
	stop = func() {
		for _, s := range slices.Backward(stops) {
			s()
		}
	}
	fail := func(format string, args ...any) {
		stop()
		b.Fatalf(format, args...)
	}
	var err error
	if o.lead, err = startReplica(b, leaderID, lease, o.tr); err != nil {
		fail("the leader: %v", err)
	}
	stops = append(stops, o.lead.stop)
	if err := awaitListed(o.lead.ctrl, o.tr); err != nil {
		fail("the leader: %v", err)
	}
	if o.lead.ctrl.Held() != 1 {
		fail("the first replica does not lead")
	}
	if o.follower, err = startReplica(b, followerID, lease, o.tr); err != nil {
		fail("the follower: %v", err)
	}
	stops = append(stops, o.follower.stop)
	deadline := time.Now().Add(time.Minute)
	for endpoint(o.follower.ctrl) != o.lead.url {
		if time.Now().After(deadline) {
			fail("the follower never learned the leader's endpoint: it reads %q, the leader publishes %q", endpoint(o.follower.ctrl), o.lead.url)
		}
		time.Sleep(5 * time.Millisecond)
	}
	o.echo = httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		_, _ = io.Copy(io.Discard, r.Body)
		w.WriteHeader(http.StatusNoContent)
	}))
	o.hc = &http.Client{Transport: http.DefaultTransport.(*http.Transport).Clone()}
	fresh := http.DefaultTransport.(*http.Transport).Clone()
	fresh.DisableKeepAlives = true
	o.fresh = &http.Client{Transport: fresh}
	stops = append(stops, o.echo.Close, o.hc.CloseIdleConnections)
	return o, stop
}

// BenchmarkTriggerOutcome reports the time from just before a POST
// /reconcile/{namespace}/{name}?wait=30s to the end of its 200 answer
// (the outcome of the reconcile that served it), sent to the leader
// (direct-*) and to a follower that forwards it to the leader
// (follower-*), idle and behind a backlog of 100,000 entries at watch
// priority, next to a loopback round trip measured in the same rounds.
// One iteration is a whole run: a fresh leader and follower, warm-up,
// the idle rounds, then the backlog and its rounds.
func BenchmarkTriggerOutcome(b *testing.B) {
	setup(b)
	loads := []load{idle, watchBacklog}
	results := make([]outcomes, len(loads))
	left := -1 // the least backlog left after the last trigger of a run
	for b.Loop() {
		func() {
			o, stop := startOutcomeRun(b)
			defer stop()
			// Warm-up, not measured: the connections (the client's to
			// both replicas, the follower's to the leader), the
			// handlers' and the workers' first use.
			o.measure(b, 20, &outcomes{})
			for i, l := range loads {
				if l != idle {
					begin := time.Now()
					o.tr.busyBacklog.Store(true)
					fillBacklog(b, o.lead.ctrl.Queues()[0], 0) // the watcher's watch priority
					b.Logf("queued %d backlog entries in %v", backlogSize, time.Since(begin).Round(time.Millisecond))
				}
				begin := time.Now()
				o.measure(b, *rounds, &results[i])
				if l == idle {
					continue
				}
				n := o.lead.ctrl.Queues()[0].Len()
				if n == 0 {
					b.Errorf("the backlog was drained before the last trigger was fired (%v of rounds): not measured behind a backlog", time.Since(begin).Round(time.Millisecond))
				}
				if left < 0 || n < left {
					left = n
				}
			}
		}()
	}
	b.ReportMetric(0, "ns/op") // the run's length, not a result
	for i, l := range loads {
		name := map[load]string{idle: "idle", watchBacklog: "backlog"}[l]
		r := results[i]
		p := func(d []time.Duration, q float64) float64 {
			return ms(stats.Percentile(slices.Sorted(slices.Values(d)), q))
		}
		b.ReportMetric(p(r.direct, 0.50), "direct-"+name+"-p50-ms")
		b.ReportMetric(p(r.direct, 0.99), "direct-"+name+"-p99-ms")
		b.ReportMetric(p(r.follower, 0.50), "follower-"+name+"-p50-ms")
		b.ReportMetric(p(r.follower, 0.99), "follower-"+name+"-p99-ms")
		b.ReportMetric(p(r.follower, 0.50)-p(r.direct, 0.50), "forward-added-"+name+"-p50-ms")
		b.ReportMetric(p(r.directStart, 0.50), "direct-"+name+"-start-p50-ms")
		b.ReportMetric(p(r.followerStart, 0.50), "follower-"+name+"-start-p50-ms")
		b.ReportMetric(p(r.gets, 0.50), "get-"+name+"-p50-ms")
		b.ReportMetric(p(r.keepAlive, 0.50), "loopback-rtt-"+name+"-p50-ms")
		b.ReportMetric(p(r.fresh, 0.50), "loopback-fresh-"+name+"-p50-ms")
	}
	b.ReportMetric(float64(left), "backlog-left")
}

func ms(d time.Duration) float64 { return float64(d) / float64(time.Millisecond) }

// endpoint is where ctrl's trigger forwards a trigger: the endpoint its
// leader publishes, as the intake decides it ("" while it leads, or
// none is known).
func endpoint(ctrl *reconcile.Controller[*corev1.ConfigMap]) string {
	d, _ := ctrl.Trigger().Intake(context.Background(), trigger.Pointer{Key: opkit.Key{Namespace: namespace, Name: "t-0"}}, trigger.IntakeOptions{})
	return d.Endpoint
}
