package trigger_test

import (
	"context"
	"fmt"
	"sync"
	"sync/atomic"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/types"

	"github.com/opkit/opkit"
	"github.com/opkit/opkit/queue"
	"github.com/opkit/opkit/trigger"
	"github.com/opkit/opkit/trigger/brokertest"
)

// deadLetters returns the events of b that dead-lettered their message.
func deadLetters(b *brokertest.Broker) []brokertest.Event {
	var dead []brokertest.Event
	for _, ev := range b.Events() {
		if ev.Reason != "" {
			dead = append(dead, ev)
		}
	}
	return dead
}

var configMaps = opkit.Resource{
	GroupVersionResource: schema.GroupVersionResource{Version: "v1", Resource: "configmaps"},
	Kind:                 "ConfigMap",
	Namespaced:           true,
}

// Widget is a cluster-scoped custom resource written the way opkit users
// write theirs: a plain struct embedding TypeMeta and ObjectMeta.
type Widget struct {
	metav1.TypeMeta   `json:",inline"`
	metav1.ObjectMeta `json:"metadata,omitempty"`
	Spec              struct {
		Size int `json:"size,omitempty"`
	} `json:"spec,omitempty"`
}

var widgets = opkit.Resource{
	GroupVersionResource: schema.GroupVersionResource{Group: "demo.opkit.dev", Version: "v1", Resource: "widgets"},
	Kind:                 "Widget",
	Namespaced:           false,
}

func cm(ns, name string) *corev1.ConfigMap {
	return &corev1.ConfigMap{
		TypeMeta:   metav1.TypeMeta{APIVersion: "v1", Kind: "ConfigMap"},
		ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: name, UID: types.UID("uid-" + name), ResourceVersion: "7"},
	}
}

type cmQueue = queue.Queue[opkit.Key, opkit.Cause[*corev1.ConfigMap]]

// newCMQueue returns a real queue whose payloads merge as the controller's
// do: the join of the causes.
func newCMQueue() *cmQueue {
	return queue.New[opkit.Key](queue.Config[opkit.Cause[*corev1.ConfigMap]]{Merge: (*opkit.Cause[*corev1.ConfigMap]).Merge})
}

// newCMTrigger returns a trigger for ConfigMaps over a new queue, with no
// getter: Enqueue and Submit only.
func newCMTrigger(t interface{ Fatal(...any) }, m trigger.Metrics) (*trigger.Trigger[*corev1.ConfigMap], *cmQueue) {
	return newCMTriggerWith(t, trigger.Config[*corev1.ConfigMap]{Metrics: m})
}

// newCMTriggerWith returns a trigger for ConfigMaps over a new queue,
// configured by cfg (its Get, Dynamic, scope, metrics...); Queue and
// Resource are set here, and a nil Logger discards.
func newCMTriggerWith(t interface{ Fatal(...any) }, cfg trigger.Config[*corev1.ConfigMap]) (*trigger.Trigger[*corev1.ConfigMap], *cmQueue) {
	q := newCMQueue()
	cfg.Resource = configMaps
	switch r := cfg.Router.(type) {
	case nil:
		if cfg.Queue == nil {
			cfg.Router = &oneLeader{q: q, holder: "replica-b"}
		}
	case *oneLeader:
		r.q = q
	case plainQueue:
		cfg.Router, cfg.Queue = nil, q
	}
	if cfg.Logger == nil {
		cfg.Logger = discard
	}
	tr, err := trigger.New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	return tr, q
}

// operatorCause is the cause a trigger of type Modified queues for obj.
func operatorCause(obj *corev1.ConfigMap, reasons ...string) opkit.Cause[*corev1.ConfigMap] {
	return opkit.Cause[*corev1.ConfigMap]{Object: obj, Sources: opkit.Sources(opkit.Operator), Reasons: opkit.ReasonsOf(reasons...)}
}

