// elector.go holds the Elector type, New, its accessors, Run and the Lease helpers.

package leader

import (
	"cmp"
	"context"
	"fmt"
	"log/slog"
	"maps"
	"sync"
	"sync/atomic"
	"time"

	coordinationv1 "k8s.io/api/coordination/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	coordclient "k8s.io/client-go/kubernetes/typed/coordination/v1"

	"github.com/opkit/opkit/queue"
)

// Elector campaigns for one Lease and runs the leader's work while it holds
// it. Create it with [New]; [Elector.Run] may be called once. The other
// methods are safe for concurrent use.
type Elector struct {
	cfg    Config
	leases coordclient.LeaseInterface
	log    *slog.Logger
	ran    atomic.Bool
	yield  chan struct{} // Yield's request to the term (buffered, 1)

	// published is what this replica publishes on the Lease while it holds
	// it: Config.Annotations, then what Publish set last. Any goroutine may
	// replace it, under mu; the map itself is never modified.
	published map[string]string

	// The fields below are written only by Run's goroutine, under mu; that
	// goroutine reads them without it.
	mu          sync.Mutex
	holder      string            // last observed holder identity
	annotations map[string]string // of the Lease last observed with a holder
	leading     bool              // between Gate.Resume and Gate.Suspend
	lastRenew   time.Time         // start of the last successful write while leading
	overrun     bool              // a finished term's work is past its bound
	// refusedRead and refusedWrite are the last errors of a campaign's
	// Lease read and write that retrying does not fix; nil after a success.
	refusedRead, refusedWrite error

	// readRefusals and writeRefusals count the campaign's 401/403
	// answers to reads and to writes in a row (Run's goroutine only): the
	// first queue.TransientRefusals are warnings.
	readRefusals, writeRefusals int
}

// New validates cfg, applies its defaults and returns an Elector. Errors
// wrap [ErrInvalidConfig].
func New(cfg Config) (*Elector, error) {
	c, err := cfg.withDefaults()
	if err != nil {
		return nil, err
	}
	return &Elector{
		cfg:    c,
		leases: c.Client.CoordinationV1().Leases(c.Namespace),
		log:    c.Logger.With("lease", c.Namespace+"/"+c.Name, "identity", c.Identity),
		yield:  make(chan struct{}, 1),
		// A copy, so that the caller's later changes to its map do not
		// race with the writes of the Lease.
		published: maps.Clone(c.Annotations),
	}, nil
}

// Yield ends the current term as a shutdown does, but Run goes on
// campaigning: the intake is suspended, the work's context ends with the
// cause ErrYielded, and the Lease is released once the work returned, so
// that another replica can take it at once. It reports whether a term
// was running; a Balancer calls it to hand a shard to another replica.
func (e *Elector) Yield() bool {
	// Under mu, as the term's start empties the channel: a Yield is for
	// the term that leads when it is called, never for the next one.
	e.mu.Lock()
	defer e.mu.Unlock()
	if !e.leading {
		return false
	}
	select {
	case e.yield <- struct{}{}:
	default: // asked already
	}
	return true
}

// Identity returns this replica's holder identity.
func (e *Elector) Identity() string { return e.cfg.Identity }

// Leader returns the holder of the Lease as last observed by this replica,
// "" if the Lease has no holder or has not been read yet, or if this
// replica's own term ended and it has not read the Lease since. A follower can
// report it (e.g. in a 503 answer). The holder may have expired since.
func (e *Elector) Leader() string {
	e.mu.Lock()
	defer e.mu.Unlock()
	return e.holder
}

// IsLeader reports whether this replica is in a term: the intake has been
// resumed and not yet suspended again.
func (e *Elector) IsLeader() bool {
	e.mu.Lock()
	defer e.mu.Unlock()
	return e.leading
}

// WorkDeadline returns the time by which the work of the current term, or
// of the term that ended last, must have returned: the start of the term's
// last successful write of the Lease plus LeaseDuration - ClockSkew. Past
// it another replica may acquire the Lease, and the elector reports the
// work as overrunning (see the package doc). A caller that lets the work
// run on after the term's context ended (a shutdown drain) must stop it
// before then, and should keep a margin for the work to wind down. It is
// the zero time before the first term.
func (e *Elector) WorkDeadline() time.Time {
	e.mu.Lock()
	defer e.mu.Unlock()
	if e.lastRenew.IsZero() {
		return time.Time{}
	}
	return e.lastRenew.Add(e.cfg.LeaseDuration - e.cfg.ClockSkew)
}

