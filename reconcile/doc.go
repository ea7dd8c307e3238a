// Package reconcile is what an operator author writes against — the
// [Reconciler] contract — and the controller that runs it: one queue, one
// watcher, optionally a leader elector, and N worker goroutines, all owned
// by [Controller.Run].
//
// Guarantees:
//   - One reconcile at a time per key (the queue hands a key to one worker
//     until it is done); different keys run concurrently.
//   - A reconciler never works on a state older than the API server's when
//     its request waited in the queue: Added/Modified requests are
//     re-fetched before the call; objects gone by then are skipped, and so
//     are objects outside the watch's label selector (a trigger's, or one
//     that left it), whose Deleted the watch delivers.
//   - An external trigger never waits for a backlog reconcile to finish:
//     besides the Concurrency workers, Config.ReservedWorkers (default 1)
//     take only entries at or above the trigger priority, so a trigger
//     starts at once even when every other worker is busy with a relist.
//   - Every outcome is defined: see the decision table on [Reconciler].
//   - A panic in the Reconciler is an error (stack logged and counted,
//     retried like any other), never a crashed process. Other callbacks
//     (Watch.OnSync, term work, Metrics, a trigger's Getter) are not
//     recovered by opkit: a panic there crashes the process as in any Go
//     program, except on the HTTP handler's goroutines, where net/http
//     recovers it and drops the connection.
//   - Shutdown stops the intake, lets in-flight reconciles finish up to a
//     deadline, then cancels them; Run returns only when every goroutine it
//     started has returned.
//
// # Binding a Go type to a resource
//
// T is a pointer to a plain struct that embeds metav1.TypeMeta and
// metav1.ObjectMeta with json tags (Spec and Status as the user likes), or a
// built-in type such as *corev1.ConfigMap. No code generation and no scheme
// registration: the controller reads and writes it through a dynamic client
// and the [opkit.Resource] given in [Config] (group, version, resource
// plural, kind, namespaced or cluster-scoped).
//
// # Re-fetch rule
//
// An Added/Modified entry that was not delayed, not retried and reaches a
// worker within Config.FreshFor (1s) of its add is reconciled with the
// object it carries, if that object is as fresh as the watch: a watch
// event's (a newer state is already on its way as the key's next event, and
// gets its own reconcile), or a trigger's marked opkit.Event.Fetched (the
// HTTP handler and the consumer read it from the API server just before
// queuing it) when its resourceVersion is the latest the watcher has seen
// for the key, which makes it as fresh as the watch too (a GET answered
// before the watch delivered a newer state fails that test and is read
// again). A watch event merged into a pending trigger brings its object
// along (see [MergeEvents]). Every other Added/Modified request — one that
// waited in a backlog, a delayed, retried or requeued one, a trigger
// queued without the mark (Trigger.Enqueue) or behind the watch — is
// re-fetched first; if the
// object is gone, or no longer matches Config.Watch.LabelSelector, it is
// skipped and counted (Metrics.Skipped), and its Deleted event does the
// rest (a trigger for another shard's object has none: it is only
// skipped). Deleted requests carry the last known state (a tombstone when
// FinalStateUnknown). A negative FreshFor re-fetches every request.
//
// # Deletes across terms
//
// A list shows what exists, not what was deleted, so the controller's
// watcher keeps the key of a deleted object ([watcher.Config.RetainDeletes])
// until its Deleted request is dealt with (reconciled, terminal, or given up
// on). A delete lost to the end of a leader term (cleared from the queue, or
// its reconcile interrupted) is therefore reconciled in this replica's next
// term, as a tombstone. Another replica taking over never saw it: a
// reconciler that must clean up after every delete uses a [Finalizer].
//
// # Kubernetes Events
//
// The controller records a Warning Event on the object when it gives up on
// it (terminal error, or MaxRetries exhausted) and, with
// Config.RecordTriggerEvents, a Normal Event for every externally triggered
// reconcile. Events are created synchronously by the worker (one API call,
// bounded by a timeout) through the dynamic client: no broadcaster and no
// goroutine per object.
//
// # Helpers
//
// [Finalizer] adds and removes a finalizer with conflict-safe patches and
// runs a finalize step; [Status] writes the status subresource with
// conflict retry and observedGeneration; [Recorder] records Kubernetes
// Events. [Group] runs the controller(s), trigger endpoints and health
// servers as one unit. Package reconcile/reconciletest unit-tests
// reconcilers against client-go's fake clients.
package reconcile
