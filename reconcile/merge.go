package reconcile

import (
	"strconv"

	"github.com/opkit/opkit"
	"github.com/opkit/opkit/queue"
)

// MergeEvents is the rule by which the controller's queue combines an event
// added for a key with the event already pending (or parked while the key is
// in flight) for it; it is the queue's Config.Merge. A re-add is an event
// the controller adds back after a reconcile (Retried after a failure,
// Requeued after a success that asked for it); every other event is new.
//
//	pending    incoming                      merge
//	---------  ----------------------------  ------------------------------------------
//	watch      new watch event, not Deleted, MergeReplace: the object came back into
//	Deleted    same UID                      the watch (a label selector it left and
//	(re-added                                matches again; the watcher reports it as
//	too)                                     Added); it is in scope now, and one entry
//	                                         stands for any number of flaps
//	re-added   another UID (a recreated      MergePrecede: the delete ran and waits
//	Deleted    object)                       for its retry or requeue, maybe an hour;
//	                                         another object's event does not wait
//	                                         for it
//	Deleted    new Deleted of another UID    MergePrecede: the queue merges it into a
//	                                         delete of that object held before, so
//	                                         deletes of two objects that alternate
//	                                         do not grow the chain
//	Deleted    another UID (recreated)       MergeSequence: the delete is delivered
//	                                         first, then the new object's event
//	re-added   not Deleted (a trigger, a     MergePrecede: nothing new waits for the
//	Deleted    change, a retry or requeue    delete's retry or requeue; the delete
//	           of a reconcile that ran       follows, the last word about its object
//	           meanwhile)
//	Deleted    watch event, not Deleted,     MergeSequence: an external Deleted
//	trigger    same UID (or the trigger's    trigger of an object that still exists
//	           unknown)                      (e.g. deleting, with finalizers) keeps its
//	                                         reconcile; the change follows it
//	Deleted    re-add, not Deleted, of       MergeSequence: after the delete (the
//	           unknown UID (a requeue        requeue re-reads the object)
//	           carries no object)
//	Deleted,   new event, not Deleted,       MergeSequence: it may be for a new object
//	UID known  without a UID                 of the name; after the delete
//	Deleted,   Deleted trigger with a UID    MergeSequence: both run, so that the
//	no UID,    (not the watch's delete, nor  name-only one (which may hold a trigger
//	not re-    one that took it: Watched)    of the object that has the name) is not
//	added                                    turned into a delete of an earlier one
//	watch      new Deleted trigger, or a     MergePrecede: the teardown keeps an entry
//	Deleted    re-added one                  of its own (the object coming back into
//	(re-added                                the watch replaces the watch's delete,
//	too)                                     not it): it merges into a teardown held
//	                                         before, or goes behind the delete (in
//	                                         front while the delete waits longer)
//	Deleted    same UID (or a UID unknown)   MergeKeep: a delete is never turned into
//	                                         something else; the watch's own Deleted
//	                                         carrying the full final state replaces a
//	                                         tombstone (MergeReplace) since both are
//	                                         the delete. The entry carries the latest
//	                                         delete the watch delivered, which its
//	                                         watcher holds until the reconcile settles
//	                                         it by UID and resourceVersion (see
//	                                         takesDelete); a waiting Deleted trigger
//	                                         takes the watch's delete and keeps its
//	                                         source and reason (marked Watched).
//	                                         A new Deleted trigger kept in a re-added
//	                                         one runs as the new request (its reason,
//	                                         a first run), with the retry count the
//	                                         re-added one had reached
//	other      re-added Deleted of another   MergeSequence: the pending event of the
//	           UID                           other object stays and the retried delete
//	                                         follows it, at its own time
//	other      new Deleted of another UID    MergePrecede: a late delete of an earlier
//	                                         object (a tombstone, or a Deleted trigger
//	                                         with its UID) merges into a delete of it
//	                                         held before, or else goes in front of an
//	                                         event that waits longer, behind one due
//	                                         no later
//	no object  Deleted with a UID; any       MergePrecede: the delete may be another
//	(a         Deleted when the pending one  object's; neither replaces the other, and
//	requeue,   is a re-add                   the one due first goes first
//	the retry
//	of a
//	failed
//	read, or a
//	trigger
//	of only
//	the name)
//	other      new Deleted trigger (same     MergePrecede: a teardown of an object
//	           UID or unknown)               that may still exist; the pending event
//	                                         keeps its reconcile, and the queue merges
//	                                         the teardown into a Deleted trigger held
//	                                         before, if any, or puts it behind
//	new        re-add, not Deleted           MergeKeep: the new event arrived while
//	                                         the re-added one was being reconciled;
//	                                         it keeps its payload, its retry count
//	                                         and its reconcile, whose result decides
//	                                         again whether to retry or requeue
//	new watch  re-added watch Deleted, same  MergeKeep: the object came back into the
//	event      UID                           watch after the delete ran (a re-added
//	                                         Deleted trigger follows the event, as
//	                                         in the row below)
//	new        re-added Deleted              MergeSequence: the new event first, then
//	trigger,                                 the delete, as for another UID: a trigger
//	or a UID                                 may stand for an object that still exists
//	unknown                                  (back in the label selector, or deleting
//	                                         with finalizers after a Deleted trigger),
//	                                         and the delete may be real (a Deleted
//	                                         trigger of only namespace and name, too)
//	new        watch Added/Modified, same    MergeKeep: the external trigger keeps its
//	trigger    UID (or a UID unknown)        source, type, reason and retry count, and
//	(Operator)                               takes the watch event's object (marked
//	                                         Fetched: the watch's own state)
//	other      anything else                 MergeReplace: the newest state wins
//
// MergePrecede puts the incoming event in front of the pending one only
// while the pending one is due later: the queue never puts an add in
// front of an entry due no later than itself (it goes right behind it),
// so nothing waits past its own due time for what went in front of it.
//
// Due time and priority merge inside the queue whatever the rule (earliest
// due, highest priority). A pending external trigger is not overwritten by a
// later watch event: the reconcile it asked for still says who asked and
// why, but it carries the object the watch delivered, so that a trigger
// reconciled without a re-fetch (see Config.FreshFor) sees the state the
// merged event brought. A later trigger replaces a pending watch event
// (newest wins), and a watch event replaces a re-added trigger (whose
// request was served: its retry count does not pass to the new event). A
// delete is the last word on its UID except for a watch with a label
// selector, which reports an object that stops matching as deleted and one
// that matches again as added, with the same UID: only a watch event can
// say so, so a re-added (retried or requeued) watch delete gives way to a
// watch event of its UID (a re-added teardown, which the object's return
// does not answer, follows it), and follows a trigger, which it neither
// drops nor is
// dropped for: the controller cannot tell a trigger for an object that is
// back or still there from one that read the object just before it was
// really deleted (whose reconcile then finds it gone). The cost: when an
// object back in the label selector had its return, or a trigger that
// replaced it, merged into a trigger, the retried delete runs after the
// trigger's reconcile and is the last word until the object changes
// again. The other way round, a trigger that arrives while a delete of
// its object has not run yet (pending, or parked behind a reconcile in
// flight) merges into the delete, which stays (MergeKeep): the trigger
// gets no reconcile of its own, even when the delete was a Deleted
// trigger of an object that still exists (deleting, with finalizers).
// A Deleted trigger is the exception when the waiting delete is the
// watch's: it keeps an entry of its own (see the table).
// Sequencing it behind the delete instead would make it wait out the
// delete's reconcile, backoff or requeue. A delete that ran and waits for
// its retry or requeue holds up nothing: triggers, changes and events of
// another object go in front of it (MergePrecede) while it is due later
// than they are, and behind it otherwise, so that events that keep coming
// cannot hold it back. So after a recreation the old
// object's delete may be retried after the new object's reconcile: a
// reconciler cleans up what belonged to the deleted object by its UID,
// not by its name. Where a chain could grow with events that alternate
// (teardown triggers and changes, deletes of two objects), the rule
// answers MergePrecede, and the queue's walk back merges the repeated
// event into its twin held earlier: a key's chain stays short (for any
// mix of two objects' events, a few entries). The rows are read top down:
// the first that fits decides.
func MergeEvents[T opkit.Object](pending *opkit.Event[T], incoming opkit.Event[T]) queue.Merge {
	pu, iu := uidOf(pending.Object), uidOf(incoming.Object)
	sameUID := pu != "" && pu == iu
	otherUID := pu != "" && iu != "" && pu != iu // both known, and not the same object
	if pending.Type != opkit.Deleted {
		if incoming.Type == opkit.Deleted && otherUID {
			if readd(incoming) {
				// The older object's retried delete follows the newer
				// object's event rather than hold it up for its backoff.
				return queue.MergeSequence
			}
			// A delete of another object goes in front, as a delete goes
			// before a recreation; the queue merges it with a delete of
			// that object held before, if any.
			return queue.MergePrecede
		}
		if incoming.Type == opkit.Deleted && pu == "" && (readd(*pending) || iu != "") {
			// The pending event carries no object (a requeue, or a trigger
			// of only namespace and name): the delete may be another
			// object's, so neither replaces the other. The delete goes in
			// front while the pending event waits longer (the queue orders
			// them by due time); that event re-reads its object, and finds
			// it gone if it was the deleted one.
			return queue.MergePrecede
		}
		if readd(incoming) && !readd(*pending) {
			// pending arrived while incoming's reconcile ran: it is newer. A
			// re-added watch delete gives way to the watch saying the object
			// is back; a re-added teardown (a Deleted trigger, which the
			// object's return does not answer) and any delete behind an
			// event it cannot tell apart by UID follow it.
			if incoming.Type != opkit.Deleted || pending.Source == opkit.APIServer && sameUID && incoming.Source == opkit.APIServer {
				return queue.MergeKeep
			}
			// A re-added delete behind a newer event the watch did not
			// deliver (a trigger, whatever its UID): after the new event.
			// The trigger may stand for an object that still exists (one
			// back in the label selector, or deleting with finalizers
			// after a Deleted trigger), and the delete may be real;
			// neither is dropped.
			return queue.MergeSequence
		}
		if pending.Source == opkit.Operator && !readd(*pending) && incoming.Source == opkit.APIServer &&
			incoming.Type != opkit.Deleted && !otherUID {
			if !isNil(incoming.Object) {
				pending.Object = incoming.Object
				pending.Fetched = true // the watch's object: as fresh as the watch
			}
			return queue.MergeKeep
		}
		if incoming.Type == opkit.Deleted && incoming.Source == opkit.Operator && !readd(incoming) {
			// A Deleted trigger (a teardown) of an object that may still
			// exist: the pending event keeps its reconcile unless a Deleted
			// trigger held before it takes this one (the queue walks back
			// and merges it there), so teardowns alternating with changes
			// do not grow the chain; otherwise it follows the event.
			return queue.MergePrecede
		}
		return queue.MergeReplace
	}
	if otherUID {
		if readd(*pending) || incoming.Type == opkit.Deleted && !readd(incoming) {
			// The delete ran and waits for its retry or requeue, which may
			// be an hour away: another object of the name (recreated) must
			// not wait for it. Its event goes in front while the delete
			// waits longer; the delete keeps its own due time behind it.
			// A new delete of another object goes in front too, so that
			// the queue merges it into a delete of that object held
			// before, if any: deletes of two objects that alternate do not
			// grow the chain.
			return queue.MergePrecede
		}
		return queue.MergeSequence
	}
	if incoming.Type != opkit.Deleted {
		watchEvent := incoming.Source == opkit.APIServer && !readd(incoming)
		switch {
		case watchEvent && pending.Source == opkit.APIServer && sameUID:
			return queue.MergeReplace // back in the watch
		case readd(*pending):
			// The delete ran and waits for its retry or requeue, maybe an
			// hour: nothing new waits for it. The event (a trigger, a
			// change after a Deleted trigger, a retry of a reconcile that
			// ran meanwhile) goes in front; the delete follows at its own
			// time, the last word as after any trigger.
			return queue.MergePrecede
		case watchEvent && pending.Source == opkit.Operator: // after a Deleted trigger, whose UID may be unknown
			return queue.MergeSequence
		case readd(incoming) && iu == "": // a requeue, or the retry of a failed read, carries no object
			return queue.MergeSequence
		case iu == "" && pu != "":
			// A trigger that does not say which object it is for (no UID)
			// may be for a new object of the name: after the delete,
			// which it neither replaces nor merges into.
			return queue.MergeSequence
		}
	}
	// Both are deletes of one object (or of a UID unknown). One entry
	// stands for both, and it must carry the latest delete of the object
	// the watch delivered: its watcher holds that one until the reconcile
	// settles it by UID and resourceVersion.
	if incoming.Type == opkit.Deleted {
		if pu == "" && iu != "" && !watchDelete(incoming) && !readd(*pending) {
			// A Deleted trigger of only the name (which may have taken in
			// a trigger of the object that has it) and a Deleted trigger
			// naming a UID, perhaps an earlier object's: both run, so that
			// neither turns the other into a delete of another object.
			return queue.MergeSequence
		}
		if incoming.Source == opkit.Operator && pending.Source == opkit.APIServer {
			// A teardown asked for while the watch's delete of its object
			// waits: it keeps an entry of its own, so that the object
			// coming back into the watch (which replaces the watch's
			// delete) does not drop it, and it is recorded as the trigger
			// it is. It goes in front of the delete only while that waits
			// longer; the queue merges it into a teardown held before, so
			// that repeated teardowns and watch events do not grow the
			// chain.
			return queue.MergePrecede
		}
		if incoming.Source == opkit.Operator && !readd(incoming) && pending.Source == opkit.Operator && readd(*pending) {
			// A new teardown while the last one waits for its retry or
			// requeue: the entry runs as the new request (its reason, a
			// first run, recorded as such), carrying whatever delete it
			// holds.
			pending.Reason, pending.Retried, pending.Requeued = incoming.Reason, false, false
		}
		if incoming.Source == opkit.APIServer && pending.Source == opkit.APIServer && !readd(incoming) &&
			pending.FinalStateUnknown && !incoming.FinalStateUnknown {
			return queue.MergeReplace // the full final state for a tombstone
		}
		if takesDelete(*pending, incoming) {
			// A Deleted trigger keeps who asked and why; it is marked when
			// the object it takes is the watch's delete, which the
			// controller then settles and later merges compare as such.
			pending.Object, pending.FinalStateUnknown = incoming.Object, incoming.FinalStateUnknown
			pending.Watched = pending.Source == opkit.Operator && watchDelete(incoming)
		}
	}
	return queue.MergeKeep
}

