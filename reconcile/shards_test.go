package reconcile_test

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"testing/synctest"
	"time"

	coordinationv1 "k8s.io/api/coordination/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/types"
	kfake "k8s.io/client-go/kubernetes/fake"
	k8stesting "k8s.io/client-go/testing"

	"github.com/opkit/opkit"
	"github.com/opkit/opkit/leader"
	"github.com/opkit/opkit/queue"
	"github.com/opkit/opkit/reconcile"
	"github.com/opkit/opkit/trigger"
	"github.com/opkit/opkit/trigger/brokertest"
	"github.com/opkit/opkit/watcher"
)

// spreadWidgets returns widgets x0..x7 with UUID-like UIDs (real ones are
// random; "uid-"+name would all share FNV-1a's high bits, hence a shard),
// and their names by shard of 2.
func spreadWidgets() (ws []*Widget, byShard [2][]string) {
	for i := range 8 {
		uid := types.UID(fmt.Sprintf("%08x-5e1f-4c2a-9d3b-7a6c5b4e3f2d", uint32(i)*2654435761))
		w := widget(fmt.Sprintf("x%d", i), func(w *Widget) { w.UID = uid })
		ws = append(ws, w)
		s := opkit.ShardOf(uid, 2)
		byShard[s] = append(byShard[s], w.Name)
	}
	return ws, byShard
}

// ownedBy is a ConfigMap controlled by w.
func ownedBy(name string, w *Widget) *unstructured.Unstructured {
	u := ownedConfigMap(name, w.Name, "1")
	refs := u.GetOwnerReferences()
	refs[0].UID = w.UID
	u.SetOwnerReferences(refs)
	return u
}

// A controller of one shard reconciles only its shard's objects: its
// watcher lists and watches only them, a child reaches its owner only
// when the owner is of the shard (by the owner reference's UID), and a
// Watches mapping that names another shard's object is skipped once the
// object is read.
func TestAShardsControllerReconcilesOnlyItsShard(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		ws, byShard := spreadWidgets()
		if len(byShard[0]) == 0 || len(byShard[1]) == 0 {
			t.Fatalf("the fixture's uids fall in one shard: %v", byShard)
		}
		mine, theirs := ws[slices.IndexFunc(ws, func(w *Widget) bool { return w.Name == byShard[0][0] })],
			ws[slices.IndexFunc(ws, func(w *Widget) bool { return w.Name == byShard[1][0] })]
		rec := &recorder{}
		e := start(t, rec, func(c *reconcile.Config[*Widget]) {
			c.Shards = opkit.Shards{Count: 2, Held: []int{0}}
			c.Owns = []opkit.Resource{configMaps}
			c.NoEvents = true
		}, ws...)
		synctest.Wait()
		var listed []string
		for _, c := range rec.snapshot() {
			listed = append(listed, c.req.Key.Name)
		}
		slices.Sort(listed)
		if !slices.Equal(listed, byShard[0]) {
			t.Fatalf("reconciled %v, want shard 0's %v", listed, byShard[0])
		}

		cms := e.dyn.Resource(configMaps.GroupVersionResource).Namespace("ns")
		ctx := context.Background()
		for _, u := range []*unstructured.Unstructured{ownedBy("theirs-cm", theirs), ownedBy("mine-cm", mine)} {
			if _, err := cms.Create(ctx, u, metav1.CreateOptions{}); err != nil {
				t.Fatal(err)
			}
		}
		synctest.Wait()
		time.Sleep(time.Second)
		synctest.Wait()
		calls := rec.snapshot()[len(listed):]
		if len(calls) != 1 || calls[0].req.Key.Name != mine.Name {
			t.Fatalf("after two children were created: %d reconciles %v, want one of %s (the other's owner is of shard 1)", len(calls), calls, mine.Name)
		}
	})
}

