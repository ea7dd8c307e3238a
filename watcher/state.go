package watcher

import (
	"hash/fnv"
	"maps"
	"slices"
	"strconv"
	"strings"

	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/types"

	"github.com/opkit/opkit"
	"github.com/opkit/opkit/internal/typed"
)

// entry is everything the watcher remembers about one live object. It is
// kept deliberately small (about 60 bytes plus the UID and resourceVersion
// strings): the objects themselves are never retained.
type entry struct {
	uid string
	rv  string
	// generation is metadata.generation; 0 when the resource does not
	// maintain it.
	generation int64
	// fingerprint hashes what makes a same-generation change worth a
	// reconcile: whether a deletion timestamp is set, the finalizers
	// other than Config.OwnFinalizers, and the watched labels and
	// annotations.
	fingerprint uint64
	// ownMissing: the object is not being deleted and lacks one of
	// Config.OwnFinalizers.
	ownMissing bool
	// epoch is the number of the latest (re)list when the object was last
	// seen (by that list or by the watch after it); after a complete list,
	// entries with an older epoch have vanished.
	epoch uint32
}

// record is one unsettled delete in the ledger: the object's UID and last
// resourceVersion, and its final state (nil for a tombstone: a relist
// found the object gone, its delete was not decodable, or the ledger kept
// MaxFinalStates final states already).
type record[T opkit.Object] struct {
	uid, rv string
	final   T
}

// readMeta returns the key of u and the entry the watcher would keep for
// it (epoch unset). Its strings alias u: store and gone copy them.
func (w *Watcher[T]) readMeta(u *unstructured.Unstructured) (opkit.Key, entry) {
	key := opkit.Key{Namespace: u.GetNamespace(), Name: u.GetName()}
	e := entry{uid: string(u.GetUID()), rv: u.GetResourceVersion(), generation: u.GetGeneration()}
	md, _ := u.Object["metadata"].(map[string]any)
	h := fnv.New64a()
	write := func(ss ...string) {
		for _, s := range ss {
			h.Write([]byte(s))
			h.Write([]byte{0})
		}
	}
	ts, deleting := md["deletionTimestamp"]
	if deleting = deleting && ts != nil; deleting {
		write("deleting")
	}
	fs, _ := md["finalizers"].([]any)
	for _, f := range fs {
		if s, _ := f.(string); !slices.Contains(w.cfg.OwnFinalizers, s) {
			write("finalizer", s)
		}
	}
	e.ownMissing = !deleting && slices.ContainsFunc(w.cfg.OwnFinalizers, func(own string) bool {
		return !slices.Contains(fs, any(own))
	})
	// The named labels and annotations, an absent one apart from an empty one.
	named := func(section string, names []string) {
		m, _ := md[section].(map[string]any)
		for _, n := range names {
			v, present := m[n]
			s, _ := v.(string)
			write(section, n, strconv.FormatBool(present), s)
		}
	}
	named("labels", w.cfg.WatchLabels)
	named("annotations", w.cfg.WatchAnnotations)
	e.fingerprint = h.Sum64()
	return key, e
}

// interner makes keys that do not alias the decoded objects they come
// from, sharing one copy of each namespace among them. Only Run's
// goroutine uses it.
type interner struct {
	namespaces map[string]string
	kept       int // namespaces in use at the last prune
}

// key returns a copy of k with its namespace interned.
func (in *interner) key(k opkit.Key) opkit.Key {
	if in.namespaces == nil {
		in.namespaces = make(map[string]string)
	}
	ns, ok := in.namespaces[k.Namespace]
	if !ok {
		ns = strings.Clone(k.Namespace)
		in.namespaces[ns] = ns
	}
	return opkit.Key{Namespace: ns, Name: strings.Clone(k.Name)}
}

// prune drops the interned namespaces no key uses any more (used returns
// the keys in use), once the table has doubled since the last prune, so
// that a cluster that keeps creating and deleting namespaces does not
// grow it for ever. The end of a list calls it: the list pays for the
// pass over the keys.
func (in *interner) prune(used func() []string) {
	if len(in.namespaces) <= 2*max(in.kept, 16) {
		return
	}
	inUse := make(map[string]bool, in.kept)
	for _, ns := range used() {
		inUse[ns] = true
	}
	maps.DeleteFunc(in.namespaces, func(ns, _ string) bool { return !inUse[ns] })
	in.kept = len(in.namespaces)
}

// pruneNamespaces prunes the interned namespaces of the keys the watcher
// no longer tracks.
func (w *Watcher[T]) pruneNamespaces() {
	w.interned.prune(func() []string {
		w.mu.RLock()
		defer w.mu.RUnlock()
		var used []string
		for k := range w.entries {
			used = append(used, k.Namespace)
		}
		for k := range w.ledger {
			used = append(used, k.Namespace)
		}
		return used
	})
}

// store tracks e as the live object under key, and drops the deletes of
// its UID from the ledger: an object back in the watch (it had left the
// label selector) was not deleted. old is the entry it replaces, if any.
func (w *Watcher[T]) store(key opkit.Key, e, old entry) {
	if e.uid == old.uid {
		e.uid = old.uid // already a private copy
	} else {
		e.uid = strings.Clone(e.uid)
	}
	e.rv = strings.Clone(e.rv)
	// Always an interned key: assigning to an existing string key replaces
	// the stored key too, so an aliasing key would undo the interning.
	key = w.interned.key(key)
	w.mu.Lock()
	defer w.mu.Unlock()
	w.entries[key] = e
	w.drop(key, func(r record[T]) bool { return r.uid == e.uid })
}