// describe renders a cause for comparison and messages: the object by
// key, UID and resourceVersion, and every other field.
func describe(c opkit.Cause[*corev1.ConfigMap]) string {
	obj := "<nil>"
	if c.Object != nil {
		obj = fmt.Sprintf("%s uid=%s rv=%s", opkit.KeyOf(c.Object), c.Object.UID, c.Object.ResourceVersion)
	}
	return fmt.Sprintf("object=%s sources=%v reasons=%q added=%v teardown=%v retries=%d", obj, c.Sources, c.Reasons, c.Added, c.Teardown, c.Retries)
}

// countingMetrics records every metric call of every kind.
type countingMetrics struct {
	mu         sync.Mutex
	enqueued   map[queue.Outcome]int
	rejected   int
	requests   map[int]int
	received   int
	acked      map[string]int
	nacked     map[string]int
	terminated map[string]int
	processed  int
	lag        []int64
	brokerErrs map[string]int
}

func newCounting() *countingMetrics {
	return &countingMetrics{
		enqueued: map[queue.Outcome]int{}, requests: map[int]int{},
		acked: map[string]int{}, nacked: map[string]int{},
		terminated: map[string]int{}, brokerErrs: map[string]int{},
	}
}

func (m *countingMetrics) Enqueued(o queue.Outcome) { m.mu.Lock(); m.enqueued[o]++; m.mu.Unlock() }
func (m *countingMetrics) Rejected()                { m.mu.Lock(); m.rejected++; m.mu.Unlock() }
func (m *countingMetrics) Request(code int, _ string, _ time.Duration) {
	m.mu.Lock()
	m.requests[code]++
	m.mu.Unlock()
}
func (m *countingMetrics) Received()       { m.mu.Lock(); m.received++; m.mu.Unlock() }
func (m *countingMetrics) Acked(r string)  { m.mu.Lock(); m.acked[r]++; m.mu.Unlock() }
func (m *countingMetrics) Nacked(r string) { m.mu.Lock(); m.nacked[r]++; m.mu.Unlock() }
func (m *countingMetrics) Terminated(r string) {
	m.mu.Lock()
	m.terminated[r]++
	m.mu.Unlock()
}
func (m *countingMetrics) Processed(time.Duration) { m.mu.Lock(); m.processed++; m.mu.Unlock() }
func (m *countingMetrics) Lag(n int64)             { m.mu.Lock(); m.lag = append(m.lag, n); m.mu.Unlock() }
func (m *countingMetrics) BrokerError(k string) {
	m.mu.Lock()
	m.brokerErrs[k]++
	m.mu.Unlock()
}

// oneLeader is the Router of a controller with one shard and a leader:
// the queue while its intake is open, else (suspended or shut down) the
// leader's identity, holder, and the endpoint it publishes, if any.
type oneLeader struct {
	q        *cmQueue
	holder   string
	endpoint atomic.Pointer[string]
}

func (r *oneLeader) Shards() int { return 1 }

func (r *oneLeader) Place(int) trigger.Place[*corev1.ConfigMap] {
	if !r.q.Suspended() && !r.q.ShuttingDown() {
		return trigger.Place[*corev1.ConfigMap]{Queue: r.q}
	}
	p := trigger.Place[*corev1.ConfigMap]{Holder: r.holder}
	if e := r.endpoint.Load(); e != nil {
		p.Endpoint = *e
	}
	return p
}

// follow makes r's leader publish url.
func (r *oneLeader) follow(url string) { r.endpoint.Store(&url) }

// intake is tr.Intake with what most tests look at of its decision: the
// object read and the queue's outcome.
func intake(tr *trigger.Trigger[*corev1.ConfigMap], ctx context.Context, p trigger.Pointer, opts trigger.IntakeOptions) (*corev1.ConfigMap, queue.Outcome, error) {
	d, err := tr.Intake(ctx, p, opts)
	return d.Object, d.Outcome, err
}

// plainQueue as a Config.Router asks newCMTriggerWith for a Trigger on
// the queue alone (Config.Queue), whose Add tells each drop.
type plainQueue struct{}

func (plainQueue) Shards() int { return 1 }
func (plainQueue) Place(int) trigger.Place[*corev1.ConfigMap] {
	return trigger.Place[*corev1.ConfigMap]{}
}
