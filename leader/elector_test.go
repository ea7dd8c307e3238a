package leader_test

import (
	"context"
	"errors"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"testing/synctest"
	"time"

	coordinationv1 "k8s.io/api/coordination/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes/fake"

	"github.com/opkit/opkit/leader"
	"github.com/opkit/opkit/queue"
)

func TestNewValidatesConfig(t *testing.T) {
	cs := fake.NewClientset()
	base := func() leader.Config {
		return leader.Config{Client: cs, Namespace: "ns", Name: "lease"}
	}
	for _, tc := range []struct {
		name  string
		tweak func(*leader.Config)
		ok    bool
	}{
		{"defaults", func(*leader.Config) {}, true},
		{"nil client", func(c *leader.Config) { c.Client = nil }, false},
		{"no namespace", func(c *leader.Config) { c.Namespace = "" }, false},
		{"no name", func(c *leader.Config) { c.Name = "" }, false},
		{"name not a DNS subdomain", func(c *leader.Config) { c.Name = "Opkit_Leader" }, false},
		{"namespace not a DNS label", func(c *leader.Config) { c.Namespace = "kube.system" }, false},
		{"negative duration", func(c *leader.Config) { c.RetryPeriod = -time.Second }, false},
		{"negative skew", func(c *leader.Config) { c.ClockSkew = -time.Second }, false},
		{"renew deadline = lease duration", func(c *leader.Config) { c.LeaseDuration, c.RenewDeadline = 10*time.Second, 10*time.Second }, false},
		{"renew deadline > lease duration", func(c *leader.Config) { c.LeaseDuration = 5 * time.Second }, false},
		{"retry period reaches renew deadline", func(c *leader.Config) { c.RetryPeriod = 10 * time.Second }, false},
		{"retry period just below", func(c *leader.Config) { c.RetryPeriod = 8 * time.Second }, true},
		{"skew margin too large", func(c *leader.Config) { c.ClockSkew = 5 * time.Second }, false},
		{"skew margin fits", func(c *leader.Config) { c.ClockSkew = 4 * time.Second }, true},
		{"lease shorter than a second", func(c *leader.Config) {
			c.LeaseDuration, c.RenewDeadline, c.RetryPeriod, c.ClockSkew = 900*time.Millisecond, 500*time.Millisecond, 100*time.Millisecond, 100*time.Millisecond
		}, false},
		{"small durations", func(c *leader.Config) {
			c.LeaseDuration, c.RenewDeadline, c.RetryPeriod, c.ClockSkew = 3*time.Second, 2*time.Second, 500*time.Millisecond, 500*time.Millisecond
		}, true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			cfg := base()
			tc.tweak(&cfg)
			el, err := leader.New(cfg)
			if tc.ok {
				if err != nil {
					t.Fatalf("New: %v", err)
				}
				if el.Identity() == "" || !strings.Contains(el.Identity(), "_") {
					t.Errorf("default Identity() = %q, want hostname_suffix", el.Identity())
				}
				return
			}
			if !errors.Is(err, leader.ErrInvalidConfig) {
				t.Fatalf("New: err = %v, want ErrInvalidConfig", err)
			}
		})
	}
}

func TestDefaultIdentitiesDiffer(t *testing.T) {
	cs := fake.NewClientset()
	a, _ := leader.New(leader.Config{Client: cs, Namespace: "ns", Name: "l"})
	b, _ := leader.New(leader.Config{Client: cs, Namespace: "ns", Name: "l"})
	if a.Identity() == b.Identity() {
		t.Errorf("two default identities are both %q", a.Identity())
	}
}

// The intake is suspended before anything else, and a replica acquires a
// Lease that does not exist yet, resumes the intake and starts its work
// with term 0.
func TestAcquiresMissingLease(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		e := newEnv(t)
		a := e.start("a", nil, nil)
		synctest.Wait()

		if got := e.j.whats("a"); got != "suspend resume work-start" {
			t.Fatalf("journal = %q, want suspend resume work-start", got)
		}
		calls := e.api.callsOf("a")
		if len(calls) == 0 || e.j.of("a")[0].at.After(calls[0].at) {
			t.Errorf("the intake was not suspended before the first API call")
		}
		l := e.api.lease()
		if holder(l) != "a" || transitions(l) != 0 || *l.Spec.LeaseDurationSeconds != 15 {
			t.Errorf("lease = holder %q transitions %d, want a, 0, 15s", holder(l), transitions(l))
		}
		if !a.elector.IsLeader() || a.elector.Leader() != "a" || a.elector.Check() != nil {
			t.Errorf("IsLeader %v Leader %q Check %v", a.elector.IsLeader(), a.elector.Leader(), a.elector.Check())
		}
		if ws := e.j.of("a"); ws[2].term != 0 {
			t.Errorf("work term = %d, want 0", ws[2].term)
		}
		if m := a.metrics.snapshot(); !m.leading || m.transitions != 1 {
			t.Errorf("metrics = %+v, want leading after 1 transition", m)
		}
		if err := a.stop(); err != nil {
			t.Errorf("Run = %v", err)
		}
	})
}

// The leader renews every RetryPeriod with resourceVersion preconditions
// and stays healthy.
func TestRenewsEveryRetryPeriod(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		e := newEnv(t)
		a := e.start("a", nil, nil)
		synctest.Wait()
		start := time.Now()
		sleep(10*retryPeriod + time.Millisecond)
		var updates int
		for _, c := range e.api.callsOf("a") {
			if c.verb == "update" && c.err == nil {
				updates++
			}
		}
		if updates != 10 {
			t.Errorf("%d successful renewals in 10 retry periods, want 10", updates)
		}
		l := e.api.lease()
		if got := l.Spec.RenewTime.Time; got.Before(start.Add(9 * retryPeriod)) {
			t.Errorf("renewTime %v is stale", got)
		}
		if !a.elector.IsLeader() || a.elector.Check() != nil || e.j.whats("a") != "suspend resume work-start" {
			t.Errorf("leader disturbed: IsLeader %v Check %v journal %q", a.elector.IsLeader(), a.elector.Check(), e.j.whats("a"))
		}
		if err := a.stop(); err != nil {
			t.Errorf("Run = %v", err)
		}
	})
}

