package reconcile

import (
	"sync"
	"time"

	"github.com/opkit/opkit"
	"github.com/opkit/opkit/queue"
)

// retries is the controller's one retry policy, in the spirit of
// client-go's rate limiters: per key, the number of consecutive turns that
// failed. when records a failed turn and returns the backoff delay for the
// count; forget ends the streak (a turn without failures, or the end of a
// term). A new change for a failing key does not reset it: the change is
// taken at once, and if that turn fails too its retry waits longer. A key
// is in the map only while it is failing.
type retries struct {
	backoff queue.Backoff
	mu      sync.Mutex
	n       map[opkit.Key]int
}

// count returns key's failed turns, raised to at least seed (a trigger
// can seed it).
func (r *retries) count(key opkit.Key, seed int) int {
	r.mu.Lock()
	defer r.mu.Unlock()
	if seed > r.n[key] {
		r.n[key] = seed
	}
	return r.n[key]
}

// when records a failed turn of key and returns the delay before the next.
func (r *retries) when(key opkit.Key) time.Duration {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.n[key]++
	return r.backoff.Delay(r.n[key])
}

// forget ends key's streak.
func (r *retries) forget(key opkit.Key) {
	r.mu.Lock()
	delete(r.n, key)
	r.mu.Unlock()
}

// reset forgets every key's streak.
func (r *retries) reset() {
	r.mu.Lock()
	clear(r.n)
	r.mu.Unlock()
}