// A Watches mapping names keys, not UIDs: a key of another shard's
// object reaches the controller, which drops it without even a read, as
// its watch does not see the object; a key of its own is reconciled.
func TestAShardsControllerSkipsAWatchesKeyOfAnotherShard(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		ws, byShard := spreadWidgets()
		other, own := byShard[1][0], byShard[0][0]
		rec := &recorder{}
		e := start(t, rec, func(c *reconcile.Config[*Widget]) {
			c.Shards = opkit.Shards{Count: 2, Held: []int{0}}
			c.Watches = []reconcile.Watch{{Resource: configMaps, Map: func(*unstructured.Unstructured) []opkit.Key {
				return []opkit.Key{{Namespace: "ns", Name: other}, {Namespace: "ns", Name: own}}
			}}}
			c.NoEvents = true
		}, ws...)
		synctest.Wait()
		before, reads := len(rec.snapshot()), e.metrics.refetchedN()
		cm := ownedConfigMap("any", "nobody", "1")
		cm.SetOwnerReferences(nil)
		if _, err := e.dyn.Resource(configMaps.GroupVersionResource).Namespace("ns").Create(context.Background(), cm, metav1.CreateOptions{}); err != nil {
			t.Fatal(err)
		}
		synctest.Wait()
		time.Sleep(time.Second)
		synctest.Wait()
		calls := rec.snapshot()[before:]
		if len(calls) != 1 || calls[0].req.Key.Name != own || e.metrics.refetchedN() != reads+1 {
			t.Fatalf("reconciles %v, reads %d -> %d; want %s's alone, with its one read (%s is of shard 1)", calls, reads, e.metrics.refetchedN(), own, other)
		}
	})
}

// A controller given one shard by hand (Shards.Held, without Leader)
// works on that shard alone: a trigger of another shard's object is
// dropped, naming no replica (none is known), and nothing is read twice
// or queued here.
func TestAStaticShardsControllerDropsATriggerOfAnotherShard(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		ws, byShard := spreadWidgets()
		e := start(t, &recorder{}, func(c *reconcile.Config[*Widget]) {
			c.Shards = opkit.Shards{Count: 2, Held: []int{0}}
			c.NoEvents = true
		}, ws...)
		synctest.Wait()
		d, err := e.ctrl.Trigger().Intake(t.Context(), trigger.Pointer{Key: opkit.Key{Namespace: "ns", Name: byShard[1][0]}}, trigger.IntakeOptions{Track: trigger.Tracked})
		if err != nil || d.Outcome != queue.DroppedSuspended || d.Ticket != nil || d.Endpoint != "" || d.Holder != "" {
			t.Fatalf("trigger of shard 1's %s: %+v %v, want dropped, naming nobody", byShard[1][0], d, err)
		}
		d, err = e.ctrl.Trigger().Intake(t.Context(), trigger.Pointer{Key: opkit.Key{Namespace: "ns", Name: byShard[0][0]}}, trigger.IntakeOptions{})
		if err != nil || !d.Outcome.Accepted() {
			t.Fatalf("trigger of shard 0's %s: %+v %v, want scheduled", byShard[0][0], d, err)
		}
	})
}

func (m *countingMetrics) refetchedN() int {
	m.mu.Lock()
	defer m.mu.Unlock()
	return m.refetched
}

// runAlone runs cfg as the only replica of 4 shards until it holds them
// all and has listed them; stop ends it and checks Run's error. It must
// be called in a synctest bubble.
func runAlone(t *testing.T, cfg reconcile.Config[*Widget]) (s *reconcile.Controller[*Widget], stop func()) {
	t.Helper()
	cfg.Shards = opkit.Shards{Count: 4}
	s, err := reconcile.NewController(cfg)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(t.Context())
	ran := make(chan error, 1)
	go func() { ran <- s.Run(ctx) }()
	time.Sleep(10 * time.Second) // every shard acquired, every list done
	synctest.Wait()
	if held := s.Held(); held != 4 {
		t.Fatalf("the only replica holds %d of 4 shards", held)
	}
	return s, func() {
		cancel()
		if err := <-ran; err != nil {
			t.Errorf("Run: %v", err)
		}
	}
}

