package leader_test

// A small simulated API server for the elector's unit tests: one shared
// store of Leases with real resourceVersion preconditions (the fake
// clientset's tracker has none), behind one fake clientset per replica, so
// a test can cut one replica off (errors or hangs) while the others go on.
// Every call that is not about Leases in the test namespace fails the test.

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	coordinationv1 "k8s.io/api/coordination/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/watch"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/kubernetes/fake"
	"k8s.io/client-go/kubernetes/scheme"
	coordclient "k8s.io/client-go/kubernetes/typed/coordination/v1"
	k8stesting "k8s.io/client-go/testing"

	"github.com/opkit/opkit/internal/logsink"
	"github.com/opkit/opkit/leader"
)

const (
	testNS    = "ops"
	leaseName = "ctrl"
)

var leasesGVR = schema.GroupVersionResource{Group: "coordination.k8s.io", Version: "v1", Resource: "leases"}

// call is one API request as the simulated server saw it.
type call struct {
	at     time.Time
	client string
	verb   string
	holder string // holder written (create/update) or read (get)
	err    error
}

type apiServer struct {
	t       *testing.T
	tracker k8stesting.ObjectTracker

	mu    sync.Mutex
	rv    int
	calls []call
	// hook runs before every lease request of a client; it may sleep (the
	// request then hangs, ignoring its context, as a stuck connection
	// would) and a non-nil error is returned to the client.
	hook map[string]func(verb string) error
	// lost names, per client, a verb whose next request is applied but
	// whose response is lost: the func runs (it may cancel the client's
	// context) and the client gets its context's error instead.
	lost map[string]lostResponse
	// held, per client, holds back the answers of its Gets until the
	// channel closes: each answers with what it read when it was made.
	held map[string]chan struct{}
}

type lostResponse struct {
	verb string
	then func()
}

// loseNext makes the client's next request of verb succeed on the server
// while the client sees its context's error, after then ran.
func (s *apiServer) loseNext(client, verb string, then func()) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.lost[client] = lostResponse{verb: verb, then: then}
}

// lose reports, and consumes, a lost response planned for this request.
func (s *apiServer) lose(client, verb string) (func(), bool) {
	s.mu.Lock()
	defer s.mu.Unlock()
	l, ok := s.lost[client]
	if !ok || l.verb != verb {
		return nil, false
	}
	delete(s.lost, client)
	return l.then, true
}

func newAPIServer(t *testing.T) *apiServer {
	return &apiServer{
		t:       t,
		tracker: k8stesting.NewObjectTracker(scheme.Scheme, scheme.Codecs.UniversalDecoder()),
		rv:      100,
		hook:    map[string]func(string) error{},
		lost:    map[string]lostResponse{},
		held:    map[string]chan struct{}{},
	}
}

// holdGets makes the client's Gets answer late, with what they read when
// they were made, until release is called: a slow response that a newer
// watch event overtakes.
func (s *apiServer) holdGets(client string) (release func()) {
	s.mu.Lock()
	defer s.mu.Unlock()
	ch := make(chan struct{})
	s.held[client] = ch
	return func() {
		s.mu.Lock()
		delete(s.held, client)
		s.mu.Unlock()
		close(ch)
	}
}

// setHook installs (or, with nil, removes) the request hook of a client.
func (s *apiServer) setHook(client string, h func(verb string) error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.hook[client] = h
}

func (s *apiServer) record(c call) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.calls = append(s.calls, c)
}

// callsOf returns the recorded calls of client (all clients if "").
func (s *apiServer) callsOf(client string) []call {
	s.mu.Lock()
	defer s.mu.Unlock()
	var out []call
	for _, c := range s.calls {
		if client == "" || c.client == client {
			out = append(out, c)
		}
	}
	return out
}

