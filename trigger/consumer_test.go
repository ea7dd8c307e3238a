package trigger_test

import (
	"context"
	"encoding/json"
	"errors"
	"net"
	"net/url"
	"os"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"testing/synctest"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime/schema"

	"github.com/opkit/opkit"
	"github.com/opkit/opkit/trigger"
	"github.com/opkit/opkit/trigger/brokertest"
)

// objects is a fake API server for the consumer: a set of existing
// ConfigMaps and an optional error injector.
type objects struct {
	mu      sync.Mutex
	exist   map[opkit.Key]bool
	fail    func(key opkit.Key) error
	calls   int
	running atomic.Int32
	peak    atomic.Int32
	block   chan struct{} // when non-nil, Get waits for it to close
}

func (o *objects) get(ctx context.Context, key opkit.Key) (*corev1.ConfigMap, error) {
	n := o.running.Add(1)
	defer o.running.Add(-1)
	for {
		p := o.peak.Load()
		if n <= p || o.peak.CompareAndSwap(p, n) {
			break
		}
	}
	o.mu.Lock()
	o.calls++
	block, fail := o.block, o.fail
	o.mu.Unlock()
	if block != nil {
		select {
		case <-block:
		case <-ctx.Done():
			return nil, ctx.Err()
		}
	}
	if fail != nil {
		if err := fail(key); err != nil {
			return nil, err
		}
	}
	o.mu.Lock()
	defer o.mu.Unlock()
	if !o.exist[key] {
		return nil, apierrors.NewNotFound(schema.GroupResource{Resource: "configmaps"}, key.Name)
	}
	return cm(key.Namespace, key.Name), nil
}

type consumerEnv struct {
	b    *brokertest.Broker
	tr   *trigger.Trigger[*corev1.ConfigMap]
	q    *cmQueue
	objs *objects
	m    *countingMetrics
	c    *trigger.Consumer[*corev1.ConfigMap]
}

func newConsumerEnv(t *testing.T, mutate func(*trigger.ConsumerConfig[*corev1.ConfigMap])) *consumerEnv {
	t.Helper()
	return newConsumerEnvWith(t, nil, mutate)
}

// newConsumerEnvWith is newConsumerEnv with the trigger's configuration
// changed by trig first: by default the trigger reads through e.objs.
func newConsumerEnvWith(t *testing.T, trig func(*trigger.Config[*corev1.ConfigMap]), mutate func(*trigger.ConsumerConfig[*corev1.ConfigMap])) *consumerEnv {
	t.Helper()
	e := &consumerEnv{b: brokertest.New(), m: newCounting(), objs: &objects{exist: map[opkit.Key]bool{{Namespace: "ns", Name: "a"}: true, {Namespace: "ns", Name: "b"}: true}}}
	tcfg := trigger.Config[*corev1.ConfigMap]{Get: e.objs.get}
	if trig != nil {
		trig(&tcfg)
	}
	e.tr, e.q = newCMTriggerWith(t, tcfg)
	cfg := trigger.ConsumerConfig[*corev1.ConfigMap]{Broker: e.b, Trigger: e.tr, Metrics: e.m, Logger: discard, LagInterval: -1}
	if mutate != nil {
		mutate(&cfg)
	}
	c, err := trigger.NewConsumer(cfg)
	if err != nil {
		t.Fatal(err)
	}
	e.c = c
	return e
}

// run starts the consumer and returns a stop function that cancels it and
// waits for Run to return (failing the test if Run returned an error).
func (e *consumerEnv) run(t *testing.T) (stop func()) {
	ctx, cancel := context.WithCancel(t.Context())
	done := make(chan error, 1)
	go func() { done <- e.c.Run(ctx) }()
	return func() {
		cancel()
		if err := <-done; err != nil {
			t.Errorf("Run = %v", err)
		}
	}
}

func ops(evs []brokertest.Event) string {
	var s []string
	for _, ev := range evs {
		x := ev.Op
		if ev.Reason != "" {
			x += ":" + ev.Reason
		}
		if ev.Op == "Nack" {
			x += "@" + ev.Delay.String()
		}
		s = append(s, x)
	}
	return strings.Join(s, ",")
}

