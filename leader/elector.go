package leader

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"runtime/debug"
	"sync"
	"sync/atomic"
	"time"

	coordinationv1 "k8s.io/api/coordination/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/fields"
	"k8s.io/apimachinery/pkg/watch"
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

	mu        sync.Mutex
	holder    string    // last observed holder identity
	leading   bool      // between Gate.Resume and Gate.Suspend
	lastRenew time.Time // start of the last successful write while leading
	overrun   bool      // a finished term's work is past its bound
	// refusedRead and refusedWrite are the last errors of a campaign's
	// Lease read and write that retrying does not fix; nil after a success.
	refusedRead, refusedWrite error
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
	}, nil
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
	if e.overrun {
		return ErrWorkOverrun
	}
	if err := cmp.Or(e.refusedWrite, e.refusedRead); err != nil && !e.leading {
		return fmt.Errorf("%w: %w", ErrCannotCampaign, err)
	}
	if e.leading {
		if age := time.Since(e.lastRenew); age > e.cfg.RenewDeadline {
			return fmt.Errorf("%w: last renewed %s ago", ErrNotRenewed, age.Round(time.Millisecond))
		}
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
		end := e.lead(ctx, lease, sent, work)
		switch end.reason {
		case endShutdown:
			e.release(ctx, end.lease, end.log)
			return nil
		case endWorkReturned:
			e.release(ctx, end.lease, end.log)
			if end.err != nil {
				return fmt.Errorf("leader: term %d work: %w", end.term.Number, end.err)
			}
			return nil
		case endLost:
			if e.cfg.ExitOnLoss {
				return fmt.Errorf("%w: term %d: %w", ErrLeadershipLost, end.term.Number, end.err)
			}
			if ctx.Err() != nil {
				return nil
			}
		}
	}
}

// ---- campaigning ----

// observation is the follower's view of the Lease.
type observation struct {
	known bool                  // a Get or a watch event has answered
	lease *coordinationv1.Lease // nil: the Lease does not exist
	at    time.Time             // when its current resourceVersion (or its absence) was first seen
	// gone is the Lease last seen before it was deleted, if it named
	// another replica: that replica may still lead until its next renew
	// fails, so the Lease is treated as held by it until it would have
	// expired (at is left at its last change: the holder cannot renew a
	// deleted Lease, so its promise ends there).
	gone *coordinationv1.Lease
}

type pollResult struct {
	lease *coordinationv1.Lease
	err   error
}

type leaseEvent struct {
	lease   *coordinationv1.Lease
	deleted bool
}

func (e *Elector) observe(obs *observation, l *coordinationv1.Lease) {
	now := time.Now()
	if l == nil {
		if !obs.known || obs.lease != nil {
			obs.gone = nil
			if obs.lease != nil && holderOf(obs.lease) != "" && holderOf(obs.lease) != e.cfg.Identity {
				// Deleted under a holder (a leader releases by clearing
				// its name, never by deleting): by hand, to force a
				// failover, or by a cleanup. The holder learns of it only
				// at its next renew.
				obs.gone = obs.lease
			} else {
				obs.at = now
			}
		}
		obs.known, obs.lease = true, nil
		e.setHolder(holderOf(obs.gone))
		return
	}
	// The wait for expiry restarts only when the Lease changed: a failed
	// write of ours (a 5xx, a timeout) makes us read it again, and an
	// unchanged Lease must not cost another LeaseDuration.
	if obs.lease == nil || obs.lease.ResourceVersion != l.ResourceVersion {
		obs.at = now
	}
	obs.known, obs.lease, obs.gone = true, l, nil
	e.setHolder(holderOf(l))
}

