// Package convergencebench measures, next to controller-runtime and in the
// same run (issue 20, point 5), how fast opkit's controller brings 1,000
// objects to their spec, how fast a new leader does after a failover, and
// how many requests each reconcile sends to the API server.
//
// Both SDKs run the same reconcile on the same local control plane
// (internal/testcluster), one after the other, each on a fresh namespace
// of its own: 1,000 Widgets (bench.opkit.dev/v1, namespaced, free-form
// spec and status, a status subresource). The reconcile:
//
//  1. takes the Widget as the SDK hands it over: opkit's req.Object (the
//     state its watch delivered; no request), controller-runtime's
//     client.Get, which reads its informer cache (no request: its normal
//     cost model);
//  2. creates or updates the child ConfigMap <name>-child (data.size =
//     spec.size, a controller owner reference to the Widget). opkit
//     states it and has a reconcile.Applier write it, one server-side
//     apply with no read (as example/reconciler does; opkit keeps no
//     cache); controller-runtime GETs it through the manager's client,
//     which reads its cache (an informer on ConfigMaps, started by the
//     first Get), then CREATEs it when it is missing or UPDATEs it when
//     it differs;
//  3. writes status.observedGeneration = metadata.generation when it
//     differs: opkit with reconcile.Status.Update, controller-runtime with
//     Status().Update, both a PUT of the status subresource at the
//     resourceVersion read (as kubebuilder's scaffold writes it).
//
// Settings that are the same for both: workers (4, opkit's default
// Concurrency; controller-runtime's MaxConcurrentReconciles; opkit's
// ReservedWorkers is set to -1, none, since its default of one more worker
// for triggers would make the counts unequal and this benchmark sends no
// trigger); a status write does not reconcile the object again (opkit:
// watcher.Config.SkipStatusOnly; controller-runtime:
// GenerationChangedPredicate); leader election on a Lease with
// LeaseDuration 6s, RenewDeadline 4s, RetryPeriod 1s (controller-runtime
// with LeaderElectionReleaseOnCancel false); the watch and cache limited
// to the namespace; no Events. Everything else is each SDK's default
// (controller-runtime: its priority queue, no warm-up of a follower's
// caches, so a new leader starts its informers when it takes over). Every
// client of a replica is built from one rest.Config with the setting's
// QPS and Burst, as each SDK builds its clients: opkit's controller and
// reconcile share one dynamic client (one token bucket; the Lease client
// has another), controller-runtime builds a client with its own bucket
// for each resource type it reads or writes and for each informer, so
// its Widget status writes and its ConfigMap writes each get the whole
// QPS. Four settings: limits=50-100 (client-go-like); limits=1000-2000
// (high enough that the API server, not the client, sets the pace);
// limits=defaults, where the benchmark sets no limit and each SDK loads
// the control plane's kubeconfig as its docs tell a user to (opkit:
// client-go's loading, then reconcile.WithClientDefaults, as
// example/operator does; controller-runtime: ctrl.GetConfig with
// --kubeconfig, which sets QPS -1 when the kubeconfig sets none); and
// limits=off, QPS -1 on the rest.Config (no client-side limit) for both,
// the bound the API server sets. With -convergence.shared also
// limits=50-100-shared, where every client of a replica draws from one
// bucket (rest.Config.RateLimiter), so both SDKs have exactly the same
// budget.
//
// One run of an SDK, on its namespace:
//
//   - Creation: replica a starts and leads; the benchmark creates the
//     1,000 Widgets (spec.size set) from 8 goroutines on its own
//     unthrottled client, and waits until every one's
//     status.observedGeneration caught up.
//   - Throughput: the benchmark patches every Widget's spec.size (a merge
//     patch each, from 8 goroutines, as fast as the API server takes
//     them); pass-s is the time from the first patch to the moment the
//     last observedGeneration caught up.
//   - Failover, all changed (b1): replica f starts and campaigns for 2s;
//     then a is killed (its clients fail every request from then on, so
//     it writes nothing and does not release the Lease; then its context
//     is cancelled) and every Widget's spec is patched; b1-s is the time
//     from f's acquisition of the Lease (its first term's start: opkit's
//     term work, controller-runtime's leader-election runnables) to the
//     moment every observedGeneration caught up. The leader is killed
//     before the patches, rather than after, so that it reconciles none
//     of them, however fast it is: every change waits for the new leader.
//   - Failover, 50 changed (b2): replica g starts and campaigns for 2s; f
//     (converged, idle) is killed the same way, and 50 Widgets chosen at
//     random (the same 50 for both SDKs in a run) are patched; b2-s is
//     the time from g's acquisition to the moment those 50 caught up,
//     b2-pass-s the time until g's reconcile of every Widget had ended
//     once.
//
// The benchmark sees observedGeneration through a watch of its own (an
// informer on its unthrottled client): a Widget caught up when its
// observedGeneration reached the generation the patch returned, at the
// moment the watch delivered that change. A run verifies after every
// phase that every Widget caught up and its child is at its spec, and
// fails rather than report when not.
//
// Metrics, each prefixed opkit- or cr- (the median of the iterations,
// with -benchtime 1x the one run):
//
//   - create-s: from the first create to the last observedGeneration;
//   - pass-s and obj/s: the throughput pass, and 1,000 / pass-s;
//     apiserver-cores: the API server's CPU time (user and system, from
//     /proc/<pid>/stat) over the pass, divided by its wall time;
//     apiserver-ms/obj: that CPU time per object, which the machine's
//     other load moves less than the pass's length;
//     process-ms/obj: the same of the test process (the SDK's replicas,
//     which compete with the API server for the cores, and the
//     benchmark's patching and watch, the same for both SDKs);
//   - b1-s, b2-s, b2-pass-s: the failovers, from the acquisition;
//     b2/b1: b2-s / b1-s (issue 20's target: at most 0.2 for opkit);
//     takeover-s: from the kill to the acquisition (b1's);
//   - req/obj-create, req/obj-update: the requests per Widget of the
//     creation and of the throughput pass, as the replica's clients
//     counted them (an http.RoundTripper in rest.Config.WrapTransport,
//     by verb and resource): requests on Widgets (and their status) and
//     ConfigMaps, from the window's start to half a second after the last
//     reconcile; Lease traffic is left out. Each Widget was reconciled
//     exactly once in each (the log says how many reconciles there were);
//   - srv-req/obj-create, srv-req/obj-update: the same from the API
//     server's own count, apiserver_request_total read from /metrics
//     before and after, less the benchmark's own requests (counted by the
//     same kind of RoundTripper). The API server counts a watch when it
//     ends, a client when it starts; none starts or ends in these windows.
//
// The log has, for each SDK and run, the load average before it, the
// requests by verb and resource of each window from both counters, and the
// new leaders' requests. ns/op is suppressed: it would only be the
// phases' length.
//
// Which SDK goes first alternates from run to run (the count is kept per
// setting in the test process), so -count interleaves them; it does not
// interleave the settings (go test repeats one sub-benchmark's runs back
// to back). A run of both SDKs takes about 5 minutes at limits=50-100,
// where opkit's two requests per reconcile in one bucket are the bound,
// and about 1.5 to 2 at limits=1000-2000, limits=defaults and limits=off.
// Caveats: the control plane, both SDKs, the benchmark's watch and its
// patching goroutines share the machine's cores, so without a client
// limit the figures are the machine's as much as the SDKs'; the
// benchmark patches while the SDK reconciles, so pass-s includes the
// patches' own time (about the same for both).
//
// The benchmark starts a private control plane on first use and skips when
// its binaries are missing. The benchmark goroutine owns every replica and
// watch it starts and stops them before the next run; it deletes the
// Widgets and ConfigMaps of a run when it ends (no garbage collector runs
// here), the namespace stays.
package convergencebench
