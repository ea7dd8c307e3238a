// Package metrics feeds opkit's metrics interfaces (queue, watcher, leader,
// trigger with its handler and consumer, controller) into Prometheus
// collectors, so the demo
// operator's /metrics shows every component. The SDK itself depends on no
// metrics library: each package declares a small interface, and this
// package is the adapter an operator author would write.
//
// The adapters hold no goroutines; every method is safe for concurrent use
// and never blocks (Prometheus collectors are lock-free or briefly locked).
package metrics

import (
	"strconv"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/opkit/opkit"
	"github.com/opkit/opkit/leader"
	"github.com/opkit/opkit/queue"
	"github.com/opkit/opkit/reconcile"
	"github.com/opkit/opkit/trigger"
	"github.com/opkit/opkit/watcher"
)

// Namespace prefixes every metric name.
const Namespace = "opkit"

// Metrics holds the collectors. Build it with New; hand its adapters to
// the SDK's Config structs.
type Metrics struct {
	queueAdds    *prometheus.CounterVec
	queueDropped *prometheus.CounterVec
	queueDepth   *prometheus.GaugeVec
	queueWait    *prometheus.HistogramVec
	queueWork    prometheus.Histogram
	queueRetries prometheus.Counter

	watchEvents   *prometheus.CounterVec
	watchRelists  *prometheus.CounterVec
	watchRestarts *prometheus.CounterVec
	watchErrors   *prometheus.CounterVec
	watchTracked  prometheus.Gauge
	watchLastSeen prometheus.Gauge
	watchClientSh prometheus.Gauge

	leaderLeading     prometheus.Gauge
	leaderLastRenew   prometheus.Gauge
	leaderRenewFailed prometheus.Counter
	leaderOverran     prometheus.Counter

	triggerEnqueued *prometheus.CounterVec
	triggerRejected prometheus.Counter

	httpRequests *prometheus.CounterVec
	httpDuration prometheus.Histogram

	consReceived   prometheus.Counter
	consAcked      *prometheus.CounterVec
	consNacked     *prometheus.CounterVec
	consTerminated *prometheus.CounterVec
	consProcessed  prometheus.Histogram
	consLag        prometheus.Gauge
	consBrokerErrs *prometheus.CounterVec

	recReconciled *prometheus.HistogramVec
	recPanics     prometheus.Counter
	recSkipped    *prometheus.CounterVec
	recRefetched  prometheus.Counter
}

