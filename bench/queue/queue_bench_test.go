package queuebench

import (
	"fmt"
	"math/rand/v2"
	"runtime"
	"slices"
	"sync"
	"sync/atomic"
	"testing"
	"time"
)

// W1: add -> get -> done with n distinct keys, n-1 of them queued behind
// the cycle (n = 1: an empty queue).
func BenchmarkW1Cycle(b *testing.B) {
	for _, n := range []int{1, 1_000, 100_000} {
		for _, impl := range Impls {
			b.Run(fmt.Sprintf("keys=%d/%s", n, impl.Name), func(b *testing.B) {
				cycle(b, impl.New(), n)
			})
		}
	}
}

// W1's floor: the three uncontended lock round trips (Add, Get, Done) that
// any queue built on one sync.Mutex pays per cycle, with nothing inside.
// It is a reference row, not a queue: W1's ratio against client-go cannot
// exceed client-go's cycle over this floor, and a cycle's own logic is its
// ns/op minus this one.
func BenchmarkW1LockFloor(b *testing.B) {
	var mu sync.Mutex
	n := 0
	for b.Loop() {
		for range 3 {
			mu.Lock()
			n++
			mu.Unlock()
		}
	}
	if n != 3*b.N {
		b.Fatalf("%d round trips, want %d", n, 3*b.N)
	}
}

// W1 with opkit's metrics on (atomic counters) versus nil, the latter
// without and with timestamps (metrics imply timestamps; the controller
// runs with timestamps).
func BenchmarkW1Metrics(b *testing.B) {
	for _, n := range []int{1, 100_000} {
		b.Run(fmt.Sprintf("keys=%d/nil", n), func(b *testing.B) { cycle(b, NewOpkit(nil), n) })
		b.Run(fmt.Sprintf("keys=%d/counting", n), func(b *testing.B) { cycle(b, NewOpkit(&CountingMetrics{}), n) })
	}
}

func cycle(b *testing.B, q Queue, n int) {
	defer q.ShutDown()
	for k := 1; k < n; k++ {
		q.Add(k, 0, 0)
	}
	next := 0
	// warm up: every key seen once, so the measured cycles reuse entries
	for range n {
		q.Add(next, 0, 0)
		k, _ := q.Get()
		q.Done(k)
		next = k
	}
	b.ReportAllocs()
	for b.Loop() {
		q.Add(next, 0, 0)
		k, _ := q.Get()
		q.Done(k)
		next = k
	}
}

// W2: two producers and two consumers over 10,000 keys. items/s is adds
// per second from the first add until everything was handed out and done;
// adds/s is the producers' rate alone. An add of a key already pending is
// merged, so a queue whose consumers fall behind merges more and scores
// more adds: handouts/s (entries handed out per second over the same time)
// and handouts/add show the consumers' side. pace% is the share of hand-outs that
// happened while the producers were running: consumers that keep pace
// score close to 100 (the drain after the producers stop is short);
// starved consumers score near 0. Each consumer counts in its own cache
// line, so that the harness adds no contention of its own between the
// consumers (shared counters would bounce a line between the cores on
// every item and narrow the gap between the queues measured). cpu% is the
// process's CPU time over the same time: with four goroutines on two cores
// behind one lock, a run does best when its goroutines take turns on
// about one core (each runs long stretches with the lock to itself) and
// worst when both cores contend for the lock on every operation; cpu%
// tells which of the two a run was in.
func BenchmarkW2ProducersConsumers(b *testing.B) {
	const keys = 10_000
	for _, impl := range Impls {
		b.Run(impl.Name, func(b *testing.B) {
			q := impl.New()
			var counts [2]consumerCounts
			var producing atomic.Bool
			var cw sync.WaitGroup
			for c := range counts {
				cw.Go(func() {
					my := &counts[c]
					for {
						k, ok := q.Get()
						if !ok {
							return
						}
						my.inflight.Store(1)
						if producing.Load() {
							my.handedDuring.Add(1)
						}
						my.handed.Add(1)
						q.Done(k)
						my.inflight.Store(0)
					}
				})
			}
			b.ReportAllocs()
			b.ResetTimer()
			cpu0 := processCPU()
			start := time.Now()
			producing.Store(true)
			var pw sync.WaitGroup
			per := b.N / 2
			for p := range 2 {
				pw.Go(func() {
					r := rand.New(rand.NewPCG(uint64(p), 2))
					for range per {
						q.Add(r.IntN(keys), 0, 0)
					}
				})
			}
			pw.Wait()
			producing.Store(false)
			produced := time.Since(start)
			// drain: until nothing is queued or in flight, twice in a row
			for idle := 0; idle < 2; {
				if q.Len() == 0 && counts[0].inflight.Load() == 0 && counts[1].inflight.Load() == 0 {
					idle++
				} else {
					idle = 0
				}
				runtime.Gosched()
			}
			elapsed := time.Since(start)
			cpu := processCPU() - cpu0
			b.StopTimer()
			q.ShutDown()
			cw.Wait()
			b.ReportMetric(float64(2*per)/elapsed.Seconds(), "items/s")
			b.ReportMetric(float64(2*per)/produced.Seconds(), "adds/s")
			pace := 0.0
			if h := counts[0].handed.Load() + counts[1].handed.Load(); h > 0 {
				pace = 100 * float64(counts[0].handedDuring.Load()+counts[1].handedDuring.Load()) / float64(h)
			}
			b.ReportMetric(pace, "pace%")
			h := counts[0].handed.Load() + counts[1].handed.Load()
			b.ReportMetric(float64(h)/elapsed.Seconds(), "handouts/s")
			b.ReportMetric(float64(h)/float64(2*per), "handouts/add")
			if cpu0 >= 0 {
				// Cores kept busy on average (the whole process: the
				// benchmark's own drain loop included).
				b.ReportMetric(100*float64(cpu)/float64(elapsed), "cpu%")
			}
		})
	}
}

