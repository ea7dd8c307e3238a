package reconcile_test

import (
	"context"
	"errors"
	"fmt"
	"hash/fnv"
	"log/slog"
	"maps"
	"math/rand/v2"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"testing/synctest"
	"time"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/watch"
	kfake "k8s.io/client-go/kubernetes/fake"
	k8stesting "k8s.io/client-go/testing"

	"github.com/opkit/opkit"
	"github.com/opkit/opkit/internal/typed"
	"github.com/opkit/opkit/leader"
	"github.com/opkit/opkit/queue"
	"github.com/opkit/opkit/reconcile"
	"github.com/opkit/opkit/trigger"
	"github.com/opkit/opkit/watcher"
)

// The controller's specification as a property: random histories of one
// and of several names, run against a small API server of the test's own
// (list, get and watch, with a label selector, 410s and watches that miss
// events) and a real leader elector on a fake Lease whose renewals the
// history makes fail. A history creates, updates, deletes and recreates
// objects (new UIDs), moves them in and out of the label selector, sends
// triggers and teardowns, forces relists, ends leadership terms while
// reconciles run, and makes reconciles fail, requeue and take time. Then
// it lets everything settle and checks:
//
//  1. every object that exists (in the selector) at the end had a
//     successful reconcile of its final state;
//  2. every UID the watch saw that is gone at the end (deleted, or out of
//     the selector) had a successful Deleted reconcile with its final
//     state, or a tombstone when the watch never delivered it; and within
//     a turn, the deletes come before the live object's reconcile;
//  3. never two reconciles of a key at once;
//  4. the reason of every trigger accepted in the last term reached a
//     reconcile, unless its object was out of the selector (skipped, as
//     the controller promises) or went after it (deleted, or out of the
//     selector); the earlier terms' triggers are covered by 1: a new term
//     lists everything;
//  5. at the end the watcher holds no unsettled delete and the queue is
//     empty.
func TestHistoriesOfOneName(t *testing.T)      { runHistories(t, 1, 1000) }
func TestHistoriesOfSeveralNames(t *testing.T) { runHistories(t, 3, 1000) }

func runHistories(t *testing.T, names, n int) {
	if testing.Short() {
		n /= 10
	}
	for seed := range uint64(n) {
		ok := t.Run(fmt.Sprintf("seed=%d", seed), func(t *testing.T) {
			synctest.Test(t, func(t *testing.T) { runHistory(t, seed, names, seed%2 == 0) })
		})
		if !ok {
			return // one failing history is enough to read
		}
	}
}

const (
	histSelector = "keep=yes"
	histOps      = 40
)