// takesDelete reports whether a kept delete takes the object of an
// incoming delete of the same object: the entry must carry the latest
// delete the watch delivered, the one its watcher holds. A watch delete
// carries one; a Deleted trigger carries its caller's snapshot until it
// takes one (and is marked Watched). So: an object with a UID beats one
// without; a trigger's object never beats a held one with a UID; the
// watch's delete beats a trigger's snapshot, whatever their
// resourceVersions (the snapshot may be of a state the watch never saw);
// of two watch deletes, a new one is the latest, and a re-added one (a
// retry) wins only if its resourceVersion is later, or, where they do not
// compare as numbers (the API leaves them opaque; etcd-backed resources
// use its revisions), if the held one is a re-add too (it ran earlier).
func takesDelete[T opkit.Object](pending, incoming opkit.Event[T]) bool {
	switch {
	case uidOf(incoming.Object) == "":
		return false
	case uidOf(pending.Object) == "":
		return true
	case !watchDelete(incoming):
		return false
	case !watchDelete(pending):
		return true
	case rvOf(incoming.Object) == rvOf(pending.Object):
		// The same delete: its full final state, newly delivered, beats
		// a tombstone.
		return !readd(incoming) && pending.FinalStateUnknown && !incoming.FinalStateUnknown
	case !readd(incoming):
		return true
	}
	if later, ok := laterRV(incoming.Object, pending.Object); ok {
		return later
	}
	return readd(pending)
}

// watchDelete reports whether a delete's object is the watch's: a watch
// event, or a Deleted trigger that took one.
func watchDelete[T opkit.Object](ev opkit.Event[T]) bool {
	return ev.Source == opkit.APIServer || ev.Watched
}

// laterRV reports whether a's resourceVersion is later than b's; ok is
// false unless both are decimal numbers.
func laterRV[T opkit.Object](a, b T) (later, ok bool) {
	x, errA := strconv.ParseUint(a.GetResourceVersion(), 10, 64)
	y, errB := strconv.ParseUint(b.GetResourceVersion(), 10, 64)
	if errA != nil || errB != nil {
		return false, false
	}
	return x > y, true
}

// readd reports whether ev was added back by the controller after a
// reconcile of it.
func readd[T opkit.Object](ev opkit.Event[T]) bool { return ev.Requeued || ev.Retried }

// rvOf returns obj's resourceVersion, or "" for a nil object.
func rvOf[T opkit.Object](obj T) string {
	if isNil(obj) {
		return ""
	}
	return obj.GetResourceVersion()
}

// uidOf returns obj's UID, or "" for a nil object.
func uidOf[T opkit.Object](obj T) string {
	if isNil(obj) {
		return ""
	}
	return string(obj.GetUID())
}