// consumerCounts is one W2 consumer's counters, written by it alone and
// read by the benchmark goroutine, padded to a cache line of their own.
type consumerCounts struct {
	inflight, handed, handedDuring atomic.Int64
	_                              [64 - 24]byte
}

// W3: 100,000 adds with random delays in [0,1s). Each round first
// measures heap bytes per pending delayed item (adds into a fresh queue
// with no consumer, GC before and after), then adds the same delays into
// another fresh queue while two consumers drain it, measuring ns per
// delayed add (up to when the queue has taken every add in, see flushAdds)
// and how late each entry is handed out after its due time
// (p99 over all entries; and p50 and p99 over the entries due after the
// last add, when the consumers are the only goroutines left and every
// wake-up comes from a timer).
func BenchmarkW3Delayed(b *testing.B) {
	const n = 100_000
	for _, impl := range Impls {
		b.Run(impl.Name, func(b *testing.B) {
			due := make([]int64, n)       // due time of key k, ns since start
			late := make([]int64, 0, 2*n) // (lateness, due) pairs
			var lateMu sync.Mutex
			delays := w3Delays(n, 0)
			var addNs, bytesPer, p99, idle50, idle99 []float64
			var addsEnd atomic.Int64 // ns since start when the last add returned
			for b.Loop() {
				// memory
				var before, after runtime.MemStats
				runtime.GC()
				runtime.ReadMemStats(&before)
				q := impl.New()
				for k := range n {
					q.Add(k, 0, delays[k]+time.Hour)
				}
				// Count the entries, not a buffer of adds. priorityqueue's
				// flush leaves an empty buffer as large as the batch it took
				// in (its size depends on how far behind its goroutine was:
				// 0 to 37 B per entry in trials); a second flush, of
				// nothing, drops it, as the next add or Get would.
				flushAdds(q)
				flushAdds(q)
				runtime.GC()
				runtime.ReadMemStats(&after)
				bytesPer = append(bytesPer, float64(int64(after.HeapAlloc)-int64(before.HeapAlloc))/n)
				q.ShutDown()
				runtime.KeepAlive(q)

				// cost of an add and lateness, consumers running
				late = late[:0]
				q = impl.New()
				start := time.Now()
				var got atomic.Int64
				var cw sync.WaitGroup
				for range 2 {
					cw.Go(func() {
						mine := make([]int64, 0, 2*n)
						for {
							k, ok := q.Get()
							if !ok {
								break
							}
							mine = append(mine, int64(time.Since(start))-due[k], due[k])
							q.Done(k)
							if got.Add(1) == n {
								q.ShutDown()
							}
						}
						lateMu.Lock()
						late = append(late, mine...)
						lateMu.Unlock()
					})
				}
				t0 := time.Now()
				var stamp int64
				for k := range n {
					// One clock read per 16 adds keeps the harness's own
					// cost out of ns/add (a read costs about 20 ns); the
					// due time it records is then up to 16 adds early, so
					// lateness is overstated by as much, never understated.
					if k%w3ClockEvery == 0 {
						stamp = int64(time.Since(start))
					}
					due[k] = stamp + int64(delays[k])
					q.Add(k, 0, delays[k])
				}
				flushAdds(q)
				addNs = append(addNs, float64(time.Since(t0).Nanoseconds())/n)
				addsEnd.Store(int64(time.Since(start)))
				cw.Wait()
				var all, idle []int64
				for i := 0; i < len(late); i += 2 {
					all = append(all, late[i])
					if late[i+1] > addsEnd.Load() {
						idle = append(idle, late[i])
					}
				}
				slices.Sort(all)
				slices.Sort(idle)
				p99 = append(p99, float64(all[len(all)*99/100])/1e6)
				idle50 = append(idle50, float64(idle[len(idle)/2])/1e6)
				idle99 = append(idle99, float64(idle[len(idle)*99/100])/1e6)
			}
			b.ReportMetric(median(addNs), "ns/add")
			b.ReportMetric(median(p99), "p99-late-ms")
			b.ReportMetric(median(idle50), "p50-late-idle-ms")
			b.ReportMetric(median(idle99), "p99-late-idle-ms")
			b.ReportMetric(median(bytesPer), "B/pending")
		})
	}
}

