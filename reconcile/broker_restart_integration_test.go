//go:build integration

package reconcile_test

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"net/url"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"k8s.io/client-go/dynamic"
	"k8s.io/client-go/kubernetes"

	"github.com/opkit/opkit"
	"github.com/opkit/opkit/internal/logsink"
	"github.com/opkit/opkit/internal/testcluster"
	"github.com/opkit/opkit/reconcile"
	"github.com/opkit/opkit/trigger"
	"github.com/opkit/opkit/trigger/brokertest"
)

// Three replicas take broker triggers, sharded (eight shards) and not,
// while the API server of the replica with work on it restarts: the
// leader's, or that of the holder of some shards, which keeps them
// through the outage (its Leases outlast it). Messages for objects of
// every shard are published before, during and after the outage. Every
// one is reconciled and acknowledged, and none waited behind a backoff:
// every Nack, a hand-back to the shard's holder or one after a read the
// API server did not answer, is delayed DroppedDelay whatever the
// message's deliveries, and none is of the APIError class (which backs
// off with the deliveries). The restarting replica answers an HTTP
// trigger meanwhile with 503 and Retry-After: when sharded, it cannot
// find the object's shard (another replica may take it); with one shard
// it leads, and cannot check the caller until its API server is back. The test logs the
// publish-to-reconcile p50/p90/max and the HTTP answers.
func TestIntegrationBrokerTriggersThroughAnAPIServerRestart(t *testing.T) {
	c, _, _, _ := privateWidgets(t, testcluster.Options{APIServers: 2})
	for _, shards := range []int{8, 1} {
		t.Run(fmt.Sprintf("shards=%d", shards), func(t *testing.T) { brokerThroughARestart(t, c, shards) })
	}
}

// droppedDelay is the consumer's DroppedDelay (its default): the delay of
// every Nack that is no backoff.
const droppedDelay = time.Second

func brokerThroughARestart(t *testing.T, c *testcluster.Cluster, shards int) {
	ctx := context.Background()
	ns := c.Namespace(t)
	kube := kubernetes.NewForConfigOrDie(c.Config())
	dyn := dynamic.NewForConfigOrDie(c.Config())
	token := pipelineToken(t, c, kube, ns)
	b := brokertest.New()
	l := &publishLedger{published: map[string]time.Time{}, reconciled: map[string]time.Time{}}
	logs := &logsink.Buffer{}
	start := func(id string, server int) *operatorReplica {
		return startOnWith(t, c, server, ns, id, replicaOptions{log: slog.New(slog.NewTextHandler(logs, nil)), checkCallers: true,
			shards: shards, longLeases: true, broker: b, reconciled: l.seen})
	}

	// Objects of every shard, two at least of each.
	count := max(shards, 1)
	var names, onePerShard []string
	perShard := make([]int, count)
	for i := 0; len(names) < 16 || slices.Min(perShard) < 2; i++ {
		if i == 200 {
			t.Fatalf("200 objects, and still a shard with fewer than two: %v", perShard)
		}
		w := create(t, dyn, ns, fmt.Sprintf("w%03d", i), 1)
		s := opkit.ShardOf(w.UID, count)
		if perShard[s]++; perShard[s] == 1 {
			onePerShard = append(onePerShard, w.Name)
		}
		names = append(names, w.Name)
	}

	// c, whose API server restarts, leads, or holds some shards.
	cr := start("c", 1)
	if shards <= 1 {
		eventually(t, time.Minute, "c leads", func() error {
			if cr.ctrl.Held() != 1 {
				return errors.New("not yet")
			}
			return nil
		})
	}
	replicas := []*operatorReplica{start("a", 0), start("b", 0), cr}
	if shards > 1 {
		hs := waitSpread(t, kube, ns, "operator", shards, "a", "b", "c")
		t.Logf("shard holders: %v", hs)
	}
	if shards <= 1 {
		onePerShard = names[:8]
	}
	// Each decision that found its place is not asked again: they read,
	// and the trigger budget refills at 5 a second.
	found := map[string]bool{}
	eventually(t, 2*time.Minute, "every replica ready and knowing where an object of each shard is worked on", func() error {
		for _, r := range replicas {
			if err := r.ctrl.Check(); err != nil {
				return fmt.Errorf("%s: %v", r.id, err)
			}
			for _, n := range onePerShard {
				if found[r.id+"/"+n] {
					continue
				}
				d, err := r.ctrl.Trigger().Intake(ctx, trigger.Pointer{Key: opkit.Key{Namespace: ns, Name: n}, Reason: "warm-up"}, trigger.IntakeOptions{})
				if err != nil || d.Endpoint == "" && !d.Outcome.Accepted() {
					return fmt.Errorf("%s decides %+v for %s (%v)", r.id, d, n, err)
				}
				found[r.id+"/"+n] = true
			}
		}
		return nil
	})

	publish := func(batch string) {
		for _, n := range names {
			reason := batch + "/" + n
			data, _ := json.Marshal(map[string]string{"namespace": ns, "name": n, "reason": reason})
			l.mu.Lock()
			l.published[reason] = time.Now()
			l.mu.Unlock()
			b.Publish(data)
		}
	}
	publish("before")
	stopping := time.Now()
	if err := c.StopAPIServer(1); err != nil {
		t.Fatal(err)
	}
	stopped := time.Now()
	publish("down")
	answers := map[string][]string{} // replica -> the HTTP answers it gave during the outage
	for _, r := range replicas {
		for _, n := range onePerShard {
			code, retryAfter, body := postWithToken(t, r.op.TriggerURL()+"/reconcile/"+ns+"/"+n+"?reason="+url.QueryEscape("http/"+r.id+"/"+n), token)
			answers[r.id] = append(answers[r.id], fmt.Sprint(code))
			if r != cr {
				continue
			}
			want := http.StatusServiceUnavailable
			if code != want || retryAfter == "" ||
				shards > 1 && !strings.Contains(body, "cannot reach its API server") {
				t.Errorf("a trigger for %s through c, whose API server is down: %d (Retry-After %q) %s; want %d", n, code, retryAfter, body, want)
			}
		}
	}
	// The restarting replica meets the outage: it hands back a message it
	// could not read.
	eventually(t, 2*time.Minute, "c nacked a message its API server did not answer for", func() error {
		if cr.scheduled.nacked()["APITransient"] == 0 {
			return fmt.Errorf("c's nacks: %v", cr.scheduled.nacked())
		}
		return nil
	})
	if err := c.StartAPIServer(1); err != nil {
		t.Fatal(err)
	}
	ready := time.Now()
	publish("up")

	eventually(t, 5*time.Minute, "every message reconciled and acknowledged", func() error {
		if waiting := l.waiting(); len(waiting) > 0 {
			return fmt.Errorf("%d not reconciled: %v", len(waiting), waiting[:min(5, len(waiting))])
		}
		if n := b.Outstanding(); n > 0 {
			return fmt.Errorf("%d messages not acknowledged", n)
		}
		return nil
	})

	// No backoff: every Nack waited DroppedDelay, none is an APIError.
	deliveries, nacks := 0, 0
	for _, ev := range b.Events() {
		deliveries = max(deliveries, ev.Delivery)
		if ev.Op != "Nack" {
			continue
		}
		nacks++
		if ev.Delay != droppedDelay {
			t.Errorf("message %d, delivery %d: nacked with a delay of %v, want DroppedDelay (%v): a backoff", ev.ID, ev.Delivery, ev.Delay, droppedDelay)
		}
	}
	for _, r := range replicas {
		if n := r.scheduled.nacked()["APIError"]; n > 0 {
			t.Errorf("%s nacked %d messages as APIError (a backoff)", r.id, n)
		}
		t.Logf("%s: nacks by reason %v; HTTP answers during the outage %v", r.id, r.scheduled.nacked(), answers[r.id])
	}
	ok, all := 0, 0
	for _, codes := range answers {
		for _, code := range codes {
			all++
			if strings.HasPrefix(code, "2") {
				ok++
			}
		}
	}
	t.Logf("shards=%d: API server stopping %v, then down %v until ready; %d messages, %d nacks, at most %d deliveries of one; publish to reconcile: all %s; published during the outage %s; HTTP triggers answered 2xx during the outage: %d of %d",
		shards, stopped.Sub(stopping).Round(100*time.Millisecond), ready.Sub(stopped).Round(100*time.Millisecond), len(l.published), nacks, deliveries, l.latencies(""), l.latencies("down/"), ok, all)
}