// A Sharded replica runs at most Concurrency reconciles at once over all
// the shards it holds, not Concurrency per shard.
func TestAShardedReplicaSharesItsWorkersOverItsShards(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		ws, _ := spreadWidgets()
		var mu sync.Mutex
		running, most, done := 0, 0, 0
		release := make(chan struct{})
		rec := reconcile.Func[*Widget](func(ctx context.Context, req reconcile.Request[*Widget]) (reconcile.Result, error) {
			mu.Lock()
			running++
			most = max(most, running)
			mu.Unlock()
			<-release
			mu.Lock()
			running--
			done++
			mu.Unlock()
			return reconcile.Done(), nil
		})
		s, stop := runAlone(t, reconcile.Config[*Widget]{
			Name: "w", Resource: widgets, Dynamic: newFakeDynamic(t, ws...), Reconciler: rec, Logger: quiet, NoEvents: true,
			Concurrency: 2, ReservedWorkers: -1,
			Leader: &leader.Config{Client: kfake.NewClientset(), Namespace: "ns", Name: "widgets", Identity: "me"},
		})
		mu.Lock()
		if most != 2 {
			t.Errorf("%d reconciles ran at once, want Concurrency, 2", most)
		}
		mu.Unlock()
		// The replica's queue, over the four shards' queues: every object
		// is held, at least the two running in flight (the entries a
		// shard's workers took and that wait for a slot too).
		if st := s.QueueStats(); st.InFlight < 2 || st.InFlight+st.Ready+st.Parked != len(ws) || st.Suspended {
			t.Errorf("QueueStats %+v, want the %d objects held, at least 2 in flight, not suspended", st, len(ws))
		}
		close(release)
		synctest.Wait()
		mu.Lock()
		if done != len(ws) {
			t.Errorf("%d of %d objects reconciled", done, len(ws))
		}
		mu.Unlock()
		stop()
	})
}

// A Sharded replica watches each related resource once for all the
// shards it holds (one list and one watch of ConfigMaps for four
// shards, not four), and a child's change reconciles its owner once, in
// the owner's shard.
func TestAShardedReplicaWatchesARelatedResourceOnce(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		ws, _ := spreadWidgets()
		rec := &recorder{}
		dyn := newFakeDynamic(t, ws...)
		s, stop := runAlone(t, reconcile.Config[*Widget]{
			Name: "w", Resource: widgets, Dynamic: dyn, Reconciler: rec, Logger: quiet, NoEvents: true,
			Owns:   []opkit.Resource{configMaps},
			Leader: &leader.Config{Client: kfake.NewClientset(), Namespace: "ns", Name: "widgets", Identity: "me"},
		})
		calls := map[string]int{}
		for _, a := range dyn.Actions() {
			if a.GetResource().Resource == "configmaps" {
				calls[a.GetVerb()]++
			}
		}
		if calls["list"] != 1 || calls["watch"] != 1 {
			t.Errorf("ConfigMaps listed %d and watched %d times for 4 shards, want once each", calls["list"], calls["watch"])
		}
		if err := s.Check(); err != nil {
			t.Errorf("Check: %v", err)
		}
		before := len(rec.snapshot())
		owner := ws[3]
		if _, err := dyn.Resource(configMaps.GroupVersionResource).Namespace("ns").Create(context.Background(), ownedBy("child", owner), metav1.CreateOptions{}); err != nil {
			t.Fatal(err)
		}
		time.Sleep(time.Second)
		synctest.Wait()
		got := rec.snapshot()[before:]
		if len(got) != 1 || got[0].req.Key.Name != owner.Name || !slices.Contains(got[0].req.Related, "configmaps") {
			t.Errorf("after a child was created: %d reconciles %v, want one of %s naming configmaps", len(got), got, owner.Name)
		}
		stop()
	})
}

// leadingLog records leader.Metrics' Leading calls.
type leadingLog struct {
	mu      sync.Mutex
	calls   []bool
	renewed time.Time // the last Renewed
}

func (l *leadingLog) Leading(b bool) { l.mu.Lock(); l.calls = append(l.calls, b); l.mu.Unlock() }
func (l *leadingLog) Renewed(at time.Time) {
	l.mu.Lock()
	l.renewed = at
	l.mu.Unlock()
}
func (l *leadingLog) lastRenewed() time.Time {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.renewed
}
func (*leadingLog) RenewFailed() {}
func (*leadingLog) WorkOverran() {}
func (l *leadingLog) get() []bool {
	l.mu.Lock()
	defer l.mu.Unlock()
	return slices.Clone(l.calls)
}

