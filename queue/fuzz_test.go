package queue_test

import (
	"context"
	"errors"
	"fmt"
	"testing"
	"testing/synctest"
	"time"

	"github.com/opkit/opkit/queue"
)

// The model: per key, the entry in flight (if any) and the entry held for
// it (at most one: pending if nothing is in flight, else parked).
type modelEntry struct {
	val, prio int
	due       time.Time
	// since is when the entry last joined the pending entries of its
	// priority (added, made pending by Done, or raised while due), and seq
	// orders those moments; first come first served among due entries of
	// one priority goes by max(due, since).
	since time.Time
	seq   int
}

// eligible is when e could first be handed out.
func (e *modelEntry) eligible() time.Time {
	if e.due.After(e.since) {
		return e.due
	}
	return e.since
}

type modelKey struct {
	inflight *modelEntry
	held     []*modelEntry
}

type model struct {
	keys      map[int]*modelKey
	suspended bool
	shutdown  bool
	shutAt    time.Time // nothing due later is handed out after shutdown
	seq       int
}

// pend records that e joins the pending entries of its priority now.
func (m *model) pend(e *modelEntry, now time.Time) {
	m.seq++
	e.since, e.seq = now, m.seq
}

// cap returns now, or the shutdown time if that is earlier.
func (m *model) cap(now time.Time) time.Time {
	if m.shutdown && m.shutAt.Before(now) {
		return m.shutAt
	}
	return now
}

// fuzzMerge joins payloads that are sets of bits: union, a join.
func fuzzMerge(held *int, incoming int) { *held |= incoming }

func (m *model) add(k, v int, o queue.AddOptions, now time.Time) queue.Outcome {
	if m.shutdown {
		return queue.DroppedShutDown
	}
	if m.suspended {
		return queue.DroppedSuspended
	}
	mk := m.keys[k]
	if mk == nil {
		mk = &modelKey{}
		m.keys[k] = mk
	}
	due := now
	if o.Delay > 0 {
		due = now.Add(o.Delay)
	}
	if o.MergeOnly && (len(mk.held) == 0 || mk.held[0].due.After(due)) {
		// Nothing waiting to merge into, or an entry the merge would
		// make earlier.
		return queue.NotHeld
	}
	e := &modelEntry{val: v, prio: o.Priority, due: due}
	switch {
	case mk.inflight == nil && len(mk.held) == 0:
		mk.held = append(mk.held, e)
		m.pend(e, now)
		return queue.Queued
	case len(mk.held) == 0:
		mk.held = append(mk.held, e) // parked behind the entry in flight
		return queue.Merged
	}
	m.mergeInto(mk, e, now)
	return queue.Merged
}

// mergeInto merges e (an add) into the entry held for mk: the union of the
// payloads, the earliest due time (a due pending entry keeps its own) and
// the highest priority.
func (m *model) mergeInto(mk *modelKey, e *modelEntry, now time.Time) {
	t := mk.held[0]
	t.val |= e.val
	pending := mk.inflight == nil
	wasDue := !t.due.After(now)
	if !(pending && wasDue) && e.due.Before(t.due) {
		t.due = e.due
	}
	// A pending entry joins the due entries of its priority now if this
	// add makes it due, or raises the priority of a due one.
	if pending && (!wasDue && !t.due.After(now) || wasDue && e.prio > t.prio) {
		m.pend(t, now)
	}
	t.prio = max(t.prio, e.prio)
}

func (m *model) held() int {
	n := 0
	for _, mk := range m.keys {
		n += len(mk.held)
	}
	return n
}

// checkGet compares what Get returned (ok false: nothing) with the model,
// and moves the model's entry in flight.
func (m *model) checkGet(it queue.Item[int, int], ok bool, now time.Time) error {
	return m.checkGetAtLeast(it, ok, now, -1<<62)
}

// checkGetAtLeast is checkGet for GetAtLeast(min): only entries of
// priority min or higher count.
func (m *model) checkGetAtLeast(it queue.Item[int, int], ok bool, now time.Time, min int) error {
	now = m.cap(now)
	best := -1 << 62
	for _, mk := range m.keys {
		if mk.inflight == nil && len(mk.held) > 0 && !mk.held[0].due.After(now) && mk.held[0].prio >= min {
			best = max(best, mk.held[0].prio)
		}
	}
	if !ok {
		if best != -1<<62 {
			return fmt.Errorf("Get(min %d) returned nothing, but an entry of priority %d is due", min, best)
		}
		return nil
	}
	mk := m.keys[it.Key]
	switch {
	case mk == nil || len(mk.held) == 0:
		return fmt.Errorf("Get returned %+v, the model holds nothing for it", it)
	case mk.inflight != nil:
		return fmt.Errorf("Get returned key %d which is already in flight", it.Key)
	}
	e := mk.held[0]
	switch {
	case e.due.After(now):
		return fmt.Errorf("Get returned %+v before its due time %v (now %v)", it, e.due, now)
	case it.Priority < best:
		return fmt.Errorf("Get returned priority %d while %d is due", it.Priority, best)
	case it.Value != e.val || it.Priority != e.prio:
		return fmt.Errorf("Get returned %+v, model expects %+v", it, *e)
	}
	if err := m.checkFirstCome(it.Key, e, now); err != nil {
		return err
	}
	mk.inflight, mk.held = e, mk.held[1:]
	return nil
}