// untilAcquirable returns how long until the observed Lease may be taken;
// zero or less means now.
func (e *Elector) untilAcquirable(obs observation) time.Duration {
	l := obs.lease
	if l == nil {
		if obs.gone == nil {
			return 0
		}
		l = obs.gone
	}
	h := holderOf(l)
	if h == "" || h == e.cfg.Identity {
		return 0
	}
	d := e.cfg.LeaseDuration
	if l.Spec.LeaseDurationSeconds != nil && *l.Spec.LeaseDurationSeconds > 0 {
		// The holder's own promise is what counts.
		d = time.Duration(*l.Spec.LeaseDurationSeconds) * time.Second
	}
	return time.Until(obs.at.Add(d))
}

// campaign returns once this replica has written itself as holder, with the
// Lease as written and the time the write was sent; or ctx's error.
func (e *Elector) campaign(ctx context.Context) (*coordinationv1.Lease, time.Time, error) {
	wctx, stopWatch := context.WithCancel(ctx)
	var wg sync.WaitGroup
	defer wg.Wait()
	defer stopWatch()
	leaseEvents := make(chan leaseEvent)
	wg.Go(func() { e.watchLease(wctx, leaseEvents) })

	var obs observation
	var polling chan pollResult // non-nil while a read is in flight
	// events counts the watch's deliveries, pollAfter is that count when
	// the read in flight was sent: a read overtaken by a watch event may
	// answer with an older version, which must not count as a change.
	var events, pollAfter int
	poll := time.NewTimer(0)
	defer poll.Stop()
	expiry := time.NewTimer(time.Hour)
	expiry.Stop()
	defer expiry.Stop()
	for {
		select {
		case <-ctx.Done():
			return nil, time.Time{}, ctx.Err()
		case ev := <-leaseEvents:
			events++
			if ev.deleted {
				e.observe(&obs, nil)
			} else {
				e.observe(&obs, ev.lease)
			}
		case <-poll.C:
			// The read runs on its own goroutine so that a slow API server
			// does not hold back the watch events meanwhile.
			if polling == nil {
				pollAfter = events
				polling = make(chan pollResult, 1)
				ch := polling
				wg.Go(func() {
					l, err := e.get(wctx)
					ch <- pollResult{l, err}
				})
			}
			continue
		case r := <-polling:
			polling = nil
			switch {
			case (r.err == nil || apierrors.IsNotFound(r.err)) && events != pollAfter:
				// Overtaken by the watch, which is at least as fresh.
				e.refused(&e.refusedRead, nil)
			case r.err == nil:
				e.observe(&obs, r.lease)
				e.refused(&e.refusedRead, nil)
			case apierrors.IsNotFound(r.err):
				e.observe(&obs, nil)
				e.refused(&e.refusedRead, nil)
			case ctx.Err() != nil:
				return nil, time.Time{}, ctx.Err()
			case refusal(r.err):
				e.refused(&e.refusedRead, r.err)
				e.log.Error("reading lease refused: this replica cannot lead until that is fixed", "err", r.err)
			default:
				e.log.Warn("reading lease", "err", r.err)
			}
			poll.Reset(jittered(e.cfg.RetryPeriod))
		case <-expiry.C:
		}
		if !obs.known {
			continue
		}
		if wait := e.untilAcquirable(obs); wait > 0 {
			// Another replica leads: there is nothing to write, so an
			// earlier refused write says nothing about now (a Role applied
			// meanwhile); the next attempt will tell.
			e.refused(&e.refusedWrite, nil)
			expiry.Reset(wait)
			continue
		}
		lease, sent, err := e.acquire(ctx, obs.lease)
		if err == nil {
			e.refused(&e.refusedWrite, nil)
			return lease, sent, nil
		}
		if ctx.Err() != nil {
			// The cancellation may have cut off the response of a request
			// the API server applied: release a Lease that names us, so
			// that the next leader need not wait for it to expire.
			e.releaseIfOurs(ctx)
			return nil, time.Time{}, ctx.Err()
		}
		// Someone else wrote first (conflict, already exists) or the API
		// failed: read again before the next attempt (a watch event may
		// well come first).
		obs.known = false
		switch {
		case apierrors.IsConflict(err) || apierrors.IsAlreadyExists(err):
			e.log.Debug("lost the race to acquire", "err", err)
			poll.Reset(0)
		case refusal(err) || apierrors.IsNotFound(err) && obs.lease == nil:
			// A Create answered NotFound: the namespace does not exist.
			e.refused(&e.refusedWrite, err)
			e.log.Error("acquiring lease refused: this replica cannot lead until that is fixed", "err", err)
			poll.Reset(jittered(e.cfg.RetryPeriod))
		default:
			e.log.Warn("acquiring lease", "err", err)
			poll.Reset(jittered(e.cfg.RetryPeriod))
		}
	}
}