func TestConsumerSettlesEachKindOfMessage(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		e := newConsumerEnv(t, nil)
		cases := []struct {
			body string
			want string
		}{
			{`{"namespace":"ns","name":"a","reason":"image pushed"}`, "Ack"},
			{`{"namespace":"ns","name":"gone"}`, "Ack"},
			{`not json`, "Term:Malformed"},
			{`{"namespace":"ns","name":"a","extra":1}`, "Term:Malformed"},
			{`{"namespace":"ns","name":"a"} {"x":1}`, "Term:Malformed"},
			{`{"namespace":"ns","name":5}`, "Term:Malformed"},
			{`["ns","a"]`, "Term:Malformed"},
			{`null`, "Term:Malformed"},
			{"  \n", "Term:Malformed"},
			{`{"namespace":"ns","Name":"a"}`, "Term:Malformed"},                   // names match exactly
			{`{"namespace":"ns","name":"a","name":"b"}`, "Term:Malformed"},        // once
			{`{"namespace":"ns","name":"a","reason":null,"x"}`, "Term:Malformed"}, // and are followed by a value
			{`{"namespace":"ns","name":"a/b"}`, "Term:Invalid"},
			{`{"name":"a"}`, "Term:Invalid"},
			{`{"namespace":"ns","name":""}`, "Term:Invalid"},
			{`{"namespace":"ns","name":"a","reason":"` + strings.Repeat("r", trigger.MaxReasonLen+1) + `"}`, "Term:Invalid"},
			{`{"namespace":"ns","name":"a","reason":"` + strings.Repeat("r", trigger.DefaultMaxBytes) + `"}`, "Term:TooLarge"},
		}
		ids := make([]uint64, len(cases))
		for i, c := range cases {
			ids[i] = e.b.Publish([]byte(c.body))
		}
		stop := e.run(t)
		synctest.Wait()
		stop()
		for i, c := range cases {
			if got := ops(e.b.Events(ids[i])); got != c.want {
				t.Errorf("%.40s: settled %q, want %q", c.body, got, c.want)
			}
		}
		// The dead letter holds exactly the malformed and invalid ones.
		dead := deadLetters(e.b)
		if len(dead) != len(cases)-2 {
			t.Errorf("dead letters = %d, want %d", len(dead), len(cases)-2)
		}
		if e.b.Outstanding() != 0 {
			t.Errorf("outstanding = %d", e.b.Outstanding())
		}
		// The object read travels with the key, with source Operator and the
		// message's reason.
		it, err := e.q.Get(context.Background())
		if want := describe(operatorCause(cm("ns", "a"), "image pushed")); err != nil || it.Key != (opkit.Key{Namespace: "ns", Name: "a"}) || describe(it.Value) != want {
			t.Errorf("queued %v %s (%v)\nwant          %s", it.Key, describe(it.Value), err, want)
		}
		if e.q.Len() != 0 {
			t.Errorf("queue len after one Get = %d, want 0 (only one trigger scheduled)", e.q.Len())
		}
		m := e.m
		if m.received != len(cases) || m.acked["Scheduled"] != 1 || m.acked["NotFound"] != 1 ||
			m.terminated["Malformed"] != 10 || m.terminated["Invalid"] != 4 || m.terminated["TooLarge"] != 1 || m.processed != len(cases) {
			t.Errorf("metrics = received %d acked %v terminated %v processed %d", m.received, m.acked, m.terminated, m.processed)
		}
	})
}

// Any reason Pointer.Check accepts fits in a message of the default size,
// however the producer escapes it.
func TestConsumerAcceptsTheLongestReasonEscaped(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		e := newConsumerEnv(t, nil)
		reason := strings.Repeat("\x01", trigger.MaxReasonLen) // six bytes each in JSON
		// The longest namespace (63) and name (253) are not in the fake
		// cluster: the message must get as far as the re-fetch (Ack: not
		// found) rather than be dead-lettered as too large.
		long, err := json.Marshal(map[string]string{"namespace": strings.Repeat("n", 63), "name": strings.Repeat("a", 253), "reason": reason})
		if err != nil {
			t.Fatal(err)
		}
		longID := e.b.Publish(long)
		body, err := json.Marshal(map[string]string{"namespace": "ns", "name": "a", "reason": reason})
		if err != nil {
			t.Fatal(err)
		}
		id := e.b.Publish(body)
		stop := e.run(t)
		synctest.Wait()
		stop()
		if got := ops(e.b.Events(id)); got != "Ack" {
			t.Fatalf("a %d-byte message with a valid reason: settled %q, want Ack", len(body), got)
		}
		if got := ops(e.b.Events(longID)); got != "Ack" || e.m.acked["NotFound"] != 1 {
			t.Fatalf("a %d-byte message with the longest valid names and reason: settled %q, want Ack (not found)", len(long), got)
		}
		if it, err := e.q.Get(context.Background()); err != nil || !slices.Equal(it.Value.Reasons, []string{reason}) {
			t.Errorf("queued reasons %.40q (%v), want the %d bytes sent", it.Value.Reasons, err, len(reason))
		}
	})
}

