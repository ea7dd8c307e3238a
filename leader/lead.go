// lead.go holds leading: a term's loop, renewing, ending the term and releasing the Lease.

package leader

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"runtime/debug"
	"time"

	coordinationv1 "k8s.io/api/coordination/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

type renewResult struct {
	lease *coordinationv1.Lease // as written; if lost, as found (nil: deleted)
	sent  time.Time
	err   error
	lost  bool // another holder (or no Lease) was found
}

// lead runs one term: it resumes the intake, runs work, renews the Lease
// every RetryPeriod, ends the term in the documented order and, unless the
// term was lost, releases the Lease. done reports whether Run must return
// err rather than campaign again.
func (e *Elector) lead(ctx context.Context, lease *coordinationv1.Lease, acquired time.Time, work func(context.Context) error) (done bool, err error) {
	term := Term{Number: transitions(lease), Identity: e.cfg.Identity, Acquired: acquired}
	log := e.log.With("term", term.Number)

	e.locked(func() {
		e.leading, e.lastRenew, e.holder, e.refusedWrite = true, term.Acquired, e.cfg.Identity, nil
		e.annotations = lease.Annotations
		select {
		case <-e.yield: // a Yield of an earlier term
		default:
		}
	})
	e.cfg.Gate.Resume()
	e.cfg.Metrics.Leading(true)
	e.cfg.Metrics.Renewed(term.Acquired)
	log.Info("acquired leadership")

	// The term's context keeps ctx's values but not its cancellation: on
	// shutdown the intake must be suspended before the work sees the end.
	termCtx, cancelTerm := context.WithCancelCause(context.WithValue(context.WithoutCancel(ctx), termKey{}, term))
	defer cancelTerm(nil)
	workDone := make(chan error, 1)
	go func() {
		defer func() {
			if r := recover(); r != nil {
				workDone <- fmt.Errorf("%w: %v\n%s", ErrWorkPanicked, r, debug.Stack())
			}
		}()
		workDone <- work(termCtx)
	}()

	deadline := time.After(e.cfg.RenewDeadline - time.Since(term.Acquired))
	tick := time.NewTicker(e.cfg.RetryPeriod)
	defer tick.Stop()
	var renewing chan renewResult // non-nil while a renew is in flight
	var lost, workErr error       // why the term was lost; what work returned
	workReturned, yielded, newHolder := false, false, ""
loop:
	for {
		select {
		case <-ctx.Done():
			break loop
		case <-e.yield:
			yielded = true
			break loop
		case workErr = <-workDone:
			workReturned = true
			break loop
		case <-deadline:
			lost = fmt.Errorf("not renewed within RenewDeadline %s", e.cfg.RenewDeadline)
			break loop
		case <-tick.C:
			if renewing == nil {
				renewing = make(chan renewResult, 1) // the sender never blocks, even if abandoned
				ch, cur, until := renewing, lease, e.lastRenew.Add(e.cfg.RenewDeadline)
				go func() { ch <- e.renew(termCtx, until, cur) }()
			}
		case r := <-renewing:
			renewing = nil
			switch {
			case r.err == nil:
				lease = r.lease
				e.locked(func() { e.lastRenew = r.sent })
				e.cfg.Metrics.Renewed(r.sent)
				deadline = time.After(e.cfg.RenewDeadline - time.Since(r.sent))
			case r.lost:
				newHolder = holderOf(r.lease)
				lost = fmt.Errorf("lease now held by %q", newHolder)
				break loop
			default:
				e.cfg.Metrics.RenewFailed()
				log.Warn("renewing lease failed", "err", r.err, "since_last_renew", time.Since(e.lastRenew))
			}
		}
	}

	// First close the intake, so nothing new is accepted while the work
	// winds down; only then tell the work, and drop what is queued.
	e.cfg.Gate.Suspend()
	// Our term is over: until the Lease is read again the leader is unknown
	// (unless a renew found it), and naming ourselves would send callers
	// back here.
	e.locked(func() { e.leading, e.holder, e.annotations = false, newHolder, nil })
	e.cfg.Metrics.Leading(false)
	if yielded {
		cancelTerm(ErrYielded)
	} else {
		cancelTerm(nil)
	}
	cleared := e.cfg.Gate.Clear()
	switch {
	case lost != nil:
		log.Warn("lost leadership; intake suspended", "cause", lost, "cleared", cleared)
	case workReturned:
		log.Info("work returned; stepping down", "err", workErr, "cleared", cleared)
	case yielded:
		log.Info("yielding the lease; intake suspended", "cleared", cleared)
	default:
		log.Info("shutting down; intake suspended", "cleared", cleared)
	}
	if !workReturned {
		e.awaitWork(workDone, log)
	}
	if renewing != nil {
		// A renew still in flight was cancelled above; a well-behaved client
		// returns at once. Its outcome tells release which resourceVersion
		// to use. A client that ignores its context is not waited for past
		// the request's own deadline; release then copes by re-reading.
		select {
		case r := <-renewing:
			if r.err == nil {
				lease = r.lease
			}
		case <-time.After(time.Until(e.lastRenew.Add(e.cfg.RenewDeadline))):
		}
	}
	if lost != nil {
		if e.cfg.ExitOnLoss {
			return true, fmt.Errorf("%w: term %d: %w", ErrLeadershipLost, term.Number, lost)
		}
		return ctx.Err() != nil, nil
	}
	e.release(ctx, lease, log)
	if yielded && !workReturned {
		return ctx.Err() != nil, nil
	}
	if workErr != nil {
		return true, fmt.Errorf("leader: term %d work: %w", term.Number, workErr)
	}
	return true, nil
}

