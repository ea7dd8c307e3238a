//go:build integration

package reconcile_test

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"maps"
	"net/http"
	"sync"
	"testing"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/dynamic"
	"k8s.io/client-go/kubernetes"

	"github.com/opkit/opkit"
	"github.com/opkit/opkit/internal/testcluster"
	"github.com/opkit/opkit/leader"
	"github.com/opkit/opkit/queue"
	"github.com/opkit/opkit/reconcile"
	"github.com/opkit/opkit/trigger"
	"github.com/opkit/opkit/watcher"
)

// operatorReplica is one replica of an operator assembled the documented
// way: a controller with leader election and an Operator serving its
// trigger endpoint, with no forwarding configuration at all.
type operatorReplica struct {
	id        string
	ctrl      *reconcile.Controller[*Widget]
	op        *reconcile.Operator
	scheduled *scheduledCount
	cancel    context.CancelFunc
	done      chan error
}

// scheduledCount counts the triggers a replica scheduled, and the
// messages its consumer handed back, by reason.
type scheduledCount struct {
	noTriggerMetrics
	mu    sync.Mutex
	n     int
	nacks map[string]int
}

func (s *scheduledCount) Enqueued(o queue.Outcome) {
	if o.Accepted() {
		s.mu.Lock()
		s.n++
		s.mu.Unlock()
	}
}
func (s *scheduledCount) get() int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.n
}

func (s *scheduledCount) Nacked(reason string) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.nacks == nil {
		s.nacks = map[string]int{}
	}
	s.nacks[reason]++
}

// nacked returns the consumer's hand-backs so far, by reason.
func (s *scheduledCount) nacked() map[string]int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return maps.Clone(s.nacks)
}

// replicaOptions tell one test's replicas from another's.
type replicaOptions struct {
	log          *slog.Logger // nil: quiet
	checkCallers bool         // TokenReview and SubjectAccessReview through kube; else InsecureSkipAuth
	owns         bool         // Owns ConfigMaps: a related watcher beside the controller's own
	shards       int          // Config.Shards.Count (0: none)
	// longLeases: Leases of 30s, renewed within 20s, so that a replica
	// keeps what it holds through its API server's restart.
	longLeases bool
	// broker, if set, feeds a consumer (the example operator's: acknowledging
	// after the reconcile), counted in the replica's scheduled.
	broker trigger.Broker
	// reconciled, if set, is told of every reconcile's request.
	reconciled func(replica string, req reconcile.Request[*Widget])
}

// startOperatorReplica starts replica id, with clients dyn and kube, and
// waits until its trigger endpoint is bound; the test's cleanup stops it.
func startOperatorReplica(t *testing.T, dyn dynamic.Interface, kube kubernetes.Interface, ns, id string, o replicaOptions) *operatorReplica {
	t.Helper()
	log := quiet
	if o.log != nil {
		log = o.log.With("replica", id)
	}
	r := &operatorReplica{id: id, scheduled: &scheduledCount{}, done: make(chan error, 1)}
	cfg := reconcile.Config[*Widget]{
		Name: "test.opkit.dev/operator", Resource: widgets, Dynamic: dyn, NoEvents: true, Logger: log,
		Reconciler: reconcile.Func[*Widget](func(_ context.Context, req reconcile.Request[*Widget]) (reconcile.Result, error) {
			if o.reconciled != nil {
				o.reconciled(id, req)
			}
			return reconcile.Done(), nil
		}),
		Watch:          watcher.Config[*Widget]{Namespace: ns},
		TriggerMetrics: r.scheduled,
		Shards:         opkit.Shards{Count: o.shards},
		Leader: &leader.Config{Client: kube, Namespace: ns, Name: "operator", Identity: id,
			LeaseDuration: 6 * time.Second, RenewDeadline: 4 * time.Second, RetryPeriod: 500 * time.Millisecond},
	}
	if o.longLeases {
		cfg.Leader.LeaseDuration, cfg.Leader.RenewDeadline, cfg.Leader.RetryPeriod = 30*time.Second, 20*time.Second, time.Second
	}
	if o.owns {
		cfg.Owns = []opkit.Resource{configMaps}
	}
	var err error
	if r.ctrl, err = reconcile.NewController(cfg); err != nil {
		t.Fatal(err)
	}
	handler := trigger.HandlerConfig{InsecureSkipAuth: true, Logger: log}
	if o.checkCallers {
		handler = trigger.HandlerConfig{Reviews: kube, Logger: log}
	}
	var components []reconcile.Runnable
	if o.broker != nil {
		c, err := trigger.NewConsumer(trigger.ConsumerConfig[*Widget]{Broker: o.broker, Trigger: r.ctrl.Trigger(),
			AckAfterReconcile: true, Concurrency: 16, Metrics: r.scheduled, Logger: log})
		if err != nil {
			t.Fatal(err)
		}
		components = append(components, reconcile.Runnable{Name: "consumer", Run: c.Run})
	}
	r.op, err = reconcile.NewOperator(reconcile.OperatorConfig{
		Controllers: []reconcile.Part{r.ctrl},
		Triggers:    &reconcile.TriggerEndpoint{Server: trigger.ServerConfig{Addr: "127.0.0.1:0", Logger: log}, Handler: handler},
		Components:  components,
		Logger:      log,
	})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	r.cancel = cancel
	go func() { r.done <- r.op.Run(ctx) }()
	t.Cleanup(func() {
		cancel()
		<-r.done
	})
	eventually(t, time.Minute, id+"'s endpoint bound", func() error {
		if r.op.TriggerURL() == "" {
			return errors.New("not yet")
		}
		return nil
	})
	return r
}

