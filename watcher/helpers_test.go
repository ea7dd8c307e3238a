package watcher_test

import (
	"context"
	"fmt"
	"io"
	"log/slog"
	"slices"
	"sync"
	"testing"
	"testing/synctest"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/watch"
	dynfake "k8s.io/client-go/dynamic/fake"
	k8stesting "k8s.io/client-go/testing"

	"github.com/opkit/opkit"
	"github.com/opkit/opkit/queue"
	"github.com/opkit/opkit/watcher"
)

// Widget is a custom resource typed by a plain struct, as users write them.
type Widget struct {
	metav1.TypeMeta   `json:",inline"`
	metav1.ObjectMeta `json:"metadata,omitempty"`
	Spec              WidgetSpec   `json:"spec,omitempty"`
	Status            WidgetStatus `json:"status,omitempty"`
}

type WidgetSpec struct {
	Size int `json:"size,omitempty"`
}

type WidgetStatus struct {
	Ready bool `json:"ready,omitempty"`
}

var widgets = opkit.Resource{
	GroupVersionResource: schema.GroupVersionResource{Group: "test.opkit.dev", Version: "v1", Resource: "widgets"},
	Kind:                 "Widget",
	Namespaced:           true,
}

// widget builds an unstructured Widget; opts edit it further.
func widget(ns, name, uid, rv string, gen int64, opts ...func(*unstructured.Unstructured)) *unstructured.Unstructured {
	u := &unstructured.Unstructured{Object: map[string]any{
		"apiVersion": "test.opkit.dev/v1",
		"kind":       "Widget",
		"metadata": map[string]any{
			"namespace":       ns,
			"name":            name,
			"uid":             uid,
			"resourceVersion": rv,
			"generation":      gen,
		},
		"spec": map[string]any{"size": int64(1)},
	}}
	for _, o := range opts {
		o(u)
	}
	return u
}

func newFake(objs ...runtime.Object) *dynfake.FakeDynamicClient {
	return dynfake.NewSimpleDynamicClientWithCustomListKinds(runtime.NewScheme(),
		map[schema.GroupVersionResource]string{widgets.GroupVersionResource: "WidgetList"}, objs...)
}

// record is one Add seen by the recorder.
type record struct {
	Key      opkit.Key
	Type     opkit.Type
	RV       string
	UID      string
	Final    bool
	Priority int
}

func (r record) String() string {
	s := fmt.Sprintf("%s %s rv=%s uid=%s prio=%d", r.Type, r.Key, r.RV, r.UID, r.Priority)
	if r.Final {
		s += " tombstone"
	}
	return s
}

// recorder is a fake queue.Adder that keeps every add, in order.
type recorder struct {
	mu      sync.Mutex
	records []record
	outcome queue.Outcome
	after   func(record) // called after each Add, without the lock
}

func (r *recorder) Add(key opkit.Key, ev opkit.Event[*Widget], opts queue.AddOptions) queue.Outcome {
	r.mu.Lock()
	if ev.Source != opkit.APIServer {
		panic("watcher added an entry whose source is not APIServer")
	}
	if opkit.KeyOf(ev.Object) != key {
		panic(fmt.Sprintf("key %v does not match object %v", key, opkit.KeyOf(ev.Object)))
	}
	rec := record{
		Key: key, Type: ev.Type, RV: ev.Object.ResourceVersion, UID: string(ev.Object.UID),
		Final: ev.FinalStateUnknown, Priority: opts.Priority,
	}
	r.records = append(r.records, rec)
	out, after := queue.Queued, r.after
	if r.outcome != 0 {
		out = r.outcome
	}
	r.mu.Unlock()
	if after != nil {
		after(rec)
	}
	return out
}

// take returns the records since the last take.
func (r *recorder) take() []record {
	r.mu.Lock()
	defer r.mu.Unlock()
	out := r.records
	r.records = nil
	return out
}

