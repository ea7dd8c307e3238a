//go:build integration

package leader_test

// Integration tests on a real etcd + kube-apiserver. They record every
// replica's tenure (Gate.Resume .. Gate.Suspend) in one journal (a mutex
// makes its order a single global order) and assert order and overlap,
// never durations.

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net/http"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"

	"github.com/opkit/opkit/internal/logsink"
	"github.com/opkit/opkit/internal/testcluster"
	"github.com/opkit/opkit/leader"
)

func TestMain(m *testing.M) { testcluster.Main(m) }

// Small durations, so that the tests are quick; what is asserted is order.
const (
	itLease = 3 * time.Second
	itRenew = 2 * time.Second
	itRetry = 500 * time.Millisecond
	itSkew  = 500 * time.Millisecond
	waitFor = 60 * time.Second // generous deadline for any expected outcome
)

// killSwitch is a RoundTripper that fails every request once killed, as if
// the process had lost the network (or died, as far as the API server can
// tell).
type killSwitch struct {
	dead atomic.Bool
	rt   http.RoundTripper
}

func (k *killSwitch) RoundTrip(r *http.Request) (*http.Response, error) {
	if k.dead.Load() {
		return nil, errors.New("killed")
	}
	return k.rt.RoundTrip(r)
}

type itReplica struct {
	name    string
	elector *leader.Elector
	kill    *killSwitch
	cancel  context.CancelFunc
	done    chan error
	logs    *logsink.Buffer
	once    sync.Once
}

func startIT(t *testing.T, cfg *rest.Config, j *journal, ns, name string) *itReplica {
	t.Helper()
	r := &itReplica{name: name, kill: &killSwitch{}, done: make(chan error, 1), logs: &logsink.Buffer{}}
	cfg = rest.CopyConfig(cfg)
	cfg.WrapTransport = func(rt http.RoundTripper) http.RoundTripper {
		r.kill.rt = rt
		return r.kill
	}
	client, err := kubernetes.NewForConfig(cfg)
	if err != nil {
		t.Fatal(err)
	}
	el, err := leader.New(leader.Config{
		Client: client, Namespace: ns, Name: "it-lease", Identity: name,
		LeaseDuration: itLease, RenewDeadline: itRenew, RetryPeriod: itRetry, ClockSkew: itSkew,
		Gate:   gate{j: j, name: name},
		Logger: slog.New(slog.NewTextHandler(r.logs, &slog.HandlerOptions{Level: slog.LevelDebug})),
	})
	if err != nil {
		t.Fatal(err)
	}
	r.elector = el
	ctx, cancel := context.WithCancel(context.Background())
	r.cancel = cancel
	go func() {
		r.done <- el.Run(ctx, func(ctx context.Context) error {
			term, _ := leader.TermFrom(ctx)
			j.addTerm(name, "work-start", term.Number)
			<-ctx.Done()
			j.addTerm(name, "work-return", term.Number)
			return nil
		})
	}()
	t.Cleanup(func() {
		r.stop()
		if t.Failed() {
			t.Logf("%s logs:\n%s", name, r.logs.String())
		}
	})
	return r
}

// stop shuts the replica down gracefully and waits for Run (idempotent).
func (r *itReplica) stop() {
	r.once.Do(func() {
		r.cancel()
		if err := <-r.done; err != nil {
			panic(fmt.Sprintf("%s: Run = %v", r.name, err))
		}
	})
}

// crash cuts the replica off and stops it without a release: its requests
// fail from now on, so the Lease is left to expire.
func (r *itReplica) crash() {
	r.kill.dead.Store(true)
	r.stop()
}

// waitLeader waits until exactly one of rs leads, and returns it.
func waitLeader(t *testing.T, j *journal, rs ...*itReplica) *itReplica {
	t.Helper()
	deadline := time.Now().Add(waitFor)
	for time.Now().Before(deadline) {
		var leaders []*itReplica
		for _, r := range rs {
			if r.elector.IsLeader() {
				leaders = append(leaders, r)
			}
		}
		if len(leaders) > 1 {
			t.Fatalf("two leaders at once:\n%s", j)
		}
		if len(leaders) == 1 {
			return leaders[0]
		}
		time.Sleep(10 * time.Millisecond)
	}
	t.Fatalf("no leader within %s:\n%s", waitFor, j)
	return nil
}