func runHistory(t *testing.T, seed uint64, nNames int, oneWorker bool) {
	rng := rand.New(rand.NewPCG(seed, uint64(nNames)))
	srv := newHistServer()
	hr := &histReconciler{seed: seed, inFlight: map[opkit.Key]bool{}}
	kube := kfake.NewSimpleClientset() // no field management: the Lease is renewed often
	var failRenew atomic.Bool
	kube.PrependReactor("update", "leases", func(k8stesting.Action) (bool, runtime.Object, error) {
		if failRenew.Load() {
			return true, nil, apierrors.NewInternalError(errors.New("etcd unavailable"))
		}
		return false, nil, nil
	})
	wm := &trackedMetrics{}
	terms := &termCounter{}
	cfg := reconcile.Config[*Widget]{
		Name: "test.opkit.dev/widgets", Resource: widgets, Dynamic: srv.client(t),
		Reconciler: hr, Logger: slog.New(slog.DiscardHandler), NoEvents: true,
		MaxRetries: -1, // nothing is given up on: everything must converge
		Backoff:    queue.Backoff{Base: time.Second, Cap: 20 * time.Second, Jitter: -1},
		Leader:     &leader.Config{Client: kube, Namespace: "ns", Name: "widgets", Identity: "me", Metrics: terms},
		Watch:      watcher.Config[*Widget]{LabelSelector: histSelector, Metrics: wm},
	}
	if oneWorker {
		// One worker: hand-outs are sequential, so the queue's Waited
		// (called as a worker takes a key) marks where each turn begins.
		cfg.Concurrency, cfg.ReservedWorkers, cfg.QueueMetrics = 1, -1, hr
	}
	ctrl, err := reconcile.NewController(cfg)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- ctrl.Run(ctx) }()
	defer func() {
		cancel()
		if err := <-done; err != nil {
			t.Errorf("Run: %v", err)
		}
	}()
	time.Sleep(5 * time.Second) // the first term

	names := make([]string, nNames)
	for i := range names {
		names[i] = "w" + strconv.Itoa(i)
	}
	var triggers []histTrigger
	perKey := map[string]int{} // triggers per name: at most MaxReasons, so that none is left out
	var log []string
	for op := range histOps {
		name := names[rng.IntN(nNames)]
		switch r := rng.IntN(100); {
		case r < 18:
			if srv.create(name, rng.IntN(4) > 0) {
				log = append(log, "create "+name)
			}
		case r < 40:
			if srv.update(name, rng.IntN(5) == 0) {
				log = append(log, "update "+name)
			}
		case r < 52:
			if srv.remove(name) {
				log = append(log, "delete "+name)
			}
		case r < 70 && perKey[name] < opkit.MaxReasons:
			obj, live := srv.typed(name)
			inScope := live && obj.Labels["keep"] == "yes"
			typ := opkit.Modified
			if rng.IntN(4) == 0 {
				typ = opkit.Deleted
			}
			if !live || rng.IntN(3) == 0 {
				obj = widget(name, func(w *Widget) { w.UID, w.ResourceVersion = "", "" }) // a key-only copy
				obj.Labels = map[string]string{"keep": "yes"}
			}
			reason := fmt.Sprintf("r%02d", op)
			o, err := ctrl.Trigger().Submit(ctx, trigger.Request[*Widget]{Object: obj, Type: typ, Source: opkit.Operator, Reason: reason})
			if err == nil && o.Accepted() {
				perKey[name]++
				triggers = append(triggers, histTrigger{name: name, reason: reason, term: terms.current(), seq: srv.seq(),
					// A trigger of an object out of the selector is skipped,
					// a teardown too unless the object is gone (then it is
					// judged on the copy it carries).
					skipped: !inScope && (typ != opkit.Deleted || live)})
				log = append(log, fmt.Sprintf("trigger %s %s %s", typ, name, reason))
			}
		case r < 76:
			srv.expire(rng.IntN(2) == 0) // a relist, maybe after missed events
			log = append(log, "relist")
		case r < 82:
			failRenew.Store(true) // the term ends within RenewDeadline
			log = append(log, "term ends")
		case r < 88:
			failRenew.Store(false)
			log = append(log, "renewals work")
		case r < 94:
			hr.setFailing(rng.IntN(3))
		}
		time.Sleep(time.Duration(rng.IntN(3000)) * time.Millisecond)
	}
	// Settle: leadership back, no more failures, a watch that misses
	// nothing, everything retried.
	failRenew.Store(false)
	hr.setFailing(0)
	srv.expire(false)
	time.Sleep(30 * time.Second)
	lastTerm := terms.current()
	time.Sleep(10 * time.Minute)
	synctest.Wait()
	srv.create("sentinel", true) // the watcher reports what it holds after each change
	time.Sleep(time.Minute)
	synctest.Wait()
	if t.Failed() {
		return
	}
	history := "history:\n " + strings.Join(log, "\n ")
	calls := hr.snapshot()
	if terms.current() != lastTerm || ctrl.Held() != 1 {
		t.Fatalf("not leading in a stable term at the end (term %d, was %d)\n%s", terms.current(), lastTerm, history)
	}

	// 1. The final state of every object in the selector was reconciled.
	for _, o := range srv.visible() {
		if !slices.ContainsFunc(calls, func(c histCall) bool { return c.ok && c.uid == o.uid && c.rv == o.rv }) {
			t.Errorf("%s (uid %s) at rv %s: its final state was never reconciled\n%s\n%s", o.name, o.uid, o.rv, describe(calls, o.name), history)
		}
	}
	// 2. Every UID the watch saw and that is gone got a Deleted reconcile
	// of its final state (or a tombstone).
	for uid, final := range srv.goneSeen() {
		if !slices.ContainsFunc(calls, func(c histCall) bool {
			return c.ok && c.typ == opkit.Deleted && c.uid == uid && (final.deleted && c.rv == final.rv || !final.deleted && c.finalUnknown)
		}) {
			t.Errorf("uid %s of %s, gone at rv %s: no successful Deleted reconcile of its final state\n%s\n%s", uid, final.name, final.rv, describe(calls, final.name), history)
		}
	}
	if oneWorker {
		for _, turn := range hr.turns() {
			for i, c := range turn[:max(len(turn)-1, 0)] {
				if c.typ != opkit.Deleted {
					t.Errorf("a turn of %s went on after its live reconcile (call %d of %d)\n%s", c.key.Name, i+1, len(turn), history)
				}
			}
		}
	}
	// 3. Never two reconciles of a key at once.
	if n := hr.overlaps.Load(); n > 0 {
		t.Errorf("%d reconciles overlapped another of their key\n%s", n, history)
	}
	// 4. The last term's triggers reached a reconcile.
	for _, tr := range triggers {
		if tr.term != lastTerm || tr.skipped || srv.wentAfter(tr.name, tr.seq) {
			continue
		}
		if !slices.ContainsFunc(calls, func(c histCall) bool { return c.key.Name == tr.name && slices.Contains(c.reasons, tr.reason) }) {
			t.Errorf("trigger %s of %s (term %d) never reached a reconcile\n%s\n%s", tr.reason, tr.name, tr.term, describe(calls, tr.name), history)
		}
	}
	// 5. Nothing left: the watcher holds the live objects only (the
	// sentinel's event reported it), the queue is empty.
	if got, want := wm.get(), len(srv.visible()); got != want {
		t.Errorf("the watcher holds %d (live objects and unsettled deletes), want %d live objects and no delete\n%s", got, want, history)
	}
	if st := ctrl.QueueStats(); st.Ready+st.Delayed+st.Parked+st.InFlight != 0 {
		t.Errorf("the queue still holds %+v\n%s", st, history)
	}
}

