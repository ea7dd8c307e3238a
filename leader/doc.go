// Package leader elects one active replica through a coordination.k8s.io/v1
// Lease and drives the queue's intake gate through every leadership
// transition, so that a follower never reconciles and an ex-leader has
// stopped before any other replica can start.
//
// One goroutine, the caller of [Elector.Run], owns the campaign loop, the
// renewals' bookkeeping and the gate: every Suspend, Resume and Clear is
// called from it. Run starts and owns helper goroutines: the term's work;
// while campaigning, one Lease watch and at most one Lease read in flight;
// while leading, at most one renew request in flight. All have exited when
// Run returns, except a renew request whose client ignores its context's
// cancellation (its result is then dropped when it finally returns). The
// accessors ([Elector.Leader], [Elector.IsLeader], [Elector.Identity],
// [Elector.LeaderAnnotation], [Elector.WorkDeadline], [Elector.Check]),
// [Elector.Publish] and [Elector.Yield] may be called from any goroutine.
//
// # Guarantees
//
//   - At start the intake is suspended ([queue.Gate.Suspend]); it is resumed
//     only after the Lease has been written with this replica as holder.
//   - A term ends when a renew fails to succeed within RenewDeadline of the
//     last successful one (a hung API call does not delay this: the renew
//     runs on its own goroutine and the loop watches the deadline), when
//     another holder is observed, when work returns (or panics: the panic
//     becomes Run's error, [ErrWorkPanicked], and the Lease is released as
//     after a returned error), or when Run's context is cancelled. The end
//     of a term is always, in this order: suspend the intake, cancel the
//     term's context, clear the queue, wait for work to return.
//   - The term's work must return before LeaseDuration - ClockSkew has
//     passed since the start of the last successful renew request; followers
//     never consider the Lease expired before LeaseDuration has passed since
//     they observed that renew. Work that outlives the bound is reported
//     (an Error log line, [Metrics.WorkOverran], [Elector.Check] fails) and
//     the elector does not campaign again until it has returned.
//   - Losing leadership does not end Run: the replica goes back to standby
//     and campaigns again, unless [Config.ExitOnLoss] is set.
//   - On graceful shutdown (Run's context cancelled) the Lease is released
//     (empty holder, written with a resourceVersion precondition) only after
//     the work has returned, so a follower can take over at once. Followers
//     watch the Lease, so they see the release within one round trip.
//   - After a crash, a follower acquires the Lease once LeaseDuration has
//     passed since it last saw the Lease change (a timer, not only the
//     RetryPeriod poll), i.e. within LeaseDuration + RetryPeriod.
//   - A Lease deleted while it names another holder (by hand or by a
//     cleanup; a leader never deletes it) is treated as still held by that
//     replica until it would have expired (LeaseDuration after its last
//     change was observed): the holder learns of the deletion only when its
//     next renew fails, and cannot renew a deleted Lease. A replica that
//     starts campaigning after the deletion cannot know and creates it at
//     once. Deleting the Lease therefore ends the holder's term but does
//     not move leadership: the holder campaigns again at once, finds no
//     Lease and creates it, while the others wait out the deleted Lease.
//     Clearing the holder by hand is indistinguishable from a release and
//     lets a follower take over at once, while the holder may still lead
//     until its next renew (at most RetryPeriod). To move leadership, stop
//     the leader (it releases the Lease on the way out).
//   - A failed write of a campaigner (a 5xx, a timeout) does not restart
//     its wait: it reads the Lease again, and only a changed Lease counts
//     as a new change.
//   - Every write is an Update carrying the resourceVersion last read:
//     concurrent campaigners and stale renewals fail with a conflict and
//     re-read the Lease.
//
// # Published annotations
//
// The holder publishes annotations on the Lease, [Config.Annotations] or
// the set last given to [Elector.Publish], and every replica reads the
// holder's with [Elector.LeaderAnnotation] (where the leader's trigger
// endpoint listens, say). The acquisition and every renewal write the
// current set, so a set published during a term reaches the Lease with
// the next renewal, without a request of its own; the release removes it.
// Their names are recorded in [PublishedAnnotation], so that each write
// removes the names no longer published, and the next holder those of a
// holder that crashed.
//
// # Terms
//
// Each term has a number, the Lease's leaseTransitions as written by the
// acquiring replica (incremented on every acquisition, including
// re-acquisition by the same replica after a lost term). The work reads it
// with [TermFrom]; the elector's own log lines carry it as "term".
//
// # Clocks
//
// Expiry is judged from local monotonic time only: a follower measures
// LeaseDuration from the moment it observed the Lease's resourceVersion
// change, never from the renewTime written by another node, so wall-clock
// offsets between nodes do not matter. ClockSkew is the margin for the
// remaining risks, clocks running at slightly different rates and request
// latency: the ex-leader's work must be gone ClockSkew before a follower
// could possibly decide that the Lease has expired.
//
// # Shards
//
// A deployment that shares its work over replicas runs one elector per
// shard, each for its own Lease, so every shard has the guarantees
// above. A [Balancer] decides who may campaign: every shard elector's
// Config.Admit is the Balancer's Admit, which lets a replica acquire
// while it holds fewer than its share, ⌈S/N⌉ of S shards for N live
// replicas (counted from member Leases, with the same local-time rule as
// expiry); a replica holding more hands one shard per RetryPeriod over
// with [Elector.Yield], which ends the term as a shutdown does (the work's
// context ends with [ErrYielded]; the Lease is released once the work
// returned) and campaigns again. A replica that joins thus gets its share
// within a few RetryPeriods, one that leaves gracefully has its shards
// taken at once, one that dies after LeaseDuration.
package leader