func TestConsumerNeverAcksADroppedTrigger(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		// Receiving while suspended (Paused false), as a consumer does for a
		// message it received just before a leadership change.
		e := newConsumerEnv(t, func(c *trigger.ConsumerConfig[*corev1.ConfigMap]) {
			c.DroppedDelay = 3 * time.Second
			c.Paused = func() bool { return false }
		})
		e.q.Suspend() // a follower: every Add is dropped
		id := e.b.Publish([]byte(`{"namespace":"ns","name":"a"}`))
		stop := e.run(t)
		defer stop()
		synctest.Wait()
		if got := ops(e.b.Events(id)); got != "Nack@3s" {
			t.Fatalf("after a drop: %q, want one Nack@3s", got)
		}
		time.Sleep(3 * time.Second) // redelivered, dropped again
		synctest.Wait()
		if got := ops(e.b.Events(id)); got != "Nack@3s,Nack@3s" {
			t.Fatalf("after the redelivery: %q", got)
		}
		e.q.Resume() // leadership acquired
		time.Sleep(3 * time.Second)
		synctest.Wait()
		evs := e.b.Events(id)
		if got := ops(evs); got != "Nack@3s,Nack@3s,Ack" || evs[2].Delivery != 3 {
			t.Fatalf("after resuming: %q (last delivery %d), want the third delivery acked", got, evs[len(evs)-1].Delivery)
		}
		if e.q.Len() != 1 {
			t.Errorf("queue len = %d, want the trigger scheduled", e.q.Len())
		}
		if e.m.nacked["Dropped"] != 2 || e.m.acked["Scheduled"] != 1 {
			t.Errorf("metrics nacked %v acked %v", e.m.nacked, e.m.acked)
		}
	})
}

// releasingBroker is a brokertest.Broker that counts Receive calls and
// implements trigger.Releaser.
type releasingBroker struct {
	*brokertest.Broker
	receives, releases atomic.Int32
}

func (b *releasingBroker) Receive(ctx context.Context) (trigger.Message, error) {
	b.receives.Add(1)
	return b.Broker.Receive(ctx)
}

func (b *releasingBroker) Release(context.Context) error {
	b.releases.Add(1)
	return nil
}

// By default a consumer whose queue intake is suspended (a follower) takes
// no message: triggers wait in the broker, no API call is made and no
// delivery is spent, and a Releaser broker is asked once per pause to hand
// back what it buffered. Once the intake resumes, the waiting trigger is
// delivered for the first time and scheduled.
func TestConsumerPausesWhileTheIntakeIsSuspended(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		rb := &releasingBroker{Broker: brokertest.New()}
		e := newConsumerEnv(t, func(c *trigger.ConsumerConfig[*corev1.ConfigMap]) { c.Broker = rb })
		e.b = rb.Broker
		e.q.Suspend()
		id := e.b.Publish([]byte(`{"namespace":"ns","name":"a"}`))
		stop := e.run(t)
		defer stop()
		time.Sleep(time.Minute) // a long leaderless spell
		synctest.Wait()
		if n := rb.receives.Load(); n != 0 {
			t.Fatalf("Receive called %d times while suspended", n)
		}
		if evs := e.b.Events(id); len(evs) != 0 || e.objs.calls != 0 {
			t.Fatalf("while suspended: broker events %q, API calls %d; want none", ops(evs), e.objs.calls)
		}
		if n := rb.releases.Load(); n != 1 {
			t.Fatalf("Release called %d times for one pause, want 1", n)
		}
		if err := e.c.Check(); err != nil {
			t.Errorf("Check while paused = %v, want ready", err)
		}

		e.q.Resume()                       // leadership acquired
		time.Sleep(250 * time.Millisecond) // the default PausePoll
		synctest.Wait()
		evs := e.b.Events(id)
		if got := ops(evs); got != "Ack" || evs[0].Delivery != 1 {
			t.Fatalf("after resuming: %q, want the first delivery acked", got)
		}
		if e.q.Len() != 1 || e.m.acked["Scheduled"] != 1 || e.m.nacked["Dropped"] != 0 {
			t.Errorf("queue len %d, acked %v, nacked %v; want the trigger scheduled with no drop", e.q.Len(), e.m.acked, e.m.nacked)
		}

		e.q.Suspend() // leadership lost again: a second pause, a second release
		time.Sleep(time.Second)
		synctest.Wait()
		id2 := e.b.Publish([]byte(`{"namespace":"ns","name":"b"}`))
		time.Sleep(time.Minute)
		synctest.Wait()
		if evs := e.b.Events(id2); len(evs) != 0 {
			t.Fatalf("second pause: %q, want no delivery", ops(evs))
		}
		if n := rb.releases.Load(); n != 2 {
			t.Errorf("Release called %d times for two pauses, want 2", n)
		}
	})
}