// postWithToken POSTs to u with a bearer token, and returns the answer's
// code, Retry-After and body.
func postWithToken(t *testing.T, u, token string) (int, string, string) {
	t.Helper()
	req, err := http.NewRequest(http.MethodPost, u, nil)
	if err != nil {
		t.Fatal(err)
	}
	req.Header.Set("Authorization", "Bearer "+token)
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatalf("POST %s: %v", u, err)
	}
	defer resp.Body.Close()
	body, _ := io.ReadAll(resp.Body)
	return resp.StatusCode, resp.Header.Get("Retry-After"), string(body)
}

// publishLedger holds when each message's reason was published, and when
// a reconcile first carried it.
type publishLedger struct {
	mu                    sync.Mutex
	published, reconciled map[string]time.Time
}

func (l *publishLedger) seen(_ string, req reconcile.Request[*Widget]) {
	now := time.Now()
	l.mu.Lock()
	defer l.mu.Unlock()
	for _, r := range req.Reasons {
		if _, ok := l.reconciled[r]; !ok {
			l.reconciled[r] = now
		}
	}
}

// waiting returns the reasons published and not reconciled yet, sorted.
func (l *publishLedger) waiting() []string {
	l.mu.Lock()
	defer l.mu.Unlock()
	var out []string
	for r := range l.published {
		if _, ok := l.reconciled[r]; !ok {
			out = append(out, r)
		}
	}
	slices.Sort(out)
	return out
}

// latencies describes, for the reasons published with prefix, the times
// from publish to reconcile: p50, p90 and max.
func (l *publishLedger) latencies(prefix string) string {
	l.mu.Lock()
	defer l.mu.Unlock()
	var ds []time.Duration
	for r, at := range l.published {
		if done, ok := l.reconciled[r]; ok && strings.HasPrefix(r, prefix) {
			ds = append(ds, done.Sub(at))
		}
	}
	if len(ds) == 0 {
		return "none"
	}
	slices.Sort(ds)
	q := func(p float64) time.Duration { return ds[int(p*float64(len(ds)-1))].Round(10 * time.Millisecond) }
	return fmt.Sprintf("p50 %v p90 %v max %v (%d)", q(0.5), q(0.9), q(1), len(ds))
}
