package trigger_test

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"
	"testing/synctest"
	"time"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/types"

	"github.com/opkit/opkit"
	"github.com/opkit/opkit/queue"
	"github.com/opkit/opkit/trigger"
)

// The specification of a trigger shared by the shards of a sharded
// controller (reconcile.Sharded): its objects carry their UIDs, and a
// shard's turn and the end of a shard's term concern only that shard's
// triggers, even for a name that is on two shards at once.

// uidsOnTwoShards returns a UID of shard 0 and one of shard 1 of two.
func uidsOnTwoShards() (types.UID, types.UID) {
	var uids [2]types.UID
	for i := 0; uids[0] == "" || uids[1] == ""; i++ {
		uid := types.UID(fmt.Sprintf("uid-%d", i))
		if s := opkit.ShardOf(uid, 2); uids[s] == "" {
			uids[s] = uid
		}
	}
	return uids[0], uids[1]
}

// byUID is a queue that records what it is given and never joins an
// entry (MergeOnly adds are NotHeld).
type byUID struct {
	mu     sync.Mutex
	causes []opkit.Cause[*corev1.ConfigMap]
}

func (q *byUID) Add(_ opkit.Key, c opkit.Cause[*corev1.ConfigMap], opts queue.AddOptions) queue.Outcome {
	if opts.MergeOnly {
		return queue.NotHeld
	}
	q.mu.Lock()
	defer q.mu.Unlock()
	q.causes = append(q.causes, c)
	return queue.Queued
}

// shardsRouter is the Router of a replica of a controller of n shards:
// the shards in held are worked on here, through their queue; the others
// by the replica whose endpoint endpoint names ("" unknown), called
// holder-i. It records the shards it was asked about.
type shardsRouter struct {
	n        int
	held     map[int]queue.Adder[opkit.Key, opkit.Cause[*corev1.ConfigMap]]
	endpoint string
	mu       sync.Mutex
	asked    []int
}

func (r *shardsRouter) Shards() int { return r.n }

func (r *shardsRouter) Place(i int) trigger.Place[*corev1.ConfigMap] {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.asked = append(r.asked, i)
	if q, ok := r.held[i]; ok {
		return trigger.Place[*corev1.ConfigMap]{Queue: q}
	}
	return trigger.Place[*corev1.ConfigMap]{Holder: fmt.Sprintf("holder-%d", i), Endpoint: r.endpoint}
}

func TestAShardsTurnAndTermConcernOnlyItsShardsTriggers(t *testing.T) {
	uid0, uid1 := uidsOnTwoShards()
	shard0, shard1 := opkit.Shards{Count: 2, Held: []int{0}}, opkit.Shards{Count: 2, Held: []int{1}}
	// ns/a is deleted and made again between the two reads: the same name
	// with a UID of each shard.
	next := uid0
	q := &byUID{}
	r := &shardsRouter{n: 2, held: map[int]queue.Adder[opkit.Key, opkit.Cause[*corev1.ConfigMap]]{0: q, 1: q}}
	tr, err := trigger.New(trigger.Config[*corev1.ConfigMap]{Router: r, Resource: configMaps, Logger: discard,
		Get: func(context.Context, opkit.Key) (*corev1.ConfigMap, error) {
			o := cm("ns", "a")
			o.UID = next
			return o, nil
		}})
	if err != nil {
		t.Fatal(err)
	}
	intake := func() *trigger.Ticket {
		t.Helper()
		d, err := tr.Intake(t.Context(), trigger.Pointer{Key: opkit.Key{Namespace: "ns", Name: "a"}}, trigger.IntakeOptions{Track: trigger.Tracked})
		if err != nil || d.Outcome != queue.Queued || d.Ticket == nil {
			t.Fatalf("intake: %+v %v, want queued with a ticket", d, err)
		}
		return d.Ticket
	}
	old := intake()
	next = uid1
	young := intake()
	key := opkit.Key{Namespace: "ns", Name: "a"}
	if len(q.causes) != 2 || q.causes[0].Object.UID != uid0 || q.causes[1].Object.UID != uid1 {
		t.Fatalf("queued %d causes, want the two objects read", len(q.causes))
	}

	// Shard 1's turn carries the higher ticket number; shard 0's trigger
	// is not its to answer.
	tr.Report(key, q.causes[1].Ticket, shard1, trigger.Outcome{State: trigger.Succeeded})
	if o := trigger.Lookup(tr, key, young.ID); o.State != trigger.Succeeded {
		t.Fatalf("shard 1's trigger after its turn: %+v, want succeeded", o)
	}
	if o := trigger.Lookup(tr, key, old.ID); o.State != trigger.Pending {
		t.Fatalf("shard 0's trigger after shard 1's turn: %+v, want still pending", o)
	}

	// Shard 1's term ends: nothing of shard 0's is abandoned.
	tr.Abandon("shard 1 was handed over", shard1)
	if o := trigger.Lookup(tr, key, old.ID); o.State != trigger.Pending {
		t.Fatalf("shard 0's trigger after shard 1's term: %+v, want still pending", o)
	}
	tr.Abandon("shard 0 was handed over", shard0)
	if o, err := old.Wait(t.Context()); err != nil || o.State != trigger.Unknown || o.Error != "shard 0 was handed over" {
		t.Fatalf("shard 0's trigger after its term: %+v %v, want unknown, saying why", o, err)
	}

	// A trigger of an object built from its name alone names no shard.
	if _, err := tr.Enqueue(t.Context(), cm("ns", "b").DeepCopy(), opkit.Modified, opkit.Operator, 0, 0); err != nil {
		t.Fatalf("an object with a UID: %v", err)
	}
	noUID := cm("ns", "b")
	noUID.UID = ""
	if ok, err := tr.Enqueue(t.Context(), noUID, opkit.Modified, opkit.Operator, 0, 0); ok || !errors.Is(err, trigger.ErrInvalid) {
		t.Fatalf("an object without a UID: %v %v, want ErrInvalid", ok, err)
	}
}