func without(rs []*itReplica, x *itReplica) []*itReplica {
	var out []*itReplica
	for _, r := range rs {
		if r != x {
			out = append(out, r)
		}
	}
	return out
}

// Three replicas with separate clients: one leads; a graceful stop hands
// over to another; a crash (no release) is taken over by the last one; at
// no time do two tenures overlap.
func TestIntegrationHandoffsNeverOverlap(t *testing.T) {
	c := testcluster.Shared(t)
	ns := c.Namespace(t)
	j := &journal{}
	rs := []*itReplica{
		startIT(t, c.Config(), j, ns, "r1"),
		startIT(t, c.Config(), j, ns, "r2"),
		startIT(t, c.Config(), j, ns, "r3"),
	}

	first := waitLeader(t, j, rs...)
	for _, r := range rs {
		if got := r.elector.Leader(); r != first && got != first.name {
			// followers learn the holder from their watch/poll
			waitUntil(t, func() bool { return r.elector.Leader() == first.name }, "%s to see %s as leader", r.name, first.name)
		}
	}

	// Graceful: the leader releases the Lease after its work returned.
	first.stop()
	rs = without(rs, first)
	second := waitLeader(t, j, rs...)
	assertAfter(t, j, first.name, "work-return", second.name, "resume")

	// Crash: the leader disappears without releasing.
	second.crash()
	rs = without(rs, second)
	third := waitLeader(t, j, rs...)
	assertAfter(t, j, second.name, "suspend", third.name, "resume")

	third.stop()
	assertNoOverlap(t, j)
	t.Logf("journal:\n%s", j)
}

// The leader's API server becomes unreachable while the other replicas
// reach the same etcd through a second API server: the leader suspends its
// intake (and its work returns) before another replica acquires.
func TestIntegrationUnreachableLeaderSuspendsBeforeTakeover(t *testing.T) {
	c := testcluster.Start(t, testcluster.Options{APIServers: 2})
	ns := c.Namespace(t)
	j := &journal{}
	a := startIT(t, c.ConfigFor(0), j, ns, "a")
	waitLeader(t, j, a)
	b := startIT(t, c.ConfigFor(1), j, ns, "b")
	cc := startIT(t, c.ConfigFor(1), j, ns, "c")
	waitUntil(t, func() bool { return b.elector.Leader() == "a" && cc.elector.Leader() == "a" }, "followers to see a")

	if err := c.StopAPIServer(0); err != nil {
		t.Fatal(err)
	}
	next := waitLeader(t, j, b, cc)
	assertAfter(t, j, "a", "suspend", next.name, "resume")
	assertAfter(t, j, "a", "work-return", next.name, "resume")
	if err := a.elector.Check(); err != nil {
		t.Errorf("a.Check() = %v after it stepped down", err)
	}
	assertNoOverlap(t, j)
	t.Logf("journal:\n%s", j)
}

func waitUntil(t *testing.T, cond func() bool, format string, args ...any) {
	t.Helper()
	deadline := time.Now().Add(waitFor)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out waiting for "+format, args...)
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// assertAfter checks that who2's last what2 comes after who1's last what1
// in the journal.
func assertAfter(t *testing.T, j *journal, who1, what1, who2, what2 string) {
	t.Helper()
	all := j.of("")
	last := func(who, what string) int {
		idx := -1
		for i, e := range all {
			if e.who == who && e.what == what {
				idx = i
			}
		}
		return idx
	}
	i1, i2 := last(who1, what1), last(who2, what2)
	if i1 < 0 || i2 < 0 || i1 > i2 {
		t.Errorf("want %s %s before %s %s:\n%s", who1, what1, who2, what2, j)
	}
}