// A consumer whose queue was shut down (a controller that stopped first)
// takes no message either: every enqueue would be dropped, and each
// delivery spent on it brings the trigger closer to the dead letter
// instead of leaving it to a replica that can schedule it.
func TestConsumerPausesOnceTheQueueIsShutDown(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		e := newConsumerEnv(t, nil)
		e.q.ShutDown()
		id := e.b.Publish([]byte(`{"namespace":"ns","name":"a"}`))
		stop := e.run(t)
		defer stop()
		time.Sleep(time.Minute)
		synctest.Wait()
		if evs := e.b.Events(id); len(evs) != 0 || e.objs.calls != 0 {
			t.Fatalf("with the queue shut down: broker events %q, API calls %d; want none", ops(evs), e.objs.calls)
		}
	})
}

// A follower is ready: broker failures seen before the consumer paused are
// forgotten while it pauses, and the first Receive after the pause tests
// the broker afresh.
func TestConsumerPausedIsReadyDespiteEarlierBrokerFailures(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		e := newConsumerEnv(t, nil)
		down := &trigger.BrokerError{Kind: "Disconnected", Op: "receive", Err: errors.New("connection refused")}
		e.b.Fail("receive", down)
		stop := e.run(t)
		defer stop()
		synctest.Wait()
		if err := e.c.Check(); trigger.KindOf(err) != "Disconnected" {
			t.Fatalf("Check with the broker down = %v, want Disconnected", err)
		}
		e.q.Suspend()           // leadership lost during the outage
		time.Sleep(time.Minute) // past the reconnect backoff: the consumer pauses
		synctest.Wait()
		if err := e.c.Check(); err != nil {
			t.Fatalf("Check while paused = %v, want ready", err)
		}
		e.q.Resume() // leading again, the broker still down
		time.Sleep(time.Second)
		synctest.Wait()
		if err := e.c.Check(); trigger.KindOf(err) != "Disconnected" {
			t.Fatalf("Check after resuming against a broker still down = %v, want Disconnected", err)
		}
		e.b.Fail("receive", nil)
		id := e.b.Publish([]byte(`{"namespace":"ns","name":"a"}`))
		time.Sleep(time.Minute)
		synctest.Wait()
		if got := ops(e.b.Events(id)); got != "Ack" {
			t.Fatalf("after the broker recovered: %q, want Ack", got)
		}
		if err := e.c.Check(); err != nil {
			t.Fatalf("Check after recovery = %v", err)
		}
	})
}

// Paused, when given, decides alone: here it pauses a consumer whose queue
// is open.
func TestConsumerPausedOverridesTheQueue(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		var paused atomic.Bool
		paused.Store(true)
		e := newConsumerEnv(t, func(c *trigger.ConsumerConfig[*corev1.ConfigMap]) {
			c.Paused = paused.Load
			c.PausePoll = time.Second
		})
		id := e.b.Publish([]byte(`{"namespace":"ns","name":"a"}`))
		stop := e.run(t)
		defer stop()
		time.Sleep(10 * time.Second)
		synctest.Wait()
		if evs := e.b.Events(id); len(evs) != 0 {
			t.Fatalf("paused: %q, want no delivery", ops(evs))
		}
		paused.Store(false)
		time.Sleep(time.Second)
		synctest.Wait()
		if got := ops(e.b.Events(id)); got != "Ack" {
			t.Fatalf("after unpausing: %q, want Ack", got)
		}
	})
}

