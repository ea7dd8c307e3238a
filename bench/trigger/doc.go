// Package triggerbench measures trigger-to-reconcile-start latency (p50 and
// p99): how long after an external trigger is fired the reconciler's first
// line runs (BenchmarkTriggerLatency); and trigger-to-outcome latency of the
// HTTP endpoint's waited-for triggers, sent to the leader and through a
// follower (BenchmarkTriggerOutcome, below).
//
// BenchmarkTriggerLatency compares, in the same run and on the same
// reconciler logic and worker count (opkit adds its default reserved
// worker, which takes only triggers: reconcile.Config.ReservedWorkers):
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
// # Trigger to outcome, direct and through a follower
//
// BenchmarkTriggerOutcome (issue 19) measures how long a caller of POST
// /reconcile/{namespace}/{name}?wait=30s waits for its 200, the Outcome of
// the reconcile that served its trigger: from just before the client sends
// the request to the end of the answer's body, sent to the leader directly
// and to a follower, which forwards it to the leader and passes the answer
// on.
//
// Two replicas run in the process: reconcile.Controllers configured as
// BenchmarkTriggerLatency's opkit controller (the same reconciler, 4
// workers and the reserved one, no trigger budget, the watch that lists
// the backlog objects), with leader election on one Lease (a new one per
// run, default durations). The first leads; the second starts once the
// leader has reconciled its initial list, and the rounds begin once it
// reads the leader's endpoint from the Lease (reconcile.EndpointAnnotation,
// published through leader.Config's Annotations). Each serves
// trigger.NewHandler on its own httptest server on loopback, configured
// alike: the controller's trigger decides where a trigger goes (the
// follower's forwards to the endpoint its leader publishes), ForwardClient is the default
// (http.DefaultClient: kept-alive connections), and InsecureSkipAuth is set:
// with the Kubernetes-native authenticator the follower and then the
// leader would each review the caller's token and permission (cached after
// the first time), which is not what is measured. The leader's handler reads
// the object (one GET) and queues the trigger; the follower reads nothing,
// it forwards.
//
// A run is 20 warm-up rounds (not measured: they open the client's
// connections to both replicas and the follower's to the leader), then
// -outcome.rounds rounds (default 1,000) idle, then the 100,000 backlog
// entries of BenchmarkTriggerLatency queued at watch priority (each
// reconcile of one waits 500µs) and as many rounds behind them. Triggers
// rank above the backlog and the reserved worker takes them: the backlog
// costs them only the CPU its reconciles use. A round is sequential (a
// closed loop): a waited-for trigger to the leader and one through the
// follower, to two different targets, in turns first; then a trivial POST
// to an httptest server on loopback (204, no body) on a kept-alive
// connection, and one on a new connection (keep-alives off), so that the
// forwarding is compared with a loopback round trip on the same machine,
// under the same load, at the same moments.
//
// Every answer must be a 200 with a succeeded Outcome run by the leader,
// carrying the X-Opkit-Forwarded header when it came through the follower
// and not otherwise; the benchmark fails when one is not, when the follower
// does not read the leader's endpoint within a minute, or when the backlog
// was drained before the last round.
//
// Metrics, in milliseconds, with <load> idle or backlog:
// direct-<load>-p50-ms and -p99-ms, follower-<load>-p50-ms and -p99-ms
// (the request to the end of the 200); forward-added-<load>-p50-ms (the
// follower's p50 minus the direct p50); direct-<load>-start-p50-ms and
// follower-<load>-start-p50-ms (the request to the reconciler's first
// line: the rest of the wait is the reconcile, the outcome's delivery and
// the answer's way back); get-<load>-p50-ms (the leader's reads of the
// objects); loopback-rtt-<load>-p50-ms and loopback-fresh-<load>-p50-ms
// (the trivial request on a kept-alive and on a new connection); and
// backlog-left, the entries still queued after the last round. ns/op is
// suppressed. One iteration is a whole run with fresh replicas (about 20s):
// run it with -benchtime=1x and -count for several runs; it uses b.Loop,
// so -benchtime=Nx pools N runs. -outcome.rounds, like -trigger.gap, goes
// after the package on the go test command line.
//
// Caveats: the control plane, both replicas and the client share the
// machine's cores, so a loopback round trip is as cheap as a round trip
// gets, and the p99s are mostly the scheduler's; between machines,
// forwarding adds a network round trip (and over TLS a handshake for a new
// connection). The follower's hop also runs the follower's handler (route,
// query, body, in-flight slot), which the trivial request does not. With
// authentication, each replica adds its (cached) reviews.
//
// The benchmarks start a private control plane (internal/testcluster) on
// first use and skip when its binaries are missing. The benchmark goroutine
// owns every controller, server and channel it starts and stops them before
// the next sub-benchmark.
package triggerbench