// trackedLog records watcher.Metrics' Tracked values.
type trackedLog struct {
	mu   sync.Mutex
	last int
}

func (*trackedLog) Event(opkit.Type, queue.Outcome) {}
func (*trackedLog) Relist(watcher.Reason)           {}
func (*trackedLog) WatchRestart(watcher.Reason)     {}
func (*trackedLog) Error(watcher.Reason)            {}
func (t *trackedLog) Tracked(n int)                 { t.mu.Lock(); t.last = n; t.mu.Unlock() }
func (*trackedLog) Observed(time.Time)              {}
func (t *trackedLog) get() int                      { t.mu.Lock(); defer t.mu.Unlock(); return t.last }

// A Sharded replica's gauges describe the replica, not its last shard:
// it leads while it holds any shard (one Leading(true) for four shards,
// one Leading(false) when it lets them all go), and its watchers' tracked
// objects add up.
func TestAShardedReplicasGaugesAddUpOverItsShards(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		ws, _ := spreadWidgets()
		lead, tracked := &leadingLog{}, &trackedLog{}
		_, stop := runAlone(t, reconcile.Config[*Widget]{
			Name: "w", Resource: widgets, Dynamic: newFakeDynamic(t, ws...), Reconciler: &recorder{}, Logger: quiet, NoEvents: true,
			Watch:  watcher.Config[*Widget]{Metrics: tracked},
			Leader: &leader.Config{Client: kfake.NewClientset(), Namespace: "ns", Name: "widgets", Identity: "me", Metrics: lead},
		})
		if got := lead.get(); !slices.Equal(got, []bool{true}) {
			t.Errorf("Leading calls %v while taking 4 shards, want [true]", got)
		}
		if got := tracked.get(); got != len(ws) {
			t.Errorf("tracked %d, want the %d objects of all shards", got, len(ws))
		}
		stop()
		if got := lead.get(); !slices.Equal(got, []bool{true, false}) {
			t.Errorf("Leading calls %v after stopping, want [true false]", got)
		}
	})
}

// A replica's "last renewal" is its stalest held shard's: one shard whose
// renewals fail shows, though the others renew.
func TestAShardedReplicasLastRenewalIsItsStalestShards(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		ws, _ := spreadWidgets()
		lead := &leadingLog{}
		kube := kfake.NewClientset()
		var failing atomic.Bool
		kube.PrependReactor("update", "leases", func(a k8stesting.Action) (bool, runtime.Object, error) {
			if failing.Load() && a.(k8stesting.UpdateAction).GetObject().(metav1.Object).GetName() == "widgets-2" {
				return true, nil, errors.New("etcd is slow")
			}
			return false, nil, nil
		})
		_, stop := runAlone(t, reconcile.Config[*Widget]{
			Name: "w", Resource: widgets, Dynamic: newFakeDynamic(t, ws...), Reconciler: &recorder{}, Logger: quiet, NoEvents: true,
			Leader: &leader.Config{Client: kube, Namespace: "ns", Name: "widgets", Identity: "me", Metrics: lead},
		})
		failed := time.Now()
		failing.Store(true)
		time.Sleep(5 * time.Second) // the other shards renew twice more
		synctest.Wait()
		if last := lead.lastRenewed(); last.After(failed) || time.Since(last) < 5*time.Second {
			t.Errorf("last renewal %v ago, want shard 2's, from before its renewals failed %v ago", time.Since(last), time.Since(failed))
		}
		stop()
	})
}

