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

// renewResult is the outcome of one renew request.
type renewResult struct {
	lease *coordinationv1.Lease // as written; if lost, as found (nil: deleted)
	sent  time.Time
	err   error
	lost  bool // another holder (or no Lease) was found
}

// termEnd is how a term's loop ended: why, and what the end of the term
// still has to deal with. At most one of lost, workReturned and yielded
// is set; none when Run's context ended.
type termEnd struct {
	lease        *coordinationv1.Lease // as this term last wrote it
	renewing     chan renewResult      // a renew still in flight, or nil
	lost         error                 // why the term was lost; nil if it was not
	newHolder    string                // the holder a renew found, if it lost the term
	workErr      error                 // what work returned
	workReturned bool
	yielded      bool
}

// lead runs one term: it resumes the intake, runs work, renews the Lease
// every RetryPeriod, ends the term in the documented order and, unless the
// term was lost, releases the Lease. done reports whether Run must return
// err rather than campaign again.
func (e *Elector) lead(ctx context.Context, lease *coordinationv1.Lease, acquired time.Time, work func(context.Context) error) (done bool, err error) {
	term := Term{Number: transitions(lease), Identity: e.cfg.Identity, Acquired: acquired}
	log := e.log.With("term", term.Number)
	e.beginTerm(term, lease, log)

	// The term's context keeps ctx's values but not its cancellation: on
	// shutdown the intake must be suspended before the work sees the end.
	termCtx, cancelTerm := context.WithCancelCause(context.WithValue(context.WithoutCancel(ctx), termKey{}, term))
	defer cancelTerm(nil)
	workDone := startWork(termCtx, work)

	end := e.holdTerm(ctx, termCtx, lease, term.Acquired, workDone, log)
	e.endTerm(end, cancelTerm, log)
	if !end.workReturned {
		e.awaitWork(workDone, log)
	}
	end.lease = e.lastWritten(end)
	return e.finishTerm(ctx, term, end, log)
}

// beginTerm records that this replica leads with lease as it acquired it,
// forgets a Yield meant for an earlier term, then resumes the intake and
// reports the new term.
func (e *Elector) beginTerm(term Term, lease *coordinationv1.Lease, log *slog.Logger) {
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
}

// startWork runs work on its own goroutine and returns the channel its
// result arrives on; a panic in work arrives as an error wrapping
// ErrWorkPanicked, with the panic value and stack.
func startWork(ctx context.Context, work func(context.Context) error) <-chan error {
	workDone := make(chan error, 1)
	go func() {
		defer func() {
			if r := recover(); r != nil {
				workDone <- fmt.Errorf("%w: %v\n%s", ErrWorkPanicked, r, debug.Stack())
			}
		}()
		workDone <- work(ctx)
	}()
	return workDone
}

// holdTerm renews lease every RetryPeriod, each renew on its own goroutine
// under termCtx, until the term ends: ctx ends, Yield is called, the work
// returns, no renew succeeds within RenewDeadline of the last one, or a
// renew finds another holder. It returns how the term ended.
func (e *Elector) holdTerm(ctx, termCtx context.Context, lease *coordinationv1.Lease, acquired time.Time, workDone <-chan error, log *slog.Logger) termEnd {
	end := termEnd{lease: lease}
	deadline := time.After(e.cfg.RenewDeadline - time.Since(acquired))
	tick := time.NewTicker(e.cfg.RetryPeriod)
	defer tick.Stop()
	for {
		select {
		case <-ctx.Done():
			return end
		case <-e.yield:
			end.yielded = true
			return end
		case end.workErr = <-workDone:
			end.workReturned = true
			return end
		case <-deadline:
			end.lost = fmt.Errorf("not renewed within RenewDeadline %s", e.cfg.RenewDeadline)
			return end
		case <-tick.C:
			if end.renewing == nil {
				end.renewing = make(chan renewResult, 1) // the sender never blocks, even if abandoned
				ch, cur, until := end.renewing, end.lease, e.lastRenew.Add(e.cfg.RenewDeadline)
				go func() { ch <- e.renew(termCtx, until, cur) }()
			}
		case r := <-end.renewing:
			end.renewing = nil
			switch {
			case r.lost: // before r.err: a lost renew has no error either
				end.newHolder = holderOf(r.lease)
				end.lost = fmt.Errorf("lease now held by %q", end.newHolder)
				return end
			case r.err == nil:
				end.lease = r.lease
				e.locked(func() { e.lastRenew, e.annotations = r.sent, r.lease.Annotations })
				e.cfg.Metrics.Renewed(r.sent)
				deadline = time.After(e.cfg.RenewDeadline - time.Since(r.sent))
			default:
				e.cfg.Metrics.RenewFailed()
				log.Warn("renewing lease failed", "err", r.err, "since_last_renew", time.Since(e.lastRenew))
			}
		}
	}
}

