package queue

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"os"
	"strconv"
	"strings"
	"sync"
	"testing"
	"testing/synctest"
	"time"
)

type wres struct {
	it  Item[int, int]
	err error
	at  time.Time
}

type worker struct {
	state  int // 0 idle, 1 blocked, 2 holding
	min    int32
	ch     chan wres
	cancel context.CancelFunc
	key    int
}

// pendingDueViolation returns a description of a pending entry that is due
// (ready, or delayed with due < now) with priority >= min, or "".
func (q *Queue[K, V]) pendingDueViolation(min int32) string {
	q.mu.Lock()
	defer q.mu.Unlock()
	now := q.now()
	if q.shutdown {
		return ""
	}
	for i := int32(0); i < q.nslots; i++ {
		s := q.sl(i)
		st := s.state()
		if s.prio < min {
			continue
		}
		if st == stReady || (st == stDelayed && s.due < now) {
			return fmt.Sprintf("key %v prio %d state %d due %v now %v (nReady %d nDelayed %d waiters %d owner %v)",
				s.key, s.prio, st, time.Duration(s.due), time.Duration(now), q.nReady, q.nDelayed, len(q.waiters), q.owner != nil)
		}
	}
	return ""
}

// TestWaitersStress runs random sequences (one per seed, in a synctest
// bubble) of workers blocked in Get or GetAtLeast with various minimum
// priorities, against adds (delayed or not, of many priorities), merges that
// raise a priority or shorten a delay, parks behind entries in flight,
// cancellations (some at exactly a due time, racing the timer), Done,
// Clear, Suspend/Resume and shutdowns. After every step it checks that no
// blocked worker is left with an entry it would take that is due, that
// nothing is handed out before it is due or below a GetAtLeast's minimum
// or to two holders, and at the end that every accepted add was handed
// out. STRESS_N sets the number of seeds (default 3000), STRESS_WIDE=1
// uses 150 keys and 41 priorities, STRESS_STEP=1 advances time one due
// time at a time (to catch entries handed out late).
func TestWaitersStress(t *testing.T) {
	n := 3000
	if s := os.Getenv("STRESS_N"); s != "" {
		n, _ = strconv.Atoi(s)
	}
	for seed := range n {
		synctest.Test(t, func(t *testing.T) {
			runStress(t, uint64(seed))
		})
		if t.Failed() {
			return
		}
	}
}

