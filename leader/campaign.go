// campaign.go holds following the Lease and acquiring it.

package leader

import (
	"context"
	"sync"
	"time"

	coordinationv1 "k8s.io/api/coordination/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/fields"
	"k8s.io/apimachinery/pkg/watch"

	"github.com/opkit/opkit/queue"
)

// observation is the follower's view of the Lease.
type observation struct {
	known bool                  // a read or a watch event has answered
	lease *coordinationv1.Lease // the Lease as it is now; nil if it does not exist
	// last is the Lease last seen, nil if none was; it is kept when the
	// Lease is deleted: if it named another replica, that replica may still
	// lead until its next renew fails, so the Lease is treated as held by it
	// until it would have expired (at stays put: the holder cannot renew a
	// deleted Lease).
	last *coordinationv1.Lease
	at   time.Time // when last's resourceVersion was first seen
}

// leaseRead is the answer of a read or a watch event: a Lease, nil if it
// does not exist, or an error.
type leaseRead struct {
	lease *coordinationv1.Lease
	err   error
}

// observe records l, the Lease just read or watched (nil: it does not exist).
func (e *Elector) observe(obs *observation, l *coordinationv1.Lease) {
	// The wait for expiry restarts only when the Lease changed: a failed
	// write of ours (a 5xx, a timeout) makes us read it again, and an
	// unchanged Lease must not cost another LeaseDuration.
	if l != nil && (obs.last == nil || obs.last.ResourceVersion != l.ResourceVersion) {
		obs.last, obs.at = l, time.Now()
	}
	obs.known, obs.lease = true, l
	e.locked(func() { e.holder, e.annotations = holderOf(obs.last), annotationsOf(obs.last) })
}

// untilAcquirable returns how long until the observed Lease may be taken;
// zero or less means now.
func (e *Elector) untilAcquirable(obs observation) time.Duration {
	if h := holderOf(obs.last); h == "" || h == e.cfg.Identity {
		return 0
	}
	d := e.cfg.LeaseDuration
	if s := obs.last.Spec.LeaseDurationSeconds; s != nil && *s > 0 {
		d = time.Duration(*s) * time.Second // the holder's own promise is what counts
	}
	return time.Until(obs.at.Add(d))
}

// campaignState is what one campaign's loop keeps between its events: the
// follower's view of the Lease, the read in flight and the timers that
// wake the loop.
type campaignState struct {
	obs     observation
	polling chan leaseRead // non-nil while a read is in flight
	// events counts the watch's deliveries, pollAfter is that count when
	// the read in flight was sent: a read overtaken by a watch event may
	// answer with an older version, which must not count as a change.
	events, pollAfter int
	poll              <-chan time.Time // when to read the Lease next
	expiry            <-chan time.Time // when the Lease may be acquirable
}

// campaign returns once this replica has written itself as holder, with the
// Lease as written and the time the write was sent; or ctx's error.
func (e *Elector) campaign(ctx context.Context) (*coordinationv1.Lease, time.Time, error) {
	wctx, stopWatch := context.WithCancel(ctx)
	var wg sync.WaitGroup
	defer wg.Wait()
	defer stopWatch()
	watched := make(chan leaseRead)
	wg.Go(func() { e.watchLease(wctx, watched) })

	s := campaignState{poll: time.After(0)}
	for {
		select {
		case <-ctx.Done():
			return nil, time.Time{}, ctx.Err()
		case ev := <-watched:
			s.events++
			e.observe(&s.obs, ev.lease)
		case <-s.poll:
			e.startRead(wctx, &wg, &s)
			continue
		case r := <-s.polling:
			if err := e.readAnswered(ctx, &s, r); err != nil {
				return nil, time.Time{}, err
			}
		case <-s.expiry:
		}
		if !s.obs.known || !e.mayAcquireNow(&s) {
			continue
		}
		lease, sent, err := e.acquire(ctx, s.obs.lease)
		if err == nil {
			e.writeRefusals = 0
			return lease, sent, nil
		}
		if ctx.Err() != nil {
			e.releaseUnusedLease(ctx)
			return nil, time.Time{}, ctx.Err()
		}
		e.acquireFailed(&s, err)
	}
}

// startRead sends a read of the Lease unless one is in flight already; its
// answer arrives on s.polling. The read runs on its own goroutine (in wg)
// so that a slow API server does not hold back the watch events meanwhile.
func (e *Elector) startRead(ctx context.Context, wg *sync.WaitGroup, s *campaignState) {
	if s.polling != nil {
		return
	}
	s.pollAfter = s.events
	s.polling = make(chan leaseRead, 1)
	ch := s.polling
	wg.Go(func() {
		l, err := e.get(ctx)
		ch <- leaseRead{l, err}
	})
}

// readAnswered records the answer r of the read in flight and schedules the
// next one. It returns ctx's error if the read failed because ctx ended.
func (e *Elector) readAnswered(ctx context.Context, s *campaignState, r leaseRead) error {
	s.polling = nil
	s.poll = time.After(e.pollPeriod())
	switch {
	case r.err == nil:
		if s.events == s.pollAfter { // else overtaken by the watch, which is at least as fresh
			e.observe(&s.obs, r.lease)
		}
		e.readRefusals = 0
		e.locked(func() { e.refusedRead = nil })
	case ctx.Err() != nil:
		return ctx.Err()
	case lasting(r.err, &e.readRefusals):
		e.locked(func() { e.refusedRead = r.err })
		e.log.Error("reading lease refused: this replica cannot lead until that is fixed", "err", r.err)
	default:
		e.log.Warn("reading lease failed; retrying", "after", e.cfg.RetryPeriod, "err", r.err)
	}
	return nil
}

