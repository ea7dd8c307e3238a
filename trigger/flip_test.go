package trigger_test

import (
	"context"
	"flag"
	"fmt"
	"math/rand/v2"
	"sync"
	"testing"
	"testing/synctest"
	"time"

	corev1 "k8s.io/api/core/v1"

	"github.com/opkit/opkit"
	"github.com/opkit/opkit/queue"
	"github.com/opkit/opkit/trigger"
	"github.com/opkit/opkit/trigger/brokertest"
)

var flipSeed = flag.Uint64("flipseed", 0, "seed of TestConsumerLosesNothingWhileLeadershipFlips (0: random)")

// recordingAdder wraps the real queue and records every outcome, so the
// test can match broker settlements against what the queue really did.
type recordingAdder struct {
	q        *cmQueue
	mu       sync.Mutex
	accepted map[opkit.Key]int
	dropped  int
}

func (r *recordingAdder) Add(k opkit.Key, v opkit.Cause[*corev1.ConfigMap], o queue.AddOptions) queue.Outcome {
	out := r.q.Add(k, v, o)
	r.mu.Lock()
	defer r.mu.Unlock()
	switch {
	case out.Accepted():
		r.accepted[k]++
	case out != queue.NotHeld: // NotHeld: Intake's try to join a waiting entry
		r.dropped++
	}
	return out
}

// TestConsumerLosesNothingWhileLeadershipFlips publishes 1,000 triggers
// (10% malformed, 10% for objects that do not exist) while the queue's
// intake is suspended and resumed as leadership flips, and checks the
// issue's rule: every trigger for an existing object is scheduled and then
// acked, none is acked while dropped, and the dead letter holds exactly
// the malformed ones.
func TestConsumerLosesNothingWhileLeadershipFlips(t *testing.T) {
	seed := *flipSeed
	if seed == 0 {
		seed = rand.Uint64()
	}
	t.Logf("seed %d", seed)
	synctest.Test(t, func(t *testing.T) {
		rng := rand.New(rand.NewPCG(seed, 0))
		b := brokertest.New()
		q := newCMQueue()
		rec := &recordingAdder{q: q, accepted: map[opkit.Key]int{}}
		objs := &objects{exist: map[opkit.Key]bool{}}
		tr, err := trigger.New(trigger.Config[*corev1.ConfigMap]{Queue: rec, Resource: configMaps, Get: objs.get, Logger: discard})
		if err != nil {
			t.Fatal(err)
		}
		m := newCounting()
		c, err := trigger.NewConsumer(trigger.ConsumerConfig[*corev1.ConfigMap]{
			Broker: b, Trigger: tr, Metrics: m, Logger: discard,
			Concurrency: 4, DroppedDelay: 200 * time.Millisecond, LagInterval: -1,
		})
		if err != nil {
			t.Fatal(err)
		}
		ctx, cancel := context.WithCancel(t.Context())
		done := make(chan error, 1)
		go func() { done <- c.Run(ctx) }()

		// A worker drains the queue as the reconciler would.
		var workers sync.WaitGroup
		workers.Go(func() {
			for {
				it, err := q.Get(ctx)
				if err != nil {
					return
				}
				q.Done(it.Key)
			}
		})

		q.Suspend() // start as a follower
		var malformed, existing, missing []uint64
		wantPerKey := map[opkit.Key]int{}
		for i := range 1000 {
			key := opkit.Key{Namespace: "ns", Name: fmt.Sprintf("obj-%d", i%50)}
			switch r := rng.IntN(10); {
			case r == 0:
				malformed = append(malformed, b.Publish([]byte(`{"namespace":"ns","name":"obj-`)))
			case r == 1:
				missing = append(missing, b.Publish([]byte(`{"namespace":"ns","name":"gone-1"}`)))
			default:
				objs.mu.Lock()
				objs.exist[key] = true
				objs.mu.Unlock()
				wantPerKey[key]++
				existing = append(existing, b.Publish(fmt.Appendf(nil, `{"namespace":"ns","name":%q}`, key.Name)))
			}
			if i%25 == 0 {
				time.Sleep(time.Duration(rng.IntN(300)) * time.Millisecond)
				if q.Suspended() {
					q.Resume()
				} else {
					q.Suspend()
				}
			}
		}
		for range 20 {
			time.Sleep(time.Duration(100+rng.IntN(500)) * time.Millisecond)
			if q.Suspended() {
				q.Resume()
			} else {
				q.Suspend()
			}
		}
		q.Resume() // a leader at last
		for b.Outstanding() > 0 {
			time.Sleep(time.Second)
		}
		cancel()
		if err := <-done; err != nil {
			t.Fatal(err)
		}
		workers.Wait()

		// Every trigger for an existing object: nacked while dropped, then
		// acked exactly once, and the ack came after a scheduled enqueue.
		for _, id := range existing {
			evs := b.Events(id)
			last := evs[len(evs)-1]
			if last.Op != "Ack" {
				t.Fatalf("message %d ended with %s", id, last.Op)
			}
			for _, ev := range evs[:len(evs)-1] {
				if ev.Op != "Nack" {
					t.Fatalf("message %d: %s before its final ack", id, ev.Op)
				}
			}
		}
		for k, n := range wantPerKey {
			if rec.accepted[k] != n {
				t.Errorf("%v: %d scheduled enqueues for %d triggers", k, rec.accepted[k], n)
			}
		}
		// Acks for scheduled triggers equal accepted enqueues; nacks for
		// drops equal dropped enqueues: no dropped trigger was acked.
		if m.acked["Scheduled"] != len(existing) || m.nacked["Dropped"] != rec.dropped {
			t.Errorf("acked(scheduled)=%d want %d; nacked(dropped)=%d, dropped enqueues=%d",
				m.acked["Scheduled"], len(existing), m.nacked["Dropped"], rec.dropped)
		}
		if rec.dropped == 0 {
			t.Error("no enqueue was dropped: the flips did not exercise the rule")
		}
		if m.acked["NotFound"] != len(missing) {
			t.Errorf("acked(not found) = %d, want %d", m.acked["NotFound"], len(missing))
		}
		dead := deadLetters(b)
		if len(dead) != len(malformed) {
			t.Fatalf("dead letters = %d, want the %d malformed", len(dead), len(malformed))
		}
		isMalformed := map[uint64]bool{}
		for _, id := range malformed {
			isMalformed[id] = true
		}
		for _, d := range dead { // handled concurrently: compare as a set
			if !isMalformed[d.ID] || d.Reason != "Malformed" {
				t.Errorf("dead letter %d (%s) is not one of the malformed messages", d.ID, d.Reason)
			}
			delete(isMalformed, d.ID)
		}
	})
}