func (r *recorder) setOutcome(o queue.Outcome) {
	r.mu.Lock()
	r.outcome = o
	r.mu.Unlock()
}

// metrics is a recording watcher.Metrics.
type metrics struct {
	mu       sync.Mutex
	events   map[string]int // "Type/Outcome"
	relists  map[watcher.Reason]int
	restarts map[watcher.Reason]int
	errors   map[watcher.Reason]int
	tracked  int
	observed int
}

func newMetrics() *metrics {
	return &metrics{events: map[string]int{}, relists: map[watcher.Reason]int{},
		restarts: map[watcher.Reason]int{}, errors: map[watcher.Reason]int{}}
}

func (m *metrics) Event(t opkit.Type, o queue.Outcome) {
	m.mu.Lock()
	m.events[t.String()+"/"+o.String()]++
	m.mu.Unlock()
}
func (m *metrics) Relist(r watcher.Reason) { m.mu.Lock(); m.relists[r]++; m.mu.Unlock() }
func (m *metrics) WatchRestart(r watcher.Reason) {
	m.mu.Lock()
	m.restarts[r]++
	m.mu.Unlock()
}
func (m *metrics) Error(r watcher.Reason) { m.mu.Lock(); m.errors[r]++; m.mu.Unlock() }
func (m *metrics) Tracked(n int)          { m.mu.Lock(); m.tracked = n; m.mu.Unlock() }
func (m *metrics) Observed(time.Time)     { m.mu.Lock(); m.observed++; m.mu.Unlock() }
func (m *metrics) get(f func(*metrics) int) int {
	m.mu.Lock()
	defer m.mu.Unlock()
	return f(m)
}

var discard = slog.New(slog.NewTextHandler(io.Discard, nil))

// config returns a Config for widgets with a recorder queue, WatchList off
// (the fake does not serve it) and a silent logger.
func config(client *dynfake.FakeDynamicClient, q *recorder) watcher.Config[*Widget] {
	return watcher.Config[*Widget]{
		Client:    client,
		Resource:  widgets,
		Queue:     q,
		WatchList: watcher.WatchListOff,
		Logger:    discard,
	}
}

// start runs w in the background; the returned stop cancels it and waits
// for Run to return.
func start(t *testing.T, w *watcher.Watcher[*Widget]) (stop func()) {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- w.Run(ctx) }()
	return func() {
		cancel()
		if err := <-done; err != nil {
			t.Errorf("Run returned %v, want nil after cancel", err)
		}
	}
}

// watches hands out test-controlled fake watchers through a watch reactor
// and records the options of every watch request.
type watches struct {
	mu       sync.Mutex
	opened   []*watch.RaceFreeFakeWatcher
	requests []metav1.ListOptions
	err      func(n int, opts metav1.ListOptions) error // optional failure per request
}

func (ws *watches) install(c *dynfake.FakeDynamicClient) {
	c.PrependWatchReactor("widgets", func(a k8stesting.Action) (bool, watch.Interface, error) {
		opts := a.(k8stesting.WatchActionImpl).ListOptions
		ws.mu.Lock()
		defer ws.mu.Unlock()
		ws.requests = append(ws.requests, opts)
		if ws.err != nil {
			if err := ws.err(len(ws.requests), opts); err != nil {
				return true, nil, err
			}
		}
		fw := watch.NewRaceFreeFake()
		ws.opened = append(ws.opened, fw)
		return true, fw, nil
	})
}

// last returns the most recently opened watch.
func (ws *watches) last(t *testing.T) *watch.RaceFreeFakeWatcher {
	t.Helper()
	ws.mu.Lock()
	defer ws.mu.Unlock()
	if len(ws.opened) == 0 {
		t.Fatal("no watch opened")
	}
	return ws.opened[len(ws.opened)-1]
}