// awaitWork waits for the term's work to return. Past LeaseDuration -
// ClockSkew after the last renew, another replica may acquire the Lease:
// that is reported loudly, and the wait goes on, because campaigning again
// while the old work runs could make this replica run two terms at once.
func (e *Elector) awaitWork(done <-chan error, log *slog.Logger) {
	bound := e.lastRenew.Add(e.cfg.LeaseDuration - e.cfg.ClockSkew)
	var err error
	select {
	case err = <-done: // returned already: no overrun, even past the bound
	default:
		select {
		case err = <-done:
		case <-time.After(time.Until(bound)):
			e.locked(func() { e.overrun = true })
			e.cfg.Metrics.WorkOverran()
			log.Error("term work ignores its context and still runs after another replica may have acquired the lease; not campaigning until it returns",
				"bound", bound)
			err = <-done
			e.locked(func() { e.overrun = false })
			log.Error("overrunning term work returned", "late_by", time.Since(bound))
		}
	}
	if err != nil && !errors.Is(err, context.Canceled) {
		log.Warn("term work returned an error", "err", err)
	}
}

// renew writes a new renewTime with the resourceVersion of cur. A conflict
// caused by someone else touching the Lease while we still hold it is
// retried once with the fresh resourceVersion. The request cannot outlive
// the term: its context ends at deadline.
func (e *Elector) renew(ctx context.Context, deadline time.Time, cur *coordinationv1.Lease) renewResult {
	ctx, cancel := context.WithDeadline(ctx, deadline)
	defer cancel()
	for attempt := 0; ; attempt++ {
		sent := time.Now()
		l := cur.DeepCopy()
		now, secs := metav1.NewMicroTime(sent), e.leaseSeconds()
		l.Spec.RenewTime, l.Spec.LeaseDurationSeconds = &now, &secs
		got, err := e.leases.Update(ctx, l, metav1.UpdateOptions{})
		switch {
		case err == nil:
			return renewResult{lease: got, sent: sent}
		case apierrors.IsNotFound(err):
			return renewResult{lost: true}
		case !apierrors.IsConflict(err) || attempt > 0:
			return renewResult{err: err}
		}
		fresh, err := e.get(ctx)
		if err != nil {
			return renewResult{err: fmt.Errorf("after conflict: %w", err)}
		}
		if holderOf(fresh) != e.cfg.Identity || transitions(fresh) != transitions(cur) {
			return renewResult{lost: true, lease: fresh}
		}
		cur = fresh
	}
}

// release clears the holder of the Lease if it still names this replica,
// with a resourceVersion precondition (cur's, then on a conflict that of
// the Lease read again); it is called only after the term's work has
// returned.
func (e *Elector) release(ctx context.Context, cur *coordinationv1.Lease, log *slog.Logger) {
	rctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), e.cfg.RenewDeadline)
	defer cancel()
	for range 3 {
		if holderOf(cur) != e.cfg.Identity {
			log.Info("not releasing: the lease no longer names this replica", "holder", holderOf(cur))
			e.locked(func() { e.holder = holderOf(cur) })
			return
		}
		l := cur.DeepCopy()
		empty, now := "", metav1.NewMicroTime(time.Now())
		l.Spec.HolderIdentity, l.Spec.RenewTime = &empty, &now
		publish(l, nil)
		_, err := e.leases.Update(rctx, l, metav1.UpdateOptions{})
		if err == nil {
			e.locked(func() { e.holder, e.annotations = "", nil })
			log.Info("released lease")
			return
		}
		if apierrors.IsConflict(err) {
			cur, err = e.get(rctx)
		}
		if err != nil {
			log.Warn("releasing lease failed; it will expire", "err", err)
			return
		}
	}
	log.Warn("releasing lease: too many conflicts; it will expire")
}
