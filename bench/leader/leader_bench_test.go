package leaderbench

import (
	"context"
	"fmt"
	"io"
	"log/slog"
	"os"
	"slices"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/go-logr/logr"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/leaderelection"
	"k8s.io/client-go/tools/leaderelection/resourcelock"
	"k8s.io/klog/v2"

	"github.com/opkit/opkit/bench/internal/traffic"
	"github.com/opkit/opkit/internal/testcluster"
	"github.com/opkit/opkit/leader"
)

// The durations both electors run with. Small, so that a crash takeover
// (about LeaseDuration) keeps the run short; valid for both (client-go:
// RenewDeadline > 1.2*RetryPeriod; opkit: also RenewDeadline + ClockSkew <
// LeaseDuration).
const (
	leaseDuration = 4 * time.Second
	renewDeadline = 3 * time.Second
	retryPeriod   = 500 * time.Millisecond
	clockSkew     = 500 * time.Millisecond
	namespace     = "leader-bench"
	// settle is how long the follower runs before the handoff: its watch
	// (opkit) is established and it has polled a few times.
	settle = 1500 * time.Millisecond
	// waitFor bounds any wait for a term to start.
	waitFor = 30 * time.Second
)

var discard = slog.New(slog.NewTextHandler(io.Discard, nil))

var env struct {
	once    sync.Once
	cluster *testcluster.Cluster
	skip    string
	err     error
}

func TestMain(m *testing.M) {
	klog.SetLogger(logr.Discard())
	code := m.Run()
	if env.cluster != nil {
		env.cluster.Stop()
	}
	os.Exit(code)
}

func setup(b *testing.B) *testcluster.Cluster {
	b.Helper()
	env.once.Do(func() {
		if err := testcluster.CheckBinaries(testcluster.DefaultBinDir()); err != nil {
			env.skip = err.Error()
			return
		}
		c, err := testcluster.New(context.Background(), testcluster.Options{})
		if err != nil {
			env.err = err
			return
		}
		env.cluster = c
		cs, err := kubernetes.NewForConfig(c.Config())
		if err != nil {
			env.err = err
			return
		}
		ns := &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: namespace}}
		_, env.err = cs.CoreV1().Namespaces().Create(context.Background(), ns, metav1.CreateOptions{})
	})
	if env.skip != "" {
		b.Skip(env.skip)
	}
	if env.err != nil {
		b.Fatal(env.err)
	}
	return env.cluster
}

// newClient returns a clientset of its own (own transport, no client-side
// rate limit) and its kill switch.
func newClient(b *testing.B, c *testcluster.Cluster) (*kubernetes.Clientset, *traffic.Switch) {
	cfg := rest.CopyConfig(c.Config())
	cfg.QPS, cfg.Burst = -1, 0
	k := &traffic.Switch{}
	cfg.WrapTransport = k.Wrap
	cs, err := kubernetes.NewForConfig(cfg)
	if err != nil {
		b.Fatal(err)
	}
	return cs, k
}

// replica is one running elector of either kind.
type replica struct {
	kill    *traffic.Switch
	started chan time.Time // when its term started (first term only)
	cancel  context.CancelFunc
	done    chan struct{}
}

func (r *replica) stop() {
	r.cancel()
	<-r.done
}

// startFunc starts an elector of one kind on lease for identity id.
// release says whether it releases the Lease when its context ends.
type startFunc func(b *testing.B, c *testcluster.Cluster, lease, id string, release bool) *replica

func startOpkit(b *testing.B, c *testcluster.Cluster, lease, id string, release bool) *replica {
	cs, k := newClient(b, c)
	el, err := leader.New(leader.Config{
		Client: cs, Namespace: namespace, Name: lease, Identity: id,
		LeaseDuration: leaseDuration, RenewDeadline: renewDeadline, RetryPeriod: retryPeriod, ClockSkew: clockSkew,
		Logger: discard,
	})
	if err != nil {
		b.Fatal(err)
	}
	// opkit always releases on shutdown; a crash is simulated by the kill
	// switch, which makes the release fail.
	_ = release
	ctx, cancel := context.WithCancel(context.Background())
	r := &replica{kill: k, started: make(chan time.Time, 1), cancel: cancel, done: make(chan struct{})}
	go func() {
		defer close(r.done)
		el.Run(ctx, func(ctx context.Context) error {
			select {
			case r.started <- time.Now():
			default:
			}
			<-ctx.Done()
			return nil
		})
	}()
	return r
}