// A conflict on renew caused by someone else touching the Lease (while it
// still names us) is resolved by re-reading; the term goes on.
func TestRenewConflictWithSameHolderIsRetried(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		e := newEnv(t)
		a := e.start("a", nil, nil)
		synctest.Wait()
		e.api.put(func(l *coordinationv1.Lease) { l.Labels = map[string]string{"touched": "yes"} })
		sleep(retryPeriod + time.Millisecond)

		var verbs []string
		for _, c := range e.api.callsOf("a") {
			if c.verb == "watch" { // on its own goroutine: order varies
				continue
			}
			s := c.verb
			if apierrors.IsConflict(c.err) {
				s += "(conflict)"
			}
			verbs = append(verbs, s)
		}
		if got, want := strings.Join(verbs, " "), "get create update(conflict) get update"; got != want {
			t.Errorf("calls = %q, want %q", got, want)
		}
		if !a.elector.IsLeader() || holder(e.api.lease()) != "a" {
			t.Errorf("lost the lease after a benign conflict")
		}
		a.stop()
	})
}

// A renew that finds another holder ends the term at once, in the
// documented order; the replica then stands by and takes the Lease again
// once the other holder stops renewing.
func TestLosesToAnotherHolderAndCampaignsAgain(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		e := newEnv(t)
		a := e.start("a", nil, nil)
		synctest.Wait()
		stolen := e.api.put(func(l *coordinationv1.Lease) {
			other := "intruder"
			n := *l.Spec.LeaseTransitions + 1
			l.Spec.HolderIdentity, l.Spec.LeaseTransitions = &other, &n
		})
		sleep(retryPeriod + time.Millisecond)
		if a.elector.IsLeader() || a.elector.Leader() != "intruder" {
			t.Fatalf("IsLeader %v Leader %q after the lease was taken", a.elector.IsLeader(), a.elector.Leader())
		}
		if got := e.j.whats("a"); !oneTermEndedInOrder(got) {
			t.Fatalf("journal = %q", got)
		}
		// The intruder never renews: a takes the Lease back after
		// LeaseDuration from when it saw the intruder's write (not before).
		lost := time.Now()
		synctest.Wait()
		sleep(leaseDuration + retryPeriod)
		resumes := 0
		var resumedAt time.Time
		for _, en := range e.j.of("a") {
			if en.what == "resume" {
				resumes++
				resumedAt = en.at
			}
		}
		if resumes != 2 {
			t.Fatalf("resumes = %d, want 2; journal %q", resumes, e.j.whats("a"))
		}
		if resumedAt.Before(lost.Add(leaseDuration - retryPeriod)) {
			t.Errorf("took the lease back after %v, before it expired", resumedAt.Sub(lost))
		}
		if l := e.api.lease(); holder(l) != "a" || transitions(l) != transitions(stolen)+1 {
			t.Errorf("lease holder %q transitions %d, want a, %d", holder(l), transitions(l), transitions(stolen)+1)
		}
		a.stop()
	})
}

// A renew that finds another holder, or no Lease at all, ends the term as
// lost: the last successful renewal still bounds the work, so work that
// takes a moment to wind down is not reported as overrunning, and no
// renewal is recorded for the lost one.
func TestARenewThatFindsTheLeaseGoneEndsTheTermAsLost(t *testing.T) {
	for name, take := range map[string]func(e *env){
		"taken by another holder": func(e *env) {
			e.api.put(func(l *coordinationv1.Lease) {
				other := "intruder"
				n := *l.Spec.LeaseTransitions + 1
				l.Spec.HolderIdentity, l.Spec.LeaseTransitions = &other, &n
			})
		},
		"deleted": func(e *env) {
			if err := e.api.tracker.Delete(leasesGVR, testNS, leaseName); err != nil {
				e.t.Fatal(err)
			}
		},
	} {
		t.Run(name, func(t *testing.T) {
			synctest.Test(t, func(t *testing.T) {
				e := newEnv(t)
				a := e.start("a", nil, func(ctx context.Context) error {
					<-ctx.Done()
					time.Sleep(time.Second) // winds down, well within its bound
					return nil
				})
				sleep(retryPeriod + time.Millisecond) // past the first renewal
				renewed := a.metrics.snapshot().lastRenew
				take(e)
				sleep(retryPeriod) // the next renewal finds the Lease gone
				if a.elector.IsLeader() {
					t.Fatal("a still leads")
				}
				if err := a.elector.Check(); err != nil {
					t.Errorf("Check while the work winds down = %v, want nil", err)
				}
				if got, want := a.elector.WorkDeadline(), renewed.Add(leaseDuration-clockSkew); !got.Equal(want) {
					t.Errorf("WorkDeadline = %v, want the last renewal's %v", got, want)
				}
				if got := a.metrics.snapshot().lastRenew; !got.Equal(renewed) {
					t.Errorf("last renewal recorded %v, want %v", got, renewed)
				}
				sleep(time.Second + time.Millisecond) // the work has returned
				if n := a.metrics.snapshot().overran; n != 0 {
					t.Errorf("%d overruns reported, want none", n)
				}
				if !strings.Contains(a.logs.String(), "lease now held by") {
					t.Error("the term did not end as lost to the Lease's new state")
				}
				a.stop()
			})
		})
	}
}

