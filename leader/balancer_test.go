package leader_test

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"testing/synctest"
	"time"

	coordinationv1 "k8s.io/api/coordination/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/watch"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/kubernetes/fake"
	"k8s.io/client-go/kubernetes/scheme"
	k8stesting "k8s.io/client-go/testing"

	"github.com/opkit/opkit/leader"
)

// leaseStore is a simulated API server holding any number of Leases in
// testNS, with resourceVersions that change on every write and
// resourceVersion preconditions on updates (the fake clientset's tracker
// has neither). Each replica's client can be cut off (every call fails,
// as for a crashed or partitioned process).
type leaseStore struct {
	mu      sync.Mutex
	tracker k8stesting.ObjectTracker
	rv      int
}

func newLeaseStore() *leaseStore {
	return &leaseStore{tracker: k8stesting.NewObjectTracker(scheme.Scheme, scheme.Codecs.UniversalDecoder()), rv: 100}
}

func (s *leaseStore) client(cut, noList *atomic.Bool) kubernetes.Interface {
	cs := fake.NewClientset()
	cs.PrependReactor("*", "leases", func(a k8stesting.Action) (bool, runtime.Object, error) {
		switch {
		case cut.Load():
			return true, nil, errors.New("connection refused")
		case noList.Load() && a.GetVerb() == "list":
			return true, nil, apierrors.NewForbidden(leasesGVR.GroupResource(), "", errors.New("no list"))
		}
		return s.serve(a)
	})
	cs.PrependWatchReactor("leases", func(a k8stesting.Action) (bool, watch.Interface, error) {
		if cut.Load() {
			return true, nil, errors.New("connection refused")
		}
		w, err := s.tracker.Watch(leasesGVR, testNS)
		return true, w, err
	})
	return cs
}

func (s *leaseStore) serve(a k8stesting.Action) (bool, runtime.Object, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	switch a := a.(type) {
	case k8stesting.CreateActionImpl:
		l := a.Object.(*coordinationv1.Lease).DeepCopy()
		s.rv++
		l.ResourceVersion = strconv.Itoa(s.rv)
		return true, l, s.tracker.Create(leasesGVR, l, testNS)
	case k8stesting.UpdateActionImpl:
		l := a.Object.(*coordinationv1.Lease).DeepCopy()
		cur, err := s.tracker.Get(leasesGVR, testNS, l.Name)
		if err != nil {
			return true, nil, err
		}
		if l.ResourceVersion != cur.(*coordinationv1.Lease).ResourceVersion {
			return true, nil, apierrors.NewConflict(leasesGVR.GroupResource(), l.Name, errors.New("the object has been modified"))
		}
		s.rv++
		l.ResourceVersion = strconv.Itoa(s.rv)
		return true, l, s.tracker.Update(leasesGVR, l, testNS)
	}
	return k8stesting.ObjectReaction(s.tracker)(a)
}

// holders returns the holder of each shard Lease "shard-i".
func (s *leaseStore) holders(shards int) []string {
	s.mu.Lock()
	defer s.mu.Unlock()
	out := make([]string, shards)
	for i := range out {
		if obj, err := s.tracker.Get(leasesGVR, testNS, fmt.Sprintf("shard-%d", i)); err == nil {
			out[i] = holder(obj.(*coordinationv1.Lease))
		}
	}
	return out
}

// shardReplica is one replica of a sharded deployment: an elector per
// shard and a Balancer.
type shardReplica struct {
	name     string
	cut      atomic.Bool
	noList   atomic.Bool
	balancer *leader.Balancer
	cancel   context.CancelFunc
	done     sync.WaitGroup
}

const testShards = 8

