package reconcile_test

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"slices"
	"strings"
	"sync/atomic"
	"testing"
	"testing/synctest"
	"time"

	coordv1 "k8s.io/api/coordination/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	kfake "k8s.io/client-go/kubernetes/fake"
	k8stesting "k8s.io/client-go/testing"

	"github.com/opkit/opkit"
	"github.com/opkit/opkit/internal/logsink"
	"github.com/opkit/opkit/internal/typed"
	"github.com/opkit/opkit/leader"
	"github.com/opkit/opkit/reconcile"
	"github.com/opkit/opkit/trigger"
)

func TestControllerReconcilesOnlyWhileLeading(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		// Another replica holds the Lease, renewed just now.
		holder, dur := "other", int32(15)
		now := metav1.NewMicroTime(time.Now())
		kube := kfake.NewClientset(&coordv1.Lease{
			ObjectMeta: metav1.ObjectMeta{Namespace: "ns", Name: "widgets"},
			Spec:       coordv1.LeaseSpec{HolderIdentity: &holder, LeaseDurationSeconds: &dur, AcquireTime: &now, RenewTime: &now},
		})
		logs := &logsink.Buffer{}
		rec := &recorder{}
		e := start(t, rec, func(c *reconcile.Config[*Widget]) {
			c.Leader = &leader.Config{Client: kube, Namespace: "ns", Name: "widgets", Identity: "me"}
			c.Logger = slog.New(slog.NewTextHandler(logs, &slog.HandlerOptions{Level: slog.LevelDebug}))
		}, widget("a"))
		synctest.Wait()
		late := reconcile.Runnable{Name: "late", Run: func(context.Context) error { return nil }}
		if err := e.ctrl.AddTermWork(late); !errors.Is(err, reconcile.ErrAlreadyRunning) {
			t.Fatalf("AddTermWork after Run = %v, want ErrAlreadyRunning", err)
		}

		// A follower: nothing reconciled, triggers dropped, healthy standby.
		if n := len(rec.snapshot()); n != 0 {
			t.Fatalf("%d reconciles on a follower", n)
		}
		if ok, err := e.ctrl.Trigger().Enqueue(context.Background(), widget("a"), opkit.Modified, opkit.Operator, 0, 0); ok || err != nil {
			t.Fatalf("Enqueue on a follower = %v, %v; want dropped", ok, err)
		}
		if err := e.ctrl.Check(); err != nil {
			t.Fatalf("Check on a standby follower: %v", err)
		}
		if d, err := e.ctrl.Trigger().Intake(context.Background(), trigger.Pointer{Key: opkit.Key{Namespace: "ns", Name: "a"}}, trigger.IntakeOptions{}); err != nil || d.Holder != "other" {
			t.Fatalf("Intake on a follower = %+v, %v; want it to name the leader, other", d, err)
		}

		// The holder stops renewing: we take over and reconcile.
		time.Sleep(30 * time.Second)
		synctest.Wait()
		calls := rec.snapshot()
		if len(calls) != 1 || calls[0].req.Key.Name != "a" {
			t.Fatalf("calls after takeover: %+v", calls)
		}
		found := false
		for _, line := range strings.Split(logs.String(), "\n") {
			if strings.Contains(line, `msg="reconcile ran"`) {
				found = true
				for _, attr := range []string{"key=ns/a", "type=Added", "sources=APIServer", "retry=0", "term="} {
					if !strings.Contains(line, attr) {
						t.Errorf("reconcile log line lacks %s: %s", attr, line)
					}
				}
			}
		}
		if !found {
			t.Fatalf("no reconcile log line:\n%s", logs.String())
		}
		if ok, _ := e.ctrl.Trigger().Enqueue(context.Background(), widget("a"), opkit.Modified, opkit.Operator, 0, 0); !ok {
			t.Fatal("Enqueue dropped on the leader")
		}
	})
}

