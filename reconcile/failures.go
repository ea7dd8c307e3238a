package reconcile

import (
	"sync"

	"k8s.io/apimachinery/pkg/types"

	"github.com/opkit/opkit"
)

// failures counts, per key, the consecutive failed reconciles of one
// object (by UID) since it last succeeded, whatever requests they served.
// The controller's retry delay grows with it, so that a new event merged
// into a pending retry (which starts a new request, retry 0) does not
// restart the backoff, as controller-runtime's per-item rate limiter does
// not. An entry lives only while its key is failing: any other outcome
// removes it, and the map is emptied when a term ends (its queue is
// cleared), so it holds at most the keys with a retry pending or in
// flight. Deletes keep no streak.
type failures struct {
	mu sync.Mutex
	m  map[opkit.Key]failure
}

type failure struct {
	uid types.UID // "" until a failed reconcile had an object
	n   int
}

// fail records a failed reconcile of key's object uid ("" when unknown)
// and returns the key's consecutive failures, this one included. A
// failure of another object of the same name (deleted and created again)
// starts the count again.
func (f *failures) fail(key opkit.Key, uid types.UID) int {
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.m == nil {
		f.m = make(map[opkit.Key]failure)
	}
	e := f.m[key]
	if e.uid != "" && uid != "" && e.uid != uid {
		e = failure{}
	}
	e.n++
	if uid != "" {
		e.uid = uid
	}
	f.m[key] = e
	return e.n
}

// forget ends the failure streak of key's object uid: it succeeded, was
// given up on, or no longer needs a reconcile. A streak of another object
// of the name (a recreated one, failing while the old one's delete is
// retried) stays; an unknown uid ("") on either side ends any.
func (f *failures) forget(key opkit.Key, uid types.UID) {
	f.mu.Lock()
	if e, ok := f.m[key]; ok && (uid == "" || e.uid == "" || e.uid == uid) {
		delete(f.m, key)
	}
	f.mu.Unlock()
}

// reset forgets every key's streak.
func (f *failures) reset() {
	f.mu.Lock()
	clear(f.m)
	f.mu.Unlock()
}

// len reports how many keys are failing.
func (f *failures) len() int {
	f.mu.Lock()
	defer f.mu.Unlock()
	return len(f.m)
}