// checkFirstCome checks that e, handed out for key, came first among the
// due entries of its priority: none became eligible before it. Among
// entries that became eligible at the same instant, those that fell due
// then (promoted from the delay heap) go first in any order, then those
// that joined then, in the order they joined.
func (m *model) checkFirstCome(key int, e *modelEntry, now time.Time) error {
	fellDue := func(x *modelEntry) bool { return x.due.After(x.since) }
	for k, mk := range m.keys {
		if k == key || mk.inflight != nil || len(mk.held) == 0 {
			continue
		}
		x := mk.held[0]
		if x.prio != e.prio || x.due.After(now) {
			continue
		}
		switch xe, ee := x.eligible(), e.eligible(); {
		case xe.Before(ee):
		case xe.Equal(ee) && fellDue(x) && !fellDue(e):
		case xe.Equal(ee) && !fellDue(x) && !fellDue(e) && x.seq < e.seq:
		default:
			continue
		}
		return fmt.Errorf("Get returned key %d (priority %d, eligible %v, seq %d) before key %d (eligible %v, seq %d)",
			key, e.prio, e.eligible(), e.seq, k, x.eligible(), x.seq)
	}
	return nil
}

// FuzzQueueAgainstModel drives the queue with random sequences of add, get,
// get-at-least, done, suspend, resume, clear, shutdown and time advances
// (synctest's fake clock; odd millisecond delays, and sleeps to a due time
// or 1ns before it), and checks it against the model after every step:
// never two holders of a key, nothing handed out before due (nor, after
// shutdown, anything that was not due at it), priority order among due
// entries and first come first served within a priority, merged
// payload/priority/due as specified, drops only while suspended or
// shut down, Clear and Len counts. At the end every accepted group of adds
// is handed out exactly once. Blocking Gets and their wake-ups are left to
// the unit tests: every Get here has a cancelled context.
func FuzzQueueAgainstModel(f *testing.F) {
	f.Add([]byte{0, 1, 0, 3, 0, 0, 5, 1, 0})
	f.Add([]byte{0, 1, 4, 0, 1, 9, 3, 0, 0, 9, 0, 7, 3, 0, 0, 5, 1, 0, 3, 0, 0})
	f.Add([]byte{0, 2, 1, 6, 0, 0, 0, 2, 1, 8, 0, 0, 7, 0, 0, 0, 3, 2, 3, 0, 0})
	f.Add([]byte{1, 1, 0, 3, 0, 0, 1, 1, 3, 2, 1, 8, 5, 1, 0, 3, 0, 0, 10, 0, 0, 3, 0, 0})
	f.Add([]byte{0, 1, 8, 0, 2, 0, 4, 0, 3, 4, 0, 3, 3, 0, 0, 5, 1, 0, 0, 1, 9, 9, 0, 7, 4, 0, 3})
	f.Add([]byte{0, 1, 0, 0, 2, 9, 9, 0, 5, 3, 0, 0, 1, 2, 0, 5, 1, 0, 3, 0, 0, 0}) // no metrics
	// an add after a delayed entry of another key fell due unnoticed
	f.Add([]byte{0, 0, 5, 0, 1, 4, 0, 2, 0, 0, 2, 0, 0, 2, 0, 0, 2, 0, 0, 2, 0, 0, 3, 0, 0, 3, 0, 0, 3, 0, 9, 0, 4, 0, 1, 4, 3, 0, 0})
	// MergeOnly adds into a delayed and a parked entry, due later than the
	// add (NotHeld) and no later (Merged); with and without metrics
	mo := []byte{0, 1, 2, 1, 1, 128, 1, 1, 131, 3, 0, 0, 0, 2, 0, 3, 0, 0, 0, 2, 1, 1, 2, 128, 1, 2, 129, 5, 2, 0, 9, 0, 4, 1, 2, 128, 3, 0, 0, 3, 0, 0}
	f.Add(mo)
	f.Add(append(mo[:len(mo):len(mo)], 0))
	f.Fuzz(func(t *testing.T, ops []byte) {
		synctest.Test(t, func(t *testing.T) {
			runModel(t, ops)
		})
	})
}