// Two replicas of two shards, one each: a replica's trigger schedules
// the objects of its shard on its own controller and drops the others'
// (Enqueue's false; Intake names the holder's published endpoint, where
// the HTTP handler forwards them); a tracked trigger's outcome names the
// replica that ran it; a name built without its UID is refused.
func TestAShardedReplicasTriggerServesOnlyTheShardsItHolds(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		ws, _ := spreadWidgets()
		dyn, kube := newFakeDynamic(t, ws...), versionedLeases()
		var mu sync.Mutex
		ranBy := map[string][]string{} // widget name -> replicas that reconciled it on a trigger
		replicas := map[string]*reconcile.Controller[*Widget]{}
		ctx, cancel := context.WithCancel(t.Context())
		var wg sync.WaitGroup
		for _, id := range []string{"a", "b"} {
			rec := reconcile.Func[*Widget](func(_ context.Context, req reconcile.Request[*Widget]) (reconcile.Result, error) {
				if req.Sources.Has(opkit.Operator) {
					mu.Lock()
					k := req.Key.Name + "/" + strings.Join(req.Reasons, ",")
					ranBy[k] = append(ranBy[k], id)
					mu.Unlock()
				}
				return reconcile.Done(), nil
			})
			s, err := reconcile.NewController(reconcile.Config[*Widget]{Name: "w", Resource: widgets, Dynamic: dyn, Reconciler: rec, Logger: quiet, NoEvents: true,
				Shards: opkit.Shards{Count: 2},
				Leader: &leader.Config{Client: kube, Namespace: "ns", Name: "widgets", Identity: id,
					Annotations: map[string]string{reconcile.EndpointAnnotation: "https://" + id + ".example"}}})
			if err != nil {
				t.Fatal(err)
			}
			replicas[id] = s
			wg.Go(func() {
				if err := s.Run(ctx); err != nil {
					t.Errorf("replica %s: %v", id, err)
				}
			})
		}
		time.Sleep(2 * time.Minute) // the replicas share the shards, one each
		synctest.Wait()
		holder := map[int]string{}
		for i := range 2 {
			l, err := kube.CoordinationV1().Leases("ns").Get(t.Context(), fmt.Sprintf("widgets-%d", i), metav1.GetOptions{})
			if err != nil || l.Spec.HolderIdentity == nil {
				t.Fatalf("shard %d's Lease: %v", i, err)
			}
			holder[i] = *l.Spec.HolderIdentity
		}
		if len(holder) != 2 || holder[0] == holder[1] {
			t.Fatalf("shard holders %v, want one shard each", holder)
		}

		a := replicas["a"]
		for _, w := range ws {
			shard := opkit.ShardOf(w.UID, 2)
			ok, err := a.Trigger().Enqueue(t.Context(), w, opkit.Modified, opkit.Operator, 0, 0)
			switch {
			case err != nil:
				t.Fatalf("trigger of %s: %v", w.Name, err)
			case ok != (holder[shard] == "a"):
				t.Errorf("trigger of %s (shard %d, held by %s) through a: scheduled %v", w.Name, shard, holder[shard], ok)
			case !ok:
				// The intake names the holder and its endpoint, for the HTTP
				// handler to forward to.
				d, err := a.Trigger().Intake(t.Context(), trigger.Pointer{Key: opkit.KeyOf(w)}, trigger.IntakeOptions{})
				if err != nil || d.Endpoint != "https://b.example" || d.Holder != "b" {
					t.Errorf("intake of %s, held by b: %+v %v, want b's endpoint", w.Name, d, err)
				}
			}
		}
		synctest.Wait()
		mu.Lock()
		for _, w := range ws {
			want := []string(nil)
			if holder[opkit.ShardOf(w.UID, 2)] == "a" {
				want = []string{"a"}
			}
			if !slices.Equal(ranBy[w.Name+"/"], want) {
				t.Errorf("triggered %s reconciled by %v, want %v", w.Name, ranBy[w.Name+"/"], want)
			}
		}
		mu.Unlock()

		// Tracked, through the replica that holds the object's shard.
		w := ws[slices.IndexFunc(ws, func(w *Widget) bool { return holder[opkit.ShardOf(w.UID, 2)] == "b" })]
		d, err := replicas["b"].Trigger().Intake(t.Context(), trigger.Pointer{Key: opkit.KeyOf(w)}, trigger.IntakeOptions{Track: trigger.Tracked})
		o, tk := d.Outcome, d.Ticket
		if err != nil || !o.Accepted() {
			t.Fatalf("tracked trigger of %s through b: %v %v", w.Name, o, err)
		}
		if out, err := tk.Wait(t.Context()); err != nil || out.State != trigger.Succeeded || out.Replica != "b" {
			t.Errorf("its outcome %+v %v, want succeeded on b", out, err)
		}

		// Each replica's consumer takes messages from one subscription:
		// a message it cannot serve is handed back until the holder takes
		// it, and each is acknowledged once its holder reconciled it.
		bus := brokertest.New()
		for id, s := range replicas {
			cons, err := trigger.NewConsumer(trigger.ConsumerConfig[*Widget]{Broker: bus, Trigger: s.Trigger(), AckAfterReconcile: true, Concurrency: 4, Logger: quiet})
			if err != nil {
				t.Fatal(err)
			}
			wg.Go(func() {
				if err := cons.Run(ctx); err != nil {
					t.Errorf("replica %s's consumer: %v", id, err)
				}
			})
		}
		for _, w := range ws {
			bus.Publish(fmt.Appendf(nil, `{"namespace":%q,"name":%q,"reason":"bus"}`, w.Namespace, w.Name))
		}
		time.Sleep(time.Minute)
		synctest.Wait()
		if n := bus.Outstanding(); n > 0 {
			t.Errorf("%d messages outstanding, want every one acknowledged", n)
		}
		mu.Lock()
		for _, w := range ws {
			if got, want := ranBy[w.Name+"/bus"], []string{holder[opkit.ShardOf(w.UID, 2)]}; !slices.Equal(got, want) {
				t.Errorf("%s's message reconciled by %v, want %v", w.Name, got, want)
			}
		}
		mu.Unlock()
		nacks := 0
		for _, e := range bus.Events() {
			if e.Op == "Nack" {
				nacks++
			}
			if e.Reason != "" {
				t.Errorf("message %d dead-lettered (%s %s)", e.ID, e.Op, e.Reason)
			}
		}
		t.Logf("%d deliveries handed back by a replica without the shard", nacks)

		noUID := *ws[0]
		noUID.UID = ""
		if _, err := a.Trigger().Enqueue(t.Context(), &noUID, opkit.Modified, opkit.Operator, 0, 0); !errors.Is(err, trigger.ErrInvalid) {
			t.Errorf("a trigger without a UID: %v, want ErrInvalid", err)
		}
		cancel()
		wg.Wait()
	})
}