// API errors during renew: the intake is suspended no later than
// RenewDeadline after the last successful renew, then the work is
// cancelled, and it has returned before a follower could acquire.
func TestRenewErrorsSuspendIntakeBeforeDeadline(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		e := newEnv(t)
		a := e.start("a", nil, nil)
		synctest.Wait()
		sleep(3*retryPeriod + time.Millisecond)
		lastRenew := a.metrics.snapshot().lastRenew
		e.api.setHook("a", func(verb string) error {
			return apierrors.NewInternalError(errors.New("etcd is down"))
		})
		sleep(renewDeadline)
		synctest.Wait()

		sus, ok := e.j.first("a", "suspend", lastRenew)
		if !ok {
			t.Fatalf("intake never suspended; journal %q", e.j.whats("a"))
		}
		if sus.at.After(lastRenew.Add(renewDeadline)) {
			t.Errorf("suspended %v after the last renew, later than RenewDeadline", sus.at.Sub(lastRenew))
		}
		cancelled, _ := e.j.first("a", "work-cancelled", lastRenew)
		returned, _ := e.j.first("a", "work-return", lastRenew)
		if cancelled.at.Before(sus.at) || indexOf(e.j.of("a"), "suspend", 1) > indexOf(e.j.of("a"), "work-cancelled", 0) {
			t.Errorf("work cancelled before the intake was suspended: %q", e.j.whats("a"))
		}
		if returned.at.After(lastRenew.Add(leaseDuration - clockSkew)) {
			t.Errorf("work returned %v after the last renew", returned.at.Sub(lastRenew))
		}
		m := a.metrics.snapshot()
		if m.failed == 0 || m.leading || m.overran != 0 {
			t.Errorf("metrics = %+v, want failed renews, not leading, no overrun", m)
		}
		if a.elector.Check() != nil {
			t.Errorf("Check() = %v for a standby replica", a.elector.Check())
		}
		// The API comes back: the Lease still names a, which takes it
		// again as a new term.
		e.api.setHook("a", nil)
		sleep(2 * retryPeriod)
		if !a.elector.IsLeader() || transitions(e.api.lease()) != 1 {
			t.Errorf("did not re-acquire after the API recovered (IsLeader %v, transitions %d)", a.elector.IsLeader(), transitions(e.api.lease()))
		}
		a.stop()
	})
}

// A renew request that hangs (and ignores its context, as a wedged
// connection might) does not delay the end of the term past RenewDeadline.
func TestHungRenewCannotOutliveRenewDeadline(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		e := newEnv(t)
		a := e.start("a", nil, nil)
		synctest.Wait()
		lastRenew := a.metrics.snapshot().lastRenew
		e.api.setHook("a", func(verb string) error {
			time.Sleep(time.Minute)
			return errors.New("connection reset")
		})
		sleep(renewDeadline)
		synctest.Wait()
		sus, ok := e.j.first("a", "suspend", lastRenew)
		if !ok || sus.at.After(lastRenew.Add(renewDeadline)) {
			t.Fatalf("suspend at %v after last renew (ok=%v), want <= RenewDeadline; journal %q", sus.at.Sub(lastRenew), ok, e.j.whats("a"))
		}
		if _, ok := e.j.first("a", "work-return", lastRenew); !ok {
			t.Errorf("work did not return")
		}
		e.api.setHook("a", nil)
		a.stop()
		time.Sleep(time.Minute) // let the hung request finish
	})
}

// Slow but successful renewals (each well within RenewDeadline) keep the
// term going.
func TestSlowRenewalsWithinDeadlineKeepTheTerm(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		e := newEnv(t)
		a := e.start("a", nil, nil)
		synctest.Wait()
		e.api.setHook("a", func(verb string) error {
			time.Sleep(renewDeadline / 3)
			return nil
		})
		sleep(5 * renewDeadline)
		if !a.elector.IsLeader() || e.j.whats("a") != "suspend resume work-start" {
			t.Errorf("slow renewals ended the term: %q", e.j.whats("a"))
		}
		if m := a.metrics.snapshot(); m.failed != 0 {
			t.Errorf("%d failed renewals", m.failed)
		}
		e.api.setHook("a", nil)
		a.stop()
	})
}

// Graceful shutdown: suspend, stop the work, and only then release the
// Lease (empty holder); Run returns nil.
func TestShutdownReleasesAfterWorkReturned(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		e := newEnv(t)
		a := e.start("a", nil, func(ctx context.Context) error {
			<-ctx.Done()
			time.Sleep(time.Second) // winding down in-flight reconciles
			return nil
		})
		synctest.Wait()
		if err := a.stop(); err != nil {
			t.Fatalf("Run = %v", err)
		}
		if got := e.j.whats("a"); !oneTermEndedInOrder(got) {
			t.Fatalf("journal = %q", got)
		}
		returned, _ := e.j.first("a", "work-return", time.Time{})
		calls := e.api.callsOf("a")
		rel := calls[len(calls)-1]
		if rel.verb != "update" || rel.holder != "" || rel.err != nil {
			t.Fatalf("last call = %+v, want a successful update clearing the holder", rel)
		}
		if rel.at.Before(returned.at) {
			t.Errorf("released before the work returned")
		}
		if l := e.api.lease(); holder(l) != "" || transitions(l) != 0 {
			t.Errorf("lease after release: holder %q transitions %d", holder(l), transitions(l))
		}
		if a.elector.IsLeader() || a.elector.Leader() != "" {
			t.Errorf("after shutdown IsLeader %v Leader %q", a.elector.IsLeader(), a.elector.Leader())
		}
	})
}

// A panic in the term's work ends the term like a returned error: the
// intake is suspended and the queue cleared, the Lease is released at once
// (a crashed process would hold it until it expired), and Run returns an
// error wrapping ErrWorkPanicked with the panic value.
func TestPanicInWorkEndsTheTermAndReleasesTheLease(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		e := newEnv(t)
		a := e.start("a", nil, func(ctx context.Context) error {
			time.Sleep(time.Second)
			panic("reconciler bug")
		})
		err := <-a.done
		if !errors.Is(err, leader.ErrWorkPanicked) || !strings.Contains(err.Error(), "reconciler bug") {
			t.Fatalf("Run = %v, want an error wrapping ErrWorkPanicked with the panic value", err)
		}
		if l := e.api.lease(); holder(l) != "" {
			t.Errorf("lease after the panic names %q, want it released", holder(l))
		}
		if got := e.j.whats("a"); !strings.HasPrefix(got, "suspend resume work-start suspend") || !strings.Contains(got, "clear") {
			t.Errorf("journal = %q, want the term ended in order (suspend, clear)", got)
		}
	})
}