func runStress(t *testing.T, seed uint64) {
	rng := rand.New(rand.NewPCG(seed, 7))
	var cfg Config[int]
	if rng.IntN(2) == 0 {
		cfg.Metrics = nopM{} // the clock-reading paths
	}
	q := New[int, int](cfg)
	nw := 2 + rng.IntN(6)
	holder := map[int]int{}
	dirty := map[int]bool{}
	var dirtyMu sync.Mutex
	var log []string
	fail := func(f string, a ...any) {
		t.Helper()
		t.Fatalf("seed %d: "+f+"\nlog:\n%s", append([]any{seed}, append(a, strings.Join(log, "\n"))...)...)
	}
	prios := []int{-3, 0, 1, 5, 10}
	nkeys := 6
	if os.Getenv("STRESS_WIDE") != "" {
		nkeys = 150
		prios = nil
		for p := -20; p <= 20; p++ {
			prios = append(prios, p)
		}
		nw = 2 + rng.IntN(14)
	}
	ws := make([]*worker, nw)
	for i := range ws {
		ws[i] = &worker{}
	}
	mins := []int32{anyPriority, anyPriority, -3, 0, 1, 5, 10, 11, 19}
	shut := false
	collect := func() {
		for i, w := range ws {
			if w.state != 1 {
				continue
			}
			select {
			case r := <-w.ch:
				if r.err != nil {
					if !errors.Is(r.err, context.Canceled) && !errors.Is(r.err, ErrShutDown) {
						fail("worker %d: %v", i, r.err)
					}
					if errors.Is(r.err, ErrShutDown) && !shut {
						fail("worker %d: ErrShutDown before shutdown", i)
					}
					log = append(log, fmt.Sprintf("  w%d -> %v", i, r.err))
					w.state = 0
					continue
				}
				log = append(log, fmt.Sprintf("  w%d -> key %d prio %d", i, r.it.Key, r.it.Priority))
				if int32(r.it.Priority) < w.min {
					fail("worker %d min %d got prio %d", i, w.min, r.it.Priority)
				}
				if h, ok := holder[r.it.Key]; ok {
					fail("key %d handed to worker %d while held by %d", r.it.Key, i, h)
				}
				holder[r.it.Key] = i
				dirty[r.it.Key] = false
				w.state, w.key = 2, r.it.Key
			default:
			}
		}
	}
	settle := func() {
		synctest.Wait()
		if os.Getenv("STRESS_NS") != "" {
			time.Sleep(time.Nanosecond)
			synctest.Wait()
		}
		collect()
	}
	check := func() {
		if shut {
			for i, w := range ws {
				if w.state == 1 {
					fail("worker %d still blocked after shutdown", i)
				}
			}
		}
		for i, w := range ws {
			if w.state == 1 {
				if v := q.pendingDueViolation(w.min); v != "" {
					fail("LIVENESS: worker %d (min %d) blocked while %s", i, w.min, v)
				}
			}
		}
	}
	steps := 30 + rng.IntN(40)
	if nkeys > 6 {
		steps = 300 + rng.IntN(400)
	}
	for range steps {
		switch op := rng.IntN(24); {
		case op < 6: // add
			if nkeys > 6 && rng.IntN(3) == 0 {
				for range rng.IntN(40) {
					k := rng.IntN(nkeys)
					o := AddOptions{Priority: prios[rng.IntN(len(prios))]}
					if rng.IntN(2) == 0 {
						o.Delay = time.Duration(1+rng.IntN(5000)) * time.Microsecond
					}
					if q.Add(k, 0, o).Accepted() {
						dirty[k] = true
					}
				}
				log = append(log, "burst")
				break
			}
			if nkeys > 6 && rng.IntN(3) == 0 {
				for range rng.IntN(100) {
					k := rng.IntN(nkeys)
					p := prios[rng.IntN(len(prios))]
					for _, d := range []time.Duration{4 * time.Millisecond, time.Duration(rng.IntN(4)) * time.Millisecond} {
						if q.Add(k, 0, AddOptions{Priority: p, Delay: d}).Accepted() {
							dirty[k] = true
						}
					}
				}
				log = append(log, "shrink burst")
				break
			}
			k := rng.IntN(nkeys)
			o := AddOptions{Priority: prios[rng.IntN(len(prios))]}
			if rng.IntN(2) == 0 {
				o.Delay = time.Duration(1+rng.IntN(5)) * time.Millisecond
			}
			out := q.Add(k, 0, o)
			if out.Accepted() {
				dirty[k] = true
			}
			log = append(log, fmt.Sprintf("add k%d %+v -> %v", k, o, out))
		case op < 10: // start a get
			for _, i := range rng.Perm(nw) {
				w := ws[i]
				if w.state != 0 {
					continue
				}
				w.min = mins[rng.IntN(len(mins))]
				ctx, cancel := context.WithCancel(context.Background())
				w.cancel = cancel
				w.ch = make(chan wres, 1)
				w.state = 1
				min := w.min
				go func() {
					var r wres
					if min == anyPriority {
						r.it, r.err = q.Get(ctx)
					} else {
						r.it, r.err = q.GetAtLeast(ctx, int(min))
					}
					r.at = time.Now()
					w.ch <- r
				}()
				log = append(log, fmt.Sprintf("start w%d min %d", i, min))
				break
			}
		case op < 12: // cancel
			for _, i := range rng.Perm(nw) {
				if w := ws[i]; w.state == 1 {
					w.cancel()
					log = append(log, fmt.Sprintf("cancel w%d", i))
					// sometimes cancel together with an add or time passing
					if rng.IntN(2) == 0 {
						k := rng.IntN(nkeys)
						o := AddOptions{Priority: prios[rng.IntN(len(prios))]}
						if q.Add(k, 0, o).Accepted() {
							dirty[k] = true
						}
						log = append(log, fmt.Sprintf("  +add k%d %+v", k, o))
					}
					break
				}
			}
		case op < 15: // done
			for _, i := range rng.Perm(nw) {
				if w := ws[i]; w.state == 2 {
					q.Done(w.key)
					delete(holder, w.key)
					w.state = 0
					log = append(log, fmt.Sprintf("done w%d k%d", i, w.key))
					break
				}
			}
		case op < 18: // time passes
			d := time.Duration(rng.IntN(3000)) * time.Microsecond
			if rng.IntN(2) == 0 {
				d = time.Duration(1+rng.IntN(3)) * time.Millisecond
			}
			end := time.Now().Add(d)
			for os.Getenv("STRESS_STEP") != "" {
				q.mu.Lock()
				due, ok := q.earliest()
				q.mu.Unlock()
				if !ok {
					break
				}
				at := q.epoch.Add(time.Duration(due) + time.Nanosecond)
				if !at.After(time.Now()) {
					q.mu.Lock()
					nw := len(q.waiters)
					q.mu.Unlock()
					if nw > 0 {
						fail("LIVENESS: delayed entry due %v not promoted at %v while %d Gets wait", time.Duration(due), time.Duration(q.now()), nw)
					}
					break
				}
				if !at.Before(end) {
					break
				}
				time.Sleep(time.Until(at))
				log = append(log, fmt.Sprintf("step to %v", time.Duration(due)))
				settle()
				check()
			}
			time.Sleep(time.Until(end))
			log = append(log, fmt.Sprintf("sleep %v", d))
		case op == 18:
			switch rng.IntN(4) {
			case 0:
				n := q.Clear()
				for k := range dirty {
					dirty[k] = false
				}
				log = append(log, fmt.Sprintf("clear %d", n))
			case 1:
				q.Suspend()
				log = append(log, "suspend")
			default:
				q.Resume()
				log = append(log, "resume")
			}
		case op >= 20:
			// something at exactly the next due time (the owner's timer)
			q.mu.Lock()
			due, ok := q.earliest()
			var owner *waiter = q.owner
			q.mu.Unlock()
			if !ok {
				break
			}
			d := time.Duration(due - q.now())
			var fns []func()
			for i, w := range ws {
				if w.state == 1 && rng.IntN(2) == 0 {
					fns = append(fns, w.cancel)
					log = append(log, fmt.Sprintf("cancel w%d at due %v (owner %p)", i, time.Duration(due), owner))
				}
			}
			if rng.IntN(2) == 0 {
				k := rng.IntN(nkeys)
				o := AddOptions{Priority: prios[rng.IntN(len(prios))]}
				if rng.IntN(2) == 0 {
					o.Delay = time.Duration(rng.IntN(3)) * time.Millisecond
				}
				log = append(log, fmt.Sprintf("add at due k%d %+v", k, o))
				fns = append(fns, func() {
					if q.Add(k, 0, o).Accepted() {
						dirtyMu.Lock()
						dirty[k] = true
						dirtyMu.Unlock()
					}
				})
			}
			for _, f := range fns {
				time.AfterFunc(d, f)
			}
			time.Sleep(d)
		case op == 19 && rng.IntN(8) == 0:
			if rng.IntN(2) == 0 {
				q.ShutDown()
			} else {
				ctx, cancel := context.WithTimeout(context.Background(), time.Duration(rng.IntN(3))*time.Millisecond)
				go func() { _ = q.ShutDownWithDrain(ctx); cancel() }()
			}
			shut = true
			log = append(log, "shutdown")
		case op == 19:
			// cancel every blocked get, then add
			for i, w := range ws {
				if w.state == 1 && rng.IntN(2) == 0 {
					w.cancel()
					log = append(log, fmt.Sprintf("cancel w%d", i))
				}
			}
		}
		settle()
		check()
	}
	// drain
	q.Resume()
	for _, w := range ws {
		if w.state == 1 {
			w.cancel()
		}
	}
	settle()
	for _, w := range ws {
		if w.state == 2 {
			q.Done(w.key)
			delete(holder, w.key)
			w.state = 0
		}
	}
	time.Sleep(time.Second)
	for {
		ctx, cancel := context.WithCancel(context.Background())
		cancel()
		it, err := q.Get(ctx)
		if err != nil {
			break
		}
		dirty[it.Key] = false
		q.Done(it.Key)
	}
	if shut {
		q.mu.Lock()
		for i := int32(0); i < q.nslots; i++ {
			sl := q.sl(i)
			if st := sl.state(); st == stReady || st == stParked || st == stInFlight || (st == stDelayed && sl.due <= q.shutAt) {
				q.mu.Unlock()
				fail("SAFETY: after shutdown drain, key %d state %d due %v shutAt %v", sl.key, st, sl.due, q.shutAt)
			}
		}
		q.mu.Unlock()
	}
	for k, d := range dirty {
		if d && !shut {
			fail("SAFETY: key %d accepted but never handed out", k)
		}
	}
	q.ShutDown()
}

type nopM struct{}

func (nopM) Added(int, bool)           {}
func (nopM) Dropped(Outcome)           {}
func (nopM) Depth(int, int)            {}
func (nopM) Waited(int, time.Duration) {}
func (nopM) Worked(time.Duration)      {}