// client returns a clientset for one replica, named name in the record: a
// fake clientset behind a thin wrapper that runs the replica's hook outside
// the fake's lock (the fake serializes all calls of one clientset, so a
// request hanging inside a reactor would block every other request).
func (s *apiServer) client(name string) kubernetes.Interface {
	return hookedClient{Interface: s.fakeClient(name), s: s, name: name}
}

func (s *apiServer) fakeClient(name string) *fake.Clientset {
	cs := fake.NewClientset()
	unexpected := func(a k8stesting.Action) (bool, runtime.Object, error) {
		s.t.Errorf("%s: unexpected API call %s %s in %q", name, a.GetVerb(), a.GetResource(), a.GetNamespace())
		return true, nil, errors.New("unexpected call")
	}
	cs.PrependReactor("*", "*", unexpected)
	cs.PrependReactor("*", "leases", func(a k8stesting.Action) (bool, runtime.Object, error) {
		if a.GetNamespace() != testNS {
			return unexpected(a)
		}
		return s.serve(name, a)
	})
	cs.PrependWatchReactor("*", func(a k8stesting.Action) (bool, watch.Interface, error) {
		s.t.Errorf("%s: unexpected watch %s", name, a.GetResource())
		return true, nil, errors.New("unexpected call")
	})
	cs.PrependWatchReactor("leases", func(a k8stesting.Action) (bool, watch.Interface, error) {
		wa := a.(k8stesting.WatchActionImpl)
		if a.GetNamespace() != testNS || wa.ListOptions.FieldSelector != "metadata.name="+leaseName {
			s.t.Errorf("%s: unexpected watch in %q with %q", name, a.GetNamespace(), wa.ListOptions.FieldSelector)
		}
		s.record(call{at: time.Now(), client: name, verb: "watch"})
		w, err := s.tracker.Watch(leasesGVR, testNS, wa.ListOptions)
		return true, w, err
	})
	return cs
}

func (s *apiServer) runHook(client, verb string) error {
	s.mu.Lock()
	h := s.hook[client]
	s.mu.Unlock()
	if h == nil {
		return nil
	}
	return h(verb)
}

func (s *apiServer) serve(client string, a k8stesting.Action) (bool, runtime.Object, error) {
	verb := a.GetVerb()
	obj, err := s.apply(a)
	c := call{at: time.Now(), client: client, verb: verb, err: err}
	if l, ok := obj.(*coordinationv1.Lease); ok {
		c.holder = holder(l)
	}
	s.record(c)
	return true, obj, err
}

type hookedClient struct {
	kubernetes.Interface
	s    *apiServer
	name string
}

func (c hookedClient) CoordinationV1() coordclient.CoordinationV1Interface {
	return hookedCoordination{CoordinationV1Interface: c.Interface.CoordinationV1(), c: c}
}

type hookedCoordination struct {
	coordclient.CoordinationV1Interface
	c hookedClient
}

func (h hookedCoordination) Leases(ns string) coordclient.LeaseInterface {
	return hookedLeases{LeaseInterface: h.CoordinationV1Interface.Leases(ns), c: h.c}
}

// hookedLeases runs the hook of its replica before each request; the
// requests the elector makes are the four below (others reach the fake's
// catch-all reactor and fail the test).
type hookedLeases struct {
	coordclient.LeaseInterface
	c hookedClient
}

func (l hookedLeases) hook(verb string) error {
	err := l.c.s.runHook(l.c.name, verb)
	if err != nil {
		l.c.s.record(call{at: time.Now(), client: l.c.name, verb: verb, err: err})
	}
	return err
}

func (l hookedLeases) Get(ctx context.Context, name string, o metav1.GetOptions) (*coordinationv1.Lease, error) {
	if err := l.hook("get"); err != nil {
		return nil, err
	}
	got, err := l.LeaseInterface.Get(ctx, name, o)
	l.c.s.mu.Lock()
	held := l.c.s.held[l.c.name]
	l.c.s.mu.Unlock()
	if held != nil {
		select {
		case <-held:
		case <-ctx.Done():
			return nil, ctx.Err()
		}
	}
	return got, err
}