// A shutdown that cuts off an acquisition the API server had already
// applied still frees the Lease: the elector reads it back and releases
// it, rather than leaving its name on it until it expires. No term starts.
func TestShutdownDuringAcquireReleasesAnAppliedLease(t *testing.T) {
	for _, tc := range []struct {
		name, verb string
		before     func(e *env) // the Lease before the campaign
	}{
		{"create", "create", func(*env) {}},
		{"update", "update", func(e *env) {
			e.api.put(func(l *coordinationv1.Lease) {
				empty := ""
				l.Spec.HolderIdentity = &empty // released by a former leader
			})
		}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			synctest.Test(t, func(t *testing.T) {
				e := newEnv(t)
				tc.before(e)
				var mu sync.Mutex // a is set while Run may already call the hook
				var a *replica
				e.api.loseNext("a", tc.verb, func() { mu.Lock(); defer mu.Unlock(); a.cancel() })
				mu.Lock()
				a = e.start("a", nil, nil)
				mu.Unlock()
				if err := <-a.done; err != nil {
					t.Fatalf("Run = %v", err)
				}
				if l := e.api.lease(); holder(l) != "" {
					t.Errorf("after the cancelled acquisition the lease names %q, want it released", holder(l))
				}
				if strings.Contains(e.j.whats("a"), "work-start") {
					t.Errorf("a term started: %q", e.j.whats("a"))
				}
			})
		})
	}
}

// A follower watching the Lease takes it over at the moment the leader
// releases it, without waiting for a poll.
func TestFollowerTakesReleasedLeaseViaWatch(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		e := newEnv(t)
		a := e.start("a", nil, nil)
		synctest.Wait()
		b := e.start("b", nil, nil)
		sleep(leaseDuration / 2) // b is a settled follower, between polls
		synctest.Wait()
		if b.elector.IsLeader() || b.elector.Leader() != "a" || b.elector.Check() != nil {
			t.Fatalf("follower: IsLeader %v Leader %q Check %v", b.elector.IsLeader(), b.elector.Leader(), b.elector.Check())
		}
		if e.j.whats("b") != "suspend" {
			t.Fatalf("follower journal = %q, want only the initial suspend", e.j.whats("b"))
		}
		getsBefore := countVerb(e.api.callsOf("b"), "get")
		stopped := time.Now()
		a.stop()
		synctest.Wait()
		resumed, ok := e.j.first("b", "resume", stopped)
		if !ok {
			t.Fatalf("follower did not take over; journal %q", e.j.whats(""))
		}
		if resumed.at.Sub(stopped) != 0 {
			t.Errorf("takeover took %v of (virtual) time; a watch-driven takeover takes none", resumed.at.Sub(stopped))
		}
		if countVerb(e.api.callsOf("b"), "get") != getsBefore {
			t.Errorf("follower polled to take over; want the watch event to trigger it")
		}
		aSus, _ := e.j.first("a", "suspend", stopped)
		aRet, _ := e.j.first("a", "work-return", stopped)
		if indexOfEntry(e.j.of(""), aRet) > indexOfEntry(e.j.of(""), resumed) || aSus.at.After(resumed.at) {
			t.Errorf("tenures overlap:\n%s", e.j)
		}
		if l := e.api.lease(); holder(l) != "b" || transitions(l) != 1 {
			t.Errorf("lease holder %q transitions %d, want b, 1", holder(l), transitions(l))
		}
		b.stop()
	})
}

// A leader cut off from the API server (a crash, as far as the others can
// tell) is replaced within LeaseDuration + RetryPeriod of its last renew,
// and only after it has suspended its intake and stopped its work.
// A follower takes over a crashed leader's Lease within LeaseDuration +
// RetryPeriod of the last renew it saw. A transient failure of its
// takeover write costs it one more RetryPeriod, not another LeaseDuration:
// the Lease it reads again has not changed.
func TestCrashedLeaderIsReplacedAfterLeaseDuration(t *testing.T) {
	for _, tc := range []struct {
		name      string
		transient bool // b's first takeover Update fails with a 503
		within    time.Duration
	}{
		{"takeover", false, leaseDuration + retryPeriod},
		{"takeover after a transient write failure", true, leaseDuration + 3*retryPeriod},
	} {
		t.Run(tc.name, func(t *testing.T) {
			synctest.Test(t, func(t *testing.T) {
				e := newEnv(t)
				a := e.start("a", nil, nil)
				synctest.Wait()
				var failed atomic.Bool
				if tc.transient {
					e.api.setHook("b", func(verb string) error {
						if verb == "update" && failed.CompareAndSwap(false, true) {
							return apierrors.NewServiceUnavailable("etcd leader changed")
						}
						return nil
					})
				}
				b := e.start("b", nil, nil)
				sleep(5*time.Second + 300*time.Millisecond)
				e.api.setHook("a", func(string) error { return errors.New("dial tcp: connection refused") })
				cut := time.Now()
				lastRenew := a.metrics.snapshot().lastRenew
				sleep(3 * leaseDuration)
				synctest.Wait()

				if tc.transient && !failed.Load() {
					t.Fatal("b's takeover Update never failed")
				}
				resumed, ok := e.j.first("b", "resume", cut)
				if !ok {
					t.Fatalf("no takeover; journal:\n%s", e.j)
				}
				if d := resumed.at.Sub(lastRenew); d > tc.within {
					t.Errorf("takeover %v after the last renew, want <= %v", d, tc.within)
				}
				aRet, _ := e.j.first("a", "work-return", cut)
				aSus, _ := e.j.first("a", "suspend", cut)
				if aRet.at.IsZero() || aRet.at.After(resumed.at) || aSus.at.After(resumed.at) {
					t.Errorf("ex-leader still worked when the follower took over:\n%s", e.j)
				}
				e.api.setHook("a", nil)
				a.stop()
				b.stop()
			})
		})
	}
}

