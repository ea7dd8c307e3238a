package watcher_test

import (
	"context"
	"fmt"
	"io"
	"log/slog"
	"math"
	"slices"
	"sync"
	"testing"
	"testing/synctest"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/schema"
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

// widget builds an unstructured Widget, up to date (its
// status.observedGeneration is gen); opts edit it further.
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
		"spec":   map[string]any{"size": int64(1)},
		"status": map[string]any{"observedGeneration": gen},
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

// record is one Add seen by the recorder. An add without an object is a
// delete's: the record describes the newest delete the ledger held for
// the key at that moment. A Refresh is a MergeOnly add: a newer state for
// an entry that may be waiting and due.
type record struct {
	Key      opkit.Key
	Type     opkit.Type
	RV       string
	UID      string
	Final    bool
	Priority int
	Refresh  bool
}

func (r record) String() string {
	if r.Refresh {
		return fmt.Sprintf("Refresh %s rv=%s", r.Key, r.RV)
	}
	s := fmt.Sprintf("%s %s rv=%s uid=%s prio=%d", r.Type, r.Key, r.RV, r.UID, r.Priority)
	if r.Final {
		s += " tombstone"
	}
	return s
}

// recorder is a fake queue.Adder that keeps every add, in order; w, when
// set (mustNew does), is the watcher whose ledger describes the deletes.
type recorder struct {
	mu      sync.Mutex
	records []record
	outcome queue.Outcome
	after   func(record) // called after each Add, without the lock
	w       *watcher.Watcher[*Widget]
}

func (r *recorder) Add(key opkit.Key, c opkit.Cause[*Widget], opts queue.AddOptions) queue.Outcome {
	rec := describe(r.watcher(), key, c, opts)
	r.mu.Lock()
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

func (r *recorder) watcher() *watcher.Watcher[*Widget] {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.w
}

// describe turns an add into a record, checking what every add of the
// watcher's must be: source APIServer only, no reasons, no teardown, and
// an object that matches the key when there is one; a refresh (MergeOnly)
// carries only an object, at the lowest priority.
func describe(w *watcher.Watcher[*Widget], key opkit.Key, c opkit.Cause[*Widget], opts queue.AddOptions) record {
	if opts.MergeOnly {
		if c.Object == nil || opkit.KeyOf(c.Object) != key || c.Sources != 0 || c.Added || opts.Priority != math.MinInt32 {
			panic(fmt.Sprintf("watcher refreshed %v with %+v at %+v: want only the object, at the lowest priority", key, c, opts))
		}
		return record{Key: key, RV: c.Object.ResourceVersion, Refresh: true}
	}
	if c.Sources != opkit.Sources(opkit.APIServer) || len(c.Reasons) > 0 || c.Teardown || c.Retries != 0 {
		panic(fmt.Sprintf("watcher added %+v: want source APIServer and nothing else", c))
	}
	rec := record{Key: key, Priority: opts.Priority}
	switch {
	case c.Object != nil:
		if opkit.KeyOf(c.Object) != key {
			panic(fmt.Sprintf("key %v does not match object %v", key, opkit.KeyOf(c.Object)))
		}
		rec.Type, rec.RV, rec.UID = opkit.Modified, c.Object.ResourceVersion, string(c.Object.UID)
		if c.Added {
			rec.Type = opkit.Added
		}
	case c.Added:
		panic("watcher added an Added cause without an object")
	default:
		rec.Type = opkit.Deleted
		if w == nil {
			break
		}
		if ds := w.Deletes(key); len(ds) > 0 {
			d := ds[len(ds)-1]
			rec.RV, rec.UID, rec.Final = d.Object.ResourceVersion, string(d.Object.UID), d.FinalStateUnknown
		}
	}
	return rec
}

// deletes describes the ledger's deletes of key, oldest first.
func deletes(w *watcher.Watcher[*Widget], key opkit.Key) []string {
	var out []string
	for _, d := range w.Deletes(key) {
		s := fmt.Sprintf("%s rv=%s", d.Object.UID, d.Object.ResourceVersion)
		if d.FinalStateUnknown {
			s += " tombstone"
		}
		out = append(out, s)
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
	sharding []bool // every Sharding call: server side?
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
func (m *metrics) Sharding(server bool) {
	m.mu.Lock()
	m.sharding = append(m.sharding, server)
	m.mu.Unlock()
}
func (m *metrics) shardingCalls() []bool {
	m.mu.Lock()
	defer m.mu.Unlock()
	return slices.Clone(m.sharding)
}
func (m *metrics) get(f func(*metrics) int) int {
	m.mu.Lock()
	defer m.mu.Unlock()
	return f(m)
}

var discard = slog.New(slog.NewTextHandler(io.Discard, nil))

// config returns a Config for widgets with a recorder queue and a
// silent logger.
func config(client *dynfake.FakeDynamicClient, q *recorder) watcher.Config[*Widget] {
	return watcher.Config[*Widget]{
		Client:   client,
		Resource: widgets,
		Queue:    q,
		Logger:   discard,
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

func (ws *watches) install(c *dynfake.FakeDynamicClient) { ws.installFor(c, "widgets") }

// installFor makes c's watches of resource fake ones the test drives.
func (ws *watches) installFor(c *dynfake.FakeDynamicClient, resource string) {
	c.PrependWatchReactor(resource, func(a k8stesting.Action) (bool, watch.Interface, error) {
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

// watching returns a watcher over c that records into a new recorder.
func watching(t *testing.T, c *dynfake.FakeDynamicClient) (*recorder, *watcher.Watcher[*Widget]) {
	q := &recorder{}
	return q, mustNew(t, config(c, q))
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

func runAB(t *testing.T) abRunning {
	c := abFake()
	ws := &watches{}
	ws.install(c)
	q, w := watching(t, c)
	stop := start(t, w)
	synctest.Wait()
	q.take()
	return abRunning{c, ws, q, w, stop}
}