// refusal reports whether err is an answer that retrying the same request
// does not change: the identity lacks the permission or the credentials,
// or the API server rejects the request itself.
func refusal(err error) bool {
	return apierrors.IsForbidden(err) || apierrors.IsUnauthorized(err) || apierrors.IsInvalid(err) ||
		apierrors.IsBadRequest(err) || apierrors.IsMethodNotSupported(err)
}

// refused records err (nil: a success) as the last outcome of one kind of
// campaign request, for Check.
func (e *Elector) refused(slot *error, err error) {
	e.mu.Lock()
	*slot = err
	e.mu.Unlock()
}

// watchLease streams the Lease's changes to out until ctx ends, restarting
// the watch whenever it closes.
func (e *Elector) watchLease(ctx context.Context, out chan<- leaseEvent) {
	sel := fields.OneTermEqualSelector("metadata.name", e.cfg.Name).String()
	timeout := int64(300)
	for ctx.Err() == nil {
		started := time.Now()
		w, err := e.leases.Watch(ctx, metav1.ListOptions{FieldSelector: sel, TimeoutSeconds: &timeout})
		if err != nil {
			e.log.Debug("watching lease", "err", err)
		} else {
			e.forward(ctx, w, out)
			w.Stop()
		}
		if time.Since(started) < e.cfg.RetryPeriod {
			// Do not spin on a failing or instantly closing watch; the poll
			// keeps the follower informed meanwhile.
			t := time.NewTimer(e.cfg.RetryPeriod)
			select {
			case <-ctx.Done():
			case <-t.C:
			}
			t.Stop()
		}
	}
}

func (e *Elector) forward(ctx context.Context, w watch.Interface, out chan<- leaseEvent) {
	for {
		select {
		case <-ctx.Done():
			return
		case ev, ok := <-w.ResultChan():
			if !ok {
				return
			}
			l, isLease := ev.Object.(*coordinationv1.Lease)
			if !isLease || l.Name != e.cfg.Name {
				if ev.Type == watch.Error {
					return
				}
				continue
			}
			var le leaseEvent
			switch ev.Type {
			case watch.Added, watch.Modified:
				le = leaseEvent{lease: l}
			case watch.Deleted:
				le = leaseEvent{deleted: true}
			default:
				continue
			}
			select {
			case out <- le:
			case <-ctx.Done():
				return
			}
		}
	}
}

// acquire writes this replica as holder: Create if the Lease does not
// exist, otherwise Update with the observed resourceVersion.
func (e *Elector) acquire(ctx context.Context, observed *coordinationv1.Lease) (*coordinationv1.Lease, time.Time, error) {
	sent := time.Now()
	rctx, cancel := context.WithTimeout(ctx, e.cfg.RenewDeadline)
	defer cancel()
	now := metav1.NewMicroTime(sent)
	id := e.cfg.Identity
	secs := e.leaseSeconds()
	if observed == nil {
		var zero int32
		l := &coordinationv1.Lease{
			ObjectMeta: metav1.ObjectMeta{Name: e.cfg.Name, Namespace: e.cfg.Namespace},
			Spec: coordinationv1.LeaseSpec{
				HolderIdentity:       &id,
				LeaseDurationSeconds: &secs,
				AcquireTime:          &now,
				RenewTime:            &now,
				LeaseTransitions:     &zero,
			},
		}
		got, err := e.leases.Create(rctx, l, metav1.CreateOptions{})
		return got, sent, err
	}
	l := observed.DeepCopy()
	var n int32
	if l.Spec.LeaseTransitions != nil {
		n = *l.Spec.LeaseTransitions + 1
	}
	l.Spec.HolderIdentity = &id
	l.Spec.LeaseDurationSeconds = &secs
	l.Spec.AcquireTime = &now
	l.Spec.RenewTime = &now
	l.Spec.LeaseTransitions = &n
	got, err := e.leases.Update(rctx, l, metav1.UpdateOptions{})
	return got, sent, err
}