// New creates the collectors and registers them with reg.
func New(reg prometheus.Registerer) (*Metrics, error) {
	cv := func(sub, name, help string, labels ...string) *prometheus.CounterVec {
		return prometheus.NewCounterVec(prometheus.CounterOpts{Namespace: Namespace, Subsystem: sub, Name: name, Help: help}, labels)
	}
	c := func(sub, name, help string) prometheus.Counter {
		return prometheus.NewCounter(prometheus.CounterOpts{Namespace: Namespace, Subsystem: sub, Name: name, Help: help})
	}
	g := func(sub, name, help string) prometheus.Gauge {
		return prometheus.NewGauge(prometheus.GaugeOpts{Namespace: Namespace, Subsystem: sub, Name: name, Help: help})
	}
	h := func(sub, name, help string) prometheus.Histogram {
		return prometheus.NewHistogram(prometheus.HistogramOpts{Namespace: Namespace, Subsystem: sub, Name: name, Help: help, Buckets: prometheus.ExponentialBuckets(0.0005, 4, 10)})
	}
	m := &Metrics{
		queueAdds:    cv("queue", "adds_total", "Accepted adds, by priority and whether they merged into a held entry.", "priority", "merged"),
		queueDropped: cv("queue", "dropped_total", "Adds dropped, by reason (DroppedSuspended: not leading; DroppedShutDown).", "reason"),
		queueDepth: prometheus.NewGaugeVec(prometheus.GaugeOpts{Namespace: Namespace, Subsystem: "queue", Name: "depth",
			Help: "Pending entries (due or delayed), by priority."}, []string{"priority"}),
		queueWait: prometheus.NewHistogramVec(prometheus.HistogramOpts{Namespace: Namespace, Subsystem: "queue", Name: "wait_seconds",
			Help: "Time from add to hand-out, by priority.", Buckets: prometheus.ExponentialBuckets(0.0001, 4, 12)}, []string{"priority"}),
		queueWork:    h("queue", "work_seconds", "Time from hand-out to Done."),
		queueRetries: c("queue", "retries_total", "Accepted adds that carry a retry count."),

		watchEvents:   cv("watcher", "events_total", "Entries the watcher handed to the queue, by type and queue outcome.", "type", "outcome"),
		watchRelists:  cv("watcher", "relists_total", "(Re)lists started, by reason.", "reason"),
		watchRestarts: cv("watcher", "watch_restarts_total", "Watches reopened, by reason.", "reason"),
		watchErrors:   cv("watcher", "errors_total", "Failed list or watch calls, by reason.", "reason"),
		watchTracked:  g("watcher", "tracked_objects", "Objects the watcher tracks."),
		watchLastSeen: g("watcher", "last_event_timestamp_seconds", "Unix time of the latest watch event or bookmark."),
		watchClientSh: g("watcher", "client_side_sharding", "1 when the API server ignored the shard selector and the watcher filters on its side."),

		leaderLeading:     g("leader", "is_leader", "1 while this replica holds the Lease."),
		leaderLastRenew:   g("leader", "last_renew_timestamp_seconds", "Unix time of the last successful acquire or renew request."),
		leaderRenewFailed: c("leader", "renew_failures_total", "Failed renew attempts."),
		leaderOverran:     c("leader", "work_overruns_total", "Terms whose work outlived its bound."),

		triggerEnqueued: cv("trigger", "enqueued_total", "External triggers that reached the queue, by outcome.", "outcome"),
		triggerRejected: c("trigger", "rejected_total", "External triggers refused for bad input."),

		httpRequests: cv("trigger_http", "requests_total", "Trigger endpoint requests, by status code and reason.", "code", "reason"),
		httpDuration: h("trigger_http", "request_duration_seconds", "Trigger endpoint request latency."),

		consReceived:   c("trigger_consumer", "received_total", "Messages received from the broker."),
		consAcked:      cv("trigger_consumer", "acked_total", "Messages acknowledged, by reason.", "reason"),
		consNacked:     cv("trigger_consumer", "nacked_total", "Messages handed back for redelivery, by reason.", "reason"),
		consTerminated: cv("trigger_consumer", "terminated_total", "Messages dead-lettered, by reason.", "reason"),
		consProcessed:  h("trigger_consumer", "processing_seconds", "Time from receipt to ack, nack or term."),
		consLag:        g("trigger_consumer", "lag", "Broker backlog: messages not yet delivered or acknowledged (every replica reports the same shared backlog: aggregate with max, not sum)."),
		consBrokerErrs: cv("trigger_consumer", "broker_errors_total", "Failed broker calls, by kind (Disconnected, Permission, Quota, NotFound, Unknown).", "kind"),

		recReconciled: prometheus.NewHistogramVec(prometheus.HistogramOpts{Namespace: Namespace, Subsystem: "reconcile", Name: "duration_seconds",
			Help: "Reconcile calls by outcome, and their duration.", Buckets: prometheus.ExponentialBuckets(0.0005, 4, 10)}, []string{"outcome"}),
		recPanics:    c("reconcile", "panics_total", "Reconciles that panicked."),
		recSkipped:   cv("reconcile", "skipped_total", "Requests not passed to the reconciler, by reason.", "reason"),
		recRefetched: c("reconcile", "refetches_total", "Objects re-fetched before their reconcile."),
	}
	for _, col := range []prometheus.Collector{
		m.queueAdds, m.queueDropped, m.queueDepth, m.queueWait, m.queueWork, m.queueRetries,
		m.watchEvents, m.watchRelists, m.watchRestarts, m.watchErrors, m.watchTracked, m.watchLastSeen, m.watchClientSh,
		m.leaderLeading, m.leaderLastRenew, m.leaderRenewFailed, m.leaderOverran,
		m.triggerEnqueued, m.triggerRejected, m.httpRequests, m.httpDuration,
		m.consReceived, m.consAcked, m.consNacked, m.consTerminated, m.consProcessed, m.consLag, m.consBrokerErrs,
		m.recReconciled, m.recPanics, m.recSkipped, m.recRefetched,
	} {
		if err := reg.Register(col); err != nil {
			return nil, err
		}
	}
	return m, nil
}