// An API failure is retried soon when an API server's restart explains
// it (5xx, refused connections; 401/403 for the first few deliveries, as
// while its authorizer syncs), whatever the deliveries so far, and with a
// delay growing with them otherwise; each class is counted apart.
func TestConsumerNacksAPIErrorsByClass(t *testing.T) {
	for _, tc := range []struct {
		name  string
		err   error
		want  string
		class string
	}{
		{"a restart's 500", apierrors.NewInternalError(errors.New("etcd leader changed")), "Nack@1s,Nack@1s,Nack@1s,Nack@1s,Ack", "APITransient"},
		{"a refused connection", &url.Error{Op: "Get", URL: "https://127.0.0.1:6443", Err: &net.OpError{Op: "dial", Net: "tcp",
			Err: &os.SyscallError{Syscall: "connect", Err: syscall.ECONNREFUSED}}}, "Nack@1s,Nack@1s,Nack@1s,Nack@1s,Ack", "APITransient"},
		{"a refusal", apierrors.NewForbidden(configMaps.GroupResource(), "a", errors.New("no")), "Nack@1s,Nack@1s,Nack@1s,Nack@5s,Ack", "APIRefused"},
		{"a bad request", apierrors.NewBadRequest("no"), "Nack@1s,Nack@2s,Nack@4s,Nack@5s,Ack", "APIError"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			synctest.Test(t, func(t *testing.T) {
				e := newConsumerEnv(t, func(c *trigger.ConsumerConfig[*corev1.ConfigMap]) {
					c.RetryBase, c.RetryCap = time.Second, 5*time.Second
				})
				failures := 4
				e.objs.fail = func(opkit.Key) error {
					if failures > 0 {
						failures--
						return tc.err
					}
					return nil
				}
				id := e.b.Publish([]byte(`{"namespace":"ns","name":"a"}`))
				stop := e.run(t)
				defer stop()
				time.Sleep(time.Minute)
				synctest.Wait()
				if got := ops(e.b.Events(id)); got != tc.want {
					t.Errorf("settlements = %q, want %q", got, tc.want)
				}
				if e.m.nacked[tc.class] != 4 {
					t.Errorf("nacked = %v, want 4 %s", e.m.nacked, tc.class)
				}
			})
		})
	}
}

// A NotFound that names no object is the API server not serving the
// resource (a CRD not installed yet, a version not served): the object may
// well exist, so the trigger is retried, not acknowledged as gone.
func TestConsumerRetriesWhileTheResourceIsNotServed(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		e := newConsumerEnv(t, func(c *trigger.ConsumerConfig[*corev1.ConfigMap]) {
			c.RetryBase, c.RetryCap = time.Second, 5*time.Second
		})
		// As client-go reports them against kube-apiserver (see
		// internal/typed's integration test): an unknown group/version, then
		// a known one without the resource.
		answers := []error{
			apierrors.NewGenericServerResponse(404, "get", schema.GroupResource{}, "", "404 page not found", 0, true),
			&apierrors.StatusError{ErrStatus: metav1.Status{Status: metav1.StatusFailure, Code: 404, Reason: metav1.StatusReasonNotFound,
				Message: "the server could not find the requested resource", Details: &metav1.StatusDetails{}}},
		}
		e.objs.fail = func(opkit.Key) error {
			if len(answers) == 0 {
				return nil
			}
			err := answers[0]
			answers = answers[1:]
			return err
		}
		id := e.b.Publish([]byte(`{"namespace":"ns","name":"a"}`))
		stop := e.run(t)
		defer stop()
		time.Sleep(time.Minute)
		synctest.Wait()
		if got := ops(e.b.Events(id)); got != "Nack@1s,Nack@2s,Ack" {
			t.Errorf("settlements = %q, want two retries, then the ack of the scheduled trigger", got)
		}
		if e.m.nacked["APIError"] != 2 || e.m.acked["NotFound"] != 0 || e.m.acked["Scheduled"] != 1 {
			t.Errorf("nacked %v, acked %v", e.m.nacked, e.m.acked)
		}
		if e.q.Len() != 1 {
			t.Errorf("queue len = %d, want the trigger queued", e.q.Len())
		}
	})
}

func TestConsumerReconnectsAndReportsBrokerErrorsByKind(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		e := newConsumerEnv(t, func(c *trigger.ConsumerConfig[*corev1.ConfigMap]) {
			c.ReconnectBase, c.ReconnectCap = time.Second, 4*time.Second
		})
		if err := e.c.Check(); !errors.Is(err, trigger.ErrNotRunning) {
			t.Fatalf("Check before Run = %v, want ErrNotRunning", err)
		}
		e.b.Fail("receive", &trigger.BrokerError{Kind: "Permission", Op: "receive", Err: errors.New("nats: permissions violation for subscription")})
		stop := e.run(t)
		defer stop()
		synctest.Wait()
		err := e.c.Check()
		var be *trigger.BrokerError
		if !errors.As(err, &be) || be.Kind != "Permission" || !strings.Contains(err.Error(), "Permission") {
			t.Fatalf("Check = %v, want a Permission BrokerError named in the message", err)
		}
		// Backoff 1s, 2s, 4s, 4s: five attempts within 11s.
		time.Sleep(11*time.Second + time.Millisecond)
		synctest.Wait()
		if n := e.m.brokerErrs["Permission"]; n != 5 {
			t.Errorf("receive attempts = %d, want 5 (backoff 1s, 2s, 4s, 4s)", n)
		}
		e.b.Fail("receive", &trigger.BrokerError{Kind: "Quota", Op: "receive", Err: errors.New("max ack pending")})
		time.Sleep(4 * time.Second)
		synctest.Wait()
		if err := e.c.Check(); trigger.KindOf(err) != "Quota" {
			t.Errorf("Check = %v, want Quota", err)
		}
		e.b.Fail("receive", nil)
		id := e.b.Publish([]byte(`{"namespace":"ns","name":"a"}`))
		time.Sleep(4 * time.Second)
		synctest.Wait()
		if err := e.c.Check(); err != nil {
			t.Errorf("Check after recovery = %v", err)
		}
		if got := ops(e.b.Events(id)); got != "Ack" {
			t.Errorf("message after reconnect: %q", got)
		}
	})
}

