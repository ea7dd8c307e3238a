package queue_test

import (
	"context"
	"errors"
	"math/rand/v2"
	"sync"
	"sync/atomic"
	"testing"
	"testing/synctest"
	"time"

	"github.com/opkit/opkit/queue"
)

// TestHammer runs many producers and consumers at once (meant for -race),
// some consumers taking only the highest of the three priorities.
// Each producer owns a range of keys and adds increasing values, some
// delayed, some with priority; consumers check that no key is ever held
// twice. After the producers stop, the consumers drain the queue, and for
// every key the last value added must have been handed out (payloads merge
// by max, and nothing accepted is lost).
//
// It runs in a synctest bubble so that the delays pass on the fake clock;
// goroutines still run in parallel.
func TestHammer(t *testing.T) {
	synctest.Test(t, hammer)
}

func hammer(t *testing.T) {
	const (
		producers   = 8
		consumers   = 8
		reserved    = 2 // consumers that only take priority >= 1 (GetAtLeast)
		keysPer     = 50
		addsPerProd = 4000
		totalKeys   = producers * keysPer
	)
	q := queue.New[int, int](queue.Config[int]{Merge: maxOf, Metrics: nopMetrics{}})
	var holders [totalKeys]atomic.Int32
	var lastSeen [totalKeys]atomic.Int64
	lastAdded := make([]int, totalKeys) // written by the key's producer only, read after wg.Wait

	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	var cw sync.WaitGroup
	for c := range consumers + reserved {
		cw.Go(func() {
			for {
				var it queue.Item[int, int]
				var err error
				if c < consumers {
					it, err = q.Get(ctx)
				} else {
					it, err = q.GetAtLeast(ctx, 1)
					if err == nil && it.Priority < 1 {
						t.Errorf("GetAtLeast(1) returned priority %d", it.Priority)
					}
				}
				if err != nil {
					if !errors.Is(err, context.Canceled) && !errors.Is(err, queue.ErrShutDown) {
						t.Error(err)
					}
					return
				}
				if n := holders[it.Key].Add(1); n != 1 {
					t.Errorf("key %d held by %d consumers", it.Key, n)
				}
				for {
					old := lastSeen[it.Key].Load()
					if int64(it.Value) <= old || lastSeen[it.Key].CompareAndSwap(old, int64(it.Value)) {
						break
					}
				}
				holders[it.Key].Add(-1)
				q.Done(it.Key)
			}
		})
	}
	var pw sync.WaitGroup
	for p := range producers {
		pw.Go(func() {
			r := rand.New(rand.NewPCG(uint64(p), 1))
			for i := 1; i <= addsPerProd; i++ {
				k := p*keysPer + r.IntN(keysPer)
				o := queue.AddOptions{Priority: r.IntN(3) - 1}
				if r.IntN(10) == 0 {
					o.Delay = time.Duration(r.IntN(2000)) * time.Microsecond
				}
				if !q.Add(k, i, o).Accepted() {
					t.Errorf("add dropped")
				}
				lastAdded[k] = i
			}
		})
	}
	pw.Wait()
	// Every entry is due within 2ms of its add. The fake clock moves only
	// when every goroutine is blocked, so when this returns the consumers
	// have taken and finished everything (a lost wake-up would leave an
	// entry behind blocked consumers).
	time.Sleep(time.Second)
	if n := q.Len(); n != 0 {
		t.Fatalf("Len = %d after the consumers went idle", n)
	}
	if err := q.ShutDownWithDrain(context.Background()); err != nil {
		t.Fatal(err)
	}
	cw.Wait()
	for k := range totalKeys {
		if lastAdded[k] != 0 && lastSeen[k].Load() != int64(lastAdded[k]) {
			t.Errorf("key %d: last added %d, last handed out %d", k, lastAdded[k], lastSeen[k].Load())
		}
	}
}