func TestLeaderDrainEndsBeforeTheLeaseCanExpire(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		kube := kfake.NewClientset()
		var cancelledAfter time.Duration
		began := make(chan time.Time, 1)
		rec := &recorder{do: func(ctx context.Context, _ int, _ reconcile.Request[*Widget]) (reconcile.Result, error) {
			<-ctx.Done()
			cancelledAfter = time.Since(<-began)
			return reconcile.Done(), ctx.Err()
		}}
		e := start(t, rec, func(c *reconcile.Config[*Widget]) {
			c.Leader = &leader.Config{Client: kube, Namespace: "ns", Name: "widgets", Identity: "me"}
			c.ShutdownTimeout = time.Minute // longer than the Lease allows
		}, widget("a"))
		synctest.Wait()
		if n := len(rec.snapshot()); n != 1 {
			t.Fatalf("%d reconciles after acquiring, want 1", n)
		}
		began <- time.Now()
		e.cancel()
		err := <-e.done
		e.done <- err
		// LeaseDuration 15s - ClockSkew 1s - RetryPeriod 2s.
		if cancelledAfter != 12*time.Second {
			t.Fatalf("in-flight reconcile cancelled %v after shutdown began, want 12s", cancelledAfter)
		}
		lease, err := kube.CoordinationV1().Leases("ns").Get(context.Background(), "widgets", metav1.GetOptions{})
		if err != nil || (lease.Spec.HolderIdentity != nil && *lease.Spec.HolderIdentity != "") {
			t.Fatalf("lease after shutdown: %+v, %v; want released", lease.Spec, err)
		}
	})
}

func TestLeaderOnlyGroupComponentsRunOnlyInTerms(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		holder, dur := "other", int32(15)
		now := metav1.NewMicroTime(time.Now())
		kube := kfake.NewClientset(&coordv1.Lease{
			ObjectMeta: metav1.ObjectMeta{Namespace: "ns", Name: "widgets"},
			Spec:       coordv1.LeaseSpec{HolderIdentity: &holder, LeaseDurationSeconds: &dur, AcquireTime: &now, RenewTime: &now},
		})
		ctrl, err := reconcile.NewController(reconcile.Config[*Widget]{
			Name: "w", Resource: widgets, Dynamic: newFakeDynamic(t, widget("a")), Reconciler: &recorder{}, Logger: quiet,
			Leader: &leader.Config{Client: kube, Namespace: "ns", Name: "widgets", Identity: "me"},
		})
		if err != nil {
			t.Fatal(err)
		}
		var gcRunning atomic.Bool
		g := reconcile.NewGroup(reconcile.GroupConfig{Leader: ctrl, Logger: quiet})
		if err := g.Add(ctrl.Runnable(), reconcile.Runnable{Name: "gc", LeaderOnly: true, Run: func(ctx context.Context) error {
			gcRunning.Store(true)
			<-ctx.Done()
			gcRunning.Store(false)
			return nil
		}}); err != nil {
			t.Fatal(err)
		}
		ctx, cancel := context.WithCancel(context.Background())
		done := make(chan error, 1)
		go func() { done <- g.Run(ctx) }()
		synctest.Wait()
		if gcRunning.Load() {
			t.Fatal("leader-only component runs on a follower")
		}
		time.Sleep(30 * time.Second) // the other holder's Lease expires
		synctest.Wait()
		if !gcRunning.Load() {
			t.Fatal("leader-only component not running on the leader")
		}
		cancel()
		if err := <-done; err != nil {
			t.Fatal(err)
		}
		if gcRunning.Load() {
			t.Fatal("leader-only component still running after shutdown")
		}
	})
}

func TestNewControllerRefusesALeaderGateAndBadLeaderConfig(t *testing.T) {
	dyn := newFakeDynamic(t)
	base := reconcile.Config[*Widget]{Name: "n", Resource: widgets, Dynamic: dyn, Reconciler: &recorder{}}
	cfg := base
	cfg.Leader = &leader.Config{Client: kfake.NewClientset(), Namespace: "ns", Name: "l", Gate: queueGate{}}
	if _, err := reconcile.NewController(cfg); !errors.Is(err, reconcile.ErrInvalidConfig) {
		t.Errorf("Leader.Gate set: err = %v", err)
	}
	cfg.Leader = &leader.Config{Namespace: "ns", Name: "l"} // no client
	if _, err := reconcile.NewController(cfg); !errors.Is(err, reconcile.ErrInvalidConfig) || !errors.Is(err, leader.ErrInvalidConfig) {
		t.Errorf("Leader without client: err = %v", err)
	}
}

