package reconcile_test

import (
	"context"
	"slices"
	"testing"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/types"

	"github.com/opkit/opkit"
	"github.com/opkit/opkit/queue"
	"github.com/opkit/opkit/reconcile"
)

func cmWithUID(uid types.UID) *corev1.ConfigMap {
	cm := &corev1.ConfigMap{}
	cm.Namespace, cm.Name, cm.UID = "ns", "a", uid
	return cm
}

func ev(typ opkit.Type, uid types.UID) opkit.Event[*corev1.ConfigMap] {
	return opkit.Event[*corev1.ConfigMap]{Object: cmWithUID(uid), Type: typ, Source: opkit.APIServer}
}

func trig(uid types.UID) opkit.Event[*corev1.ConfigMap] {
	return opkit.Event[*corev1.ConfigMap]{Object: cmWithUID(uid), Type: opkit.Modified, Source: opkit.Operator, Reason: "deploy"}
}

func requeued(e opkit.Event[*corev1.ConfigMap]) opkit.Event[*corev1.ConfigMap] {
	e.Requeued = true
	return e
}

func deletedTrigger(uid types.UID) opkit.Event[*corev1.ConfigMap] {
	e := trig(uid)
	e.Type = opkit.Deleted
	return e
}

func retried(e opkit.Event[*corev1.ConfigMap]) opkit.Event[*corev1.ConfigMap] {
	e.Retried = true
	return e
}