// handlerTransport sends a forwarded request to the handler h in this
// process, as the holder's endpoint would serve it.
type handlerTransport struct{ h http.Handler }

func (t handlerTransport) RoundTrip(r *http.Request) (*http.Response, error) {
	w := httptest.NewRecorder()
	t.h.ServeHTTP(w, r)
	return w.Result(), nil
}

// A replica that does not hold the object's shard reads the object to
// learn its UID and forwards the trigger to the shard's holder, whose
// answer the caller gets: a trigger, and a GET of a trigger this replica
// does not know. A forwarded request is not forwarded again, and a
// replica that knows no holder answers itself.
func TestAReplicaForwardsToTheHolderOfTheObjectsShard(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		holder := newHandlerEnv(t, nil)
		other := newHandlerEnv(t, nil)
		q := newCMQueue()
		// Of 8 shards, this replica holds all but ns/a's.
		aShard := opkit.ShardOf("uid-a", 8)
		r := &shardsRouter{n: 8, held: map[int]queue.Adder[opkit.Key, opkit.Cause[*corev1.ConfigMap]]{}, endpoint: "http://holder.example:8443"}
		for i := range 8 {
			if i != aShard {
				r.held[i] = q
			}
		}
		tr, err := trigger.New(trigger.Config[*corev1.ConfigMap]{Router: r, Resource: configMaps, Dynamic: other.dyn, Logger: discard})
		if err != nil {
			t.Fatal(err)
		}
		if other.h, err = trigger.NewHandler(tr, trigger.HandlerConfig{Authenticator: allowAll{}, Logger: discard,
			ForwardClient: &http.Client{Transport: handlerTransport{holder.h}},
			MaxWaiting:    1, // a waiting caller forwarded takes one place, not two
		}); err != nil {
			t.Fatal(err)
		}
		other.q = q

		w := post(other, "/reconcile/ns/a?reason=deployed&wait=1s")
		var a trigger.Accepted
		if err := json.Unmarshal(w.Body.Bytes(), &a); err != nil || w.Code != http.StatusAccepted || a.ID == "" || w.Header().Get("X-Opkit-Forwarded") == "" {
			t.Fatalf("through the other replica: %d %s, want the holder's 202 with an id", w.Code, w.Body)
		}
		if len(r.asked) != 1 || r.asked[0] != aShard {
			t.Fatalf("places asked for %v, want the shard of the UID read, uid-a's (%d)", r.asked, aShard)
		}
		if holder.q.Len() != 1 || other.q.Len() != 0 {
			t.Fatalf("queued: holder %d, other %d; want the holder's", holder.q.Len(), other.q.Len())
		}

		// The id is the holder's: the other replica forwards the GET.
		if o := outcomeOf(t, other.do(http.MethodGet, a.StatusPath, nil, nil)); o.State != trigger.Pending || o.ID != a.ID {
			t.Fatalf("GET through the other replica: %+v, want the holder's pending", o)
		}
		// Unknown to the holder too.
		if o := outcomeOf(t, other.do(http.MethodGet, "/reconcile/ns/a/triggers/nobody-0-1", nil, nil)); o.State != trigger.Unknown {
			t.Fatalf("an unknown id: %+v, want unknown", o)
		}
		// Of an object that does not exist: no shard, this replica answers.
		if o := outcomeOf(t, other.do(http.MethodGet, "/reconcile/ns/gone/triggers/"+a.ID, nil, nil)); o.State != trigger.Unknown {
			t.Fatalf("an id under a missing object: %+v, want unknown", o)
		}

		// One hop: a forwarded request that reaches a replica without the
		// shard is dropped there (503), not forwarded again.
		wantStatus(t, other.do(http.MethodPost, "/reconcile/ns/a", nil, http.Header{"X-Opkit-Forwarded": {"replica-c"}}), http.StatusServiceUnavailable, "ServiceUnavailable")

		// No holder known: the replica answers itself.
		r.endpoint = ""
		wantStatus(t, post(other, "/reconcile/ns/a"), http.StatusServiceUnavailable, "ServiceUnavailable")
		if o := outcomeOf(t, other.do(http.MethodGet, a.StatusPath, nil, nil)); o.State != trigger.Unknown {
			t.Fatalf("GET with no holder known: %+v, want this replica's unknown", o)
		}
	})
}