func TestConsumerReportsSettleFailures(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		// Receiving while suspended, so that the message's enqueue is dropped
		// and its nack fails.
		e := newConsumerEnv(t, func(c *trigger.ConsumerConfig[*corev1.ConfigMap]) { c.Paused = func() bool { return false } })
		e.b.Fail("settle", &trigger.BrokerError{Kind: "Disconnected", Op: "ack", Err: errors.New("connection closed")})
		stop := e.run(t)
		defer stop()
		e.q.Suspend()
		id := e.b.Publish([]byte(`{"namespace":"ns","name":"a"}`))
		synctest.Wait()
		if got := ops(e.b.Events(id)); got != "" {
			t.Fatalf("settlements recorded despite the failure: %q", got)
		}
		if err := e.c.Check(); trigger.KindOf(err) != "Disconnected" {
			t.Errorf("Check = %v, want Disconnected", err)
		}
		e.b.Fail("settle", nil)
		e.q.Resume()
		time.Sleep(30 * time.Second) // the fake broker's AckWait
		synctest.Wait()
		evs := e.b.Events(id)
		if got := ops(evs); got != "Ack" || evs[0].Delivery != 2 {
			t.Errorf("settlements = %q, want the redelivery acked", got)
		}
		if err := e.c.Check(); err != nil {
			t.Errorf("Check after recovery = %v", err)
		}
	})
}

func TestConsumerBoundsConcurrencyAndStopsGracefully(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		e := newConsumerEnv(t, func(c *trigger.ConsumerConfig[*corev1.ConfigMap]) { c.Concurrency = 3 })
		e.objs.block = make(chan struct{})
		for range 10 {
			e.b.Publish([]byte(`{"namespace":"ns","name":"a"}`))
		}
		ctx, cancel := context.WithCancel(t.Context())
		done := make(chan error, 1)
		go func() { done <- e.c.Run(ctx) }()
		synctest.Wait()
		if n := e.b.InFlight(); n != 3 {
			t.Fatalf("in flight = %d, want Concurrency 3", n)
		}
		cancel()
		synctest.Wait()
		select {
		case <-done:
			t.Fatal("Run returned while messages were in flight")
		default:
		}
		close(e.objs.block)
		if err := <-done; err != nil {
			t.Fatalf("Run = %v", err)
		}
		if p := e.objs.peak.Load(); p != 3 {
			t.Errorf("peak concurrent re-fetches = %d, want 3", p)
		}
		evs := e.b.Events()
		if got := ops(evs); got != "Ack,Ack,Ack" {
			t.Errorf("settlements = %q, want the 3 in-flight messages acked", got)
		}
		if e.b.Outstanding() != 7 || e.b.InFlight() != 0 {
			t.Errorf("outstanding %d in flight %d, want 7 untouched and none held", e.b.Outstanding(), e.b.InFlight())
		}
	})
}

// cancelOnReceive cancels the consumer's context while handing out a
// message: the message is received but can no longer be handled.
type cancelOnReceive struct {
	*brokertest.Broker
	cancel context.CancelFunc
}

func (b cancelOnReceive) Receive(ctx context.Context) (trigger.Message, error) {
	m, err := b.Broker.Receive(ctx)
	b.cancel()
	return m, err
}

