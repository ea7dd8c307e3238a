package queue

import (
	"cmp"
	"math/rand/v2"
	"time"
)

// Backoff computes retry delays: exponential in the number of consecutive
// failures, capped, with jitter. It is opkit's one backoff helper: the
// controller's retries, the watcher's reconnects, the consumer's
// redeliveries and the leader elector's polls all use it. The zero value
// is valid: each zero field takes its default ([DefaultBackoffBase],
// [DefaultBackoffCap], [DefaultBackoffJitter]). Backoff holds no state:
// callers count the failures.
type Backoff struct {
	// Base is the delay of the first retry. Zero means DefaultBackoffBase.
	Base time.Duration
	// Cap bounds every delay. Zero means DefaultBackoffCap.
	Cap time.Duration
	// Jitter is the fraction by which a delay is randomly shortened, in
	// [0, 1]: the delay d becomes a value in [d*(1-Jitter), d]. Zero means
	// DefaultBackoffJitter; a negative value disables jitter; values above 1
	// count as 1.
	Jitter float64
}

// The defaults a zero Backoff stands for.
const (
	DefaultBackoffBase   = 5 * time.Millisecond
	DefaultBackoffCap    = 5 * time.Minute
	DefaultBackoffJitter = 0.1
)

// TransientRefusals is how many 401 or 403 answers in a row the watcher
// and the leader elector retry with their normal backoff, as warnings,
// before they take the refusal for a permission problem (logged as an
// error, reported by their health checks, retried slowly): an API server
// that has just started refuses requests until its authenticator and
// authorizer have synced. It is the one home of that policy.
const TransientRefusals = 3

// Delay returns the delay before retry number retries (1 for the first
// retry): Base * 2^(retries-1), at most Cap, shortened by jitter. It
// returns 0 for retries < 1.
func (b Backoff) Delay(retries int) time.Duration {
	if retries < 1 {
		return 0
	}
	base, capd := b.Base, b.Cap
	if base <= 0 {
		base = DefaultBackoffBase
	}
	if capd <= 0 {
		capd = DefaultBackoffCap
	}
	jitter := min(cmp.Or(b.Jitter, DefaultBackoffJitter), 1) // a negative one stays: no jitter
	d := capd
	if shift := retries - 1; shift < 62 && base <= capd>>shift {
		d = base << shift
	}
	if jitter > 0 {
		d -= time.Duration(jitter * rand.Float64() * float64(d))
	}
	return d
}