// leaderAndFollower starts two replicas and waits until one leads and the
// other reads the leader's published endpoint.
func leaderAndFollower(t *testing.T, dyn dynamic.Interface, kube kubernetes.Interface, ns string) (lead, follower *operatorReplica) {
	t.Helper()
	a, b := startOperatorReplica(t, dyn, kube, ns, "a", replicaOptions{}), startOperatorReplica(t, dyn, kube, ns, "b", replicaOptions{})
	eventually(t, time.Minute, "a leader, and a follower that knows its endpoint", func() error {
		for _, pair := range [][2]*operatorReplica{{a, b}, {b, a}} {
			if pair[0].ctrl.Held() != 1 || pair[0].ctrl.Check() != nil {
				continue
			}
			d, err := pair[1].ctrl.Trigger().Intake(context.Background(), trigger.Pointer{Key: opkit.Key{Namespace: ns, Name: "w"}}, trigger.IntakeOptions{})
			if err == nil && d.Endpoint == pair[0].op.TriggerURL() {
				lead, follower = pair[0], pair[1]
				return nil
			}
		}
		return errors.New("not yet")
	})
	return lead, follower
}

// post POSTs path to base and returns the answer's code and body.
func postTo(t *testing.T, base, path string) (int, []byte) {
	resp, err := http.Post(base+path, "", nil)
	if err != nil {
		t.Errorf("POST %s%s: %v", base, path, err)
		return 0, nil
	}
	defer resp.Body.Close()
	body, _ := io.ReadAll(resp.Body)
	return resp.StatusCode, body
}

// A user's operator wired the documented way, with no forwarding
// configuration (no annotation, no endpoint, no identity given twice):
// a trigger sent to the follower reaches the leader, and the caller
// hears the leader's outcome.
func TestIntegrationAnOperatorForwardsWithoutForwardingConfiguration(t *testing.T) {
	_, dyn, kube, ns := privateWidgets(t, testcluster.Options{})
	create(t, dyn, ns, "w", 1)
	lead, follower := leaderAndFollower(t, dyn, kube, ns)
	code, body := postTo(t, follower.op.TriggerURL(), "/reconcile/"+ns+"/w?reason=deployed&wait=1m")
	var out trigger.Outcome
	if err := json.Unmarshal(body, &out); code != http.StatusOK || err != nil || out.State != trigger.Succeeded || out.Replica != lead.id {
		t.Fatalf("through the follower: %d %s, want 200 with the leader's (%s) success", code, body, lead.id)
	}
	if follower.scheduled.get() != 0 {
		t.Errorf("the follower scheduled %d triggers, want none", follower.scheduled.get())
	}
}

// When the leader stops (SIGTERM), its callers that wait for an outcome,
// directly or through a follower, are answered 503 at once, before the
// leader's shutdown finished: the shutdown, and the Lease's release,
// never wait for them. The follower then leads.
func TestIntegrationAStoppingLeaderAnswersItsWaitingCallersFirst(t *testing.T) {
	_, dyn, kube, ns := privateWidgets(t, testcluster.Options{})
	create(t, dyn, ns, "w", 1)
	lead, follower := leaderAndFollower(t, dyn, kube, ns)

	type answer struct {
		via  string
		code int
		body []byte
		at   time.Time
	}
	answers := make(chan answer, 2)
	for _, r := range []*operatorReplica{lead, follower} {
		go func() {
			code, body := postTo(t, r.op.TriggerURL(), "/reconcile/"+ns+"/w?delay=5m&wait=5m")
			answers <- answer{r.id, code, body, time.Now()}
		}()
	}
	eventually(t, time.Minute, "both callers waiting on the leader", func() error {
		if n := lead.scheduled.get(); n < 2 {
			return fmt.Errorf("%d scheduled", n)
		}
		return nil
	})

	lead.cancel()
	var got []answer
	for range 2 {
		got = append(got, <-answers)
	}
	if err := <-lead.done; err != nil {
		t.Fatalf("the leader's Run: %v", err)
	}
	stopped := time.Now()
	lead.done <- nil // for the cleanup
	for _, a := range got {
		if a.code != http.StatusServiceUnavailable || !a.at.Before(stopped) {
			t.Errorf("the caller through %s: %d %s at %v, want 503 before the leader stopped (%v)", a.via, a.code, a.body, a.at, stopped)
		}
	}
	l, err := kube.CoordinationV1().Leases(ns).Get(context.Background(), "operator", metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if h := l.Spec.HolderIdentity; h != nil && *h == lead.id {
		t.Errorf("the Lease is still held by the stopped leader %s", lead.id)
	}
	eventually(t, time.Minute, "the follower leads", func() error {
		if follower.ctrl.Held() != 1 {
			return errors.New("not yet")
		}
		return nil
	})
}
