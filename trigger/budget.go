package trigger

// The trigger budget, and how its callers share it.

import (
	"cmp"
	"context"
	"math"
	"slices"
	"sync"
	"time"
)

// budget is Intake's trigger budget (Config.Rate, Config.Burst), shared
// among its callers smallest asker first:
//
//   - Once a second the rate is divided among the callers that asked since
//     the last division (the others keep their tokens), by what each asked for (tokens a second; a rise counts at once, a fall
//     is smoothed over about demandTime). Callers are taken in bands of a
//     factor of two, the lowest first: each gets its band's top while the
//     rate lasts, the band where it runs out shares the rest equally, and
//     the bands above get nothing.
//   - A caller's part is a token bucket of that rate. A request takes a
//     token of it (and overdraws the budget by one, so that the parts and
//     the rest stay within the rate), else a token the parts left in the
//     budget, else it is refused.
//   - A caller new since the last division first takes one of the
//     newcomers' tokens (Burst/4 a second), and its first part starts
//     with a token: it is served before its demand is known. Beyond
//     maxShares callers at once, the others take only what the parts left.
//
// So a caller asking for at most Rate / callers is always served in full,
// and one asking for little goes before a crowd asking for more, however
// many, paced or not.
type budget struct {
	mu       sync.Mutex
	all      bucket            // the budget; it may go down to -burst
	of       map[string]*share // the callers'
	divided  time.Time         // when the rate was last divided
	newcomer float64           // tokens left for newcomers until the next division
}

// share is a caller's part of the budget (its rate set by the last
// division) and what it asked for.
type share struct {
	part   bucket
	asked  float64 // tokens asked for since the last division
	demand float64 // tokens asked for a second
	fresh  bool    // not divided for yet
}

// bucket is a token bucket: tokens as of last, rate a second, at most
// burst.
type bucket struct {
	tokens, rate, burst float64
	last                time.Time
}

// fill adds what b's rate gave since last.
func (b *bucket) fill(now time.Time) {
	b.tokens = min(b.burst, b.tokens+now.Sub(b.last).Seconds()*b.rate)
	b.last = now
}

const (
	maxShares  = 1024            // callers known at once
	demandTime = 5 * time.Second // how long what a caller asked for counts
	forgotten  = 1.0 / 256       // a demand below it: the caller is forgotten
)

func newBudget(rate float64, burst int) *budget {
	now := time.Now()
	b := float64(burst)
	return &budget{all: bucket{tokens: b, rate: rate, burst: b, last: now}, of: map[string]*share{}, divided: now, newcomer: max(1, b/4)}
}

// take takes a token for caller, reporting whether there was one.
func (b *budget) take(caller string) bool {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.try(caller, true) == 0
}

// wait takes a token for caller, waiting for one until ctx ends.
func (b *budget) wait(ctx context.Context, caller string) error {
	b.mu.Lock()
	d := b.try(caller, true)
	for d > 0 {
		b.mu.Unlock()
		t := time.NewTimer(d)
		select {
		case <-ctx.Done():
			t.Stop()
			return ctx.Err()
		case <-t.C:
		}
		b.mu.Lock()
		d = b.try(caller, false)
	}
	b.mu.Unlock()
	return nil
}

// try takes a token for caller (counted as asked for when ask), or says
// how long until the budget has one. b.mu is held.
func (b *budget) try(caller string, ask bool) time.Duration {
	now := time.Now()
	if now.Sub(b.divided) >= time.Second {
		b.divide(now)
	}
	b.all.fill(now)
	sh := b.of[caller]
	if sh == nil && len(b.of) < maxShares {
		sh = &share{part: bucket{last: now}, fresh: true}
		if b.newcomer >= 1 {
			b.newcomer--
			sh.part.tokens, sh.part.burst = 1, 1
		}
		b.of[caller] = sh
	}
	if sh == nil { // one caller too many: what the parts left
		sh = &share{}
	}
	if ask {
		sh.asked++
	}
	sh.part.fill(now)
	switch {
	case sh.part.tokens >= 1:
		sh.part.tokens--
		b.all.tokens = max(-b.all.burst, b.all.tokens-1)
	case b.all.tokens >= 1:
		b.all.tokens--
	default: // a token of the budget, or the next division, whichever first
		return min(time.Second, time.Duration(math.Ceil((1-b.all.tokens)/b.all.rate*float64(time.Second))))
	}
	return 0
}

// divide sets each caller's part of the rate from what it asked for,
// smallest asker first (see budget), and forgets callers that ask for
// nothing any longer.
func (b *budget) divide(now time.Time) {
	elapsed := now.Sub(b.divided).Seconds()
	kept := math.Exp(-elapsed / demandTime.Seconds())
	b.divided, b.newcomer = now, max(1, b.all.burst/4)
	var callers []*share
	for c, sh := range b.of {
		asked := sh.asked / elapsed
		sh.demand, sh.asked = max(asked, kept*sh.demand+(1-kept)*asked), 0
		switch {
		case sh.demand < forgotten:
			delete(b.of, c)
		case asked == 0: // silent: it keeps its tokens, and gets no rate
			sh.part.fill(now)
			sh.part.rate = 0
		default:
			callers = append(callers, sh)
		}
	}
	slices.SortFunc(callers, func(x, y *share) int { return cmp.Compare(x.demand, y.demand) })
	left := b.all.rate
	for len(callers) > 0 {
		top := bandTop(callers[0].demand)
		n := 1
		for n < len(callers) && bandTop(callers[n].demand) == top {
			n++
		}
		each := min(top, left/float64(n))
		for _, sh := range callers[:n] {
			sh.part.fill(now)
			sh.part.rate, sh.part.burst = each, max(1, b.all.burst*each/b.all.rate)
			if sh.fresh && each > 0 {
				sh.part.tokens, sh.fresh = max(sh.part.tokens, 1), false
			}
		}
		left -= each * float64(n)
		callers = callers[n:]
	}
}

// bandTop is the top of the band of a demand d: the power of two above
// it.
func bandTop(d float64) float64 { return math.Exp2(math.Floor(math.Log2(d)) + 1) }