// A GET of an id this replica does not know reads the object, paid from
// the trigger budget: with the budget spent it answers 429, as a trigger
// would, not "unknown" (which would tell a polling caller its trigger was
// lost).
func TestAGetThatCannotReadIsRefusedNotUnknown(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		env := newHandlerEnv(t, nil)
		r := &shardsRouter{n: 8, endpoint: "http://holder.example"} // holds none
		tr, err := trigger.New(trigger.Config[*corev1.ConfigMap]{Router: r, Resource: configMaps, Dynamic: env.dyn,
			Rate: 0.001, Burst: 1, Logger: discard})
		if err != nil {
			t.Fatal(err)
		}
		h, err := trigger.NewHandler(tr, trigger.HandlerConfig{Authenticator: allowAll{}, Logger: discard,
			ForwardClient: &http.Client{Transport: handlerTransport{env.h}}})
		if err != nil {
			t.Fatal(err)
		}
		env.h = h
		if o := outcomeOf(t, env.do(http.MethodGet, "/reconcile/ns/a/triggers/x-0-1", nil, nil)); o.State != trigger.Unknown {
			t.Fatalf("the first GET, forwarded: %+v, want the holder's unknown", o)
		}
		wantStatus(t, env.do(http.MethodGet, "/reconcile/ns/a/triggers/x-0-1", nil, nil), http.StatusTooManyRequests, "TooManyRequests")
	})
}

// A consumer hands back a message for an object whose shard another
// replica holds; it reads the object once to find its shard, and hands
// back its redeliveries for 30s without a read or a token of the budget,
// which is left for the messages it works on.
func TestAConsumerHandsBackWhatItReadLatelyWithoutAReadOrAToken(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		_, there := uidsOnTwoShards()
		var mu sync.Mutex
		reads := 0
		get := func(_ context.Context, k opkit.Key) (*corev1.ConfigMap, error) {
			mu.Lock()
			defer mu.Unlock()
			reads++
			obj := cm(k.Namespace, k.Name)
			obj.UID = there
			return obj, nil
		}
		router := &shardsRouter{n: 2, held: map[int]queue.Adder[opkit.Key, opkit.Cause[*corev1.ConfigMap]]{0: &byUID{}}}
		e := newConsumerEnvWith(t, func(c *trigger.Config[*corev1.ConfigMap]) {
			c.Get, c.Queue, c.Router, c.Rate, c.Burst = get, nil, router, 0.001, 2
		}, nil)
		id := e.b.Publish([]byte(`{"namespace":"ns","name":"a"}`))
		stop := e.run(t)
		defer stop()
		time.Sleep(10 * time.Second) // a redelivery every DroppedDelay (1s)
		synctest.Wait()
		nacks := strings.Count(ops(e.b.Events(id)), "Nack")
		mu.Lock()
		n := reads
		mu.Unlock()
		if nacks < 5 || n != 1 {
			t.Fatalf("%d hand-backs with %d reads, want several with 1 (the budget has two tokens)", nacks, n)
		}
		time.Sleep(30 * time.Second) // the UID read is forgotten: a delivery reads again, for the second token
		synctest.Wait()
		mu.Lock()
		n = reads
		mu.Unlock()
		if n != 2 {
			t.Fatalf("%d reads 40s on, want 2: one more once the UID was forgotten, and none without a token", n)
		}
	})
}
