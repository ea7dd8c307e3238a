package trigger

import (
	"context"
	"slices"
	"sync"
)

// fairSlots shares n slots between callers, each named by a key (the
// handler's: the user once known, else the client address; the
// authenticator's: the user whose review it is). A request takes a free
// slot at once. When none is free it waits, and a slot given back goes to
// the waiting request whose caller holds the fewest, the earliest of
// those first: however many requests one caller (or a crowd of callers)
// keeps in flight, a caller with none gets the next slot. At most n
// requests wait; a newcomer finding the line full takes the place of the
// latest request of the caller with the most held and waiting, when that
// is more than its own (that request is refused), else it is refused.
type fairSlots struct {
	mu    sync.Mutex
	free  int
	held  map[string]int
	line  []*waiter // in arrival order
	limit int       // of line
}

// waiter is a request waiting for a slot: ready gets true when a slot
// was given to it, false when a newcomer took its place.
type waiter struct {
	key   string
	ready chan bool
}

func newFairSlots(n int) *fairSlots {
	return &fairSlots{free: n, held: map[string]int{}, limit: n}
}

// acquire takes a slot for key, waiting until one is given or ctx ends;
// it reports whether it got one (the caller then calls release(key)).
func (s *fairSlots) acquire(ctx context.Context, key string) bool {
	s.mu.Lock()
	if s.free > 0 {
		s.free--
		s.held[key]++
		s.mu.Unlock()
		return true
	}
	if len(s.line) >= s.limit && !s.evictFor(key) {
		s.mu.Unlock()
		return false
	}
	w := &waiter{key: key, ready: make(chan bool, 1)}
	s.line = append(s.line, w)
	s.mu.Unlock()
	select {
	case ok := <-w.ready:
		return ok
	case <-ctx.Done():
	}
	s.mu.Lock()
	if i := slices.Index(s.line, w); i >= 0 {
		s.line = slices.Delete(s.line, i, i+1)
		s.mu.Unlock()
		return false
	}
	s.mu.Unlock()
	if <-w.ready { // given a slot as ctx ended: give it back
		s.release(key)
	}
	return false
}

// release gives key's slot back: to the waiting request whose caller
// holds the fewest, else to the free ones.
func (s *fairSlots) release(key string) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.held[key]--; s.held[key] <= 0 {
		delete(s.held, key)
	}
	if len(s.line) == 0 {
		s.free++
		return
	}
	next := 0
	for i, w := range s.line {
		if s.held[w.key] < s.held[s.line[next].key] {
			next = i
		}
	}
	w := s.line[next]
	s.line = slices.Delete(s.line, next, next+1)
	s.held[w.key]++
	w.ready <- true
}

// evictFor refuses the latest waiting request of the caller with the
// most slots held and waited for, if that is more than key's, making room
// in the line; the caller holds mu.
func (s *fairSlots) evictFor(key string) bool {
	count := map[string]int{}
	for _, w := range s.line {
		count[w.key]++
	}
	mine, most := count[key]+s.held[key], 0
	for k, n := range count {
		most = max(most, n+s.held[k])
	}
	if most <= mine {
		return false
	}
	for i, w := range slices.Backward(s.line) {
		if k := w.key; count[k]+s.held[k] == most {
			s.line = slices.Delete(s.line, i, i+1)
			w.ready <- false
			return true
		}
	}
	return false
}