// Work that ignores its context outlives the bound: it is reported (log
// at Error, metric, Check) and the replica does not campaign again until
// the work has returned.
func TestWorkIgnoringContextBlocksCampaign(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		e := newEnv(t)
		release := make(chan struct{})
		first := true
		a := e.start("a", nil, func(ctx context.Context) error {
			if first { // the first term's work ignores its context
				first = false
				<-release
				return nil
			}
			<-ctx.Done()
			return nil
		})
		synctest.Wait()
		lastRenew := a.metrics.snapshot().lastRenew
		e.api.setHook("a", func(string) error { return errors.New("connection refused") })
		sleep(leaseDuration)
		synctest.Wait()
		if m := a.metrics.snapshot(); m.overran != 1 {
			t.Errorf("WorkOverran count = %d, want 1", m.overran)
		}
		if !errors.Is(a.elector.Check(), leader.ErrWorkOverrun) {
			t.Errorf("Check() = %v, want ErrWorkOverrun", a.elector.Check())
		}
		if !strings.Contains(a.logs.String(), "level=ERROR") {
			t.Errorf("no Error log for the overrun:\n%s", a.logs.String())
		}
		e.api.setHook("a", nil)
		es := e.j.of("a")
		i := indexOf(es, "suspend", 1) // the first is the one at start
		if i < 0 || es[i].at.After(lastRenew.Add(renewDeadline)) {
			t.Fatalf("no timely suspend; journal %q", e.j.whats("a"))
		}
		sus := es[i]
		sleep(5 * leaseDuration)
		synctest.Wait()
		for _, c := range e.api.callsOf("a") {
			if c.at.After(sus.at) {
				t.Errorf("campaigned (%s at +%v) while the old work still ran", c.verb, c.at.Sub(sus.at))
			}
		}
		close(release)
		synctest.Wait()
		if a.elector.Check() != nil {
			t.Errorf("Check() = %v after the work returned", a.elector.Check())
		}
		sleep(retryPeriod)
		if !a.elector.IsLeader() {
			t.Errorf("did not campaign again after the work returned; journal %q", e.j.whats("a"))
		}
		a.stop()
	})
}

// With ExitOnLoss, Run returns ErrLeadershipLost once the work returned.
func TestExitOnLoss(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		e := newEnv(t)
		a := e.start("a", func(c *leader.Config) { c.ExitOnLoss = true }, nil)
		synctest.Wait()
		e.api.setHook("a", func(string) error { return errors.New("connection refused") })
		err := <-a.done
		if !errors.Is(err, leader.ErrLeadershipLost) {
			t.Errorf("Run = %v, want ErrLeadershipLost", err)
		}
		// The term's end clears the queue as it cancels the work, without
		// waiting for it: "clear" may come before or after "work-return".
		// Run returns only after the work did.
		if got := e.j.whats("a"); !strings.Contains(got, "work-return") {
			t.Errorf("Run returned before the work: %q", got)
		}
	})
}

// Work returning on its own ends Run with its error, after stepping down
// and releasing the Lease.
func TestWorkErrorEndsRun(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		e := newEnv(t)
		boom := errors.New("boom")
		a := e.start("a", nil, func(ctx context.Context) error {
			time.Sleep(3 * time.Second)
			return boom
		})
		err := <-a.done
		if !errors.Is(err, boom) {
			t.Errorf("Run = %v, want boom", err)
		}
		if holder(e.api.lease()) != "" {
			t.Errorf("lease not released")
		}
		if got := e.j.whats("a"); got != "suspend resume work-start work-return suspend clear" {
			t.Errorf("journal = %q", got)
		}
		if err := a.elector.Run(context.Background(), func(context.Context) error { return nil }); !errors.Is(err, leader.ErrAlreadyRunning) {
			t.Errorf("second Run = %v, want ErrAlreadyRunning", err)
		}
	})
}

// A follower facing a live leader never resumes its intake, reports the
// leader, and is healthy; it takes over an existing Lease whose holder
// stopped renewing, LeaseDuration after it saw the last change.
func TestFollowerStandsByWhileLeaseIsRenewed(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		e := newEnv(t)
		renew := func() {
			e.api.put(func(l *coordinationv1.Lease) {
				other, secs, n := "other", int32(15), int32(7)
				now := metav1.NewMicroTime(time.Now())
				l.Spec = coordinationv1.LeaseSpec{HolderIdentity: &other, LeaseDurationSeconds: &secs, RenewTime: &now, AcquireTime: &now, LeaseTransitions: &n}
			})
		}
		renew()
		b := e.start("b", nil, nil)
		for range 20 {
			sleep(retryPeriod)
			renew()
		}
		synctest.Wait()
		if b.elector.IsLeader() || b.elector.Leader() != "other" || b.elector.Check() != nil || e.j.whats("b") != "suspend" {
			t.Fatalf("follower: IsLeader %v Leader %q Check %v journal %q", b.elector.IsLeader(), b.elector.Leader(), b.elector.Check(), e.j.whats("b"))
		}
		lastChange := time.Now()
		sleep(leaseDuration + retryPeriod)
		resumed, ok := e.j.first("b", "resume", lastChange)
		if !ok {
			t.Fatalf("no takeover of the expired lease")
		}
		if d := resumed.at.Sub(lastChange); d < leaseDuration || d > leaseDuration+retryPeriod {
			t.Errorf("took over %v after the last change, want in [LeaseDuration, LeaseDuration+RetryPeriod]", d)
		}
		if l := e.api.lease(); holder(l) != "b" || transitions(l) != 8 {
			t.Errorf("lease holder %q transitions %d, want b, 8", holder(l), transitions(l))
		}
		b.stop()
	})
}

// Two followers racing for a released Lease: exactly one wins (the other
// gets a conflict), and tenures do not overlap.
func TestConcurrentCampaignersOneWins(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		e := newEnv(t)
		a := e.start("a", nil, nil)
		synctest.Wait()
		b := e.start("b", nil, nil)
		c := e.start("c", nil, nil)
		sleep(retryPeriod)
		a.stop()
		synctest.Wait()
		leaders := 0
		for _, r := range []*replica{b, c} {
			if r.elector.IsLeader() {
				leaders++
			}
		}
		if leaders != 1 {
			t.Fatalf("%d leaders after the release, want 1:\n%s", leaders, e.j)
		}
		conflicts := 0
		for _, cl := range e.api.callsOf("") {
			if apierrors.IsConflict(cl.err) {
				conflicts++
			}
		}
		if conflicts == 0 {
			t.Errorf("no conflict recorded; the race was not exercised")
		}
		assertNoOverlap(t, e.j)
		b.stop()
		c.stop()
	})
}

