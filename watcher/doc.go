// Package watcher turns one resource's list and watch stream from the API
// server into queue entries (keys, with an opkit.Cause of source APIServer)
// and a ledger of unsettled deletes, without informers and without keeping
// the live objects in memory.
//
// A [Watcher] is built with [New] from a [Config] and driven by
// [Watcher.Run], which blocks. Run owns every goroutine and connection it
// starts: the list and watch calls run on Run's own goroutine (client-go's
// stream decoder adds one goroutine per open watch), and all of them are
// gone when Run returns. [Watcher.Synced] and [Watcher.Check] may be called
// from any goroutine at any time.
//
// # Guarantees
//
//   - Every Run starts with a full list: every object present is added as
//     Added (what needs work first, see Priorities), objects tracked by an earlier Run that no longer exist are
//     recorded as deleted, and every key with unsettled deletes is added
//     again. The leader runs the watcher once per term, after clearing the
//     queue, so each term starts from a full resync.
//   - Deletes come from the ledger, never from the queue. A delete (a
//     Deleted event, with the final state the watch delivered; or an
//     object a relist found gone, as a tombstone) is recorded under its
//     key, then the key is added to the queue. [Watcher.Deletes] returns a
//     key's unsettled deletes, oldest first; [Watcher.Settle] forgets one
//     once it was dealt with. An object that comes back into the watch
//     (it had left the label selector) was not deleted: its records go.
//   - The watch starts at the list's resourceVersion, with bookmarks on; the
//     resourceVersion advances with every event and bookmark. A watch the
//     server closes is reopened from that resourceVersion, with no relist.
//   - A 410 Gone (resourceVersion too old) triggers a relist that is diffed
//     against what the watcher knows: vanished objects are recorded as
//     tombstones (FinalStateUnknown), objects whose resourceVersion changed
//     are added as Modified, unchanged objects produce nothing. An object
//     recreated under the same name (a new UID) records a tombstone of the
//     old UID and adds the new one as Added.
//   - The ledger is bounded: at most [Config.MaxFinalStates] deletes keep
//     their final state (beyond, a tombstone), and a key holds at most
//     [Config.MaxDeletesPerKey] (beyond, the oldest is dropped, logged at
//     error level and counted). Whoever runs the watcher must Settle every
//     delete it is done with (reconcile's controller does).
//   - Per live object the watcher keeps only its key, UID,
//     resourceVersion, generation and a 64-bit fingerprint of its deletion
//     state and finalizers (and of the labels and annotations named in
//     [Config.WatchLabels] and [Config.WatchAnnotations]); never the
//     object. A change [Config.SkipStatusOnly] leaves out (a status
//     update, the operator's own finalizer) still hands its newer state to
//     an entry for the key that is already due (an add with queue's
//     MergeOnly and no delay: a delayed retry or requeue is left alone),
//     so that its reconcile need not read the object again. Only a delete
//     keeps its final state, until it is settled.
//   - Lists are paginated ([Config.PageSize] objects per page, from one
//     consistent snapshot).
//
// # Priorities
//
// Every entry says how much its object needs work ([Config.Rank]; by
// default how many generations status.observedGeneration lags behind
// metadata.generation). A list queues the objects that need work at the
// watch's priority, raised by how long they have waited, and the
// up-to-date ones at [Config.ListPriority], after them; watch events and
// deletes are work, at the watch's priority. So a new leader reconciles
// first what changed while no one led, the furthest behind first, and an
// object left behind by a term that ended early goes ahead of the ones it
// reconciled.
//
// # Errors
//
// Network errors, 5xx, 429 and an API server that is down are retried with
// jittered exponential backoff (see [Backoff]), at most a second apart
// while the server refuses connections; a 429's Retry-After is honoured.
// The failure count is forgotten as soon as a list succeeds or a watch
// delivers anything. Every failure is reported by [Watcher.Check] until a
// call succeeds. 404 (resource type not served, e.g. the CRD is not
// installed), and 401 or 403 (permission) once they came
// queue.TransientRefusals times in a row, are logged at error level and
// retried slowly ([Backoff.Slow]); the first refusals in a row are
// warnings retried like transient failures, as a just-started API server
// refuses until its authorizer has synced. A
// watch that delivers neither an event nor a bookmark for
// [Config.IdleTimeout] is restarted.
//
// # Dropped adds
//
// The watcher never blocks on the queue. When an add is not accepted (the
// queue's intake is suspended or shut down) the watcher counts it
// ([Metrics.Event] receives the outcome) and keeps tracking the object as if
// it had been delivered: it does not retry the add. Recovery is the job of
// the caller, which restarts the watcher (a fresh Run, hence a full list,
// and every key of the ledger) when the intake resumes; the leader does
// exactly that on every new term. A delete is never lost that way: it
// stays in the ledger until it is settled.
//
// A list attempt that fails midway is retried from a fresh snapshot; keys
// it already added may be added again (the queue merges them), and
// vanished objects are only decided by a list that completed.
//
// # Shards
//
// With [Config.Shards] the watcher lists and watches only the objects
// whose metadata.uid hashes into the held shards (see opkit.Shards),
// through the API server's sharded list and watch (KEP-5866, alpha in
// Kubernetes v1.36, feature gate ShardedListAndWatch): each replica then
// receives about 1/N of the stream. The watcher checks every object it
// receives all the same (one FNV-1a hash), as a server without the gate
// sends everything (and behind a load balancer one server may apply the
// selector and the next not); what is not of its shards it drops, logs a
// warning once and tells a [ShardingMetrics]. A UID never changes, so an
// object never moves between shards; a deleted object and a new one of
// the same name may be on different shards. Changing the held shards
// means a new Watcher: the old shards' keys are no longer this one's.
//
// # Synced
//
// A Run reports the start and the end of every (re)list through
// [Config.OnSync]; [Watcher.Synced] turns true once the Run's first list has
// been fully emitted and stays true until Run returns.
package watcher
