// Package queue is opkit's work queue: a keyed, deduplicating priority and
// delay queue with a suspendable intake, shared by the producers of one
// controller (the watcher, the triggers, the workers' retries call Add from
// their own goroutines) and its workers (each worker goroutine calls Get and
// Done). The queue owns no goroutine: a blocked Get waits on its own timer.
//
// Guarantees:
//
//   - Keyed and deduplicated: at most one pending entry per key.
//   - Exclusive while in flight: a key handed out by Get is not handed out
//     again until Done.
//   - Delay: nothing is handed out before it is due.
//   - Priority: due entries are served highest priority first, FIFO within
//     a priority.
//   - Suspendable intake: Suspend, Resume and Clear are atomic with respect
//     to Add.
//   - Blocking Get with a context; idempotent ShutDown; ShutDownWithDrain.
package queue
