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
		id := e.b.PublishRequest([]byte(`{"namespace":"ns","name":"a","reason":"deployed"}`))
		synctest.Wait()
		it, err := e.q.Get(context.Background())
		if err != nil || it.Value.Ticket == 0 {
			t.Fatalf("queued %+v (%v), want an entry with a ticket", it.Value, err)
		}
		e.tr.Report(it.Key, it.Value.Ticket, opkit.Shards{}, trigger.Outcome{State: trigger.Failed, Error: "the database is down"})
		e.q.Done(it.Key)
		time.Sleep(25 * time.Second) // the retry's backoff
		synctest.Wait()
		if got := ops(e.b.EventsFor(id)); got != "" {
			t.Fatalf("settled %q after a failed reconcile, want nothing yet", got)
		}
		if n := e.b.Progress(id); n != 2 {
			t.Fatalf("%d InProgress calls in 25s, want 2 (every 10s)", n)
		}
		// The retry carries the ticket on, as the controller's does.
		e.q.Add(it.Key, it.Value, queue.AddOptions{Priority: it.Priority}) // (a re-add with the same cause)
		it, _ = e.q.Get(context.Background())
		e.tr.Report(it.Key, it.Value.Ticket, opkit.Shards{}, trigger.Outcome{State: trigger.Succeeded, Attempts: 2})
		e.q.Done(it.Key)
		synctest.Wait()
		if got := ops(e.b.EventsFor(id)); got != "Ack" {
			t.Fatalf("settled %q, want Ack once the retry succeeded", got)
		}
		replies := e.b.Replies(id)
		var out trigger.Outcome
		if len(replies) != 1 || json.Unmarshal(replies[0], &out) != nil || out.State != trigger.Succeeded || out.Attempts != 2 {
			t.Fatalf("replies %q, want the succeeded outcome", replies)
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
		if got := ops(e.b.EventsFor(id)); got != "Nack@1s" {
			t.Fatalf("settled %q, want a Nack for the next leader", got)
		}
	})
}
