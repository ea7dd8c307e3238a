package trigger

// The trigger budget, and how its callers share it.

import (
	"context"
	"math"
	"sync"
	"time"
)

// budget is Intake's trigger budget, a token bucket (Config.Rate,
// Config.Burst) whose tokens go first to the callers that ask least.
//
// Each caller has a demand: the tokens it asked for a second lately,
// refused or not, plus those it took (each over about demandTime). To
// take a token, a caller needs the bucket to hold more the more it
// demands: one token when it asked for nothing lately, half the burst
// when it demands twice the rate, nearly all of it when far more. So a
// greedy caller, or a crowd of them, takes only what the others leave; a
// caller asking for less than they do is served first, however many they
// are and however they pace themselves; and of callers asking alike, the
// one that took less goes first. A new caller counts as demanding the
// rate, and so does, for floodMemory however quiet it was, a caller that
// flooded (asked for well over the burst at once, or far beyond the rate
// for a while): a crowd that comes back cannot empty the bucket before
// callers that kept asking little. The limit of the rule: callers that
// asked less than a calm caller and come back flooding go first for their
// first few asks, until their demand catches up. A caller alone takes
// about half the burst at once, then the rate. The consumer (wait) takes
// any token.
type budget struct {
	mu      sync.Mutex
	tokens  float64
	rate    float64 // tokens a second
	burst   float64
	flood   float64   // a demand above it is a flood: a newcomer's that asked for and took the whole burst at once
	last    time.Time // when tokens was last filled
	callers map[string]*demand
	swept   time.Time // when callers was last swept of the forgotten
}

// demand is what a caller asked for and took: rate tokens a second as of
// last.
type demand struct {
	rate    float64
	last    time.Time
	flooded time.Time // when its rate was last above the budget's flood
}

// at returns d's rate at now, faded since last: no lower than floor for
// a caller that flooded within floodMemory.
func (d *demand) at(now time.Time, floor float64) float64 {
	r := d.rate * math.Exp(-now.Sub(d.last).Seconds()/demandTime.Seconds())
	if now.Sub(d.flooded) < floodMemory {
		r = max(r, floor)
	}
	return r
}

const (
	maxCallers  = 1024            // callers remembered at once
	demandTime  = 5 * time.Second // how long an ask counts in a demand (its weight falls by e in that time)
	floodMemory = 2 * time.Minute // how long a caller that flooded counts as a newcomer at best
	forgotten   = 1.0 / 256       // a demand below it is forgotten
)

func newBudget(rate float64, burst int) *budget {
	now := time.Now()
	return &budget{tokens: float64(burst), rate: rate, burst: float64(burst), flood: rate + 2*float64(burst)/demandTime.Seconds(),
		last: now, callers: map[string]*demand{}, swept: now}
}

// take takes a token for caller, reporting whether there was one.
func (b *budget) take(caller string) bool {
	b.mu.Lock()
	defer b.mu.Unlock()
	d := b.callers[caller]
	if d == nil {
		d = b.newcomer(caller, time.Now())
	}
	return b.try(d) == 0
}

// wait takes a token, waiting for one until ctx ends.
func (b *budget) wait(ctx context.Context) error {
	b.mu.Lock()
	d := b.try(nil)
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
		d = b.try(nil)
	}
	b.mu.Unlock()
	return nil
}

// try takes a token for a caller of demand d (nil: any token will do),
// or says how long until the bucket holds what it needs. b.mu is held.
func (b *budget) try(d *demand) time.Duration {
	now := time.Now()
	b.tokens = min(b.burst, b.tokens+now.Sub(b.last).Seconds()*b.rate)
	b.last = now
	need := 1.0
	if d != nil {
		d.rate, d.last = d.at(now, b.rate), now
		need += (b.burst - 1) * (d.rate / (d.rate + 2*b.rate))
		d.rate += 1 / demandTime.Seconds() // the ask
		if d.rate > b.flood {
			d.flooded = now
		}
	}
	if b.tokens < need {
		return time.Duration(math.Ceil((need - b.tokens) / b.rate * float64(time.Second)))
	}
	b.tokens--
	if d != nil {
		d.rate += 1 / demandTime.Seconds() // the token taken
	}
	return 0
}

// newcomer remembers caller, as demanding the rate until it shows less
// (a crowd of newcomers cannot empty the bucket before a known caller
// asking little), if there is room for one more (after forgetting the
// faded, flooded or not: it comes back as a newcomer, at most once every
// demandTime); else its demand is the largest there is: it takes only
// from a full bucket.
func (b *budget) newcomer(caller string, now time.Time) *demand {
	if len(b.callers) >= maxCallers && now.Sub(b.swept) >= demandTime {
		b.swept = now
		for c, d := range b.callers {
			if d.at(now, 0) < forgotten {
				delete(b.callers, c)
			}
		}
	}
	d := &demand{rate: b.rate, last: now}
	if len(b.callers) >= maxCallers {
		d.rate = math.MaxFloat64 // not +Inf: its need would be NaN, which every bucket meets
	} else {
		b.callers[caller] = d
	}
	return d
}