// get returns the live entry of key.
func (w *Watcher[T]) get(key opkit.Key) (entry, bool) {
	w.mu.RLock()
	defer w.mu.RUnlock()
	e, ok := w.entries[key]
	return e, ok
}

// tracked reports to Metrics how many live objects and unsettled deletes
// the watcher holds.
func (w *Watcher[T]) tracked() {
	w.mu.RLock()
	n := len(w.entries) + w.nRecords
	w.mu.RUnlock()
	w.cfg.Metrics.Tracked(n)
}

// gone records in the ledger the delete of the object e (its UID and last
// resourceVersion) under key, with its final state unless final is nil,
// stops tracking it as live, and adds key to the queue at the watch's
// priority (a delete needs work). The record is in
// place before the queue sees the key, so the worker that takes it finds
// the delete. Beyond MaxFinalStates final states in all the record is a
// tombstone; beyond MaxDeletesPerKey records of key the oldest is dropped.
func (w *Watcher[T]) gone(key opkit.Key, e entry, final T) {
	r := record[T]{uid: strings.Clone(e.uid), rv: strings.Clone(e.rv)}
	k := w.interned.key(key)
	w.mu.Lock()
	if live, ok := w.entries[k]; ok && live.uid == e.uid {
		delete(w.entries, k)
	}
	if !isNil(final) && w.nFinal < w.cfg.MaxFinalStates {
		r.final = final
		w.nFinal++
	}
	rs := append(w.ledger[k], r) // the watch reports deletes in resourceVersion order
	w.nRecords++
	dropped, overflow := rs[0], len(rs) > w.cfg.MaxDeletesPerKey
	if overflow {
		w.forget(dropped)
		rs = slices.Delete(rs, 0, 1)
	}
	w.ledger[k] = rs
	w.mu.Unlock()
	if overflow {
		w.cfg.Metrics.Error(ReasonOverflow)
		w.log.Error("too many unsettled deletes of one name: the oldest is dropped and will not be reconciled",
			"key", key.String(), "uid", dropped.uid, "resourceVersion", dropped.rv, "maxDeletesPerKey", w.cfg.MaxDeletesPerKey)
	}
	w.emit(key, opkit.Deleted, *new(T), w.cfg.Priority)
}

// drop removes the records of key that match; the caller holds mu.
func (w *Watcher[T]) drop(key opkit.Key, match func(record[T]) bool) {
	rs := slices.DeleteFunc(w.ledger[key], func(r record[T]) bool {
		matched := match(r)
		if matched {
			w.forget(r)
		}
		return matched
	})
	if len(rs) == 0 {
		delete(w.ledger, key)
	} else {
		w.ledger[key] = rs
	}
}

// forget counts a record out of the ledger; the caller holds mu.
func (w *Watcher[T]) forget(r record[T]) {
	w.nRecords--
	if !isNil(r.final) {
		w.nFinal--
	}
}

// isNil reports whether obj is a nil T.
func isNil[T opkit.Object](obj T) bool {
	var zero T
	return any(obj) == any(zero)
}

// ResourceVersion returns the resourceVersion of the latest state of key
// the watcher has seen (from a list or a watch event, status-only changes
// included), and false if it tracks no such object. Any later state reaches
// the queue as a watch event. It is safe to call while Run runs: the
// controller uses it to decide whether an object read elsewhere is the
// latest the watch knows.
func (w *Watcher[T]) ResourceVersion(key opkit.Key) (string, bool) {
	e, ok := w.get(key)
	return e.rv, ok
}

// Deleted is one unsettled delete: an object the watch saw go (deleted,
// or out of the label selector), waiting for the controller to reconcile
// it and call [Watcher.Settle].
type Deleted[T opkit.Object] struct {
	// Object is the final state the watch delivered; for a tombstone it
	// carries only namespace, name, UID and the last resourceVersion seen,
	// and the resource's apiVersion and kind.
	Object T
	// FinalStateUnknown marks a tombstone: a relist found the object gone
	// (its final state was never seen), its final state could not be
	// decoded, or the ledger held Config.MaxFinalStates final states
	// already.
	FinalStateUnknown bool
}

// Deletes returns the unsettled deletes of key, oldest first (in the
// order the watch reported them, which is resourceVersion order). It is
// safe to call from any goroutine.
func (w *Watcher[T]) Deletes(key opkit.Key) []Deleted[T] {
	w.mu.RLock()
	defer w.mu.RUnlock()
	var out []Deleted[T]
	for _, r := range w.ledger[key] {
		d := Deleted[T]{Object: r.final}
		if isNil(r.final) {
			d = Deleted[T]{Object: typed.Tombstone[T](key, types.UID(r.uid), r.rv), FinalStateUnknown: true}
			d.Object.GetObjectKind().SetGroupVersionKind(w.cfg.Resource.GroupVersionKind())
		}
		out = append(out, d)
	}
	return out
}

// Settle reports that the delete of the object key with uid, whose last
// resourceVersion was rv, has been dealt with (reconciled, or given up
// on): the ledger forgets it. Until then every Run's first list adds key
// to the queue again, so a delete lost with a queue (cleared at the end
// of a leader's term) or an interrupted reconcile is delivered again.
// Settle of a delete the ledger does not hold does nothing. The same
// object can be deleted more than once (it leaves a label selector, comes
// back and leaves again): each delete is settled on its own. It is safe
// to call from any goroutine, while Run runs or not.
func (w *Watcher[T]) Settle(key opkit.Key, uid types.UID, rv string) {
	w.mu.Lock()
	defer w.mu.Unlock()
	w.drop(key, func(r record[T]) bool { return r.uid == string(uid) && r.rv == rv })
}