func (l hookedLeases) Create(ctx context.Context, x *coordinationv1.Lease, o metav1.CreateOptions) (*coordinationv1.Lease, error) {
	if err := l.hook("create"); err != nil {
		return nil, err
	}
	got, err := l.LeaseInterface.Create(ctx, x, o)
	return l.maybeLose(ctx, "create", got, err)
}

func (l hookedLeases) Update(ctx context.Context, x *coordinationv1.Lease, o metav1.UpdateOptions) (*coordinationv1.Lease, error) {
	if err := l.hook("update"); err != nil {
		return nil, err
	}
	got, err := l.LeaseInterface.Update(ctx, x, o)
	return l.maybeLose(ctx, "update", got, err)
}

// maybeLose replaces an applied request's response by the context's error
// when the test planned to lose it (see apiServer.loseNext).
func (l hookedLeases) maybeLose(ctx context.Context, verb string, got *coordinationv1.Lease, err error) (*coordinationv1.Lease, error) {
	if err != nil {
		return got, err
	}
	then, ok := l.c.s.lose(l.c.name, verb)
	if !ok {
		return got, nil
	}
	then()
	<-ctx.Done()
	return nil, fmt.Errorf("response lost: %w", ctx.Err())
}

func (l hookedLeases) Watch(ctx context.Context, o metav1.ListOptions) (watch.Interface, error) {
	if err := l.hook("watch"); err != nil {
		return nil, err
	}
	return l.LeaseInterface.Watch(ctx, o)
}

// apply executes one lease request against the store, with the API
// server's resourceVersion rules.
func (s *apiServer) apply(a k8stesting.Action) (runtime.Object, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	switch a := a.(type) {
	case k8stesting.GetActionImpl:
		if a.Name != leaseName {
			s.t.Errorf("get of unexpected lease %q", a.Name)
		}
		return s.tracker.Get(leasesGVR, testNS, a.Name)
	case k8stesting.CreateActionImpl:
		l := a.Object.(*coordinationv1.Lease).DeepCopy()
		if l.ResourceVersion != "" {
			return nil, apierrors.NewBadRequest("resourceVersion set on create")
		}
		s.rv++
		l.ResourceVersion = strconv.Itoa(s.rv)
		if err := s.tracker.Create(leasesGVR, l, testNS); err != nil {
			return nil, err
		}
		return l.DeepCopy(), nil
	case k8stesting.UpdateActionImpl:
		l := a.Object.(*coordinationv1.Lease).DeepCopy()
		cur, err := s.tracker.Get(leasesGVR, testNS, l.Name)
		if err != nil {
			return nil, err
		}
		if l.ResourceVersion == "" {
			s.t.Errorf("update without resourceVersion precondition")
		}
		if l.ResourceVersion != cur.(*coordinationv1.Lease).ResourceVersion {
			return nil, apierrors.NewConflict(leasesGVR.GroupResource(), l.Name, errors.New("the object has been modified"))
		}
		s.rv++
		l.ResourceVersion = strconv.Itoa(s.rv)
		if err := s.tracker.Update(leasesGVR, l, testNS); err != nil {
			return nil, err
		}
		return l.DeepCopy(), nil
	}
	s.t.Errorf("unexpected lease call %s", a.GetVerb())
	return nil, errors.New("unexpected call")
}

// put writes a Lease directly (as another actor would), bumping its
// resourceVersion and notifying watchers.
func (s *apiServer) put(mutate func(l *coordinationv1.Lease)) *coordinationv1.Lease {
	s.mu.Lock()
	defer s.mu.Unlock()
	var l *coordinationv1.Lease
	cur, err := s.tracker.Get(leasesGVR, testNS, leaseName)
	exists := err == nil
	if exists {
		l = cur.(*coordinationv1.Lease).DeepCopy()
	} else {
		l = &coordinationv1.Lease{ObjectMeta: metav1.ObjectMeta{Name: leaseName, Namespace: testNS}}
	}
	mutate(l)
	s.rv++
	l.ResourceVersion = strconv.Itoa(s.rv)
	if exists {
		err = s.tracker.Update(leasesGVR, l, testNS)
	} else {
		err = s.tracker.Create(leasesGVR, l, testNS)
	}
	if err != nil {
		s.t.Fatalf("put lease: %v", err)
	}
	return l.DeepCopy()
}