// endTerm ends the term in the documented order: it suspends the intake,
// records that this replica no longer leads, cancels the work's context
// (with the cause ErrYielded after a Yield) and clears the queue. It does
// not wait for the work.
func (e *Elector) endTerm(end termEnd, cancelTerm context.CancelCauseFunc, log *slog.Logger) {
	// First close the intake, so nothing new is accepted while the work
	// winds down; only then tell the work, and drop what is queued.
	e.cfg.Gate.Suspend()
	// Our term is over: until the Lease is read again the leader is unknown
	// (unless a renew found it), and naming ourselves would send callers
	// back here.
	e.locked(func() { e.leading, e.holder, e.annotations = false, end.newHolder, nil })
	e.cfg.Metrics.Leading(false)
	if end.yielded {
		cancelTerm(ErrYielded)
	} else {
		cancelTerm(nil)
	}
	cleared := e.cfg.Gate.Clear()
	switch {
	case end.lost != nil:
		log.Warn("lost leadership; intake suspended", "cause", end.lost, "cleared", cleared)
	case end.workReturned:
		log.Info("work returned; stepping down", "err", end.workErr, "cleared", cleared)
	case end.yielded:
		log.Info("yielding the lease; intake suspended", "cleared", cleared)
	default:
		log.Info("shutting down; intake suspended", "cleared", cleared)
	}
}

// lastWritten returns the Lease as the ended term last wrote it, whose
// resourceVersion release uses: end.lease, or what a renew still in flight
// returned. That renew was cancelled with the term and a well-behaved
// client returns at once; one that ignores its context is not waited for
// past the request's own deadline, and release then copes by re-reading.
func (e *Elector) lastWritten(end termEnd) *coordinationv1.Lease {
	if end.renewing == nil {
		return end.lease
	}
	select {
	case r := <-end.renewing:
		if r.err == nil {
			return r.lease
		}
	case <-time.After(time.Until(e.lastRenew.Add(e.cfg.RenewDeadline))):
	}
	return end.lease
}

// finishTerm runs once the ended term's work has returned: unless the term
// was lost it releases the Lease; it reports, as lead does, whether Run
// must return err.
func (e *Elector) finishTerm(ctx context.Context, term Term, end termEnd, log *slog.Logger) (done bool, err error) {
	if end.lost != nil {
		if e.cfg.ExitOnLoss {
			return true, fmt.Errorf("%w: term %d: %w", ErrLeadershipLost, term.Number, end.lost)
		}
		return ctx.Err() != nil, nil
	}
	e.release(ctx, end.lease, log)
	if end.yielded { // the work ended because the term did: campaign again
		return ctx.Err() != nil, nil
	}
	if end.workErr != nil {
		return true, fmt.Errorf("leader: term %d work: %w", term.Number, end.workErr)
	}
	return true, nil
}

// awaitWork waits for the term's work to return. Past WorkDeadline
// (LeaseDuration - ClockSkew after the last renew), another replica may
// acquire the Lease:
// that is reported loudly, and the wait goes on, because campaigning again
// while the old work runs could make this replica run two terms at once.
func (e *Elector) awaitWork(done <-chan error, log *slog.Logger) {
	bound := e.WorkDeadline()
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

// renew writes a new renewTime, and the annotations this replica publishes
// now (see Publish), with the resourceVersion of cur. A conflict
// caused by someone else touching the Lease while we still hold it is
// retried once with the fresh resourceVersion. The request cannot outlive
// the term: its context ends at deadline.
func (e *Elector) renew(ctx context.Context, deadline time.Time, cur *coordinationv1.Lease) renewResult {
	ctx, cancel := context.WithDeadline(ctx, deadline)
	defer cancel()
	for attempt := 0; ; attempt++ {
		sent := time.Now()
		l := cur.DeepCopy()
		now, secs := metav1.NewMicroTime(sent), wholeSeconds(e.cfg.LeaseDuration)
		l.Spec.RenewTime, l.Spec.LeaseDurationSeconds = &now, &secs
		publish(l, e.publishing()) // the current set, changed or not
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