// Check is a health check. It returns an error wrapping [ErrNotRenewed] if
// this replica leads but has not renewed within RenewDeadline,
// [ErrWorkOverrun] while a finished term's work outlives its bound, or
// [ErrCannotCampaign] (wrapping the API error) while the API server refuses
// a follower's last read or write of the Lease for good (forbidden,
// unauthorized, invalid; a Create of a Lease in a missing namespace): a
// replica that could never lead is not a healthy standby. Other followers
// are healthy.
func (e *Elector) Check() error {
	e.mu.Lock()
	defer e.mu.Unlock()
	age, refused := time.Since(e.lastRenew), cmp.Or(e.refusedWrite, e.refusedRead)
	switch {
	case e.overrun:
		return ErrWorkOverrun
	case e.leading && age > e.cfg.RenewDeadline:
		return fmt.Errorf("%w: last renewed %s ago", ErrNotRenewed, age.Round(time.Millisecond))
	case !e.leading && refused != nil:
		return fmt.Errorf("%w: %w", ErrCannotCampaign, refused)
	}
	return nil
}

// Run suspends the intake, then campaigns for the Lease until ctx is
// cancelled. In each term it resumes the intake and calls work with a
// context that carries the [Term] and is cancelled when the term ends; at
// the end of a term it suspends the intake, cancels that context, clears the
// queue and waits for work to return (see the package doc for the bounds).
//
// Run returns:
//   - nil after ctx is cancelled; if it was leading, the work has returned
//     and the Lease has been released (a failed release is logged: the
//     Lease then expires normally);
//   - work's error, wrapped with the term, if work returns while its term
//     is still on (the Lease is released first), or nil if work returned nil;
//     a panic in work (on the goroutine Run started it on) counts as
//     returning an error wrapping [ErrWorkPanicked], so the term ends in
//     order and the Lease is released rather than left to expire behind a
//     crashed process;
//   - an error wrapping [ErrLeadershipLost] after a lost term, if
//     Config.ExitOnLoss is set (the work has returned);
//   - [ErrAlreadyRunning] on a second call.
//
// Run does not return while a term's work is still running, however long
// it ignores its context.
func (e *Elector) Run(ctx context.Context, work func(ctx context.Context) error) error {
	if work == nil {
		return fmt.Errorf("%w: nil work function", ErrInvalidConfig)
	}
	if !e.ran.CompareAndSwap(false, true) {
		return ErrAlreadyRunning
	}
	e.cfg.Gate.Suspend()
	for {
		lease, sent, err := e.campaign(ctx)
		if err != nil {
			return nil // ctx cancelled while following
		}
		if time.Since(sent) >= e.cfg.RenewDeadline {
			// The acquisition took so long that the term would already be
			// over; do not start it. The Lease names us, so the next
			// campaign round can take it again at once.
			e.log.Warn("acquisition too slow, not starting a term", "took", time.Since(sent))
			continue
		}
		if done, err := e.lead(ctx, lease, sent, work); done {
			return err
		}
	}
}

// get reads the Lease; a Lease that does not exist is nil, not an error.
func (e *Elector) get(ctx context.Context) (*coordinationv1.Lease, error) {
	ctx, cancel := context.WithTimeout(ctx, e.cfg.RenewDeadline)
	defer cancel()
	l, err := e.leases.Get(ctx, e.cfg.Name, metav1.GetOptions{})
	if apierrors.IsNotFound(err) {
		return nil, nil
	}
	return l, err
}

// locked runs f, which writes fields that mu guards, under mu.
func (e *Elector) locked(f func()) {
	e.mu.Lock()
	defer e.mu.Unlock()
	f()
}

// pollPeriod is RetryPeriod shortened by up to a fifth at random (opkit's
// one backoff helper), so that followers started together do not poll
// together.
func (e *Elector) pollPeriod() time.Duration {
	return queue.Backoff{Base: e.cfg.RetryPeriod, Cap: e.cfg.RetryPeriod, Jitter: 0.2}.Delay(1)
}

func holderOf(l *coordinationv1.Lease) string {
	if l == nil || l.Spec.HolderIdentity == nil {
		return ""
	}
	return *l.Spec.HolderIdentity
}

func transitions(l *coordinationv1.Lease) int32 {
	if l == nil || l.Spec.LeaseTransitions == nil {
		return 0
	}
	return *l.Spec.LeaseTransitions
}