type queueGate struct{}

func (queueGate) Suspend()   {}
func (queueGate) Resume()    {}
func (queueGate) Clear() int { return 0 }

func TestLeaderDrainEndsBeforeTheLeaseCanExpireWhenRenewalsFail(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		kube := kfake.NewClientset()
		// The Lease is created (acquired) once; every renewal then fails.
		kube.PrependReactor("update", "leases", func(k8stesting.Action) (bool, runtime.Object, error) {
			return true, nil, apierrors.NewInternalError(errors.New("etcd unavailable"))
		})
		acquired := time.Now()
		var cancelled time.Time
		rec := &recorder{do: func(ctx context.Context, _ int, _ reconcile.Request[*Widget]) (reconcile.Result, error) {
			<-ctx.Done()
			cancelled = time.Now()
			return reconcile.Done(), ctx.Err()
		}}
		e := start(t, rec, func(c *reconcile.Config[*Widget]) {
			c.Leader = &leader.Config{Client: kube, Namespace: "ns", Name: "widgets", Identity: "me"}
			c.ShutdownTimeout = time.Minute
		}, widget("a"))
		synctest.Wait()
		if n := len(rec.snapshot()); n != 1 {
			t.Fatalf("%d reconciles after acquiring, want 1", n)
		}
		// Shut down late in the term: the last successful write (the
		// acquisition) is 9s old, RenewDeadline (10s) not yet reached.
		time.Sleep(9 * time.Second)
		e.cancel()
		err := <-e.done
		e.done <- err
		// Other replicas may acquire LeaseDuration (15s) after that write;
		// the elector's bound keeps ClockSkew (1s) in hand.
		if bound := acquired.Add(14 * time.Second); cancelled.After(bound) {
			t.Fatalf("in-flight reconcile cancelled %v after the last renew, past the bound of 14s", cancelled.Sub(acquired))
		}
	})
}

func TestLeaderControllerDropsTriggersFromConstructionOn(t *testing.T) {
	ctrl, err := reconcile.NewController(reconcile.Config[*Widget]{
		Name: "w", Resource: widgets, Dynamic: newFakeDynamic(t, widget("a")), Reconciler: &recorder{}, Logger: quiet,
		Leader: &leader.Config{Client: kfake.NewClientset(), Namespace: "ns", Name: "widgets", Identity: "me"},
	})
	if err != nil {
		t.Fatal(err)
	}
	// A trigger endpoint or consumer started by a Group may run before the
	// controller's Run: this replica does not lead yet, so nothing may be
	// scheduled (a consumer would ack it, and another replica may lead).
	if ok, err := ctrl.Trigger().Enqueue(context.Background(), widget("a"), opkit.Modified, opkit.Operator, 0, 0); ok || err != nil {
		t.Fatalf("Enqueue before Run = %v, %v; want dropped", ok, err)
	}
	if st := ctrl.QueueStats(); st.Ready+st.Delayed+st.Parked != 0 {
		n := st.Ready + st.Delayed + st.Parked
		t.Fatalf("queue holds %d entries before Run", n)
	}
}