func TestConsumerNacksWhatItReceivedWhileStopping(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		ctx, cancel := context.WithCancel(t.Context())
		b := brokertest.New()
		id := b.Publish([]byte(`{"namespace":"ns","name":"a"}`))
		tr, q := newCMTriggerWith(t, trigger.Config[*corev1.ConfigMap]{
			Get: func(context.Context, opkit.Key) (*corev1.ConfigMap, error) { return cm("ns", "a"), nil },
		})
		c, err := trigger.NewConsumer(trigger.ConsumerConfig[*corev1.ConfigMap]{
			Broker: cancelOnReceive{b, cancel}, Trigger: tr, Logger: discard,
		})
		if err != nil {
			t.Fatal(err)
		}
		if err := c.Run(ctx); err != nil {
			t.Fatal(err)
		}
		if got := ops(b.Events(id)); got != "Nack@0s" {
			t.Errorf("settlements = %q, want Nack@0s", got)
		}
		if q.Len() != 0 {
			t.Error("a message received while stopping was scheduled")
		}
	})
}

func TestConsumerReportsLag(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		e := newConsumerEnv(t, func(c *trigger.ConsumerConfig[*corev1.ConfigMap]) {
			c.LagInterval = 10 * time.Second
			c.APITimeout = time.Minute // the blocked re-fetch outlasts the polls
		})
		e.objs.block = make(chan struct{})
		for range 4 {
			e.b.Publish([]byte(`{"namespace":"ns","name":"a"}`))
		}
		stop := e.run(t)
		synctest.Wait()
		// The first poll runs as Run starts, before or after the first
		// Receive (4 or 3 waiting); the second, 10s later, sees 3 waiting
		// (one in flight, its handler blocked); the third fails.
		time.Sleep(10 * time.Second)
		synctest.Wait()
		e.b.Fail("lag", &trigger.BrokerError{Kind: "Permission", Op: "lag"})
		time.Sleep(10 * time.Second)
		synctest.Wait()
		// The gauge keeps its last value: Check says it is stale.
		var be *trigger.BrokerError
		if err := e.c.Check(); !errors.As(err, &be) || be.Kind != "Permission" || !errors.Is(err, trigger.ErrLagUnavailable) {
			t.Errorf("Check while Lag fails = %v, want the lag's Permission error", err)
		}
		e.b.Fail("lag", nil)
		time.Sleep(10 * time.Second)
		synctest.Wait()
		if err := e.c.Check(); err != nil {
			t.Errorf("Check once Lag works again = %v, want nil", err)
		}
		close(e.objs.block)
		stop()
		if len(e.m.lag) != 3 || (e.m.lag[0] != 3 && e.m.lag[0] != 4) || e.m.lag[1] != 3 || e.m.lag[2] != 3 {
			t.Errorf("lag reports = %v, want [3 or 4, 3, 3]", e.m.lag)
		}
		if e.m.brokerErrs["Permission"] != 1 {
			t.Errorf("broker errors = %v", e.m.brokerErrs)
		}
	})
}

// A broker that dead-letters on a Nack (its delivery limit) says so, and
// the consumer counts a terminated message, not a nack: a trigger that
// dies this way shows in the metrics.
func TestConsumerCountsADeadLetterOnNackAsTerminated(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		e := newConsumerEnv(t, func(c *trigger.ConsumerConfig[*corev1.ConfigMap]) {
			c.RetryBase, c.RetryCap = time.Second, time.Second
		})
		e.b.MaxDeliver = 3
		e.objs.fail = func(opkit.Key) error { return apierrors.NewInternalError(errors.New("etcd leader changed")) }
		id := e.b.Publish([]byte(`{"namespace":"ns","name":"a"}`))
		stop := e.run(t)
		time.Sleep(time.Minute)
		synctest.Wait()
		stop()
		if got := ops(e.b.Events(id)); got != "Nack@1s,Nack@1s,Nack:MaxDeliveries@1s" {
			t.Errorf("settlements = %q", got)
		}
		if dl := deadLetters(e.b); len(dl) != 1 || dl[0].Reason != "MaxDeliveries" {
			t.Fatalf("dead letters = %+v, want one (MaxDeliveries)", dl)
		}
		if e.m.nacked["APITransient"] != 2 || e.m.terminated["MaxDeliveries"] != 1 {
			t.Errorf("nacked %v, terminated %v; want 2 APITransient nacks and 1 MaxDeliveries", e.m.nacked, e.m.terminated)
		}
	})
}

func TestConsumerAllowUnknownFields(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		e := newConsumerEnv(t, func(c *trigger.ConsumerConfig[*corev1.ConfigMap]) { c.AllowUnknownFields = true })
		id := e.b.Publish([]byte(`{"namespace":"ns","name":"b","source":"ci","sha":"abc"}`))
		stop := e.run(t)
		synctest.Wait()
		stop()
		if got := ops(e.b.Events(id)); got != "Ack" {
			t.Errorf("settlements = %q, want Ack", got)
		}
	})
}

