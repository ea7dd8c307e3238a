package reconcile

import (
	"github.com/opkit/opkit"
	"github.com/opkit/opkit/queue"
)

// MergeEvents is the rule by which the controller's queue combines an event
// added for a key with the event already pending (or parked while the key is
// in flight) for it; it is the queue's Config.Merge.
//
//	pending    incoming                      merge
//	---------  ----------------------------  ------------------------------------------
//	Deleted    same UID (or a UID unknown)   MergeKeep: a delete is never turned into
//	                                         something else; a Deleted carrying the
//	                                         full final state replaces a tombstone
//	                                         (MergeReplace) since both are the delete
//	Deleted    another UID (recreated)       MergeSequence: the delete is delivered
//	                                         first, then the new object's event
//	other      Deleted of another UID        MergeSequence: the pending event of the
//	                                         newer object stays and the old object's
//	                                         delete follows it (only a retried delete
//	                                         arrives in that order)
//	other      anything else                 MergeReplace: the newest state wins
//
// Due time and priority merge inside the queue whatever the rule (earliest
// due, highest priority). With MergeReplace the incoming event's Source and
// Reason win too: a trigger's reason merged into a later watch event is not
// reported separately.
func MergeEvents[T opkit.Object](pending, incoming opkit.Event[T]) queue.Merge {
	pu, iu := uidOf(pending.Object), uidOf(incoming.Object)
	if pending.Type != opkit.Deleted {
		if incoming.Type == opkit.Deleted && pu != "" && iu != "" && pu != iu {
			return queue.MergeSequence
		}
		return queue.MergeReplace
	}
	if pu != "" && iu != "" && pu != iu {
		return queue.MergeSequence
	}
	if incoming.Type == opkit.Deleted && pending.FinalStateUnknown && !incoming.FinalStateUnknown {
		return queue.MergeReplace
	}
	return queue.MergeKeep
}

// uidOf returns obj's UID, or "" for a nil object.
func uidOf[T opkit.Object](obj T) string {
	if isNil(obj) {
		return ""
	}
	return string(obj.GetUID())
}