// Term numbers reach the work through the context and grow with each
// acquisition.
func TestTermFromContext(t *testing.T) {
	if _, ok := leader.TermFrom(context.Background()); ok {
		t.Errorf("TermFrom(background) reported a term")
	}
	synctest.Test(t, func(t *testing.T) {
		e := newEnv(t)
		a := e.start("a", nil, nil)
		synctest.Wait()
		b := e.start("b", nil, nil)
		a.stop()
		synctest.Wait()
		var terms []int32
		for _, en := range e.j.of("") {
			if en.what == "work-start" {
				terms = append(terms, en.term)
			}
		}
		if len(terms) != 2 || terms[0] != 0 || terms[1] != 1 {
			t.Errorf("terms = %v, want [0 1]", terms)
		}
		if !strings.Contains(b.logs.String(), "term=1") {
			t.Errorf("b's logs do not carry the term")
		}
		b.stop()
	})
}

// assertNoOverlap checks, from the journal, that no two replicas were
// between resume and suspend at the same time.
func assertNoOverlap(t *testing.T, j *journal) {
	t.Helper()
	holder := ""
	for _, en := range j.of("") {
		switch en.what {
		case "resume":
			if holder != "" {
				t.Fatalf("%s resumed while %s leads:\n%s", en.who, holder, j)
			}
			holder = en.who
		case "suspend":
			if holder == en.who {
				holder = ""
			}
		}
	}
}

// oneTermEndedInOrder reports whether a replica's journal is one term that
// ended in the documented order: suspend, cancel, clear, wait for the
// work. Once its context is cancelled the work runs beside the clear, so
// it may journal its cancellation, and even its return, before the clear.
func oneTermEndedInOrder(journal string) bool {
	switch strings.TrimPrefix(journal, "suspend resume work-start suspend ") {
	case "work-cancelled clear work-return", "clear work-cancelled work-return", "work-cancelled work-return clear":
		return true
	}
	return false
}

func countVerb(cs []call, verb string) int {
	n := 0
	for _, c := range cs {
		if c.verb == verb {
			n++
		}
	}
	return n
}

// indexOf returns the index of the nth (0-based) entry with what.
func indexOf(es []entry, what string, nth int) int {
	for i, e := range es {
		if e.what == what {
			if nth == 0 {
				return i
			}
			nth--
		}
	}
	return -1
}

func indexOfEntry(es []entry, x entry) int {
	for i, e := range es {
		if e == x {
			return i
		}
	}
	return -1
}

// Without a working watch a follower still takes over through its polls:
// a released Lease within one jittered RetryPeriod, an expired one within
// LeaseDuration + RetryPeriod of the last change it saw.
func TestFollowerWithoutWatchFallsBackToPolling(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		e := newEnv(t)
		a := e.start("a", nil, nil)
		synctest.Wait()
		e.api.setHook("b", func(verb string) error {
			if verb == "watch" {
				return apierrors.NewServiceUnavailable("watch refused")
			}
			return nil
		})
		b := e.start("b", nil, nil)
		sleep(5 * time.Second)
		stopped := time.Now()
		a.stop()
		sleep(2 * retryPeriod)
		resumed, ok := e.j.first("b", "resume", stopped)
		if !ok {
			t.Fatalf("follower did not take over by polling; journal %q", e.j.whats("b"))
		}
		if d := resumed.at.Sub(stopped); d > retryPeriod*12/10 {
			t.Errorf("took %v to take a released lease by polling, want <= 1.2*RetryPeriod", d)
		}
		if countVerb(e.api.callsOf("b"), "watch") < 2 {
			t.Errorf("the follower did not retry its watch")
		}
		b.stop()
	})
}

// A Lease deleted while a follower watches is created again by it, but
// not before it would have expired: the holder it named learns of the
// deletion only at its next renew and may lead until then. Nor later: the
// deletion does not extend the holder's last promise.
func TestFollowerRecreatesDeletedLease(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		e := newEnv(t)
		e.api.put(func(l *coordinationv1.Lease) {
			other, secs := "other", int32(15)
			l.Spec.HolderIdentity, l.Spec.LeaseDurationSeconds = &other, &secs
		})
		b := e.start("b", nil, nil)
		seen := time.Now()
		sleep(time.Second)
		if b.elector.IsLeader() {
			t.Fatalf("follower took a live lease")
		}
		if err := e.api.tracker.Delete(leasesGVR, testNS, leaseName); err != nil {
			t.Fatal(err)
		}
		synctest.Wait()
		sleep(12 * time.Second) // 13s after b saw the Lease, 12s after the deletion
		if b.elector.IsLeader() || b.elector.Leader() != "other" {
			t.Fatalf("%v after b saw the Lease: IsLeader %v, Holder %q; want the deleted holder's lease (15s) respected",
				time.Since(seen), b.elector.IsLeader(), b.elector.Leader())
		}
		sleep(2*time.Second + time.Millisecond)
		if !b.elector.IsLeader() || holder(e.api.lease()) != "b" || transitions(e.api.lease()) != 0 {
			t.Errorf("%v after b saw the Lease: IsLeader %v, lease holder %q; want it taken when it expired (15s)",
				time.Since(seen), b.elector.IsLeader(), holder(e.api.lease()))
		}
		b.stop()
	})
}