// Components returns a collector that reports, at every scrape, each
// component check returns as opkit_component_ready{component} (1 ready,
// 0 not): every component's liveness, including ones whose trouble must
// not take the pod out of its Service (a broker outage). Register it with
// the registry New was given, once the components are known.
func Components(check func() []reconcile.ComponentStatus) prometheus.Collector {
	return componentsCollector{check: check, desc: prometheus.NewDesc(Namespace+"_component_ready",
		"1 while a component is ready, 0 otherwise (not started, failed, or its own check fails).", []string{"component"}, nil)}
}

type componentsCollector struct {
	check func() []reconcile.ComponentStatus
	desc  *prometheus.Desc
}

func (c componentsCollector) Describe(ch chan<- *prometheus.Desc) { ch <- c.desc }

func (c componentsCollector) Collect(ch chan<- prometheus.Metric) {
	for _, s := range c.check() {
		v := 1.0
		if s.Err != nil {
			v = 0
		}
		ch <- prometheus.MustNewConstMetric(c.desc, prometheus.GaugeValue, v, s.Name)
	}
}

// QueueStats returns a collector that reports, at every scrape, the
// queue's in-flight work from stats (a Queue's Stats method): entries in
// flight and parked behind them, how long the oldest in-flight entry has
// run, and the sum over all of them. A reconcile that hangs shows here
// while it hangs; the work-duration histograms see it only once it ends.
// The queue must have been created with metrics (reconcile.Config's
// QueueMetrics) for the durations to be measured.
func QueueStats(stats func() queue.Stats) prometheus.Collector {
	d := func(name, help string) *prometheus.Desc {
		return prometheus.NewDesc(Namespace+"_queue_"+name, help, nil, nil)
	}
	return queueStatsCollector{stats: stats, descs: [4]*prometheus.Desc{
		d("in_flight", "Entries handed out to workers and not yet done."),
		d("parked", "Entries waiting behind an in-flight entry of the same key."),
		d("longest_running_seconds", "How long the oldest in-flight entry has been in flight."),
		d("unfinished_work_seconds", "Time in flight summed over all in-flight entries."),
	}}
}

type queueStatsCollector struct {
	stats func() queue.Stats
	descs [4]*prometheus.Desc
}

func (c queueStatsCollector) Describe(ch chan<- *prometheus.Desc) {
	for _, d := range c.descs {
		ch <- d
	}
}

func (c queueStatsCollector) Collect(ch chan<- prometheus.Metric) {
	st := c.stats()
	for i, v := range []float64{float64(st.InFlight), float64(st.Parked), st.LongestRunning.Seconds(), st.UnfinishedWork.Seconds()} {
		ch <- prometheus.MustNewConstMetric(c.descs[i], prometheus.GaugeValue, v)
	}
}

// Queue returns the adapter for queue.Metrics.
func (m *Metrics) Queue() queue.Metrics { return queueMetrics{m} }

// Watcher returns the adapter for watcher.Metrics.
func (m *Metrics) Watcher() watcher.Metrics { return watcherMetrics{m} }

// Leader returns the adapter for leader.Metrics.
func (m *Metrics) Leader() leader.Metrics { return leaderMetrics{m} }

// Trigger returns the adapter for trigger.Metrics: the counts of the
// trigger, its HTTP handler and its consumer.
func (m *Metrics) Trigger() trigger.Metrics { return triggerMetrics{m} }

// Controller returns the adapter for reconcile.Metrics.
func (m *Metrics) Controller() reconcile.Metrics { return controllerMetrics{m} }

type queueMetrics struct{ m *Metrics }