// lease returns the stored Lease (nil if none).
func (s *apiServer) lease() *coordinationv1.Lease {
	s.mu.Lock()
	defer s.mu.Unlock()
	obj, err := s.tracker.Get(leasesGVR, testNS, leaseName)
	if err != nil {
		return nil
	}
	return obj.(*coordinationv1.Lease)
}

func holder(l *coordinationv1.Lease) string {
	if l == nil || l.Spec.HolderIdentity == nil {
		return ""
	}
	return *l.Spec.HolderIdentity
}

func transitions(l *coordinationv1.Lease) int32 {
	if l == nil || l.Spec.LeaseTransitions == nil {
		return -1
	}
	return *l.Spec.LeaseTransitions
}

// journal is the ordered record of what the replicas' gates and work did.
type journal struct {
	mu      sync.Mutex
	entries []entry
}

type entry struct {
	at   time.Time
	who  string
	what string // suspend, resume, clear, work-start, work-cancelled, work-return
	term int32
}

func (j *journal) add(who, what string) {
	j.addTerm(who, what, -1)
}

func (j *journal) addTerm(who, what string, term int32) {
	j.mu.Lock()
	defer j.mu.Unlock()
	j.entries = append(j.entries, entry{at: time.Now(), who: who, what: what, term: term})
}

// of returns the entries of who (all if ""), in order.
func (j *journal) of(who string) []entry {
	j.mu.Lock()
	defer j.mu.Unlock()
	var out []entry
	for _, e := range j.entries {
		if who == "" || e.who == who {
			out = append(out, e)
		}
	}
	return out
}

// whats returns the sequence of what fields of who's entries.
func (j *journal) whats(who string) string {
	var s []string
	for _, e := range j.of(who) {
		s = append(s, e.what)
	}
	return strings.Join(s, " ")
}

// first returns the first entry of who with what, at or after since.
func (j *journal) first(who, what string, since time.Time) (entry, bool) {
	for _, e := range j.of(who) {
		if e.what == what && !e.at.Before(since) {
			return e, true
		}
	}
	return entry{}, false
}

func (j *journal) String() string {
	var b strings.Builder
	for _, e := range j.of("") {
		fmt.Fprintf(&b, "  %s %s %s term=%d\n", e.at.Format("15:04:05.000000"), e.who, e.what, e.term)
	}
	return b.String()
}

// gate is a queue.Gate that writes to the journal.
type gate struct {
	j    *journal
	name string
}

func (g gate) Suspend()   { g.j.add(g.name, "suspend") }
func (g gate) Resume()    { g.j.add(g.name, "resume") }
func (g gate) Clear() int { g.j.add(g.name, "clear"); return 0 }

// metrics counts what the elector reports.
type metrics struct {
	mu sync.Mutex
	c  counts
}

type counts struct {
	leading                      bool
	transitions, failed, overran int
	lastRenew                    time.Time
}

func (m *metrics) Leading(b bool) {
	m.mu.Lock()
	defer m.mu.Unlock()
	m.c.leading = b
	m.c.transitions++
}
func (m *metrics) Renewed(at time.Time) { m.mu.Lock(); m.c.lastRenew = at; m.mu.Unlock() }
func (m *metrics) RenewFailed()         { m.mu.Lock(); m.c.failed++; m.mu.Unlock() }
func (m *metrics) WorkOverran()         { m.mu.Lock(); m.c.overran++; m.mu.Unlock() }