func TestNewConsumerValidates(t *testing.T) {
	get := func(context.Context, opkit.Key) (*corev1.ConfigMap, error) { return nil, nil }
	tr, _ := newCMTriggerWith(t, trigger.Config[*corev1.ConfigMap]{Get: get})
	for name, cfg := range map[string]trigger.ConsumerConfig[*corev1.ConfigMap]{
		"no broker":        {Trigger: tr},
		"no trigger":       {Broker: brokertest.New()},
		"negative timeout": {Broker: brokertest.New(), Trigger: tr, APITimeout: -1},
		"negative conc":    {Broker: brokertest.New(), Trigger: tr, Concurrency: -1},
		"negative size":    {Broker: brokertest.New(), Trigger: tr, MaxMessageBytes: -1},
		"bad type":         {Broker: brokertest.New(), Trigger: tr, Type: 9},
	} {
		if _, err := trigger.NewConsumer(cfg); err == nil {
			t.Errorf("%s: NewConsumer succeeded", name)
		}
	}
	if _, err := trigger.NewConsumer(trigger.ConsumerConfig[*corev1.ConfigMap]{Broker: brokertest.New(), Trigger: tr}); err != nil {
		t.Errorf("NewConsumer with only a Broker and a Trigger: %v", err)
	}
}

// An object of another kind from the API server is not the message's
// fault: it is retried like an API error, never dead-lettered.
func TestConsumerNacksAnObjectOfAnotherKind(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		e := newConsumerEnvWith(t, func(c *trigger.Config[*corev1.ConfigMap]) {
			c.Get = func(_ context.Context, key opkit.Key) (*corev1.ConfigMap, error) {
				o := cm(key.Namespace, key.Name)
				o.Kind = "Secret"
				return o, nil
			}
		}, func(c *trigger.ConsumerConfig[*corev1.ConfigMap]) {
			c.RetryBase, c.RetryCap = time.Second, 2*time.Second
		})
		e.b.MaxDeliver = 3
		id := e.b.Publish([]byte(`{"namespace":"ns","name":"a"}`))
		stop := e.run(t)
		time.Sleep(time.Minute)
		synctest.Wait()
		stop()
		if got := ops(e.b.Events(id)); got != "Nack@1s,Nack@2s,Nack:MaxDeliveries@2s" {
			t.Errorf("settlements = %q, want nacks with the API error backoff", got)
		}
		if e.m.nacked["APIError"] != 2 || e.m.terminated["Invalid"] != 0 || e.q.Len() != 0 {
			t.Errorf("nacked %v, terminated %v, queue len %d; want API error nacks, no Term, nothing queued", e.m.nacked, e.m.terminated, e.q.Len())
		}
	})
}

// ConsumerConfig.Type is the type of the triggers: Added marks the cause
// Added, Deleted asks for a teardown.
func TestConsumerTypeBecomesTheCauseMarks(t *testing.T) {
	for _, tc := range []struct {
		typ             opkit.Type
		added, teardown bool
	}{
		{0, false, false},
		{opkit.Added, true, false},
		{opkit.Deleted, false, true},
	} {
		t.Run(tc.typ.String(), func(t *testing.T) {
			synctest.Test(t, func(t *testing.T) {
				e := newConsumerEnv(t, func(c *trigger.ConsumerConfig[*corev1.ConfigMap]) { c.Type = tc.typ })
				e.b.Publish([]byte(`{"namespace":"ns","name":"a","reason":"r"}`))
				stop := e.run(t)
				synctest.Wait()
				stop()
				it, err := e.q.Get(context.Background())
				want := operatorCause(cm("ns", "a"), "r")
				want.Added, want.Teardown = tc.added, tc.teardown
				if err != nil || describe(it.Value) != describe(want) {
					t.Errorf("type %v: queued %s (%v)\nwant           %s", tc.typ, describe(it.Value), err, describe(want))
				}
			})
		})
	}
}

func TestConsumerRunTwiceConcurrentlyFails(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		e := newConsumerEnv(t, nil)
		stop := e.run(t)
		synctest.Wait()
		if err := e.c.Run(t.Context()); err == nil {
			t.Error("second concurrent Run succeeded")
		}
		if err := e.c.Check(); err != nil {
			t.Errorf("Check while running = %v", err)
		}
		stop()
		if err := e.c.Check(); !errors.Is(err, trigger.ErrNotRunning) {
			t.Errorf("Check after stop = %v", err)
		}
	})
}