func (ws *watches) rvs() []string {
	ws.mu.Lock()
	defer ws.mu.Unlock()
	var out []string
	for _, o := range ws.requests {
		out = append(out, o.ResourceVersion)
	}
	return out
}

// countLists counts list requests through a reactor that does not handle them.
func countLists(c *dynfake.FakeDynamicClient) func() int {
	var mu sync.Mutex
	n := 0
	c.PrependReactor("list", "widgets", func(k8stesting.Action) (bool, runtime.Object, error) {
		mu.Lock()
		n++
		mu.Unlock()
		return false, nil, nil
	})
	return func() int { mu.Lock(); defer mu.Unlock(); return n }
}

func sameRecords(t *testing.T, what string, got, want []record) {
	t.Helper()
	if !slices.Equal(got, want) {
		t.Errorf("%s:\n got  %v\n want %v", what, got, want)
	}
}

func key(name string) opkit.Key { return opkit.Key{Namespace: "ns", Name: name} }

// abFake returns a fake cluster holding widgets ns/a (uid ua, rv 1) and
// ns/b (uid ub, rv 2).
func abFake() *dynfake.FakeDynamicClient {
	return newFake(widget("ns", "a", "ua", "1", 1), widget("ns", "b", "ub", "2", 1))
}

// watching returns a watcher over c that records into a new recorder, with
// Config.RetainDeletes as given.
func watching(t *testing.T, c *dynfake.FakeDynamicClient, retainDeletes bool) (*recorder, *watcher.Watcher[*Widget]) {
	q := &recorder{}
	cfg := config(c, q)
	cfg.RetainDeletes = retainDeletes
	return q, mustNew(t, cfg)
}

// abRunning is a Run over abFake with the watch under the test's control:
// the fixture's first list is done and its entries taken. Call it inside a
// synctest bubble; stop ends the Run.
type abRunning struct {
	c    *dynfake.FakeDynamicClient
	ws   *watches
	q    *recorder
	w    *watcher.Watcher[*Widget]
	stop func()
}

func runAB(t *testing.T, retainDeletes bool) abRunning {
	c := abFake()
	ws := &watches{}
	ws.install(c)
	q, w := watching(t, c, retainDeletes)
	stop := start(t, w)
	synctest.Wait()
	q.take()
	return abRunning{c, ws, q, w, stop}
}

// settleAtOnce makes the recorder behave like a controller that reconciles
// (and settles) every delete as soon as the queue takes it.
func settleAtOnce(r abRunning) {
	r.q.mu.Lock()
	r.q.after = func(rec record) {
		r.q.mu.Lock()
		dropped := r.q.outcome != 0 && !r.q.outcome.Accepted()
		r.q.mu.Unlock()
		if rec.Type == opkit.Deleted && !dropped {
			r.w.Settle(rec.Key, types.UID(rec.UID), rec.RV)
		}
	}
	r.q.mu.Unlock()
}

// policyQueue records adds; decide picks each add's outcome and may act
// (like a concurrently running controller) before returning.
type policyQueue struct {
	mu      sync.Mutex
	records []record
	decide  func(record) queue.Outcome
}

func (p *policyQueue) Add(k opkit.Key, ev opkit.Event[*Widget], o queue.AddOptions) queue.Outcome {
	rec := record{Key: k, Type: ev.Type, RV: ev.Object.ResourceVersion, UID: string(ev.Object.UID), Final: ev.FinalStateUnknown, Priority: o.Priority}
	p.mu.Lock()
	p.records = append(p.records, rec)
	d := p.decide
	p.mu.Unlock()
	if d != nil {
		return d(rec)
	}
	return queue.Queued
}

func (p *policyQueue) set(d func(record) queue.Outcome) { p.mu.Lock(); p.decide = d; p.mu.Unlock() }
func (p *policyQueue) take() []record {
	p.mu.Lock()
	defer p.mu.Unlock()
	out := p.records
	p.records = nil
	return out
}