func TestMergeEventsNeverTurnsAPendingDeleteIntoSomethingElse(t *testing.T) {
	tomb := ev(opkit.Deleted, "u1")
	tomb.FinalStateUnknown = true
	nilObj := opkit.Event[*corev1.ConfigMap]{Type: opkit.Modified, Source: opkit.Operator}
	for _, tc := range []struct {
		name              string
		pending, incoming opkit.Event[*corev1.ConfigMap]
		want              queue.Merge
	}{
		{"added then modified: newest wins", ev(opkit.Added, "u1"), ev(opkit.Modified, "u1"), queue.MergeReplace},
		{"modified then deleted: the delete wins", ev(opkit.Modified, "u1"), ev(opkit.Deleted, "u1"), queue.MergeReplace},
		{"modified then recreated: newest wins", ev(opkit.Modified, "u1"), ev(opkit.Added, "u2"), queue.MergeReplace},
		{"recreated, then a late delete of the old object: both, it may precede (merging into a held delete of its object)", ev(opkit.Added, "u2"), ev(opkit.Deleted, "u1"), queue.MergePrecede},
		{"trigger, then a Deleted trigger of another uid: both, it may precede", trig("u2"), deletedTrigger("u1"), queue.MergePrecede},
		{"retried delete, then a recreated object's event: both, the new object first", retried(ev(opkit.Deleted, "u1")), ev(opkit.Added, "u2"), queue.MergePrecede},
		{"requeued delete, then a trigger for a recreated object: both, the trigger first", requeued(ev(opkit.Deleted, "u1")), trig("u2"), queue.MergePrecede},
		{"retried delete, then another object's retry: both, the retry first", retried(ev(opkit.Deleted, "u1")), retried(ev(opkit.Modified, "u2")), queue.MergePrecede},
		// Only a watch with a label selector reports the same UID after a
		// delete: the object left the selector and matches again, before
		// the delete was handed out. It is in scope now.
		{"deleted then modified, same uid (back in the watch): the object", ev(opkit.Deleted, "u1"), ev(opkit.Modified, "u1"), queue.MergeReplace},
		{"deleted then added, same uid (back in the watch): the object", ev(opkit.Deleted, "u1"), ev(opkit.Added, "u1"), queue.MergeReplace},
		{"Deleted trigger then watch modified, same uid: both", deletedTrigger("u1"), ev(opkit.Modified, "u1"), queue.MergeSequence},
		{"Deleted trigger without uid then watch added: both", deletedTrigger(""), ev(opkit.Added, "u1"), queue.MergeSequence},
		{"deleted then trigger, same uid: keep the delete", ev(opkit.Deleted, "u1"), trig("u1"), queue.MergeKeep},
		{"deleted then retry of an older event, same uid: keep the delete", ev(opkit.Deleted, "u1"), retried(ev(opkit.Modified, "u1")), queue.MergeKeep},
		{"deleted then a requeue (no object): after the delete", ev(opkit.Deleted, "u1"), requeued(nilObj), queue.MergeSequence},
		{"deleted then deleted: keep", ev(opkit.Deleted, "u1"), ev(opkit.Deleted, "u1"), queue.MergeKeep},
		{"deleted then recreated: both, delete first", ev(opkit.Deleted, "u1"), ev(opkit.Added, "u2"), queue.MergeSequence},
		{"deleted then recreated and modified: both", ev(opkit.Deleted, "u1"), ev(opkit.Modified, "u2"), queue.MergeSequence},
		{"deleted then an event without uid: both, after the delete (it may be for a new object)", ev(opkit.Deleted, "u1"), ev(opkit.Modified, ""), queue.MergeSequence},
		{"deleted then a trigger without object: both, after the delete", ev(opkit.Deleted, "u1"), nilObj, queue.MergeSequence},
		{"watch change then a Deleted trigger: both (merged into a Deleted trigger held before, if any)", ev(opkit.Modified, "u1"), deletedTrigger("u1"), queue.MergePrecede},
		{"trigger without object then a watch delete: both, the one due first first", nilObj, ev(opkit.Deleted, "u1"), queue.MergePrecede},
		{"tombstone then full final state: replace", tomb, ev(opkit.Deleted, "u1"), queue.MergeReplace},
		{"full final state then tombstone: keep", ev(opkit.Deleted, "u1"), tomb, queue.MergeKeep},
		{"tombstone then a Deleted trigger: both, the teardown keeps its own entry", tomb, deletedTrigger("u1"), queue.MergePrecede},
		{"tombstone then a retried full delete: the tombstone stays (the watcher holds it)", tomb, retried(ev(opkit.Deleted, "u1")), queue.MergeKeep},
		{"Deleted trigger then a retried watch delete: the trigger takes its object", deletedTrigger("u1"), retried(ev(opkit.Deleted, "u1")), queue.MergeKeep},
		{"trigger then watch event: the trigger keeps who asked", trig("u1"), ev(opkit.Modified, "u1"), queue.MergeKeep},
		{"trigger without uid then watch event: keep", trig(""), ev(opkit.Added, "u1"), queue.MergeKeep},
		{"trigger then delete: the delete wins", trig("u1"), ev(opkit.Deleted, "u1"), queue.MergeReplace},
		{"trigger then recreated object's watch event: newest wins", trig("u1"), ev(opkit.Added, "u2"), queue.MergeReplace},
		{"watch event then trigger: the trigger wins", ev(opkit.Modified, "u1"), trig("u1"), queue.MergeReplace},
		{"trigger then trigger: newest wins", trig("u1"), trig("u1"), queue.MergeReplace},
		{"requeued trigger then watch event: the trigger was served, newest wins", requeued(trig("u1")), ev(opkit.Modified, "u1"), queue.MergeReplace},
		{"requeued trigger then trigger: newest wins", requeued(trig("u1")), trig("u1"), queue.MergeReplace},
		{"retried trigger then watch event: the new event, retry count 0", retried(trig("u1")), ev(opkit.Modified, "u1"), queue.MergeReplace},
		{"retried watch event then watch event: newest wins", retried(ev(opkit.Modified, "u1")), ev(opkit.Modified, "u1"), queue.MergeReplace},
		// Re-adds reach a parked event that arrived while they ran: it is newer.
		{"trigger then retry of an older trigger: the new trigger stays", trig("u1"), retried(trig("u1")), queue.MergeKeep},
		{"trigger then requeue of an older trigger: the new trigger stays", trig("u1"), requeued(trig("u1")), queue.MergeKeep},
		{"trigger then retry of a watch event: the trigger keeps its own object", trig("u1"), retried(ev(opkit.Modified, "u1")), queue.MergeKeep},
		{"watch event then retry of an older one: the new event stays", ev(opkit.Modified, "u1"), retried(ev(opkit.Added, "u1")), queue.MergeKeep},
		{"watch event then requeue of an older one: the new event stays", ev(opkit.Modified, "u1"), requeued(ev(opkit.Modified, "u1")), queue.MergeKeep},
		{"trigger then retried delete: both, the trigger first (its object may still exist)", trig("u1"), retried(ev(opkit.Deleted, "u1")), queue.MergeSequence},
		{"trigger then requeued delete: both, the trigger first", trig("u1"), requeued(ev(opkit.Deleted, "u1")), queue.MergeSequence},
		{"trigger then a retried Deleted trigger, same uid: both, the trigger first", trig("u1"), retried(deletedTrigger("u1")), queue.MergeSequence},
		{"watch event then a retried Deleted trigger without uid: both, the event first", ev(opkit.Added, "u2"), retried(deletedTrigger("")), queue.MergeSequence},
		{"trigger then a requeued Deleted trigger without uid: both, the trigger first", trig("u2"), requeued(deletedTrigger("")), queue.MergeSequence},
		{"watch event then retried delete, same uid (back in the watch): the watch event stays", ev(opkit.Added, "u1"), retried(ev(opkit.Deleted, "u1")), queue.MergeKeep},
		{"watch event then retried delete of another uid: both", ev(opkit.Added, "u2"), retried(ev(opkit.Deleted, "u1")), queue.MergeSequence},
		{"watch event then a retried Deleted trigger, same uid: both, the event first (the teardown stands)", ev(opkit.Added, "u1"), retried(deletedTrigger("u1")), queue.MergeSequence},
		{"watch delete then a retried Deleted trigger: both, the teardown keeps its own entry", ev(opkit.Deleted, "u1"), retried(deletedTrigger("u1")), queue.MergePrecede},
		{"recreated, then the old object's delete retried: both, retried too", ev(opkit.Added, "u2"), retried(ev(opkit.Deleted, "u1")), queue.MergeSequence},
		{"retried event then retry: newest wins", retried(ev(opkit.Modified, "u1")), retried(ev(opkit.Modified, "u1")), queue.MergeReplace},
		{"retried watch delete then the same delete again: keep", retried(ev(opkit.Deleted, "u1")), ev(opkit.Deleted, "u1"), queue.MergeKeep},
		{"Deleted trigger then a trigger, same uid: keep the delete", deletedTrigger("u1"), trig("u1"), queue.MergeKeep},
		{"Deleted trigger then a trigger, no uid: keep the delete", deletedTrigger(""), trig("u1"), queue.MergeKeep},
		{"retried Deleted trigger then a trigger: both, the trigger first (the delete waits for its retry)", retried(deletedTrigger("u1")), trig("u1"), queue.MergePrecede},
		{"requeued watch delete then a trigger: both, the trigger first", requeued(ev(opkit.Deleted, "u1")), trig("u1"), queue.MergePrecede},
		{"retried Deleted trigger then a watch change: both, the change first", retried(deletedTrigger("u1")), ev(opkit.Modified, "u1"), queue.MergePrecede},
		{"retried watch delete then the object back in the watch: the object", retried(ev(opkit.Deleted, "u1")), ev(opkit.Added, "u1"), queue.MergeReplace},
		{"retried delete then a retry of a trigger that ran meanwhile: both, the retry first", retried(ev(opkit.Deleted, "u1")), retried(trig("u1")), queue.MergePrecede},
		{"retried delete then an objectless requeue: both, the requeue first", retried(ev(opkit.Deleted, "u1")), requeued(opkit.Event[*corev1.ConfigMap]{Type: opkit.Modified, Source: opkit.Operator}), queue.MergePrecede},
	} {
		pending := tc.pending
		if got := reconcile.MergeEvents(&pending, tc.incoming); got != tc.want {
			t.Errorf("%s: got %v, want %v", tc.name, got, tc.want)
		}
		// A trigger takes the object of a new watch event, and a Deleted
		// trigger that of any watch delete; every other kept event stays.
		takesObject := tc.pending.Source == opkit.Operator && tc.incoming.Source == opkit.APIServer &&
			(tc.pending.Type == opkit.Deleted && tc.incoming.Type == opkit.Deleted || !tc.incoming.Retried && !tc.incoming.Requeued)
		want := tc.pending
		if tc.want == queue.MergeKeep && !takesObject && pending != want {
			t.Errorf("%s: the kept event changed: %+v", tc.name, pending)
		}
	}
}