// versionedLeases is a fake clientset whose Leases get a new
// resourceVersion on every write and whose updates check it, as the API
// server's do (the fake's tracker does neither): the balancer counts a
// member alive while its Lease's resourceVersion changes, and two
// electors must not both win one Lease.
func versionedLeases() *kfake.Clientset {
	cs := kfake.NewClientset()
	var mu sync.Mutex
	rv := 0
	leases := coordinationv1.SchemeGroupVersion.WithResource("leases")
	cs.PrependReactor("*", "leases", func(a k8stesting.Action) (bool, runtime.Object, error) {
		mu.Lock()
		defer mu.Unlock()
		switch a := a.(type) {
		case k8stesting.CreateActionImpl:
			l := a.Object.(*coordinationv1.Lease).DeepCopy()
			rv++
			l.ResourceVersion = strconv.Itoa(rv)
			return true, l, cs.Tracker().Create(leases, l, l.Namespace)
		case k8stesting.UpdateActionImpl:
			l := a.Object.(*coordinationv1.Lease).DeepCopy()
			cur, err := cs.Tracker().Get(leases, l.Namespace, l.Name)
			if err != nil {
				return true, nil, err
			}
			if cur.(*coordinationv1.Lease).ResourceVersion != l.ResourceVersion {
				return true, nil, apierrors.NewConflict(leases.GroupResource(), l.Name, errors.New("the object has been modified"))
			}
			rv++
			l.ResourceVersion = strconv.Itoa(rv)
			return true, l, cs.Tracker().Update(leases, l, l.Namespace)
		}
		return false, nil, nil
	})
	return cs
}