func (m *metrics) snapshot() counts {
	m.mu.Lock()
	defer m.mu.Unlock()
	return m.c
}

// replica is one elector under test with its recorders.
type replica struct {
	name    string
	elector *leader.Elector
	metrics *metrics
	logs    *logsink.Buffer
	ctx     context.Context // Run's, until stop cancels it
	cancel  context.CancelFunc
	work    func(ctx context.Context) error // the work Run is given
	done    chan error                      // Run's result
}

// Test durations: LeaseDuration 15s, RenewDeadline 10s, RetryPeriod 2s,
// ClockSkew 1s (the defaults).
const (
	leaseDuration = 15 * time.Second
	renewDeadline = 10 * time.Second
	retryPeriod   = 2 * time.Second
	clockSkew     = 1 * time.Second
)

type env struct {
	t   *testing.T
	api *apiServer
	j   *journal
}

func newEnv(t *testing.T) *env {
	return &env{t: t, api: newAPIServer(t), j: &journal{}}
}

// start runs a replica whose work is workFn (nil: a well-behaved work that
// returns when its context ends).
func (e *env) start(name string, tweak func(*leader.Config), workFn func(ctx context.Context) error) *replica {
	e.t.Helper()
	r := e.prepare(name, tweak, workFn)
	r.run()
	return r
}

// prepare builds a replica as start does, but leaves it to the test to
// call run, so that it can use the elector before Run.
func (e *env) prepare(name string, tweak func(*leader.Config), workFn func(ctx context.Context) error) *replica {
	e.t.Helper()
	r := &replica{name: name, metrics: &metrics{}, logs: &logsink.Buffer{}, done: make(chan error, 1)}
	cfg := leader.Config{
		Client:    e.api.client(name),
		Namespace: testNS,
		Name:      leaseName,
		Identity:  name,
		Gate:      gate{j: e.j, name: name},
		Metrics:   r.metrics,
		Logger:    slog.New(slog.NewTextHandler(r.logs, &slog.HandlerOptions{Level: slog.LevelDebug})),
	}
	if tweak != nil {
		tweak(&cfg)
	}
	el, err := leader.New(cfg)
	if err != nil {
		e.t.Fatalf("New: %v", err)
	}
	r.elector = el
	if workFn == nil {
		workFn = func(ctx context.Context) error {
			<-ctx.Done()
			return nil
		}
	}
	work := func(ctx context.Context) error {
		term, ok := leader.TermFrom(ctx)
		if !ok || term.Identity != name {
			e.t.Errorf("%s: TermFrom = %+v, %v", name, term, ok)
		}
		e.j.addTerm(name, "work-start", term.Number)
		cancelled := make(chan struct{})
		stop := context.AfterFunc(ctx, func() {
			e.j.addTerm(name, "work-cancelled", term.Number)
			close(cancelled)
		})
		err := workFn(ctx)
		if !stop() {
			<-cancelled // the context ended: journal that before the return
		} else if ctx.Err() != nil {
			// The context ended but stop won the race against the AfterFunc
			// goroutine, so f never ran: journal the cancellation here.
			e.j.addTerm(name, "work-cancelled", term.Number)
		}
		e.j.addTerm(name, "work-return", term.Number)
		return err
	}
	r.work = work
	r.ctx, r.cancel = context.WithCancel(e.t.Context())
	e.t.Cleanup(func() {
		if e.t.Failed() {
			e.t.Logf("%s logs:\n%s", name, r.logs.String())
		}
	})
	return r
}

// run starts the replica's Run.
func (r *replica) run() {
	go func() { r.done <- r.elector.Run(r.ctx, r.work) }()
}

// stop cancels the replica's Run and returns its result.
func (r *replica) stop() error {
	r.cancel()
	return <-r.done
}

// sleep advances the bubble's clock by d (all goroutines run meanwhile).
func sleep(d time.Duration) { time.Sleep(d) }