// mayAcquireNow reports whether this replica should try to acquire the
// observed Lease now: it has expired or is free, and Config.Admit agrees.
// If not, it sets s.expiry to when to ask again.
func (e *Elector) mayAcquireNow(s *campaignState) bool {
	if wait := e.untilAcquirable(s.obs); wait > 0 {
		// Another replica leads: there is nothing to write, so an
		// earlier refused write says nothing about now (a Role applied
		// meanwhile); the next attempt will tell.
		e.locked(func() { e.refusedWrite = nil })
		s.expiry = time.After(wait)
		return false
	}
	if e.cfg.Admit != nil && !e.cfg.Admit() {
		s.expiry = time.After(e.cfg.RetryPeriod)
		return false
	}
	return true
}

// releaseUnusedLease is called when ctx ended during an acquiring write.
// The cancellation may have cut off the response of a request the API
// server applied: it releases a Lease that names this replica, so that the
// next leader need not wait for it to expire. No work ran under it, so
// there is nothing to wait for.
func (e *Elector) releaseUnusedLease(ctx context.Context) {
	if l, err := e.get(context.WithoutCancel(ctx)); err == nil && holderOf(l) == e.cfg.Identity {
		e.release(ctx, l, e.log)
	}
}

// acquireFailed handles an acquiring write that failed with err while ctx
// is still on: someone else wrote first (conflict, already exists) or the
// API failed. The Lease is read again before the next attempt (a watch
// event may well come first), at once after a lost race.
func (e *Elector) acquireFailed(s *campaignState, err error) {
	s.obs.known = false
	retry := e.pollPeriod()
	switch {
	case apierrors.IsConflict(err) || apierrors.IsAlreadyExists(err):
		e.log.Debug("lost the race to acquire", "err", err)
		retry = 0
	case lasting(err, &e.writeRefusals) || apierrors.IsNotFound(err) && s.obs.lease == nil:
		// A Create answered NotFound: the namespace does not exist.
		e.locked(func() { e.refusedWrite = err })
		e.log.Error("acquiring lease refused: this replica cannot lead until that is fixed", "err", err)
	default:
		e.log.Warn("acquiring lease failed; retrying", "after", retry, "err", err)
	}
	s.poll = time.After(retry)
}

// lasting reports whether err is an answer that retrying the same request
// does not change: the API server rejects the request itself, or the
// identity lacks the permission or the credentials, once
// queue.TransientRefusals 401/403 answers to such requests came in a row
// before this one (an API server that has just started refuses until its
// authorizer has synced). It counts the 401/403 answers in *refusals;
// the caller resets it after a success.
func lasting(err error, refusals *int) bool {
	if apierrors.IsForbidden(err) || apierrors.IsUnauthorized(err) {
		*refusals++
		return *refusals > queue.TransientRefusals
	}
	return apierrors.IsInvalid(err) || apierrors.IsBadRequest(err) || apierrors.IsMethodNotSupported(err)
}

// watchLease sends the Lease's changes to out until ctx ends, restarting
// the watch whenever it closes, at most once per RetryPeriod (the poll
// keeps the follower informed meanwhile).
func (e *Elector) watchLease(ctx context.Context, out chan<- leaseRead) {
	timeout := int64(300)
	opts := metav1.ListOptions{FieldSelector: fields.OneTermEqualSelector("metadata.name", e.cfg.Name).String(), TimeoutSeconds: &timeout}
	for ctx.Err() == nil {
		started := time.Now()
		if w, err := e.leases.Watch(ctx, opts); err != nil {
			e.log.Debug("watching lease", "err", err)
		} else {
			stop := context.AfterFunc(ctx, w.Stop) // ends the range below
			for ev := range w.ResultChan() {
				l, ok := ev.Object.(*coordinationv1.Lease)
				if !ok || l.Name != e.cfg.Name { // an error or a bookmark
					continue
				}
				if ev.Type == watch.Deleted {
					l = nil
				}
				select {
				case out <- leaseRead{lease: l}:
				case <-ctx.Done():
				}
			}
			stop()
			w.Stop()
		}
		select {
		case <-ctx.Done():
		case <-time.After(time.Until(started.Add(e.cfg.RetryPeriod))):
		}
	}
}

// acquire writes this replica as holder: Create if the Lease does not
// exist (observed is nil), otherwise Update with the observed
// resourceVersion.
func (e *Elector) acquire(ctx context.Context, observed *coordinationv1.Lease) (*coordinationv1.Lease, time.Time, error) {
	l := &coordinationv1.Lease{ObjectMeta: metav1.ObjectMeta{Name: e.cfg.Name, Namespace: e.cfg.Namespace}}
	var n int32
	if observed != nil {
		l = observed.DeepCopy()
		n = transitions(observed) + 1
	}
	sent := time.Now()
	now, id, secs := metav1.NewMicroTime(sent), e.cfg.Identity, wholeSeconds(e.cfg.LeaseDuration)
	l.Spec.HolderIdentity, l.Spec.LeaseDurationSeconds, l.Spec.LeaseTransitions = &id, &secs, &n
	l.Spec.AcquireTime, l.Spec.RenewTime = &now, &now
	publish(l, e.publishing())
	rctx, cancel := context.WithTimeout(ctx, e.cfg.RenewDeadline)
	defer cancel()
	if observed == nil {
		got, err := e.leases.Create(rctx, l, metav1.CreateOptions{})
		return got, sent, err
	}
	got, err := e.leases.Update(rctx, l, metav1.UpdateOptions{})
	return got, sent, err
}
