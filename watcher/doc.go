// Package watcher turns one resource's list and watch stream from the API
// server into queue entries (opkit.Event with Source APIServer), without
// informers and without keeping the objects in memory.
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
//   - Every Run starts with a full list: every object present becomes an
//     Added entry, and objects tracked by an earlier Run that no longer
//     exist become Deleted tombstones. The leader runs the watcher once per
//     term, after clearing the queue, so each term starts from a full resync.
//   - The watch starts at the list's resourceVersion, with bookmarks on; the
//     resourceVersion advances with every event and bookmark. A watch the
//     server closes is reopened from that resourceVersion, with no relist.
//   - A 410 Gone (resourceVersion too old) triggers a relist that is diffed
//     against what the watcher knows: vanished objects become Deleted
//     entries carrying a tombstone (FinalStateUnknown), objects whose
//     resourceVersion changed become Modified, unchanged objects produce
//     nothing. An object recreated under the same name (a new UID) produces
//     a tombstone Deleted for the old UID, then an Added for the new one.
//   - Per object the watcher keeps only its key, UID, resourceVersion,
//     generation and a 64-bit fingerprint of its deletion state (and of the
//     labels and annotations named in [Config.WatchLabels] and
//     [Config.WatchAnnotations]); never the object.
//   - Where the server supports it, the initial sync is a streaming
//     WatchList (sendInitialEvents=true, resourceVersionMatch=NotOlderThan,
//     ending at the "k8s.io/initial-events-end" bookmark), falling back to a
//     paginated list when the server refuses it or its streams keep
//     ending before their initial events do. See [WatchListMode].
//
// # Errors
//
// Network errors, 5xx, 429 and an API server that is down are retried with
// jittered exponential backoff (see [Backoff]); a 429's Retry-After is
// honoured. 403 (permission) and 404 (resource type not served, e.g. the CRD
// is not installed) are logged at error level, reported by [Watcher.Check]
// and retried slowly ([Backoff.Slow]). A watch that delivers neither an event
// nor a bookmark for [Config.IdleTimeout] is restarted.
//
// # Dropped adds
//
// The watcher never blocks on the queue. When an add is not accepted (the
// queue's intake is suspended or shut down) the watcher counts it
// ([Metrics.Event] receives the outcome) and keeps tracking the object as if
// it had been delivered: it does not retry the add. Recovery is the job of
// the caller, which restarts the watcher (a fresh Run, hence a full list)
// when the intake resumes; the leader does exactly that on every new term.
// A list cannot show what is gone, so a delete the queue did not accept is
// kept as a tombstone and emitted again by the next list. A delete the queue
// accepted but that was lost later (cleared with the queue at the end of a
// term, or its reconcile interrupted) is covered by [Config.RetainDeletes]
// and [Watcher.Settle], which the reconcile package's controller uses. An
// object created again under a deleted one's name does not end either:
// the earlier object's delete is kept next to the new object, and a list
// emits it before the new object's entry.
//
// A list attempt that fails midway is retried from a fresh snapshot; entries
// it already emitted may be emitted again (the queue coalesces them), and
// vanished objects are only decided by a list that completed.
//
// # Synced
//
// A Run reports the start and the end of every (re)list through
// [Config.OnSync]; [Watcher.Synced] turns true once the Run's first list has
// been fully emitted and stays true until Run returns.
package watcher