// A delete whose reconcile the end of a term interrupts is not lost: the
// next term's list no longer shows the object, but the watcher's ledger
// kept the delete, with its final state, until it is settled, and the
// next term's list adds its key again.
func TestADeleteInterruptedByTheEndOfATermIsReconciledInTheNext(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		rec, e, nextTerm := firstDeleteOutlivesTheTerm(t, widget("a"), widget("b"))
		synctest.Wait()
		if n := len(rec.snapshot()); n != 2 {
			t.Fatalf("%d reconciles in the first term, want 2", n)
		}
		if err := e.dyn.Tracker().Delete(widgets.GroupVersionResource, "ns", "b"); err != nil {
			t.Fatal(err)
		}
		synctest.Wait()
		nextTerm()
		var got []string
		for _, c := range rec.snapshot() {
			got = append(got, fmt.Sprintf("%s %s final=%v interrupted=%v", c.req.Type, c.req.Key.Name, c.req.FinalStateUnknown, c.ctxErr != nil))
		}
		want := []string{
			"Added a final=false interrupted=false", "Added b final=false interrupted=false", // first term (list order)
			"Deleted b final=false interrupted=true",
			"Added a final=false interrupted=false", "Deleted b final=false interrupted=false", // next term's list
		}
		if !slices.Equal(got[:2], want[:2]) && !slices.Equal(got[:2], []string{want[1], want[0]}) || len(got) != len(want) ||
			got[2] != want[2] || !slices.Contains(got[3:], want[3]) || !slices.Contains(got[3:], want[4]) {
			t.Fatalf("reconciles:\n %s\nwant:\n %s", strings.Join(got, "\n "), strings.Join(want, "\n "))
		}
	})
}

// An object deleted and created again under the same name while its
// delete's reconcile runs into the end of a term: the next term reconciles
// the old object's delete (a tombstone) and then the new object. The new
// object must not take the old one's delete with it.
func TestARecreatedObjectsInterruptedDeleteIsReconciledInTheNextTerm(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		rec, e, nextTerm := firstDeleteOutlivesTheTerm(t, widget("b"))
		synctest.Wait()
		if err := e.dyn.Tracker().Delete(widgets.GroupVersionResource, "ns", "b"); err != nil {
			t.Fatal(err)
		}
		synctest.Wait()
		again, err := typed.ToUnstructured(widget("b", func(w *Widget) { w.UID, w.ResourceVersion = "uid-b2", "5" }))
		if err != nil {
			t.Fatal(err)
		}
		if err := e.dyn.Tracker().Create(widgets.GroupVersionResource, again, "ns"); err != nil {
			t.Fatal(err)
		}
		synctest.Wait() // its Added waits behind the delete in flight
		nextTerm()
		var got []string
		for _, c := range rec.snapshot() {
			got = append(got, fmt.Sprintf("%s %s %s final=%v interrupted=%v", c.req.Type, c.req.Key.Name, c.req.Object.GetUID(), c.req.FinalStateUnknown, c.ctxErr != nil))
		}
		want := []string{
			"Added b uid-b final=false interrupted=false",
			"Deleted b uid-b final=false interrupted=true",
			"Deleted b uid-b final=false interrupted=false", // the next term: the old object's delete first
			"Added b uid-b2 final=false interrupted=false",
		}
		if !slices.Equal(got, want) {
			t.Fatalf("reconciles:\n %s\nwant:\n %s", strings.Join(got, "\n "), strings.Join(want, "\n "))
		}
	})
}

// firstDeleteOutlivesTheTerm starts a leader-elected controller over objs
// whose reconciler blocks the first Deleted request until its term ends.
// nextTerm ends the term (every Lease renewal fails until the deadline),
// then lets the next campaign win and waits for the new term's work.
func firstDeleteOutlivesTheTerm(t *testing.T, objs ...*Widget) (rec *recorder, e *env, nextTerm func()) {
	elect, endTerm, nextCampaign := electedWithTermEnd(t)
	var deletes atomic.Int32
	rec = &recorder{do: func(ctx context.Context, _ int, req reconcile.Request[*Widget]) (reconcile.Result, error) {
		if req.Type == opkit.Deleted && deletes.Add(1) == 1 {
			<-ctx.Done() // the first one outlives the term
			return reconcile.Done(), ctx.Err()
		}
		return reconcile.Done(), nil
	}}
	e = start(t, rec, elect, objs...)
	return rec, e, func() {
		endTerm(e)
		nextCampaign()
	}
}