// A follower whose Lease requests the API server refuses for good (here:
// RBAC forbids them) could never lead: Check says so once
// queue.TransientRefusals refusals came in a row (the first ones may be a
// just-started API server's), and is healthy again once the requests go
// through.
func TestCheckReportsAFollowerThatCannotCampaign(t *testing.T) {
	for _, tc := range []struct {
		name     string
		verb     string // the refused request
		existing bool   // a Lease held by another replica exists
	}{
		{"read forbidden", "get", true},
		{"create forbidden", "create", false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			synctest.Test(t, func(t *testing.T) {
				e := newEnv(t)
				if tc.existing {
					e.api.put(func(l *coordinationv1.Lease) {
						other, secs := "other", int32(15)
						l.Spec.HolderIdentity, l.Spec.LeaseDurationSeconds = &other, &secs
					})
				}
				forbidden := apierrors.NewForbidden(leasesGVR.GroupResource(), leaseName, errors.New("RBAC: no rule"))
				e.api.setHook("a", func(verb string) error {
					if verb == tc.verb {
						return forbidden
					}
					return nil
				})
				a := e.start("a", nil, nil)
				sleep(time.Second) // one refusal
				if err := a.elector.Check(); err != nil {
					t.Fatalf("Check after the first refusal = %v, want nil: it may be a just-started API server's", err)
				}
				sleep(2 * time.Second * (queue.TransientRefusals + 1)) // a poll period (at most 2s) each
				if err := a.elector.Check(); !errors.Is(err, leader.ErrCannotCampaign) || !apierrors.IsForbidden(err) {
					t.Fatalf("Check = %v, want ErrCannotCampaign wrapping the Forbidden", err)
				}
				e.api.setHook("a", nil) // the Role is fixed
				sleep(5 * time.Second)
				if err := a.elector.Check(); err != nil {
					t.Fatalf("Check after the fix = %v, want nil", err)
				}
				if !tc.existing && !a.elector.IsLeader() {
					t.Fatalf("not leading once the create goes through")
				}
				a.stop()
			})
		})
	}
}

// A refused write says nothing once another replica leads (a follower has
// nothing to write then): Check is healthy again.
func TestCheckForgetsARefusedWriteWhileAnotherReplicaLeads(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		e := newEnv(t)
		e.api.setHook("a", func(verb string) error {
			if verb == "create" {
				return apierrors.NewForbidden(leasesGVR.GroupResource(), leaseName, errors.New("RBAC: no rule"))
			}
			return nil
		})
		a := e.start("a", nil, nil)
		sleep(2 * time.Second * (queue.TransientRefusals + 1))
		if err := a.elector.Check(); !errors.Is(err, leader.ErrCannotCampaign) {
			t.Fatalf("Check = %v, want ErrCannotCampaign", err)
		}
		// Another replica (with the permission) creates the Lease and leads.
		e.api.put(func(l *coordinationv1.Lease) {
			other, secs := "other", int32(15)
			l.Spec.HolderIdentity, l.Spec.LeaseDurationSeconds = &other, &secs
		})
		sleep(5 * time.Second)
		if err := a.elector.Check(); err != nil || a.elector.Leader() != "other" {
			t.Fatalf("Check = %v, Leader %q; want a healthy follower of other", err, a.elector.Leader())
		}
		a.stop()
	})
}

// A read answered after a newer watch event carries an older Lease. It
// must not count as a change of the Lease: that would restart the expiry
// clock and delay a takeover by up to a lease duration.
func TestAReadOvertakenByTheWatchDoesNotDelayTheTakeover(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		e := newEnv(t)
		other, secs := "other", int32(15)
		e.api.put(func(l *coordinationv1.Lease) {
			l.Spec.HolderIdentity, l.Spec.LeaseDurationSeconds = &other, &secs
		})
		release := e.api.holdGets("b") // b's first read answers late
		b := e.start("b", nil, nil)
		sleep(2 * time.Second)
		renewed := time.Now()
		e.api.put(func(l *coordinationv1.Lease) { // the holder's last renew: b's watch sees it
			now := metav1.NewMicroTime(renewed)
			l.Spec.RenewTime = &now
		})
		sleep(5 * time.Second)
		release() // the read made at the start answers now, with the first version
		sleep(time.Until(renewed.Add(15*time.Second + time.Millisecond)))
		if !b.elector.IsLeader() {
			t.Fatalf("%v after the last renew b does not lead; want the takeover %v after it", time.Since(renewed), 15*time.Second)
		}
		b.stop()
	})
}

// stuckGate blocks in Suspend once armed, as an intake that cannot be
// closed would.
type stuckGate struct {
	gate
	armed   *bool
	release chan struct{}
}

func (g stuckGate) Suspend() {
	g.gate.Suspend()
	if *g.armed {
		<-g.release
	}
}

// Check reports a leader that has not renewed within RenewDeadline (here
// because the end of its term is stuck in the gate) as unhealthy.
func TestCheckReportsLeaderNotRenewed(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		e := newEnv(t)
		armed := false
		g := stuckGate{gate: gate{j: e.j, name: "a"}, armed: &armed, release: make(chan struct{})}
		a := e.start("a", func(c *leader.Config) { c.Gate = g }, nil)
		synctest.Wait()
		armed = true
		e.api.setHook("a", func(string) error { return errors.New("connection refused") })
		sleep(renewDeadline - time.Millisecond)
		if err := a.elector.Check(); err != nil {
			t.Errorf("Check() = %v within RenewDeadline", err)
		}
		sleep(2 * time.Millisecond)
		synctest.Wait()
		if err := a.elector.Check(); !errors.Is(err, leader.ErrNotRenewed) {
			t.Errorf("Check() = %v past RenewDeadline, want ErrNotRenewed", err)
		}
		close(g.release)
		synctest.Wait()
		if err := a.elector.Check(); err != nil {
			t.Errorf("Check() = %v once stepped down", err)
		}
		e.api.setHook("a", nil)
		a.stop()
	})
}

// WorkDeadline follows the last successful write: it moves with every
// renewal and stays put while renewals fail, so that a caller draining the
// term's work can end it before another replica may acquire.
func TestWorkDeadlineFollowsTheLastSuccessfulRenew(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		e := newEnv(t)
		a := e.start("a", nil, nil)
		synctest.Wait()
		acquired := time.Now()
		bound := leaseDuration - clockSkew
		if got := a.elector.WorkDeadline(); !got.Equal(acquired.Add(bound)) {
			t.Fatalf("WorkDeadline after acquiring = %v, want acquisition + %v", got.Sub(acquired), bound)
		}
		sleep(retryPeriod)
		synctest.Wait()
		renewed := time.Now()
		if got := a.elector.WorkDeadline(); !got.Equal(renewed.Add(bound)) {
			t.Fatalf("WorkDeadline after a renewal = acquisition + %v, want %v", got.Sub(acquired), renewed.Sub(acquired)+bound)
		}
		e.api.setHook("a", func(string) error { return apierrors.NewInternalError(errors.New("down")) })
		sleep(3 * retryPeriod)
		synctest.Wait()
		if got := a.elector.WorkDeadline(); !got.Equal(renewed.Add(bound)) {
			t.Fatalf("WorkDeadline moved while renewals failed: acquisition + %v", got.Sub(acquired))
		}
		e.api.setHook("a", nil)
		if err := a.stop(); err != nil {
			t.Errorf("Run = %v", err)
		}
	})
}

