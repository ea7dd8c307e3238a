package watcher

import (
	"hash/fnv"
	"slices"
	"strings"
	"sync"

	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"

	"github.com/opkit/opkit"
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
	// reconcile: whether a deletion timestamp is set, the finalizers, and
	// the watched labels and annotations.
	fingerprint uint64
	// epoch is the number of the latest (re)list that saw the object; after
	// a complete list, entries with an older epoch have vanished.
	epoch uint32
}

// record is one unsettled delete in the ledger: the object's UID and last
// resourceVersion, and its final state (nil for a tombstone: a relist
// found the object gone, its delete was not decodable, or the ledger kept
// MaxFinalStates final states already).
type record[T opkit.Object] struct {
	uid, rv string
	final   T
	epoch   uint32 // the (re)list during or after which it was recorded
}

// meta is what the watcher reads from an object's metadata.
type meta struct {
	key         opkit.Key
	uid         string
	rv          string
	generation  int64
	fingerprint uint64
}

// readMeta extracts the watcher's view of u without copying the object.
func readMeta(u *unstructured.Unstructured, watchLabels, watchAnnotations []string) meta {
	md, _ := u.Object["metadata"].(map[string]any)
	str := func(k string) string { s, _ := md[k].(string); return s }
	m := meta{
		key: opkit.Key{Namespace: str("namespace"), Name: str("name")},
		uid: str("uid"),
		rv:  str("resourceVersion"),
	}
	switch g := md["generation"].(type) {
	case int64:
		m.generation = g
	case float64:
		m.generation = int64(g)
	case int:
		m.generation = int64(g)
	}

	h := fnv.New64a()
	write := func(s string) { h.Write([]byte(s)); h.Write([]byte{0}) }
	if ts, ok := md["deletionTimestamp"]; ok && ts != nil {
		write("deleting")
	}
	if fs, ok := md["finalizers"].([]any); ok {
		write("finalizers")
		for _, f := range fs {
			s, _ := f.(string)
			write(s)
		}
	}
	hashNamed(h.Write, write, "labels", md["labels"], watchLabels)
	hashNamed(h.Write, write, "annotations", md["annotations"], watchAnnotations)
	m.fingerprint = h.Sum64()
	return m
}

// hashNamed feeds the values of the named keys of a string map into the hash,
// distinguishing an absent key from an empty value.
func hashNamed(raw func([]byte) (int, error), write func(string), section string, v any, names []string) {
	if len(names) == 0 {
		return
	}
	m, _ := v.(map[string]any)
	write(section)
	for _, n := range names {
		val, ok := m[n]
		if !ok {
			raw([]byte{1})
			continue
		}
		s, _ := val.(string)
		write(n)
		write(s)
	}
}

// tracker holds what one watcher remembers: the live objects it sees, and
// the ledger of unsettled deletes. It is owned by Run's goroutine (and
// survives across Runs, so a new Run can detect objects deleted while no
// Run was active, and deliver the deletes a previous Run's queue lost):
// only that goroutine adds and changes entries and records. Every access
// holds mu, because the controller's workers read the ledger and the
// latest resourceVersions, and settle records, from other goroutines.
type tracker[T opkit.Object] struct {
	mu      sync.RWMutex
	entries map[opkit.Key]entry
	// ledger holds, per key, the unsettled deletes in resourceVersion
	// order (see Watcher.Deletes).
	ledger   map[opkit.Key][]record[T]
	nRecords int
	nFinal   int // records that keep a final state
	// namespaces interns namespace strings so that keys share them;
	// namespaces no key uses any more are dropped by pruneNamespaces.
	namespaces map[string]string
	nsKept     int // namespaces in use at the last prune
	epoch      uint32
}

func newTracker[T opkit.Object]() *tracker[T] {
	return &tracker[T]{
		entries:    make(map[opkit.Key]entry),
		ledger:     make(map[opkit.Key][]record[T]),
		namespaces: make(map[string]string),
	}
}

// pruneNamespaces drops the interned namespaces no tracked key uses any
// more, once the table has doubled since the last prune, so that a cluster
// that keeps creating and deleting namespaces does not grow it for ever.
// Only Run's goroutine calls it (it alone touches the table); it costs a
// pass over the keys, paid for by the list that calls it.
func (t *tracker[T]) pruneNamespaces() {
	if len(t.namespaces) <= 2*max(t.nsKept, 16) {
		return
	}
	used := make(map[string]struct{}, t.nsKept)
	t.mu.RLock()
	for k := range t.entries {
		used[k.Namespace] = struct{}{}
	}
	for k := range t.ledger {
		used[k.Namespace] = struct{}{}
	}
	t.mu.RUnlock()
	for ns := range t.namespaces {
		if _, ok := used[ns]; !ok {
			delete(t.namespaces, ns)
		}
	}
	t.nsKept = len(t.namespaces)
}

// canonical returns a key whose strings do not alias the decoded object,
// with the namespace interned.
func (t *tracker[T]) canonical(k opkit.Key) opkit.Key {
	ns, ok := t.namespaces[k.Namespace]
	if !ok {
		ns = strings.Clone(k.Namespace)
		t.namespaces[ns] = ns
	}
	return opkit.Key{Namespace: ns, Name: strings.Clone(k.Name)}
}