// termCounter numbers this replica's terms (leader.Metrics): the current
// one while leading, -1 between terms.
type termCounter struct {
	mu      sync.Mutex
	started int32
	leading bool
}

func (c *termCounter) Leading(on bool) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if on && !c.leading {
		c.started++
	}
	c.leading = on
}
func (*termCounter) Renewed(time.Time) {}
func (*termCounter) RenewFailed()      {}
func (*termCounter) WorkOverran()      {}
func (c *termCounter) current() int32 {
	c.mu.Lock()
	defer c.mu.Unlock()
	if !c.leading {
		return -1
	}
	return c.started
}

type histTrigger struct {
	name, reason string
	term         int32
	seq          int  // the server's change counter when it was accepted
	skipped      bool // its object was out of the selector
}

// histCall is one reconcile the history's reconciler saw.
type histCall struct {
	key          opkit.Key
	typ          opkit.Type
	uid, rv      string
	finalUnknown bool
	reasons      []string
	ok           bool // returned Done with its context intact
}

func describe(calls []histCall, name string) string {
	var b strings.Builder
	b.WriteString("reconciles of " + name + ":")
	for _, c := range calls {
		if c.key.Name == name {
			fmt.Fprintf(&b, "\n %s uid=%s rv=%s unknown=%v %v ok=%v", c.typ, c.uid, c.rv, c.finalUnknown, c.reasons, c.ok)
		}
	}
	return b.String()
}

// histReconciler fails, requeues and takes time as its seed and the
// history's failure level say; it records every call and, as the queue's
// Metrics with one worker, where each turn begins.
type histReconciler struct {
	seed     uint64
	mu       sync.Mutex
	calls    []histCall
	marks    []int // indexes into calls where a turn began
	failing  int   // 0: never; 1: sometimes; 2: often
	attempts map[string]int
	inFlight map[opkit.Key]bool
	overlaps atomic.Int32
}

func (h *histReconciler) setFailing(level int) { h.mu.Lock(); h.failing = level; h.mu.Unlock() }