func runModel(t *testing.T, ops []byte) {
	// The bytes left over after the last operation (len%3) pick the
	// configuration: metrics (which read the clock more often), except
	// with exactly one left over.
	cfg := queue.Config[int]{Merge: fuzzMerge}
	if len(ops)%3 != 1 {
		cfg.Metrics = nopMetrics{}
	}
	q := queue.New[int, int](cfg)
	m := &model{keys: map[int]*modelKey{}}
	next := 1
	for len(ops) >= 3 {
		op, k, arg := ops[0]%11, int(ops[1]%6), int(ops[2])
		// The key byte's high bits make delays and sleeps odd numbers of
		// milliseconds, so that an entry handed out early by any amount
		// shows (with round numbers, up to half a step went unseen).
		jitter := time.Duration(ops[1]>>3) * time.Millisecond
		ops = ops[3:]
		now := time.Now()
		switch op {
		case 0, 1, 2:
			o := queue.AddOptions{
				Delay:    time.Duration(arg%4) * 100 * time.Millisecond,
				Priority: (arg>>2)%3 - 1,
			}
			if o.Delay > 0 {
				o.Delay += jitter
			}
			if op == 2 { // many priorities: more levels than the queue keeps empty ones
				o.Priority = (arg>>2)%48 - 24
			}
			o.MergeOnly = op == 1 && arg&0x80 != 0
			v := 1 << (next % 30) // one bit per add: the union shows every add merged
			next++
			want := m.add(k, v, o, now)
			if got := q.Add(k, v, o); got != want {
				t.Fatalf("Add(%d, %d, %+v) = %v, model says %v", k, v, o, got, want)
			}
		case 3:
			it, ok := tryGet(t, q)
			if err := m.checkGet(it, ok, now); err != nil {
				t.Fatal(err)
			}
		case 4:
			min := arg%5 - 2
			if arg&0x80 != 0 { // reach into the many priorities of op 2
				min = arg%48 - 24
			}
			it, err := q.GetAtLeast(cancelled(), min)
			ok := err == nil
			if !ok && !errors.Is(err, context.Canceled) && !errors.Is(err, queue.ErrShutDown) {
				t.Fatalf("GetAtLeast: %v", err)
			}
			if err := m.checkGetAtLeast(it, ok, now, min); err != nil {
				t.Fatal(err)
			}
		case 5:
			for i := range 6 {
				kk := (k + i) % 6
				if mk := m.keys[kk]; mk != nil && mk.inflight != nil {
					mk.inflight = nil
					if len(mk.held) > 0 {
						m.pend(mk.held[0], now) // a parked successor becomes pending
					}
					q.Done(kk)
					break
				}
			}
		case 6:
			q.Suspend()
			m.suspended = true
		case 7:
			q.Resume()
			m.suspended = false
		case 8:
			want := m.held()
			for _, mk := range m.keys {
				mk.held = nil
			}
			if got := q.Clear(); got != want {
				t.Fatalf("Clear = %d, model says %d", got, want)
			}
		case 9, 10:
			switch {
			case op == 10 && arg%4 == 0:
				q.ShutDown()
				if !m.shutdown { // ShutDown is idempotent: the first one counts
					m.shutdown, m.shutAt = true, now
				}
				continue
			case op == 10 && arg%4 == 1 || op == 10 && arg%4 == 2:
				// To the next due time, or 1ns before it: an entry handed
				// out early by the least amount shows.
				if next, ok := m.nextDue(now); ok {
					d := next.Sub(now)
					if arg%4 == 1 {
						d--
					}
					time.Sleep(d)
				}
			default:
				time.Sleep(time.Duration(arg%8)*50*time.Millisecond + jitter)
			}
		}
		if got, want := q.Len(), m.held(); got != want {
			t.Fatalf("Len = %d, model says %d", got, want)
		}
	}
	// Drain: resume, let every delay pass, and finish everything.
	q.Resume()
	m.suspended = false
	time.Sleep(time.Second)
	done := func(k int) {
		mk := m.keys[k]
		mk.inflight = nil
		if len(mk.held) > 0 {
			m.pend(mk.held[0], time.Now())
		}
		q.Done(k)
	}
	for k, mk := range m.keys {
		if mk.inflight != nil {
			done(k)
		}
	}
	for {
		now := time.Now()
		it, ok := tryGet(t, q)
		if err := m.checkGet(it, ok, now); err != nil {
			t.Fatal(err)
		}
		if !ok {
			break
		}
		done(it.Key)
	}
	// Everything accepted was handed out, except, after a shutdown, the
	// entries that were not due at it (and what is parked behind them).
	for k, mk := range m.keys {
		if len(mk.held) > 0 && (!m.shutdown || !mk.held[0].due.After(m.shutAt)) {
			t.Fatalf("after drain the model still holds %d entries for key %d (due %v, shutdown %v at %v)",
				len(mk.held), k, mk.held[0].due, m.shutdown, m.shutAt)
		}
	}
	if n := m.held(); q.Len() != n {
		t.Fatalf("after drain Len = %d, model holds %d", q.Len(), n)
	}
}

// nextDue returns the earliest due time after now among pending entries.
func (m *model) nextDue(now time.Time) (time.Time, bool) {
	var next time.Time
	found := false
	for _, mk := range m.keys {
		if mk.inflight == nil && len(mk.held) > 0 && mk.held[0].due.After(now) && (!found || mk.held[0].due.Before(next)) {
			next, found = mk.held[0].due, true
		}
	}
	return next, found
}