// A later watch delete of the same object (it came back into the watch and
// left again) behind the retry of its earlier delete: the entry stays, but
// carries the later delete's object, the one its watcher now holds until
// that delete is settled (by resourceVersion).
func TestMergeEventsARetriedDeleteTakesALaterDeleteOfItsObject(t *testing.T) {
	for _, final := range []bool{false, true} {
		pending := retried(ev(opkit.Deleted, "u1"))
		pending.Object.ResourceVersion = "3"
		later := ev(opkit.Deleted, "u1")
		later.Object.ResourceVersion, later.FinalStateUnknown = "5", final
		if got := reconcile.MergeEvents(&pending, later); got != queue.MergeKeep {
			t.Fatalf("got %v, want MergeKeep", got)
		}
		if pending.Object.ResourceVersion != "5" || pending.FinalStateUnknown != final || !pending.Retried {
			t.Errorf("kept %+v (rv %s), want the retry carrying the later delete (rv 5, final state unknown %v)", pending, pending.Object.ResourceVersion, final)
		}
	}
	// A delete it cannot tell is of the same object leaves it as it is.
	pending := retried(ev(opkit.Deleted, "u1"))
	pending.Object.ResourceVersion = "3"
	unknown := ev(opkit.Deleted, "")
	unknown.Object.ResourceVersion = "7"
	if got := reconcile.MergeEvents(&pending, unknown); got != queue.MergeKeep || pending.Object.ResourceVersion != "3" || pending.Object.UID != "u1" {
		t.Errorf("a delete of unknown uid: got %v, kept uid %s rv %s; want MergeKeep of the retry unchanged", got, pending.Object.UID, pending.Object.ResourceVersion)
	}
}