func (h *histReconciler) Reconcile(ctx context.Context, req reconcile.Request[*Widget]) (reconcile.Result, error) {
	h.mu.Lock()
	if h.inFlight[req.Key] {
		h.overlaps.Add(1)
	}
	h.inFlight[req.Key] = true
	if h.attempts == nil {
		h.attempts = map[string]int{}
	}
	id := fmt.Sprintf("%s/%s/%s/%s", req.Key.Name, req.Type, req.Object.UID, req.Object.ResourceVersion)
	n := h.attempts[id]
	h.attempts[id]++
	failing := h.failing
	i := len(h.calls)
	h.calls = append(h.calls, histCall{key: req.Key, typ: req.Type, uid: string(req.Object.UID), rv: req.Object.ResourceVersion,
		finalUnknown: req.FinalStateUnknown, reasons: req.Reasons})
	h.mu.Unlock()
	defer func() {
		h.mu.Lock()
		h.inFlight[req.Key] = false
		h.mu.Unlock()
	}()
	draw := histDraw(h.seed, id, n) // the same for the same request and attempt
	select {
	case <-time.After(time.Duration(draw%2000) * time.Millisecond):
	case <-ctx.Done():
		return reconcile.Done(), ctx.Err()
	}
	switch p := draw % 100; {
	case failing == 2 && p < 50, failing == 1 && p < 20:
		return reconcile.Done(), errors.New("dependency down")
	case failing > 0 && p < 60:
		return reconcile.RequeueAfter(time.Duration(draw%5) * time.Second), nil
	}
	if ctx.Err() == nil {
		h.mu.Lock()
		h.calls[i].ok = true
		h.mu.Unlock()
	}
	return reconcile.Done(), nil
}

// histDraw is a pseudo-random number fixed by the seed, the request and
// the attempt, whatever the order in which the workers run.
func histDraw(seed uint64, id string, attempt int) uint64 {
	h := fnv.New64a()
	fmt.Fprintf(h, "%d/%s/%d", seed, id, attempt)
	return rand.New(rand.NewPCG(h.Sum64(), seed)).Uint64()
}

func (h *histReconciler) snapshot() []histCall {
	h.mu.Lock()
	defer h.mu.Unlock()
	return slices.Clone(h.calls)
}

// turns splits the calls where turns began.
func (h *histReconciler) turns() [][]histCall {
	h.mu.Lock()
	defer h.mu.Unlock()
	var out [][]histCall
	for i, m := range h.marks {
		end := len(h.calls)
		if i+1 < len(h.marks) {
			end = h.marks[i+1]
		}
		out = append(out, h.calls[m:end])
	}
	return out
}

// The queue.Metrics side: Waited marks a hand-out.
func (h *histReconciler) Added(int, bool)       {}
func (h *histReconciler) Dropped(queue.Outcome) {}
func (h *histReconciler) Depth(int, int)        {}
func (h *histReconciler) Worked(time.Duration)  {}
func (h *histReconciler) Waited(int, time.Duration) {
	h.mu.Lock()
	h.marks = append(h.marks, len(h.calls))
	h.mu.Unlock()
}

// histServer is the history's API server for widgets: objects by name,
// a label selector applied to lists and watches (an object that leaves it
// is deleted for the watch, one that enters it added), watches it can
// expire (410) after making them miss events, and GETs that see
// everything.
type histServer struct {
	mu      sync.Mutex
	rv      int
	uids    int
	objs    map[string]*histObj
	watches []*histWatch
	// seen: what the watcher last received of every UID, from a list or
	// a watch event; gone: the UIDs that are not in the selector now
	// (deleted, or their labels changed); left: when each name last left,
	// by change counter.
	seen map[string]histSeen
	gone map[string]bool
	left map[string]int
	n    int // the change counter
}

// histSeen is the last event of a UID the watcher received.
type histSeen struct {
	name, rv string
	deleted  bool
}

type histObj struct {
	name, uid, rv string
	keep          bool
	size          int
}

