// Package queue is opkit's work queue: a keyed, deduplicating priority and
// delay queue with a suspendable intake, one per controller, fed by the
// producers' goroutines (the watcher, the triggers and the workers' retries
// call Add) and drained by the worker goroutines (each calls Get, then
// Done); the queue itself owns no goroutine, not even a timer loop.
//
// A [Queue] is generic over its key K (opkit.Key in practice) and its
// payload V (an opkit.Cause: why the key is queued). Create one with
// [New]; the zero [Config] is valid. Producers see it as an [Adder], the leader elector as a [Gate],
// workers as a [Getter].
//
// # Guarantees
//
//   - Keyed, deduplicated, order-free. A key holds at most one pending
//     entry. An add for a pending key merges into it as a join: the
//     earliest due time, the highest priority, and the payloads joined by
//     [Config.Merge]. The same adds in any order give the same entry. An
//     add returns Queued for a key the queue held nothing for, Merged
//     otherwise. An add with [AddOptions.MergeOnly] only merges, and only
//     into an entry due no later than itself (a merge that moves no due
//     time): for a key with nothing waiting, or with an entry due later,
//     it stores nothing (NotHeld).
//   - Exclusive while in flight. A key handed out by Get is not handed out
//     again until Done(key). Adds for it meanwhile are merged into one
//     parked entry, which becomes pending at Done.
//   - Delay. An entry is never handed out before it is due. There is no
//     polling tick: while Gets are blocked and an entry is delayed, one of
//     those Gets waits on a timer armed for the earliest due time and takes
//     the entry itself when it fires.
//   - Priority. Due entries are handed out highest priority first, and
//     within a priority first come first served, from the moment each
//     could first be handed out: an add without delay when it is added, a
//     delayed entry when it falls due (also when no Get was waiting then:
//     the next Add or Get puts it in place before anything else), a parked
//     entry when Done makes it pending, a due entry whose priority an add
//     raised when it was raised. Entries that fall due together go in due
//     order. A high-priority add is returned by the next Get whatever the
//     backlog; finding it costs O(number of distinct priorities), not
//     O(backlog).
//   - Reserved lanes. [Queue.GetAtLeast] is a Get that takes only entries
//     at or above a priority, with Get's guarantees. A consumer that calls
//     only it (e.g. a worker kept for external triggers) is never busy with
//     the backlog below, so an urgent entry does not wait for a backlog
//     entry to finish. Wake-ups go only to Gets that take the entry, so
//     the two kinds of Get never take each other's.
//   - Suspendable intake. [Queue.Suspend] makes every Add return
//     DroppedSuspended until [Queue.Resume]; [Queue.Clear] removes pending
//     and parked entries and returns how many. In-flight entries are not
//     touched (their Done is still expected). These take the same lock as
//     Add, so there is no check-then-act window: an Add that begins after
//     Suspend has returned is dropped, and no add accepted before a Clear
//     survives it.
//   - Blocking Get with a context. [Queue.Get] blocks until an entry is
//     due, ctx ends (ctx.Err() is returned) or the queue shuts down.
//     [Queue.ShutDown] is idempotent: later adds return DroppedShutDown,
//     blocked Gets wake, Get hands out what is already due and then returns
//     [ErrShutDown] without blocking. [Queue.ShutDownWithDrain] also waits,
//     bounded by its context, until every in-flight entry is Done. No
//     goroutine of the queue exists, before or after shutdown.
//   - No history. What the queue holds for a key ends at Done, apart from
//     a bounded cache of finished keys (below); retry counts and backoff
//     are the caller's ([Backoff] computes delays).
//   - Observability without dependencies. [Metrics] receives adds, merges,
//     drops by reason, depth by priority, queue latency and work
//     duration; [Queue.Stats] samples unfinished work and the longest
//     running entry. A nil Metrics costs nothing: no call, no clock read.
//
// # Costs
//
// Add, Get and Done take one mutex each and are O(1) for due entries
// (a FIFO ring per priority) and O(log n) for delayed ones (a binary heap
// by due time). Entries live in a paged slab and are reused; keys map to
// them through an open-addressing index. A cycle for a key seen before
// allocates nothing: the queue keeps finished keys mapped to their slot
// for that, but never more of them than max(1024, live entries).
//
// Clock reads are the other cost that counts (one costs about a quarter
// of an add/get/done cycle on a VM). A delayed add reads the clock once
// for its due time; an add without delay reads none. With Metrics set an
// add reads it too (unless it merges into an entry already due), and Get
// and Done read it once more each, for the queue latency and the work
// duration; without Metrics a slot is also 8 bytes smaller.
//
// # Concurrency
//
// All methods are safe for concurrent use. Config.Merge and the Metrics
// methods are called synchronously, some with the queue's lock held: they
// must be quick and must not call the queue.
package queue