// Once its term has ended a replica no longer names itself as the leader
// (a follower's 503 would send callers back to it), even while the term's
// work winds down and before it has read the Lease again.
func TestEndedTermDoesNotReportItselfAsLeader(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		e := newEnv(t)
		a := e.start("a", nil, func(ctx context.Context) error {
			<-ctx.Done()
			sleep(5 * time.Second) // winding down
			return nil
		})
		synctest.Wait()
		if got := a.elector.Leader(); got != "a" {
			t.Fatalf("Leader() while leading = %q, want a", got)
		}
		e.api.setHook("a", func(string) error { return apierrors.NewServiceUnavailable("down") })
		sleep(renewDeadline + time.Second) // the term ended at RenewDeadline
		synctest.Wait()
		if a.elector.IsLeader() {
			t.Error("still leading after RenewDeadline without a renewal")
		}
		if got := a.elector.Leader(); got == "a" {
			t.Errorf("Leader() after the term ended = %q, want not itself", got)
		}
		e.api.setHook("a", nil)
		if err := a.stop(); err != nil {
			t.Errorf("Run = %v", err)
		}
	})
}

// The holder publishes Config.Annotations on the Lease; a follower reads
// them with LeaderAnnotation; they go when the holder releases the Lease.
func TestTheHolderPublishesItsAnnotations(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		e := newEnv(t)
		const endpoint = "trigger.opkit.dev/endpoint"
		publish := func(url string) func(*leader.Config) {
			return func(c *leader.Config) { c.Annotations = map[string]string{endpoint: url} }
		}
		a := e.start("a", publish("https://10.0.0.1:8443"), nil)
		sleep(time.Second)
		b := e.start("b", publish("https://10.0.0.2:8443"), nil)
		sleep(3 * time.Second)
		if !a.elector.IsLeader() || b.elector.IsLeader() {
			t.Fatal("a should lead, b follow")
		}
		if got := b.elector.LeaderAnnotation(endpoint); got != "https://10.0.0.1:8443" {
			t.Fatalf("b reads %q, want a's endpoint", got)
		}
		if got := a.elector.LeaderAnnotation(endpoint); got != "https://10.0.0.1:8443" {
			t.Fatalf("a reads %q, want its own endpoint", got)
		}
		if err := a.stop(); err != nil {
			t.Fatal(err)
		}
		// b may already have taken the released Lease over.
		if got := e.api.lease().Annotations[endpoint]; got == "https://10.0.0.1:8443" {
			t.Fatalf("the released Lease still says %q", got)
		}
		sleep(3 * time.Second)
		if !b.elector.IsLeader() || b.elector.LeaderAnnotation(endpoint) != "https://10.0.0.2:8443" {
			t.Fatalf("b leads %v with %q, want its own endpoint published", b.elector.IsLeader(), b.elector.LeaderAnnotation(endpoint))
		}
		b.stop()
	})
}

// A holder that dies without releasing the Lease leaves its annotations
// behind; the next holder removes them even when it publishes other names
// (a rolling upgrade that renamed or dropped the endpoint), so nobody
// reads a dead replica's endpoint as the leader's.
func TestTheNextHolderRemovesACrashedHoldersAnnotations(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		e := newEnv(t)
		a := e.start("a", func(c *leader.Config) {
			c.Annotations = map[string]string{"old.example/endpoint": "https://10.0.0.1:8443"}
		}, nil)
		sleep(time.Second)
		b := e.start("b", func(c *leader.Config) {
			c.Annotations = map[string]string{"new.example/endpoint": "https://10.0.0.2:8443"}
		}, nil)
		c := e.start("c", nil, nil)
		sleep(3 * time.Second)
		if !a.elector.IsLeader() || c.elector.LeaderAnnotation("old.example/endpoint") != "https://10.0.0.1:8443" {
			t.Fatal("a should lead with its endpoint published")
		}
		// a crashes: its renewals fail and it never gets to release.
		e.api.setHook("a", func(string) error { return errors.New("dial tcp: connection refused") })
		sleep(3 * leaseDuration)
		synctest.Wait()
		if !b.elector.IsLeader() && !c.elector.IsLeader() {
			t.Fatalf("nobody took over; journal:\n%s", e.j)
		}
		got := e.api.lease().Annotations
		if _, stale := got["old.example/endpoint"]; stale {
			t.Errorf("the new holder left the crashed holder's annotation: %v", got)
		}
		if c.elector.LeaderAnnotation("old.example/endpoint") != "" {
			t.Error("a follower still reads the crashed holder's endpoint")
		}
		if b.elector.IsLeader() && got["new.example/endpoint"] != "https://10.0.0.2:8443" {
			t.Errorf("b leads but did not publish its endpoint: %v", got)
		}
		e.api.setHook("a", nil)
		a.stop()
		b.stop()
		c.stop()
	})
}

// Releasing the Lease removes what the holder published, bookkeeping
// included.
func TestReleasingTheLeaseRemovesThePublishedAnnotations(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		e := newEnv(t)
		a := e.start("a", func(c *leader.Config) {
			c.Annotations = map[string]string{"trigger.opkit.dev/endpoint": "https://10.0.0.1:8443"}
		}, nil)
		sleep(time.Second)
		if got := e.api.lease().Annotations[leader.PublishedAnnotation]; got != "trigger.opkit.dev/endpoint" {
			t.Fatalf("%s = %q while leading", leader.PublishedAnnotation, got)
		}
		if err := a.stop(); err != nil {
			t.Fatal(err)
		}
		if got := e.api.lease().Annotations; len(got) != 0 {
			t.Fatalf("the released Lease still carries %v", got)
		}
	})
}