func (o *histObj) unstructured() *unstructured.Unstructured {
	keep := "no"
	if o.keep {
		keep = "yes"
	}
	u, _ := typed.ToUnstructured(widget(o.name, func(w *Widget) {
		w.UID, w.ResourceVersion, w.Spec.Size = types.UID(o.uid), o.rv, o.size
		w.Labels = map[string]string{"keep": keep}
	}))
	return u
}

func newHistServer() *histServer {
	return &histServer{rv: 1, objs: map[string]*histObj{}, seen: map[string]histSeen{}, gone: map[string]bool{}, left: map[string]int{}}
}

func (s *histServer) seq() int { s.mu.Lock(); defer s.mu.Unlock(); return s.n }

func (s *histServer) client(t *testing.T) *fakeDyn {
	c := newFakeDynamic(t)
	c.PrependReactor("list", "widgets", func(k8stesting.Action) (bool, runtime.Object, error) {
		s.mu.Lock()
		defer s.mu.Unlock()
		l := &unstructured.UnstructuredList{}
		l.SetAPIVersion("test.opkit.dev/v1")
		l.SetKind("WidgetList")
		for _, name := range slices.Sorted(maps.Keys(s.objs)) {
			if o := s.objs[name]; o.keep {
				l.Items = append(l.Items, *o.unstructured())
				s.seen[o.uid] = histSeen{name: o.name, rv: o.rv}
			}
		}
		l.SetResourceVersion(strconv.Itoa(s.rv))
		return true, l, nil
	})
	c.PrependReactor("get", "widgets", func(a k8stesting.Action) (bool, runtime.Object, error) {
		s.mu.Lock()
		defer s.mu.Unlock()
		name := a.(k8stesting.GetAction).GetName()
		if o, ok := s.objs[name]; ok {
			return true, o.unstructured(), nil
		}
		return true, nil, apierrors.NewNotFound(widgets.GroupVersionResource.GroupResource(), name)
	})
	c.PrependWatchReactor("widgets", func(a k8stesting.Action) (bool, watch.Interface, error) {
		s.mu.Lock()
		defer s.mu.Unlock()
		// The server keeps no history: a watch from an older
		// resourceVersion is answered as after a compaction.
		if rv := a.(k8stesting.WatchActionImpl).ListOptions.ResourceVersion; rv != "" && rv != strconv.Itoa(s.rv) {
			return true, nil, apierrors.NewResourceExpired("too old resource version: " + rv)
		}
		w := newHistWatch(s)
		s.watches = append(s.watches, w)
		return true, w, nil
	})
	return c
}

// send delivers an event to the open watches that are not missing events,
// and keeps track of the final states; the caller holds mu.
func (s *histServer) send(typ watch.EventType, o *histObj) {
	if s.gone[o.uid] = typ == watch.Deleted; s.gone[o.uid] {
		s.left[o.name] = s.n
	}
	for _, w := range s.watches {
		w.send(watch.Event{Type: typ, Object: o.unstructured()})
	}
}

// delivered records that the watcher received ev.
func (s *histServer) delivered(ev watch.Event) {
	u, ok := ev.Object.(*unstructured.Unstructured)
	if !ok {
		return
	}
	s.mu.Lock()
	s.seen[string(u.GetUID())] = histSeen{name: u.GetName(), rv: u.GetResourceVersion(), deleted: ev.Type == watch.Deleted}
	s.mu.Unlock()
}

func (s *histServer) next() string { s.rv++; s.n++; return strconv.Itoa(s.rv) }

func (s *histServer) create(name string, keep bool) bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	if _, ok := s.objs[name]; ok {
		return false
	}
	s.uids++
	o := &histObj{name: name, uid: fmt.Sprintf("%s-u%d", name, s.uids), rv: s.next(), keep: keep}
	s.objs[name] = o
	if keep {
		s.send(watch.Added, o)
	}
	return true
}

// update changes the object's spec, or with flip moves it across the
// label selector.
func (s *histServer) update(name string, flip bool) bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	o, ok := s.objs[name]
	if !ok {
		return false
	}
	was := o.keep
	o.rv = s.next()
	if flip {
		o.keep = !o.keep
	} else {
		o.size++
	}
	switch {
	case was && o.keep:
		s.send(watch.Modified, o)
	case was:
		s.send(watch.Deleted, o)
	case o.keep:
		s.send(watch.Added, o)
	}
	return true
}