// store records m, marking it seen in the current epoch when listing.
func (t *tracker[T]) store(m meta, seen bool, old entry, known bool) {
	e := entry{
		generation:  m.generation,
		fingerprint: m.fingerprint,
		epoch:       old.epoch,
	}
	if seen {
		e.epoch = t.epoch
	}
	if known && old.uid == m.uid {
		e.uid = old.uid // already a private copy
	} else {
		e.uid = strings.Clone(m.uid)
	}
	e.rv = strings.Clone(m.rv)
	// Always a canonical key: assigning to an existing string key replaces
	// the stored key too, so an aliasing key would undo the interning.
	k := t.canonical(m.key)
	t.mu.Lock()
	t.entries[k] = e
	t.mu.Unlock()
}

// get returns the entry of key.
func (t *tracker[T]) get(key opkit.Key) (entry, bool) {
	t.mu.RLock()
	e, ok := t.entries[key]
	t.mu.RUnlock()
	return e, ok
}

// count returns how many live objects and unsettled deletes the tracker
// holds.
func (t *tracker[T]) count() int {
	t.mu.RLock()
	defer t.mu.RUnlock()
	return len(t.entries) + t.nRecords
}

// gone records the delete of the object key (uid, last resourceVersion
// rv), with its final state unless final is nil, and stops tracking it as
// live. It keeps at most maxFinal final states in all (beyond, a tombstone)
// and perKey records per key: it returns the record it dropped to make
// room, if it had to.
func (t *tracker[T]) gone(key opkit.Key, uid, rv string, final T, maxFinal, perKey int) (dropped *record[T]) {
	k := t.canonical(key)
	t.mu.Lock()
	defer t.mu.Unlock()
	if e, ok := t.entries[k]; ok && e.uid == uid {
		delete(t.entries, k)
	}
	r := record[T]{uid: strings.Clone(uid), rv: strings.Clone(rv), epoch: t.epoch}
	if !isNil(final) && t.nFinal < maxFinal {
		r.final = final
		t.nFinal++
	}
	rs := append(t.ledger[k], r) // the watch reports deletes in resourceVersion order
	t.nRecords++
	if len(rs) > perKey {
		d := rs[0]
		dropped = &d
		rs = slices.Delete(rs, 0, 1)
		t.forgot(d)
	}
	t.ledger[k] = rs
	return dropped
}

// back drops the records of uid under key: the object is in the watch
// again (it had left the label selector and came back), so it was not
// deleted. It costs a read lock when there is nothing to drop.
func (t *tracker[T]) back(key opkit.Key, uid string) {
	t.mu.RLock()
	found := slices.ContainsFunc(t.ledger[key], func(r record[T]) bool { return r.uid == uid })
	t.mu.RUnlock()
	if found {
		t.mu.Lock()
		t.drop(key, func(r record[T]) bool { return r.uid == uid })
		t.mu.Unlock()
	}
}

// settle drops the record of the delete of uid at rv under key, if it is
// still there. The same object can be deleted more than once (it leaves a
// label selector, comes back and leaves again): each delete is settled on
// its own.
func (t *tracker[T]) settle(key opkit.Key, uid, rv string) {
	t.mu.Lock()
	defer t.mu.Unlock()
	t.drop(key, func(r record[T]) bool { return r.uid == uid && r.rv == rv })
}

// drop removes the records of key that match; the caller holds mu.
func (t *tracker[T]) drop(key opkit.Key, match func(record[T]) bool) {
	rs, ok := t.ledger[key]
	if !ok {
		return
	}
	kept := rs[:0]
	for _, r := range rs {
		if match(r) {
			t.forgot(r)
		} else {
			kept = append(kept, r)
		}
	}
	clear(rs[len(kept):])
	if len(kept) == 0 {
		delete(t.ledger, key)
	} else {
		t.ledger[key] = kept
	}
}

// forgot counts a record out; the caller holds mu.
func (t *tracker[T]) forgot(r record[T]) {
	t.nRecords--
	if !isNil(r.final) {
		t.nFinal--
	}
}

// records returns a copy of key's records, oldest first.
func (t *tracker[T]) records(key opkit.Key) []record[T] {
	t.mu.RLock()
	defer t.mu.RUnlock()
	return slices.Clone(t.ledger[key])
}

// ledgerKeys returns the keys with unsettled deletes that the list of the
// current epoch did not add: it listed no live object of the name and
// recorded none of its deletes.
func (t *tracker[T]) ledgerKeys() []opkit.Key {
	t.mu.RLock()
	defer t.mu.RUnlock()
	var out []opkit.Key
	for k, rs := range t.ledger {
		e, live := t.entries[k]
		if !slices.ContainsFunc(rs, func(r record[T]) bool { return r.epoch == t.epoch }) && (!live || e.epoch != t.epoch) {
			out = append(out, k)
		}
	}
	return out
}

// keyed is a tracked key with its entry.
type keyed struct {
	key opkit.Key
	entry
}

// vanished returns, sorted by key, the live objects not seen by the list
// of the current epoch: the objects gone since.
func (t *tracker[T]) vanished() []keyed {
	var out []keyed
	t.mu.RLock()
	for k, e := range t.entries {
		if e.epoch != t.epoch {
			out = append(out, keyed{k, e})
		}
	}
	t.mu.RUnlock()
	slices.SortFunc(out, func(a, b keyed) int {
		if c := strings.Compare(a.key.Namespace, b.key.Namespace); c != 0 {
			return c
		}
		return strings.Compare(a.key.Name, b.key.Name)
	})
	return out
}

// isNil reports whether obj is a nil T.
func isNil[T opkit.Object](obj T) bool {
	var zero T
	return any(obj) == any(zero)
}