// ---- leading ----

type endReason int

const (
	endShutdown endReason = iota + 1
	endWorkReturned
	endLost
)

type termEnd struct {
	reason endReason
	err    error // work's error (endWorkReturned) or the cause (endLost)
	term   Term
	lease  *coordinationv1.Lease // the Lease as last written by us
	log    *slog.Logger
}

type renewResult struct {
	lease *coordinationv1.Lease
	sent  time.Time
	err   error
	lost  bool // another holder (or no Lease) was found
}

// lead runs one term: it resumes the intake, runs work, renews the Lease
// every RetryPeriod, and ends the term in the documented order.
func (e *Elector) lead(ctx context.Context, lease *coordinationv1.Lease, acquired time.Time, work func(context.Context) error) termEnd {
	term := Term{Identity: e.cfg.Identity, Acquired: acquired}
	if lease.Spec.LeaseTransitions != nil {
		term.Number = *lease.Spec.LeaseTransitions
	}
	log := e.log.With("term", term.Number)
	m := e.cfg.Metrics

	e.mu.Lock()
	e.leading, e.lastRenew, e.holder = true, acquired, e.cfg.Identity
	e.mu.Unlock()
	e.cfg.Gate.Resume()
	m.Leading(true)
	m.Renewed(acquired)
	log.Info("acquired leadership")

	// The term's context keeps ctx's values but not its cancellation: on
	// shutdown the intake must be suspended before the work sees the end.
	termCtx, cancelTerm := context.WithCancel(withTerm(context.WithoutCancel(ctx), term))
	defer cancelTerm()
	workDone := make(chan error, 1)
	go func() { workDone <- runWork(termCtx, work) }()

	renewCtx, cancelRenew := context.WithCancel(ctx)
	defer cancelRenew()
	lastRenew := acquired
	current := lease
	deadline := time.NewTimer(time.Until(lastRenew.Add(e.cfg.RenewDeadline)))
	defer deadline.Stop()
	tick := time.NewTimer(e.cfg.RetryPeriod)
	defer tick.Stop()
	var renewing chan renewResult // non-nil while a renew is in flight
	var renewDeadline time.Time   // the in-flight renew's deadline

	end := termEnd{term: term, log: log}
	workReturned := false
loop:
	for {
		select {
		case <-ctx.Done():
			end.reason = endShutdown
			break loop
		case err := <-workDone:
			workReturned = true
			end.reason, end.err = endWorkReturned, err
			break loop
		case <-deadline.C:
			end.reason = endLost
			end.err = fmt.Errorf("not renewed within RenewDeadline %s", e.cfg.RenewDeadline)
			break loop
		case <-tick.C:
			if renewing == nil {
				renewing = make(chan renewResult, 1) // the sender never blocks, even if abandoned
				renewDeadline = lastRenew.Add(e.cfg.RenewDeadline)
				go e.renew(renewCtx, renewDeadline, current, renewing)
			}
		case r := <-renewing:
			renewing = nil
			switch {
			case r.err == nil:
				lastRenew, current = r.sent, r.lease
				e.mu.Lock()
				e.lastRenew = lastRenew
				e.mu.Unlock()
				m.Renewed(lastRenew)
				deadline.Reset(time.Until(lastRenew.Add(e.cfg.RenewDeadline)))
				tick.Reset(e.cfg.RetryPeriod)
			case r.lost:
				end.reason = endLost
				end.err = fmt.Errorf("lease now held by %q", holderOf(r.lease))
				if r.lease != nil {
					e.setHolder(holderOf(r.lease))
				}
				break loop
			default:
				m.RenewFailed()
				log.Warn("renewing lease failed", "err", r.err, "since_last_renew", time.Since(lastRenew))
				tick.Reset(e.cfg.RetryPeriod)
			}
		}
	}

	// First close the intake, so nothing new is accepted while the work
	// winds down; only then tell the work, and drop what is queued.
	e.cfg.Gate.Suspend()
	e.mu.Lock()
	e.leading = false
	if e.holder == e.cfg.Identity {
		// Our term is over: until the Lease is read again the leader is
		// unknown, and naming ourselves would send callers back here.
		e.holder = ""
	}
	e.mu.Unlock()
	m.Leading(false)
	cancelTerm()
	cleared := e.cfg.Gate.Clear()
	cancelRenew()
	switch end.reason {
	case endLost:
		log.Warn("lost leadership; intake suspended", "cause", end.err, "cleared", cleared)
	case endShutdown:
		log.Info("shutting down; intake suspended", "cleared", cleared)
	case endWorkReturned:
		log.Info("work returned; stepping down", "err", end.err, "cleared", cleared)
	}
	if !workReturned {
		err := e.awaitWork(workDone, lastRenew.Add(e.cfg.LeaseDuration-e.cfg.ClockSkew), log)
		if err != nil && !errors.Is(err, context.Canceled) {
			log.Warn("term work returned an error", "err", err)
		}
	}
	if renewing != nil {
		// A renew still in flight was cancelled above; a well-behaved client
		// returns at once. Its outcome tells release which resourceVersion
		// to use. A client that ignores its context is not waited for past
		// the request's own deadline; release then copes by re-reading.
		t := time.NewTimer(time.Until(renewDeadline))
		select {
		case r := <-renewing:
			if r.err == nil {
				current = r.lease
			}
		case <-t.C:
		}
		t.Stop()
	}
	end.lease = current
	return end
}