// w3ClockEvery is how many of W3's adds share one reading of the
// harness's clock.
const w3ClockEvery = 16

// W3 adds alone: the same 100,000 delayed adds into a fresh queue with no
// consumer, repeated (each round timed until the queue has taken every add
// in, see flushAdds), so that the cost of an add is measured without the
// consumers' wake-ups and with the process's heap already grown (W3 itself
// starts each round from a collected heap and pays for first-touching the
// memory the queue grows into).
func BenchmarkW3AddsOnly(b *testing.B) {
	const n = 100_000
	delays := w3Delays(n, time.Hour)
	for _, impl := range Impls {
		b.Run(impl.Name, func(b *testing.B) {
			for b.Loop() {
				q := impl.New()
				for k := range n {
					q.Add(k, 0, delays[k])
				}
				flushAdds(q)
				b.StopTimer()
				q.ShutDown()
				b.StartTimer()
			}
			b.ReportMetric(float64(b.Elapsed().Nanoseconds())/float64(b.N*n), "ns/add")
		})
	}
}

// flushAdds returns once q has taken in every add made before the call, so
// that a timed region ending with it includes the work a queue defers past
// its Add. controller-runtime's priorityqueue only appends an add to a
// buffer that a goroutine of its own later inserts; its Len takes the
// queue's lock (held by any flush under way) and flushes what is left. For
// opkit's and client-go's queues it is one more uncontended lock round trip
// (their Add is done when it returns, but for client-go's delayed adds: up
// to 1,000 of them wait in a channel for its waiting loop, which nothing
// exported waits for).
func flushAdds(q Queue) { q.Len() }

// w3Delays returns W3's n delays: random in [0, 1s) (the same sequence
// every time), plus offset.
func w3Delays(n int, offset time.Duration) []time.Duration {
	delays := make([]time.Duration, n)
	r := rand.New(rand.NewPCG(3, 3))
	for i := range delays {
		delays[i] = time.Duration(r.Int64N(int64(time.Second))) + offset
	}
	return delays
}

func median(v []float64) float64 {
	s := slices.Clone(v)
	slices.Sort(s)
	return s[len(s)/2]
}

// W4: the same 1,000 keys added 10 times while pending; ns/add runs until
// the queue has taken every add in (see flushAdds) and excludes the drain
// of the 1,000 entries that follows each round.
func BenchmarkW4Dedup(b *testing.B) {
	const keys, times = 1_000, 10
	for _, impl := range Impls {
		b.Run(impl.Name, func(b *testing.B) {
			q := impl.New()
			defer q.ShutDown()
			var addTime time.Duration
			rounds := 0
			b.ReportAllocs()
			for b.Loop() {
				start := time.Now()
				for range times {
					for k := range keys {
						q.Add(k, 0, 0)
					}
				}
				flushAdds(q)
				addTime += time.Since(start)
				rounds++
				for range keys {
					k, _ := q.Get()
					q.Done(k)
				}
			}
			b.ReportMetric(float64(addTime.Nanoseconds())/float64(rounds*keys*times), "ns/add")
		})
	}
}

// W5: one high-priority add behind 100,000 pending low-priority entries;
// ns/op is the time until Get returns it. Queues without priorities hand
// out the backlog first (each low entry taken is added back so the
// backlog stays at 100,000).
func BenchmarkW5PriorityJump(b *testing.B) {
	const backlog = 100_000
	const high = -1
	for _, impl := range Impls {
		b.Run(impl.Name, func(b *testing.B) {
			q := impl.New()
			defer q.ShutDown()
			for k := range backlog {
				q.Add(k, -1, 0)
			}
			b.ReportAllocs()
			for b.Loop() {
				q.Add(high, 1, 0)
				for {
					k, _ := q.Get()
					q.Done(k)
					if k == high {
						break
					}
					q.Add(k, -1, 0)
				}
			}
		})
	}
}