// startShardReplica runs a replica whose shard work records, per shard,
// which replica works on it; two at once fail the test.
func startShardReplica(t *testing.T, s *leaseStore, name string, working *sync.Map, tweak ...func(*shardReplica)) *shardReplica {
	r := &shardReplica{name: name}
	for _, f := range tweak {
		f(r)
	}
	client := s.client(&r.cut, &r.noList)
	discard := slog.New(slog.NewTextHandler(io.Discard, nil))
	b, err := leader.NewBalancer(leader.BalancerConfig{Client: client, Namespace: testNS, Group: "ctrl", Identity: name,
		Shards: testShards, Logger: discard})
	if err != nil {
		t.Fatal(err)
	}
	r.balancer = b
	ctx, cancel := context.WithCancel(t.Context())
	r.cancel = cancel
	for i := range testShards {
		e, err := leader.New(leader.Config{Client: client, Namespace: testNS, Name: fmt.Sprintf("shard-%d", i), Identity: name,
			Admit: b.Admit, Logger: discard})
		if err != nil {
			t.Fatal(err)
		}
		b.Add(e)
		r.done.Go(func() {
			_ = e.Run(ctx, func(ctx context.Context) error {
				if other, busy := working.LoadOrStore(i, name); busy {
					t.Errorf("shard %d: %s starts while %s works on it", i, name, other)
				}
				<-ctx.Done()
				working.Delete(i)
				return nil
			})
		})
	}
	r.done.Go(func() { _ = b.Run(ctx) })
	return r
}

// stop ends the replica gracefully; crash cuts it off from the API
// server first, so it neither releases nor deletes anything.
func (r *shardReplica) stop() { r.cancel(); r.done.Wait() }
func (r *shardReplica) crash() {
	r.cut.Store(true)
	r.stop()
}

// held counts the shards each replica holds; "" counts the free ones.
func held(holders []string) map[string]int {
	n := map[string]int{}
	for _, h := range holders {
		n[h]++
	}
	return n
}

// Three replicas share eight shards at most three each, every shard held
// by one; when one leaves gracefully the other two take its shards at
// once (four each), when one crashes the last takes them all once the
// Leases expire; a replica that joins gets its share by others yielding.
// No shard is ever worked on by two replicas at once.
func TestTheBalancerSpreadsShardsOverTheReplicas(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		s := newLeaseStore()
		var working sync.Map
		settle := func(d time.Duration) []string {
			time.Sleep(d)
			synctest.Wait()
			return s.holders(testShards)
		}
		want := func(what string, holders []string, maxEach int, replicas ...string) {
			t.Helper()
			n := held(holders)
			for _, r := range replicas {
				if n[r] == 0 || n[r] > maxEach {
					t.Errorf("%s: %s holds %d shards, want 1 to %d (holders %v)", what, r, n[r], maxEach, holders)
				}
			}
			if n[""] != 0 || len(n) != len(replicas) {
				t.Errorf("%s: holders %v, want every shard held by one of %v", what, holders, replicas)
			}
		}

		a := startShardReplica(t, s, "a", &working)
		b := startShardReplica(t, s, "b", &working)
		c := startShardReplica(t, s, "c", &working)
		want("three replicas", settle(time.Minute), 3, "a", "b", "c")
		if a.balancer.Members() != 3 || a.balancer.Share() != 3 {
			t.Errorf("a counts %d members, share %d; want 3, 3", a.balancer.Members(), a.balancer.Share())
		}

		c.stop()
		want("c left", settle(10*time.Second), 4, "a", "b")

		d := startShardReplica(t, s, "d", &working)
		want("d joined", settle(time.Minute), 3, "a", "b", "d")

		b.crash()
		want("b crashed", settle(time.Minute), 4, "a", "d")

		a.stop()
		d.stop()
	})
}

// A replica that cannot list the member Leases is not counted and takes
// no shard: the others hold them all, and its Balancer's Check says why.
func TestAReplicaThatCannotCountTakesNothingAndIsNotCounted(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		s := newLeaseStore()
		var working sync.Map
		a := startShardReplica(t, s, "a", &working)
		b := startShardReplica(t, s, "b", &working, func(r *shardReplica) { r.noList.Store(true) })
		time.Sleep(time.Minute)
		synctest.Wait()
		if n := held(s.holders(testShards)); n["a"] != testShards {
			t.Errorf("holders %v, want every shard with a", s.holders(testShards))
		}
		if a.balancer.Members() != 1 {
			t.Errorf("a counts %d members, want 1 (b never wrote a member Lease)", a.balancer.Members())
		}
		if err := b.balancer.Check(); err == nil || !strings.Contains(err.Error(), "counting") {
			t.Errorf("b's Check = %v, want the failed count", err)
		}
		b.stop()
		a.stop()
	})
}