func (q queueMetrics) Added(priority int, merged bool) {
	q.m.queueAdds.WithLabelValues(strconv.Itoa(priority), strconv.FormatBool(merged)).Inc()
}
func (q queueMetrics) Dropped(reason queue.Outcome) {
	q.m.queueDropped.WithLabelValues(reason.String()).Inc()
}
func (q queueMetrics) Depth(priority int, delta int) {
	q.m.queueDepth.WithLabelValues(strconv.Itoa(priority)).Add(float64(delta))
}
func (q queueMetrics) Waited(priority int, d time.Duration) {
	q.m.queueWait.WithLabelValues(strconv.Itoa(priority)).Observe(d.Seconds())
}
func (q queueMetrics) Worked(d time.Duration) { q.m.queueWork.Observe(d.Seconds()) }
func (q queueMetrics) Retried(int)            { q.m.queueRetries.Inc() }

type watcherMetrics struct{ m *Metrics }

func (w watcherMetrics) Event(t opkit.Type, outcome queue.Outcome) {
	w.m.watchEvents.WithLabelValues(t.String(), outcome.String()).Inc()
}
func (w watcherMetrics) Relist(reason watcher.Reason) {
	w.m.watchRelists.WithLabelValues(string(reason)).Inc()
}
func (w watcherMetrics) WatchRestart(reason watcher.Reason) {
	w.m.watchRestarts.WithLabelValues(string(reason)).Inc()
}
func (w watcherMetrics) Error(reason watcher.Reason) {
	w.m.watchErrors.WithLabelValues(string(reason)).Inc()
}
func (w watcherMetrics) Tracked(n int)         { w.m.watchTracked.Set(float64(n)) }
func (w watcherMetrics) Observed(at time.Time) { w.m.watchLastSeen.Set(float64(at.UnixNano()) / 1e9) }
func (w watcherMetrics) Sharding(serverSide bool) {
	if serverSide {
		w.m.watchClientSh.Set(0)
	} else {
		w.m.watchClientSh.Set(1)
	}
}

type leaderMetrics struct{ m *Metrics }

func (l leaderMetrics) Leading(leading bool) {
	v := 0.0
	if leading {
		v = 1
	}
	l.m.leaderLeading.Set(v)
}
func (l leaderMetrics) Renewed(at time.Time) { l.m.leaderLastRenew.Set(float64(at.UnixNano()) / 1e9) }
func (l leaderMetrics) RenewFailed()         { l.m.leaderRenewFailed.Inc() }
func (l leaderMetrics) WorkOverran()         { l.m.leaderOverran.Inc() }

type triggerMetrics struct{ m *Metrics }

func (t triggerMetrics) Enqueued(o queue.Outcome) {
	t.m.triggerEnqueued.WithLabelValues(o.String()).Inc()
}
func (t triggerMetrics) Rejected() { t.m.triggerRejected.Inc() }
func (t triggerMetrics) Request(code int, reason string, took time.Duration) {
	t.m.httpRequests.WithLabelValues(strconv.Itoa(code), reason).Inc()
	t.m.httpDuration.Observe(took.Seconds())
}
func (t triggerMetrics) Received()                    { t.m.consReceived.Inc() }
func (t triggerMetrics) Acked(reason string)          { t.m.consAcked.WithLabelValues(reason).Inc() }
func (t triggerMetrics) Nacked(reason string)         { t.m.consNacked.WithLabelValues(reason).Inc() }
func (t triggerMetrics) Terminated(reason string)     { t.m.consTerminated.WithLabelValues(reason).Inc() }
func (t triggerMetrics) Processed(took time.Duration) { t.m.consProcessed.Observe(took.Seconds()) }
func (t triggerMetrics) Lag(n int64)                  { t.m.consLag.Set(float64(n)) }
func (t triggerMetrics) BrokerError(kind string)      { t.m.consBrokerErrs.WithLabelValues(kind).Inc() }

type controllerMetrics struct{ m *Metrics }

func (c controllerMetrics) Reconciled(outcome string, took time.Duration) {
	c.m.recReconciled.WithLabelValues(outcome).Observe(took.Seconds())
}
func (c controllerMetrics) Panicked()             { c.m.recPanics.Inc() }
func (c controllerMetrics) Skipped(reason string) { c.m.recSkipped.WithLabelValues(reason).Inc() }
func (c controllerMetrics) Refetched()            { c.m.recRefetched.Inc() }