// awaitWork waits for the term's work to return. Past bound, another
// replica may acquire the Lease: that is reported loudly, and the wait goes
// on, because campaigning again while the old work runs could make this
// replica run two terms at once.
func (e *Elector) awaitWork(done <-chan error, bound time.Time, log *slog.Logger) error {
	select {
	case err := <-done:
		return err
	default:
	}
	t := time.NewTimer(time.Until(bound))
	defer t.Stop()
	select {
	case err := <-done:
		return err
	case <-t.C:
	}
	e.mu.Lock()
	e.overrun = true
	e.mu.Unlock()
	e.cfg.Metrics.WorkOverran()
	log.Error("term work ignores its context and still runs after another replica may have acquired the lease; not campaigning until it returns",
		"bound", bound)
	err := <-done
	e.mu.Lock()
	e.overrun = false
	e.mu.Unlock()
	log.Error("overrunning term work returned", "late_by", time.Since(bound))
	return err
}

// renew writes a new renewTime with the resourceVersion of cur. A conflict
// caused by someone else touching the Lease while we still hold it is
// retried once with the fresh resourceVersion. The request cannot outlive
// the term: its context ends at deadline.
func (e *Elector) renew(ctx context.Context, deadline time.Time, cur *coordinationv1.Lease, out chan<- renewResult) {
	ctx, cancel := context.WithDeadline(ctx, deadline)
	defer cancel()
	for attempt := 0; ; attempt++ {
		sent := time.Now()
		l := cur.DeepCopy()
		now := metav1.NewMicroTime(sent)
		secs := e.leaseSeconds()
		l.Spec.RenewTime = &now
		l.Spec.LeaseDurationSeconds = &secs
		got, err := e.leases.Update(ctx, l, metav1.UpdateOptions{})
		if err == nil {
			out <- renewResult{lease: got, sent: sent}
			return
		}
		if apierrors.IsNotFound(err) {
			out <- renewResult{lost: true, err: err}
			return
		}
		if !apierrors.IsConflict(err) || attempt > 0 {
			out <- renewResult{err: err}
			return
		}
		fresh, gerr := e.get(ctx)
		switch {
		case apierrors.IsNotFound(gerr):
			out <- renewResult{lost: true, err: gerr}
			return
		case gerr != nil:
			out <- renewResult{err: fmt.Errorf("after conflict: %w", gerr)}
			return
		case holderOf(fresh) != e.cfg.Identity || transitions(fresh) != transitions(cur):
			out <- renewResult{lost: true, lease: fresh, err: err}
			return
		}
		cur = fresh
	}
}