func (s *histServer) remove(name string) bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	o, ok := s.objs[name]
	if !ok {
		return false
	}
	delete(s.objs, name)
	o.rv = s.next()
	if o.keep {
		s.send(watch.Deleted, o)
	}
	return true
}

// expire ends every open watch with a 410; with missed, the watches miss
// the events until then instead (they stop receiving at once, and end at
// the next expire, or when the watcher finds them idle and resumes, which
// the server answers with a 410 too).
func (s *histServer) expire(missed bool) {
	s.mu.Lock()
	defer s.mu.Unlock()
	for _, w := range s.watches {
		if missed && !w.missing {
			w.missing = true
			continue
		}
		w.expire()
	}
}

// typed returns the object as a GET would, if it exists.
func (s *histServer) typed(name string) (*Widget, bool) {
	s.mu.Lock()
	defer s.mu.Unlock()
	o, ok := s.objs[name]
	if !ok {
		return nil, false
	}
	w, _ := typed.FromUnstructured[*Widget](o.unstructured())
	return w, true
}

// visible returns the objects in the selector.
func (s *histServer) visible() []histObj {
	s.mu.Lock()
	defer s.mu.Unlock()
	var out []histObj
	for _, o := range s.objs {
		if o.keep {
			out = append(out, *o)
		}
	}
	return out
}

// goneSeen returns, for every UID that the watcher saw and that is gone
// from the selector now, what it last received of it: its final state,
// when that was a delete (or the UID's leaving the selector); otherwise
// the watcher can only have found it gone by a list, and its delete is a
// tombstone.
func (s *histServer) goneSeen() map[string]histSeen {
	s.mu.Lock()
	defer s.mu.Unlock()
	out := map[string]histSeen{}
	for uid, seen := range s.seen {
		if s.gone[uid] {
			out[uid] = seen
		}
	}
	return out
}

// wentAfter reports whether name left the selector (or was deleted) after
// change seq.
func (s *histServer) wentAfter(name string, seq int) bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.left[name] > seq
}

// histWatch is a watch.Interface the server feeds without ever blocking:
// events wait in a buffer, and a goroutine hands them to the watcher one
// at a time, so the server knows which events the watcher received.
type histWatch struct {
	mu      sync.Mutex
	buf     chan watch.Event
	out     chan watch.Event
	stop    chan struct{}
	ended   bool // stopped by the watcher, or expired: nothing more is queued
	missing bool // the watch no longer receives events: it is about to expire
}

func newHistWatch(s *histServer) *histWatch {
	w := &histWatch{buf: make(chan watch.Event, 1000), out: make(chan watch.Event), stop: make(chan struct{})}
	go func() {
		defer close(w.out)
		for {
			select {
			case ev, ok := <-w.buf:
				if !ok {
					return
				}
				select {
				case w.out <- ev:
					s.delivered(ev)
				case <-w.stop:
					return
				}
			case <-w.stop:
				return
			}
		}
	}()
	return w
}

func (w *histWatch) ResultChan() <-chan watch.Event { return w.out }

// Stop is the watcher's: it ends the watch.
func (w *histWatch) Stop() {
	w.mu.Lock()
	defer w.mu.Unlock()
	select {
	case <-w.stop:
	default:
		close(w.stop)
	}
	w.ended = true
}

// send queues ev unless the watch ended or is missing events.
func (w *histWatch) send(ev watch.Event) {
	w.mu.Lock()
	defer w.mu.Unlock()
	if !w.ended && !w.missing {
		w.buf <- ev
	}
}

// expire ends the watch with a 410 after what it has queued.
func (w *histWatch) expire() {
	w.mu.Lock()
	defer w.mu.Unlock()
	if w.ended {
		return
	}
	w.buf <- watch.Event{Type: watch.Error, Object: &metav1.Status{Status: metav1.StatusFailure, Code: 410, Reason: metav1.StatusReasonExpired}}
	close(w.buf)
	w.ended = true
}