// A watch delete merged into a pending Deleted trigger: the trigger keeps
// who asked and why, and takes the watch's object (the one its watcher
// holds until the delete is settled by UID and resourceVersion), marked
// Watched.
func TestMergeEventsDeletedTriggerTakesTheWatchDelete(t *testing.T) {
	for _, final := range []bool{false, true} {
		pending := deletedTrigger("u1")
		pending.Object.ResourceVersion = "1"
		watched := ev(opkit.Deleted, "u1")
		watched.Object.ResourceVersion, watched.FinalStateUnknown = "3", final
		if got := reconcile.MergeEvents(&pending, watched); got != queue.MergeKeep {
			t.Fatalf("got %v, want MergeKeep", got)
		}
		if pending.Source != opkit.Operator || pending.Reason != "deploy" || pending.Object != watched.Object || pending.FinalStateUnknown != final || !pending.Watched {
			t.Errorf("kept %+v (rv %s); want the trigger's source and reason with the watch's delete (rv 3, final state unknown %v), marked Watched",
				pending, pending.Object.ResourceVersion, final)
		}
	}
}

// A watch event merged into a pending trigger leaves who asked and why,
// and brings its newer object.
func TestMergeEventsTriggerKeepsAttributionAndTakesTheNewerObject(t *testing.T) {
	pending := trig("u1")
	pending.Object.ResourceVersion = "5"
	watched := ev(opkit.Added, "u1")
	watched.Object.ResourceVersion = "9"
	if got := reconcile.MergeEvents(&pending, watched); got != queue.MergeKeep {
		t.Fatalf("got %v, want MergeKeep", got)
	}
	if pending.Source != opkit.Operator || pending.Reason != "deploy" || pending.Type != opkit.Modified {
		t.Errorf("attribution changed: %+v", pending)
	}
	if pending.Object != watched.Object || !pending.Fetched {
		t.Errorf("object RV %s, fetched %v; want the watch event's (RV 9), marked fetched", pending.Object.ResourceVersion, pending.Fetched)
	}
}

