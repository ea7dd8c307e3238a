package trigger_test

import (
	"sync"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/types"

	"github.com/opkit/opkit"
	"github.com/opkit/opkit/queue"
	"github.com/opkit/opkit/trigger"
)

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

type cmQueue = queue.Queue[opkit.Key, opkit.Event[*corev1.ConfigMap]]

func newCMTrigger(t interface{ Fatal(...any) }, m trigger.Metrics) (*trigger.Trigger[*corev1.ConfigMap], *cmQueue) {
	q := queue.New[opkit.Key, opkit.Event[*corev1.ConfigMap]](queue.Config[opkit.Event[*corev1.ConfigMap]]{})
	tr, err := trigger.New(trigger.Config[*corev1.ConfigMap]{Queue: q, Resource: configMaps, Metrics: m, Logger: discard})
	if err != nil {
		t.Fatal(err)
	}
	return tr, q
}

// countingMetrics records every metric call of every kind.
type countingMetrics struct {
	mu         sync.Mutex
	enqueued   map[queue.Outcome]int
	rejected   int
	requests   map[int]int
	received   int
	acked      map[trigger.AckReason]int
	nacked     map[trigger.NackReason]int
	terminated map[trigger.TermReason]int
	processed  int
	lag        []int64
	brokerErrs map[trigger.BrokerErrorKind]int
}

func newCounting() *countingMetrics {
	return &countingMetrics{
		enqueued: map[queue.Outcome]int{}, requests: map[int]int{},
		acked: map[trigger.AckReason]int{}, nacked: map[trigger.NackReason]int{},
		terminated: map[trigger.TermReason]int{}, brokerErrs: map[trigger.BrokerErrorKind]int{},
	}
}

func (m *countingMetrics) Enqueued(o queue.Outcome) { m.mu.Lock(); m.enqueued[o]++; m.mu.Unlock() }
func (m *countingMetrics) Rejected()                { m.mu.Lock(); m.rejected++; m.mu.Unlock() }
func (m *countingMetrics) Request(code int, _ string, _ time.Duration) {
	m.mu.Lock()
	m.requests[code]++
	m.mu.Unlock()
}
func (m *countingMetrics) Received()                   { m.mu.Lock(); m.received++; m.mu.Unlock() }
func (m *countingMetrics) Acked(r trigger.AckReason)   { m.mu.Lock(); m.acked[r]++; m.mu.Unlock() }
func (m *countingMetrics) Nacked(r trigger.NackReason) { m.mu.Lock(); m.nacked[r]++; m.mu.Unlock() }
func (m *countingMetrics) Terminated(r trigger.TermReason) {
	m.mu.Lock()
	m.terminated[r]++
	m.mu.Unlock()
}
func (m *countingMetrics) Processed(time.Duration) { m.mu.Lock(); m.processed++; m.mu.Unlock() }
func (m *countingMetrics) Lag(n int64)             { m.mu.Lock(); m.lag = append(m.lag, n); m.mu.Unlock() }
func (m *countingMetrics) BrokerError(k trigger.BrokerErrorKind) {
	m.mu.Lock()
	m.brokerErrs[k]++
	m.mu.Unlock()
}
