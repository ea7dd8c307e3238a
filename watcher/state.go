package watcher

import (
	"hash/fnv"
	"slices"
	"strings"
	"sync"

	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"

	"github.com/opkit/opkit"
)

// entry is everything the watcher remembers about one object. It is kept
// deliberately small (about 60 bytes plus the UID and resourceVersion
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
	// queuedIn is, for a tombstone whose delete the queue accepted, the Run
	// that handed it over (tracker.run); 0 while the queue has not taken
	// it. Only a later Run's first list emits it again: its queue may have
	// lost it (cleared at the end of a leader's term).
	queuedIn uint16
	// deleted marks a tombstone: the object is gone, but its delete is kept
	// until it is settled (see Watcher.Settle), or, when the queue did not
	// accept it, until a list emits it again.
	deleted bool
}

// reemit reports whether a list (initial: a Run's first; run: the current
// Run) or a recreation of the object emits the delete of e again: any
// vanished live object's, and a tombstone's unless the queue took it in
// this Run. A delete the queue took during this Run's first list (a
// streamed list takes changes as they come) is not sent twice.
func (e entry) reemit(initial bool, run uint16) bool {
	return !e.deleted || e.queuedIn == 0 || initial && e.queuedIn != run
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

// tracker holds the entries of one watcher. It is owned by Run's goroutine
// (and survives across Runs, so a new Run can detect objects deleted while
// no Run was active): only that goroutine adds and changes entries. Every
// access holds mu, because other goroutines read entries
// (Watcher.ResourceVersion) and drop settled tombstones (Watcher.Settle).
type tracker struct {
	mu      sync.RWMutex
	entries map[opkit.Key]entry
	// earlier holds, per key, the tombstones of earlier objects of that
	// name, oldest first, whose deletes are still kept (the queue did not
	// take them, or, with RetainDeletes, they are not settled yet) while
	// entries tracks a newer object of the same name: an object deleted
	// and created again must not take its predecessor's delete with it.
	earlier  map[opkit.Key][]entry
	nEarlier int
	// namespaces interns namespace strings so that keys share them;
	// namespaces no key uses any more are dropped by pruneNamespaces.
	namespaces map[string]string
	nsKept     int // namespaces in use at the last prune
	epoch      uint32
	// run numbers the Runs (never 0; it wraps, which is harmless: a
	// tombstone a Run's first list re-emits takes that Run's number).
	run uint16
}

func newTracker() *tracker {
	return &tracker{
		entries:    make(map[opkit.Key]entry),
		earlier:    make(map[opkit.Key][]entry),
		namespaces: make(map[string]string),
	}
}

// pruneNamespaces drops the interned namespaces no tracked key uses any
// more, once the table has doubled since the last prune, so that a cluster
// that keeps creating and deleting namespaces does not grow it for ever.
// Only Run's goroutine calls it (it alone touches the table); it costs a
// pass over the keys, paid for by the list that calls it.
func (t *tracker) pruneNamespaces() {
	if len(t.namespaces) <= 2*max(t.nsKept, 16) {
		return
	}
	used := make(map[string]struct{}, t.nsKept)
	t.mu.RLock()
	for k := range t.entries {
		used[k.Namespace] = struct{}{}
	}
	for k := range t.earlier {
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

// nextRun numbers a new Run; only Run's goroutine calls it, before the
// Run touches the tracker.
func (t *tracker) nextRun() {
	t.mu.Lock()
	t.run++
	if t.run == 0 {
		t.run = 1
	}
	t.mu.Unlock()
}

// canonical returns a key whose strings do not alias the decoded object,
// with the namespace interned.
func (t *tracker) canonical(k opkit.Key) opkit.Key {
	ns, ok := t.namespaces[k.Namespace]
	if !ok {
		ns = strings.Clone(k.Namespace)
		t.namespaces[ns] = ns
	}
	return opkit.Key{Namespace: ns, Name: strings.Clone(k.Name)}
}

// store records m, marking it seen in the current epoch when listing.
func (t *tracker) store(m meta, seen bool, old entry, known bool) {
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
func (t *tracker) get(key opkit.Key) (entry, bool) {
	t.mu.RLock()
	e, ok := t.entries[key]
	t.mu.RUnlock()
	return e, ok
}

// count returns how many entries the tracker holds, tombstones (earlier
// objects' included) too.
func (t *tracker) count() int {
	t.mu.RLock()
	defer t.mu.RUnlock()
	return len(t.entries) + t.nEarlier
}

// displace keeps e, the entry of an earlier object of key as the caller
// read it, as a tombstone behind the newer object now tracked under key.
// It keeps nothing and reports false when e was a tombstone that has been
// settled since the caller read it (Settle runs on other goroutines).
func (t *tracker) displace(key opkit.Key, e entry) bool {
	wasDeleted := e.deleted
	e.deleted = true
	k := t.canonical(key)
	t.mu.Lock()
	defer t.mu.Unlock()
	switch cur, ok := t.entries[k]; {
	case ok && cur.uid == e.uid && cur.rv == e.rv:
		delete(t.entries, k) // store puts the newer object there next
	case wasDeleted:
		return false
	}
	t.earlier[k] = append(t.earlier[k], e)
	t.nEarlier++
	return true
}

// earlierOf returns a copy of the tombstones kept for earlier objects of
// key, oldest first.
func (t *tracker) earlierOf(key opkit.Key) []entry {
	t.mu.RLock()
	defer t.mu.RUnlock()
	if t.nEarlier == 0 {
		return nil
	}
	return slices.Clone(t.earlier[key])
}

// reemitted records the outcome of emitting again the delete of the
// earlier object of key with uid and rv: it is forgotten if the queue took
// it and retain is false, else kept with queued telling whether the queue
// took it. inList marks it seen by the current list, which then does not
// emit it again when it finishes.
func (t *tracker) reemitted(key opkit.Key, uid, rv string, accepted, retain, inList bool) {
	t.mu.Lock()
	defer t.mu.Unlock()
	es := t.earlier[key]
	for i := range es {
		if es[i].uid != uid || es[i].rv != rv {
			continue
		}
		if accepted && !retain {
			t.dropEarlier(key, i)
			return
		}
		es[i].queuedIn = 0
		if accepted {
			es[i].queuedIn = t.run
		}
		if inList {
			es[i].epoch = t.epoch
		}
		return
	}
}

// dropEarlier forgets the tombstone i of the earlier objects of key; the
// caller holds mu.
func (t *tracker) dropEarlier(key opkit.Key, i int) {
	es := slices.Delete(t.earlier[key], i, i+1)
	if len(es) == 0 {
		delete(t.earlier, key)
	} else {
		t.earlier[key] = es
	}
	t.nEarlier--
}

// hold keeps key as a tombstone of the object with uid and last
// resourceVersion rv, its delete about to be handed to the queue (queued
// until unqueued says otherwise). Its epoch stays that of the last list
// that saw the object, so the next list that completes finds it vanished.
func (t *tracker) hold(key opkit.Key, uid, rv string) {
	t.mu.Lock()
	e := t.entries[key]
	if e.uid != uid {
		uid = strings.Clone(uid)
	}
	if e.rv != rv {
		rv = strings.Clone(rv)
	}
	if e.epoch == t.epoch {
		e.epoch = t.epoch - 1
	}
	t.entries[t.canonical(key)] = entry{uid: uid, rv: rv, epoch: e.epoch, deleted: true, queuedIn: t.run}
	t.mu.Unlock()
}

// unqueued records that the queue did not take the delete of the
// tombstone of key and uid, if it is still held.
func (t *tracker) unqueued(key opkit.Key, uid string) {
	t.mu.Lock()
	if e, ok := t.entries[key]; ok && e.deleted && e.uid == uid {
		e.queuedIn = 0
		t.entries[key] = e
	}
	t.mu.Unlock()
}

// settle forgets the tombstone of key if it is still the one of uid and
// rv: the same object can be deleted more than once (it leaves a label
// selector, comes back and leaves again), and each of its deletes is
// settled by its own reconcile.
func (t *tracker) settle(key opkit.Key, uid, rv string) {
	t.mu.Lock()
	defer t.mu.Unlock()
	if e, ok := t.entries[key]; ok && e.deleted && e.uid == uid && e.rv == rv {
		delete(t.entries, key)
		return
	}
	for i, e := range t.earlier[key] {
		if e.uid == uid && e.rv == rv {
			t.dropEarlier(key, i)
			return
		}
	}
}

// keyed is a tracked key with its entry; earlier marks the tombstone of an
// earlier object of the key (see tracker.earlier).
type keyed struct {
	key opkit.Key
	entry
	earlier bool
}

// vanished returns, sorted by key, the entries not seen by the list of the
// current epoch: the objects gone since, and the tombstones whose delete
// is to be emitted again (all of them in a Run's first list, else those
// the queue did not take). The tombstones of a key's earlier objects come
// first, oldest first.
func (t *tracker) vanished(initial bool) []keyed {
	var out []keyed
	t.mu.RLock()
	for k, es := range t.earlier {
		for _, e := range es {
			if e.epoch != t.epoch && e.reemit(initial, t.run) {
				out = append(out, keyed{k, e, true})
			}
		}
	}
	for k, e := range t.entries {
		if e.epoch != t.epoch && e.reemit(initial, t.run) {
			out = append(out, keyed{k, e, false})
		}
	}
	t.mu.RUnlock()
	slices.SortStableFunc(out, func(a, b keyed) int {
		if c := strings.Compare(a.key.Namespace, b.key.Namespace); c != 0 {
			return c
		}
		return strings.Compare(a.key.Name, b.key.Name)
	})
	return out
}
