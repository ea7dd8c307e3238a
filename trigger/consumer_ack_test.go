package trigger_test

import (
	"context"
	"encoding/json"
	"testing"
	"testing/synctest"
	"time"

	corev1 "k8s.io/api/core/v1"

	"github.com/opkit/opkit"
	"github.com/opkit/opkit/queue"
	"github.com/opkit/opkit/trigger"
)

// With AckAfterReconcile a message is acknowledged only once the
// reconcile that serves it succeeded (or failed terminally): a failed
// reconcile keeps it waiting for the retry, kept alive by InProgress, and
// the outcome is the reply to a request.
func TestAckAfterReconcileWaitsForTheFinalOutcome(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		e := newConsumerEnv(t, func(c *trigger.ConsumerConfig[*corev1.ConfigMap]) {
			c.AckAfterReconcile, c.ProgressInterval = true, 10*time.Second
		})
		defer e.run(t)()
		id := e.b.Publish([]byte(`{"namespace":"ns","name":"a","reason":"deployed"}`))
		synctest.Wait()
		it, err := e.q.Get(context.Background())
		if err != nil || it.Value.Ticket == 0 {
			t.Fatalf("queued %+v (%v), want an entry with a ticket", it.Value, err)
		}
		e.tr.Report(it.Key, it.Value.Ticket, opkit.Shards{}, trigger.Outcome{State: trigger.Failed, Error: "the database is down"})
		e.q.Done(it.Key)
		time.Sleep(25 * time.Second) // the retry's backoff
		synctest.Wait()
		if got := ops(e.b.Events(id)); got != "InProgress,InProgress" {
			t.Fatalf("%q after a failed reconcile, want no settlement yet, and InProgress every 10s (twice in 25s)", got)
		}
		// The retry carries the ticket on, as the controller's does.
		e.q.Add(it.Key, it.Value, queue.AddOptions{Priority: it.Priority}) // (a re-add with the same cause)
		it, _ = e.q.Get(context.Background())
		e.tr.Report(it.Key, it.Value.Ticket, opkit.Shards{}, trigger.Outcome{State: trigger.Succeeded, Attempts: 2})
		e.q.Done(it.Key)
		synctest.Wait()
		evs := e.b.Events(id)
		if got := ops(evs); got != "InProgress,InProgress,Reply,Ack" {
			t.Fatalf("%q, want the reply and Ack once the retry succeeded", got)
		}
		var out trigger.Outcome
		if reply := evs[2].Data; json.Unmarshal(reply, &out) != nil || out.State != trigger.Succeeded || out.Attempts != 2 {
			t.Fatalf("reply %q, want the succeeded outcome", reply)
		}
	})
}

// If the leader's term ends before the reconcile, the message is handed
// back, never acknowledged: the broker redelivers it to the next leader.
func TestAckAfterReconcileHandsBackWhenTheTermEnds(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		e := newConsumerEnv(t, func(c *trigger.ConsumerConfig[*corev1.ConfigMap]) { c.AckAfterReconcile = true })
		defer e.run(t)()
		id := e.b.Publish([]byte(`{"namespace":"ns","name":"a"}`))
		synctest.Wait()
		e.q.Suspend()
		e.q.Clear()
		e.tr.Abandon("term ended", opkit.Shards{})
		synctest.Wait()
		if got := ops(e.b.Events(id)); got != "Nack@1s" {
			t.Fatalf("settled %q, want a Nack for the next leader", got)
		}
	})
}