// release clears the holder of the Lease if it still names this replica,
// with a resourceVersion precondition; it is called only after the term's
// work has returned.
func (e *Elector) release(ctx context.Context, cur *coordinationv1.Lease, log *slog.Logger) {
	rctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), e.cfg.RenewDeadline)
	defer cancel()
	for attempt := 0; attempt < 3; attempt++ {
		if holderOf(cur) != e.cfg.Identity {
			log.Info("not releasing: lease held by another replica", "holder", holderOf(cur))
			e.setHolder(holderOf(cur))
			return
		}
		l := cur.DeepCopy()
		empty := ""
		now := metav1.NewMicroTime(time.Now())
		l.Spec.HolderIdentity = &empty
		l.Spec.RenewTime = &now
		_, err := e.leases.Update(rctx, l, metav1.UpdateOptions{})
		if err == nil {
			e.setHolder("")
			log.Info("released lease")
			return
		}
		if !apierrors.IsConflict(err) {
			log.Warn("releasing lease failed; it will expire", "err", err)
			return
		}
		fresh, gerr := e.get(rctx)
		if gerr != nil {
			if !apierrors.IsNotFound(gerr) {
				log.Warn("releasing lease failed; it will expire", "err", gerr)
			}
			return
		}
		cur = fresh
	}
	log.Warn("releasing lease: too many conflicts; it will expire")
}

// runWork calls work, turning a panic into an error wrapping
// ErrWorkPanicked with the panic value and stack.
func runWork(ctx context.Context, work func(context.Context) error) (err error) {
	defer func() {
		if r := recover(); r != nil {
			err = fmt.Errorf("%w: %v\n%s", ErrWorkPanicked, r, debug.Stack())
		}
	}()
	return work(ctx)
}

// releaseIfOurs reads the Lease (with a context of its own, bounded by
// RenewDeadline, as ctx has ended) and releases it if it names this
// replica. No work ran under it, so there is nothing to wait for.
func (e *Elector) releaseIfOurs(ctx context.Context) {
	rctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), e.cfg.RenewDeadline)
	defer cancel()
	l, err := e.get(rctx)
	if err != nil {
		if !apierrors.IsNotFound(err) {
			e.log.Warn("reading lease after a cancelled acquisition failed; if it was acquired, it will expire", "err", err)
		}
		return
	}
	if holderOf(l) == e.cfg.Identity {
		e.log.Info("a cancelled acquisition had taken the lease; releasing it")
		e.release(ctx, l, e.log)
	}
}

// ---- helpers ----

func (e *Elector) get(ctx context.Context) (*coordinationv1.Lease, error) {
	rctx, cancel := context.WithTimeout(ctx, e.cfg.RenewDeadline)
	defer cancel()
	return e.leases.Get(rctx, e.cfg.Name, metav1.GetOptions{})
}

func (e *Elector) setHolder(h string) {
	e.mu.Lock()
	e.holder = h
	e.mu.Unlock()
}

// leaseSeconds is LeaseDuration rounded up to whole seconds, so that the
// promise written to the Lease is never shorter than the one we keep.
func (e *Elector) leaseSeconds() int32 {
	return int32((e.cfg.LeaseDuration + time.Second - 1) / time.Second)
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

// jittered returns d shortened by up to retryJitter at random.
func jittered(d time.Duration) time.Duration {
	return queue.Backoff{Base: d, Cap: d, Jitter: retryJitter}.Delay(1)
}
