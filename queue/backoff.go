package queue

import (
	"math/rand/v2"
	"time"
)

// Backoff computes retry delays: exponential in the retry count, capped,
// with jitter. The zero value means [DefaultBackoff]; each zero field
// takes its default. Backoff holds no per-key state: the retry count
// travels with the entry (AddOptions.Retries, Item.Retries).
type Backoff struct {
	// Base is the delay of the first retry. Default 5ms.
	Base time.Duration
	// Cap bounds every delay. Default 5m.
	Cap time.Duration
	// Jitter is the fraction by which a delay is randomly shortened, in
	// [0, 1]: the delay d becomes a value in [d*(1-Jitter), d]. Default
	// 0.1; a negative value disables jitter; values above 1 count as 1.
	Jitter float64
}

// DefaultBackoff is the policy a zero Backoff stands for.
var DefaultBackoff = Backoff{Base: 5 * time.Millisecond, Cap: 5 * time.Minute, Jitter: 0.1}

// Delay returns the delay before retry number retries (1 for the first
// retry): Base * 2^(retries-1), at most Cap, shortened by jitter. It
// returns 0 for retries < 1.
func (b Backoff) Delay(retries int) time.Duration {
	if retries < 1 {
		return 0
	}
	base, capd, jitter := b.Base, b.Cap, b.Jitter
	if base <= 0 {
		base = DefaultBackoff.Base
	}
	if capd <= 0 {
		capd = DefaultBackoff.Cap
	}
	if jitter == 0 {
		jitter = DefaultBackoff.Jitter
	}
	if jitter > 1 {
		jitter = 1
	}
	d := capd
	if shift := retries - 1; shift < 62 && base <= capd>>shift {
		d = base << shift
	}
	if jitter > 0 {
		d -= time.Duration(jitter * rand.Float64() * float64(d))
	}
	return d
}
