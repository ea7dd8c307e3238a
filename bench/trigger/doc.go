// Package triggerbench measures trigger-to-reconcile-start latency (p50 and
// p99): how long after an external trigger is fired the reconciler's first
// line runs. It compares, in the same run and on the same reconciler logic
// and worker count (opkit adds its default reserved worker, which takes
// only triggers: reconcile.Config.ReservedWorkers):
//
//   - opkit's Trigger.Enqueue on the controller's queue (reconcile.Controller:
//     queue → worker → re-fetch → reconciler), against the real API server
//     and against client-go's dynamic fake (the same path without network
//     round trips);
//   - opkit's HTTP endpoint (trigger.NewHandler behind an httptest server on
//     loopback, POST /reconcile/{namespace}/{name}, which reads the object
//     from a real API server before the enqueue; the worker reconciles that
//     state without reading it again when the watch has seen it too);
//   - controller-runtime's external-trigger path: source.Channel with a
//     GenericEvent into a controller built by controller.NewTypedUnmanaged
//     (its default priority queue).
//
// Each runs idle and behind a backlog of 100,000 entries queued at watch
// priority, and at relist priority, before the first trigger; the
// reconciler spends a short wait on every backlog entry so that the backlog
// is still being drained while the triggers are fired. opkit's watch sees
// the backlog objects (a wrapper adds them to its lists; they exist nowhere
// else), so each backlog entry is reconciled from the state it carries, as
// a watch event's is, rather than skipped as a key the watch does not see.
//
// Metrics: p50-ns and p99-ns of the latency; for opkit also queue-p50-ns and
// queue-p99-ns (how long triggers waited in the queue, the share its
// priorities decide) and get-p50-ns and get-p99-ns (the API server's GETs);
// backlog-left is the backlog still queued when the last trigger was
// fired. ns/op is suppressed: it would only be the pacing (-trigger.gap).
//
// The benchmarks start a private control plane (internal/testcluster) on
// first use and skip when its binaries are missing. The benchmark goroutine
// owns every controller, server and channel it starts and stops them before
// the next sub-benchmark.
package triggerbench