// Sequences through a real queue with MergeEvents: what a worker is handed,
// in order, when a watch with a label selector reports an object leaving
// and coming back (a delete and an add of the same UID), and when a
// requeue meets a delete queued behind it.
func TestMergeEventsSequencesThroughTheQueue(t *testing.T) {
	k := opkit.Key{Namespace: "ns", Name: "a"}
	for _, tc := range []struct {
		name string
		run  func(t *testing.T, q *queue.Queue[opkit.Key, opkit.Event[*corev1.ConfigMap]]) // leaves the rest pending
		want []string
	}{
		{"left the selector, then back before the delete ran: the object", func(t *testing.T, q *queue.Queue[opkit.Key, opkit.Event[*corev1.ConfigMap]]) {
			q.Add(k, ev(opkit.Deleted, "u1"), queue.AddOptions{})
			q.Add(k, ev(opkit.Added, "u1"), queue.AddOptions{})
		}, []string{"Added u1"}},
		{"flapping 100 times while the key is in flight: one entry behind it", func(t *testing.T, q *queue.Queue[opkit.Key, opkit.Event[*corev1.ConfigMap]]) {
			q.Add(k, ev(opkit.Modified, "u1"), queue.AddOptions{})
			if _, err := q.Get(context.Background()); err != nil {
				t.Fatal(err)
			}
			for range 100 {
				q.Add(k, ev(opkit.Deleted, "u1"), queue.AddOptions{})
				q.Add(k, ev(opkit.Added, "u1"), queue.AddOptions{})
			}
			if st := q.Stats(); st.Parked != 1 {
				t.Errorf("%d entries parked behind the one in flight, want 1", st.Parked)
			}
			q.Done(k)
		}, []string{"Added u1"}},
		{"back while its delete ran and failed: the add, not the retry", func(t *testing.T, q *queue.Queue[opkit.Key, opkit.Event[*corev1.ConfigMap]]) {
			q.Add(k, ev(opkit.Deleted, "u1"), queue.AddOptions{})
			it, _ := q.Get(context.Background())
			q.Add(k, ev(opkit.Added, "u1"), queue.AddOptions{}) // parked behind the running delete
			q.Add(k, retried(it.Value), queue.AddOptions{Retries: 1})
			q.Done(k)
		}, []string{"Added u1"}},
		{"a requeue behind an old object's retried delete that is due: both, the delete first", func(t *testing.T, q *queue.Queue[opkit.Key, opkit.Event[*corev1.ConfigMap]]) {
			q.Add(k, ev(opkit.Deleted, "u1"), queue.AddOptions{})
			del, _ := q.Get(context.Background())
			q.Add(k, ev(opkit.Added, "u2"), queue.AddOptions{}) // recreated, parked
			q.Add(k, retried(del.Value), queue.AddOptions{Retries: 1})
			q.Done(k)
			added, _ := q.Get(context.Background()) // Added u2 runs and asks for a requeue
			rq := added.Value
			rq.Object = nil
			q.Add(k, requeued(rq), queue.AddOptions{})
			q.Done(k)
		}, []string{"Deleted u1", "Added (requeued)"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			q := queue.New[opkit.Key](queue.Config[opkit.Event[*corev1.ConfigMap]]{Merge: reconcile.MergeEvents[*corev1.ConfigMap]})
			tc.run(t, q)
			var got []string
			for q.Len() > 0 {
				it, err := q.Get(context.Background())
				if err != nil {
					t.Fatal(err)
				}
				d := it.Value.Type.String()
				switch {
				case it.Value.Object == nil && it.Value.Requeued:
					d += " (requeued)"
				case it.Value.Object != nil:
					d += " " + string(it.Value.Object.UID)
				}
				got = append(got, d)
				q.Done(k)
			}
			if !slices.Equal(got, tc.want) {
				t.Errorf("handed out %q, want %q", got, tc.want)
			}
		})
	}
}
