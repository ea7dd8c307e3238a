package metrics_test

import (
	"context"
	"strings"
	"testing"
	"testing/synctest"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"

	"github.com/opkit/opkit"
	"github.com/opkit/opkit/example/metrics"
	"github.com/opkit/opkit/queue"
)

func TestAdaptersFeedCollectors(t *testing.T) {
	reg := prometheus.NewRegistry()
	m, err := metrics.New(reg)
	if err != nil {
		t.Fatal(err)
	}
	m.Queue().Added(100, false)
	m.Queue().Depth(100, 1)
	m.Queue().Dropped(queue.DroppedSuspended)
	m.Watcher().Event(opkit.Added, queue.Queued)
	m.Leader().Leading(true)
	m.Trigger().Enqueued(queue.Queued)
	m.Trigger().Request(202, "Accepted", time.Millisecond)
	m.Trigger().Acked("Scheduled")
	m.Trigger().Lag(7)
	m.Trigger().BrokerError("Permission")
	m.Controller().Reconciled("done", time.Millisecond)

	want := `
# HELP opkit_trigger_consumer_lag Broker backlog: messages not yet delivered or acknowledged (every replica reports the same shared backlog: aggregate with max, not sum).
# TYPE opkit_trigger_consumer_lag gauge
opkit_trigger_consumer_lag 7
# HELP opkit_trigger_consumer_broker_errors_total Failed broker calls, by kind (Disconnected, Permission, Quota, NotFound, Unknown).
# TYPE opkit_trigger_consumer_broker_errors_total counter
opkit_trigger_consumer_broker_errors_total{kind="Permission"} 1
# HELP opkit_leader_is_leader 1 while this replica holds the Lease.
# TYPE opkit_leader_is_leader gauge
opkit_leader_is_leader 1
# HELP opkit_queue_depth Pending entries (due or delayed), by priority.
# TYPE opkit_queue_depth gauge
opkit_queue_depth{priority="100"} 1
# HELP opkit_trigger_http_requests_total Trigger endpoint requests, by status code and reason.
# TYPE opkit_trigger_http_requests_total counter
opkit_trigger_http_requests_total{code="202",reason="Accepted"} 1
`
	if err := testutil.GatherAndCompare(reg, strings.NewReader(want),
		"opkit_trigger_consumer_lag", "opkit_trigger_consumer_broker_errors_total", "opkit_leader_is_leader",
		"opkit_queue_depth", "opkit_trigger_http_requests_total"); err != nil {
		t.Fatal(err)
	}
	if n := testutil.CollectAndCount(reg, "opkit_reconcile_duration_seconds", "opkit_watcher_events_total", "opkit_queue_dropped_total"); n != 3 {
		t.Fatalf("series = %d, want 3", n)
	}
}

// QueueStats reports a reconcile in flight while it runs: the oldest
// in-flight entry's age and the work still unfinished.
func TestQueueStatsReportsWorkInFlight(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		reg := prometheus.NewRegistry()
		m, err := metrics.New(reg)
		if err != nil {
			t.Fatal(err)
		}
		q := queue.New[string, int](queue.Config[int]{Metrics: m.Queue()})
		defer q.ShutDown()
		if err := reg.Register(metrics.QueueStats(q.Stats)); err != nil {
			t.Fatal(err)
		}
		q.Add("a", 1, queue.AddOptions{})
		q.Add("b", 2, queue.AddOptions{})
		if _, err := q.Get(context.Background()); err != nil {
			t.Fatal(err)
		}
		time.Sleep(90 * time.Second)
		if _, err := q.Get(context.Background()); err != nil {
			t.Fatal(err)
		}
		q.Add("a", 3, queue.AddOptions{}) // parked behind the in-flight a
		time.Sleep(30 * time.Second)
		want := `
# HELP opkit_queue_in_flight Entries handed out to workers and not yet done.
# TYPE opkit_queue_in_flight gauge
opkit_queue_in_flight 2
# HELP opkit_queue_parked Entries waiting behind an in-flight entry of the same key.
# TYPE opkit_queue_parked gauge
opkit_queue_parked 1
# HELP opkit_queue_longest_running_seconds How long the oldest in-flight entry has been in flight.
# TYPE opkit_queue_longest_running_seconds gauge
opkit_queue_longest_running_seconds 120
# HELP opkit_queue_unfinished_work_seconds Time in flight summed over all in-flight entries.
# TYPE opkit_queue_unfinished_work_seconds gauge
opkit_queue_unfinished_work_seconds 150
`
		if err := testutil.GatherAndCompare(reg, strings.NewReader(want), "opkit_queue_in_flight", "opkit_queue_parked",
			"opkit_queue_longest_running_seconds", "opkit_queue_unfinished_work_seconds"); err != nil {
			t.Fatal(err)
		}
	})
}