// electedWithTermEnd returns a Config modifier that makes the controller
// leader-elected on a fake Lease, endTerm, which ends the current term
// (every renewal fails until the deadline) and checks it ended, and
// nextCampaign, which lets the next campaign win and waits for the new
// term's work.
func electedWithTermEnd(t *testing.T) (elect func(*reconcile.Config[*Widget]), endTerm func(*env), nextCampaign func()) {
	kube := kfake.NewClientset()
	var failRenew atomic.Bool
	kube.PrependReactor("update", "leases", func(k8stesting.Action) (bool, runtime.Object, error) {
		if failRenew.Load() {
			return true, nil, apierrors.NewInternalError(errors.New("etcd unavailable"))
		}
		return false, nil, nil
	})
	elect = func(c *reconcile.Config[*Widget]) {
		c.Leader = &leader.Config{Client: kube, Namespace: "ns", Name: "widgets", Identity: "me"}
	}
	endTerm = func(e *env) {
		failRenew.Store(true) // the term ends at RenewDeadline
		time.Sleep(20 * time.Second)
		synctest.Wait()
		if e.ctrl.Held() == 1 {
			t.Fatalf("still leading with every renewal failing")
		}
	}
	nextCampaign = func() {
		failRenew.Store(false) // the next campaign succeeds
		time.Sleep(30 * time.Second)
		synctest.Wait()
	}
	return elect, endTerm, nextCampaign
}

// A failing key's streak ends with the term: the next term's list
// reconciles it with the shortest delay again, not with the delay the
// last term had reached (its retry went with the cleared queue).
func TestTheFailureStreakEndsWithTheTerm(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		elect, endTerm, nextCampaign := electedWithTermEnd(t)
		rec := &recorder{do: func(context.Context, int, reconcile.Request[*Widget]) (reconcile.Result, error) {
			return reconcile.Done(), errors.New("dependency down")
		}}
		e := start(t, rec, elect, widget("a"))
		time.Sleep(40 * time.Second) // fails at 0, 1, 3, 7, 15, 31s: the next delay 32s
		synctest.Wait()
		endTerm(e)
		n := len(rec.snapshot())
		nextCampaign()
		calls := rec.snapshot()
		if len(calls) < n+3 {
			t.Fatalf("%d reconciles in the next term, want at least 3; reconciles:%s", len(calls)-n, describeCalls(calls))
		}
		if got := fmt.Sprint(gapsAfter(calls[n:n+3], 0)); got != "[1s 2s]" {
			t.Errorf("the next term's retry gaps %s, want [1s 2s]; reconciles:%s", got, describeCalls(calls[n:]))
		}
	})
}

// A teardown's reconcile does not settle the watcher's delete of its
// object: when the watch's delete waited behind it and the end of the
// term cleared the queue, the teardown finishing after that (it did not
// watch its context) leaves the delete in the ledger, and the next term
// delivers it.
func TestADeletedTriggerDoesNotSettleTheWatchDelete(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		elect, endTerm, nextCampaign := electedWithTermEnd(t)
		gate := make(chan struct{})
		rec := &recorder{do: func(_ context.Context, _ int, req reconcile.Request[*Widget]) (reconcile.Result, error) {
			if req.Type == opkit.Deleted && req.Sources.Has(opkit.Operator) {
				<-gate // a teardown that ignores its context
			}
			return reconcile.Done(), nil
		}}
		e := start(t, rec, elect, widget("a"))
		synctest.Wait()
		if o, err := e.ctrl.Trigger().Submit(context.Background(), trigger.Request[*Widget]{Object: widget("a"), Type: opkit.Deleted, Source: opkit.Operator, Reason: "teardown"}); err != nil || !o.Accepted() {
			t.Fatalf("Submit: %v %v", o, err)
		}
		synctest.Wait() // the teardown is in flight, held at the gate
		if err := e.dyn.Resource(widgets.GroupVersionResource).Namespace("ns").Delete(context.Background(), "a", metav1.DeleteOptions{}); err != nil {
			t.Fatal(err)
		}
		synctest.Wait() // the watch's delete waits behind the teardown
		endTerm(e)      // and is cleared with the term
		close(gate)     // the teardown finishes
		synctest.Wait()
		n := len(rec.snapshot())
		nextCampaign()
		for _, c := range rec.snapshot()[n:] {
			if c.req.Type == opkit.Deleted && c.req.Sources == apiServer && c.req.Object.UID == widget("a").UID {
				return
			}
		}
		t.Fatalf("the next term did not deliver the watch's delete of a; reconciles:%s", describeCalls(rec.snapshot()))
	})
}
