package leader

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"maps"
	"runtime/debug"
	"slices"
	"strings"
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
	yield  chan struct{} // Yield's request to the term (buffered, 1)

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

// ---- campaigning ----

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

func annotationsOf(l *coordinationv1.Lease) map[string]string {
	if holderOf(l) == "" {
		return nil
	}
	return l.Annotations
}

// LeaderAnnotation returns the annotation name of the Lease as last
// observed while someone held it (see Config.Annotations), "" when it
// has none or no one holds it.
func (e *Elector) LeaderAnnotation(name string) string {
	e.mu.Lock()
	defer e.mu.Unlock()
	return e.annotations[name]
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

// campaign returns once this replica has written itself as holder, with the
// Lease as written and the time the write was sent; or ctx's error.
func (e *Elector) campaign(ctx context.Context) (*coordinationv1.Lease, time.Time, error) {
	wctx, stopWatch := context.WithCancel(ctx)
	var wg sync.WaitGroup
	defer wg.Wait()
	defer stopWatch()
	watched := make(chan leaseRead)
	wg.Go(func() { e.watchLease(wctx, watched) })

	var obs observation
	var polling chan leaseRead // non-nil while a read is in flight
	// events counts the watch's deliveries, pollAfter is that count when
	// the read in flight was sent: a read overtaken by a watch event may
	// answer with an older version, which must not count as a change.
	var events, pollAfter int
	poll := time.After(0)
	var expiry <-chan time.Time
	for {
		select {
		case <-ctx.Done():
			return nil, time.Time{}, ctx.Err()
		case ev := <-watched:
			events++
			e.observe(&obs, ev.lease)
		case <-poll:
			// The read runs on its own goroutine so that a slow API server
			// does not hold back the watch events meanwhile.
			if polling == nil {
				pollAfter = events
				polling = make(chan leaseRead, 1)
				ch := polling
				wg.Go(func() {
					l, err := e.get(wctx)
					ch <- leaseRead{l, err}
				})
			}
			continue
		case r := <-polling:
			polling = nil
			poll = time.After(e.pollPeriod())
			switch {
			case r.err == nil:
				if events == pollAfter { // else overtaken by the watch, which is at least as fresh
					e.observe(&obs, r.lease)
				}
				e.readRefusals = 0
				e.locked(func() { e.refusedRead = nil })
			case ctx.Err() != nil:
				return nil, time.Time{}, ctx.Err()
			case lasting(r.err, &e.readRefusals):
				e.locked(func() { e.refusedRead = r.err })
				e.log.Error("reading lease refused: this replica cannot lead until that is fixed", "err", r.err)
			default:
				e.log.Warn("reading lease failed; retrying", "after", e.cfg.RetryPeriod, "err", r.err)
			}
		case <-expiry:
		}
		if !obs.known {
			continue
		}
		if wait := e.untilAcquirable(obs); wait > 0 {
			// Another replica leads: there is nothing to write, so an
			// earlier refused write says nothing about now (a Role applied
			// meanwhile); the next attempt will tell.
			e.locked(func() { e.refusedWrite = nil })
			expiry = time.After(wait)
			continue
		}
		if e.cfg.Admit != nil && !e.cfg.Admit() {
			expiry = time.After(e.cfg.RetryPeriod)
			continue
		}
		lease, sent, err := e.acquire(ctx, obs.lease)
		if err == nil {
			e.writeRefusals = 0
			return lease, sent, nil
		}
		if ctx.Err() != nil {
			// The cancellation may have cut off the response of a request
			// the API server applied: release a Lease that names us, so
			// that the next leader need not wait for it to expire. No work
			// ran under it, so there is nothing to wait for.
			if l, err := e.get(context.WithoutCancel(ctx)); err == nil && holderOf(l) == e.cfg.Identity {
				e.release(ctx, l, e.log)
			}
			return nil, time.Time{}, ctx.Err()
		}
		// Someone else wrote first (conflict, already exists) or the API
		// failed: read again before the next attempt (a watch event may
		// well come first).
		obs.known = false
		retry := e.pollPeriod()
		switch {
		case apierrors.IsConflict(err) || apierrors.IsAlreadyExists(err):
			e.log.Debug("lost the race to acquire", "err", err)
			retry = 0
		case lasting(err, &e.writeRefusals) || apierrors.IsNotFound(err) && obs.lease == nil:
			// A Create answered NotFound: the namespace does not exist.
			e.locked(func() { e.refusedWrite = err })
			e.log.Error("acquiring lease refused: this replica cannot lead until that is fixed", "err", err)
		default:
			e.log.Warn("acquiring lease failed; retrying", "after", retry, "err", err)
		}
		poll = time.After(retry)
	}
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
		if observed.Spec.LeaseTransitions != nil {
			n = *observed.Spec.LeaseTransitions + 1
		}
	}
	sent := time.Now()
	now, id, secs := metav1.NewMicroTime(sent), e.cfg.Identity, e.leaseSeconds()
	l.Spec.HolderIdentity, l.Spec.LeaseDurationSeconds, l.Spec.LeaseTransitions = &id, &secs, &n
	l.Spec.AcquireTime, l.Spec.RenewTime = &now, &now
	publish(l, e.cfg.Annotations)
	rctx, cancel := context.WithTimeout(ctx, e.cfg.RenewDeadline)
	defer cancel()
	if observed == nil {
		got, err := e.leases.Create(rctx, l, metav1.CreateOptions{})
		return got, sent, err
	}
	got, err := e.leases.Update(rctx, l, metav1.UpdateOptions{})
	return got, sent, err
}

// PublishedAnnotation lists, comma-separated, the annotation names the
// holder published on the Lease (Config.Annotations), so that the next
// holder removes them even when the previous one died without releasing
// the Lease and the new one does not publish the same names.
const PublishedAnnotation = "leader.opkit.dev/published"

// publish removes from l the annotations its previous holder published
// and adds own, recording their names in PublishedAnnotation.
func publish(l *coordinationv1.Lease, own map[string]string) {
	for _, k := range strings.Split(l.Annotations[PublishedAnnotation], ",") {
		delete(l.Annotations, k)
	}
	delete(l.Annotations, PublishedAnnotation)
	if len(own) == 0 {
		return
	}
	if l.Annotations == nil {
		l.Annotations = map[string]string{}
	}
	maps.Copy(l.Annotations, own)
	l.Annotations[PublishedAnnotation] = strings.Join(slices.Sorted(maps.Keys(own)), ",")
}

// ---- leading ----

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

// ---- helpers ----

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

// leaseSeconds is LeaseDuration rounded up to whole seconds, so that the
// promise written to the Lease is never shorter than the one we keep.
func (e *Elector) leaseSeconds() int32 { return wholeSeconds(e.cfg.LeaseDuration) }

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
