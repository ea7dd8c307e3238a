// Package ownsbench measures owned children (issue 18): opkit's
// reconcile.Config.Owns, a watcher.Related with watcher.OwnedBy that keeps
// per child only its key, resourceVersion and owner keys, next to
// controller-runtime's Owns, which keeps every child in an informer's
// cache, on the same control plane in the same run.
//
// The owners are 250 Gadgets (a custom resource, fixture.Gadget) in a
// namespace; the children, 5,000 ConfigMaps by default (-owns.children),
// spread over them round-robin, each with three small data keys, three
// labels and a controller reference to its owner (about 1 KB of JSON with
// managedFields). Another namespace holds 250 Gadgets and no child, for
// the baseline of the memory measurement.
//
// The contenders, each with 4 workers and a client of 1,000 requests a
// second (burst 2,000), scoped to the namespace:
//
//   - opkit: a reconcile.Controller over the Gadgets with Owns the
//     ConfigMaps and no reserved worker (ReservedWorkers -1);
//   - cr: a controller-runtime manager whose controller is built with
//     For(&Gadget{}).Owns(&corev1.ConfigMap{}), its defaults otherwise
//     (typed informers that keep managedFields, the priority queue);
//   - cr-lean: the same with Owns(..., builder.OnlyMetadata), a
//     metadata-only informer of the children, and a cache that strips
//     managedFields (cache.TransformStripManagedFields): the least
//     controller-runtime keeps per child.
//
// Memory: the live heap (two full collections, then HeapAlloc) before a
// contender starts and once it has settled (every owner reconciled, its
// queue empty and its watches healthy as far as it tells, and no reconcile
// started for a second), with the contender running; the growth on the
// Gadgets alone is subtracted from the growth on the Gadgets and their
// children, and the difference divided by the children. The contenders run
// one at a time in the same process, each stopped before the next starts,
// and each first runs once unmeasured in every call of the benchmark (each
// -count), so that one-time allocations (transports, registries) fall in
// no measurement.
//
// Latency, on the same running contender: the benchmark patches one data
// key of a child of each of 100 owners, one every 50ms, through its own
// unthrottled client, and measures from just before it sends the patch
// (the API server's write is included, for every contender alike) to the
// start of the owner's next reconcile (the reconciler's first line notes
// the time); then it creates a child for each of 50 other owners, waits
// for their reconciles and quiet, and deletes those children the same way.
// No other reconcile happens meanwhile (the log counts strays).
//
// Metrics, each contender's name first: -B/child, the heap per child;
// -p50-ms and -p99-ms, change to reconcile start (nearest rank over 100:
// the p99 is the second slowest); -del-p50-ms, deletion to reconcile
// start; opkit/cr-B and opkit/cr-lean-B, opkit's heap per child as a share
// of each. For opkit also -get-p50-ms and -wait-p50-ms: during the
// changes, its GETs of the owner (a related watch carries no object, so
// the worker reads the owner before the reconcile, while
// controller-runtime's reconciler starts with a key and reads its cache
// afterwards) and its queue waits. ns/op is suppressed: it would only be
// the run's length.
//
// One iteration measures the three contenders, one after the other in an
// order that is reversed every other iteration (over -count too), in about
// a minute: run it with -benchtime=1x and -count for several runs. It uses
// b.Loop; -benchtime=Nx pools N iterations (the heap per child averaged,
// the latencies together).
//
// The benchmark starts a private control plane (internal/testcluster) on
// first use and skips when its binaries are missing; there is no garbage
// collector, and none is needed. The benchmark goroutine owns every
// controller and manager it starts and stops it before the next one
// starts.
package ownsbench