func startClientGo(b *testing.B, c *testcluster.Cluster, lease, id string, release bool) *replica {
	cs, k := newClient(b, c)
	r := &replica{kill: k, started: make(chan time.Time, 1), done: make(chan struct{})}
	lock := &resourcelock.LeaseLock{
		LeaseMeta:  metav1.ObjectMeta{Namespace: namespace, Name: lease},
		Client:     cs.CoordinationV1(),
		LockConfig: resourcelock.ResourceLockConfig{Identity: id},
	}
	le, err := leaderelection.NewLeaderElector(leaderelection.LeaderElectionConfig{
		Lock:            lock,
		LeaseDuration:   leaseDuration,
		RenewDeadline:   renewDeadline,
		RetryPeriod:     retryPeriod,
		ReleaseOnCancel: release,
		Name:            lease,
		Callbacks: leaderelection.LeaderCallbacks{
			OnStartedLeading: func(ctx context.Context) {
				select {
				case r.started <- time.Now():
				default:
				}
			},
			OnStoppedLeading: func() {},
		},
	})
	if err != nil {
		b.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	r.cancel = cancel
	go func() {
		defer close(r.done)
		le.Run(ctx)
	}()
	return r
}

func waitStarted(b *testing.B, r *replica, what string) time.Time {
	select {
	case t := <-r.started:
		return t
	case <-time.After(waitFor):
		b.Fatalf("%s: no term within %s", what, waitFor)
		return time.Time{}
	}
}

var leaseSeq atomic.Int64

// measure runs b.N handoffs: the leader is stopped gracefully (crash
// false) or killed (crash true), and the time until the follower's term
// starts is collected.
func measure(b *testing.B, start startFunc, crash bool) {
	c := setup(b)
	var samples []time.Duration
	for i := 0; b.Loop(); i++ {
		lease := fmt.Sprintf("lease-%d", leaseSeq.Add(1))
		a := start(b, c, lease, "a", !crash)
		waitStarted(b, a, "leader")
		f := start(b, c, lease, "f", !crash)
		time.Sleep(settle)
		var t0 time.Time
		if crash {
			a.kill.Kill()
			t0 = time.Now()
			a.stop() // its requests fail: nothing is released
		} else {
			t0 = time.Now()
			a.stop() // returns once it has released (client-go: ReleaseOnCancel)
		}
		t1 := waitStarted(b, f, "follower")
		samples = append(samples, t1.Sub(t0))
		f.stop()
	}
	slices.Sort(samples)
	b.ReportMetric(0, "ns/op") // the loop's pacing is not a result
	ms := func(d time.Duration) float64 { return float64(d) / float64(time.Millisecond) }
	n := len(samples)
	median := (samples[(n-1)/2] + samples[n/2]) / 2
	b.ReportMetric(ms(median), "median-ms")
	b.ReportMetric(ms(samples[len(samples)-1]), "max-ms")
	b.Logf("%d samples: %v", len(samples), samples)
}

// BenchmarkGracefulHandoff: leader shuts down and releases → follower's
// term starts.
func BenchmarkGracefulHandoff(b *testing.B) {
	b.Run("opkit", func(b *testing.B) { measure(b, startOpkit, false) })
	b.Run("client-go", func(b *testing.B) { measure(b, startClientGo, false) })
}

// BenchmarkCrashTakeover: leader's requests start failing (no release) →
// follower's term starts.
func BenchmarkCrashTakeover(b *testing.B) {
	b.Run("opkit", func(b *testing.B) { measure(b, startOpkit, true) })
	b.Run("client-go", func(b *testing.B) { measure(b, startClientGo, true) })
}
