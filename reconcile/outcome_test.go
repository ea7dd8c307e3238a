package reconcile_test

import (
	"context"
	"errors"
	"testing"
	"testing/synctest"
	"time"

	"github.com/opkit/opkit"
	"github.com/opkit/opkit/reconcile"
	"github.com/opkit/opkit/trigger"
)

// The controller reports every turn's outcome to the triggers it serves:
// a Tracked ticket learns of the first turn (here a failure, with its
// error), a FinalOnly one of the retry that succeeds.
func TestTheControllerReportsOutcomesToTrackedTriggers(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		rec := &recorder{do: func(_ context.Context, n int, _ reconcile.Request[*Widget]) (reconcile.Result, error) {
			if n == 1 { // the first turn after the list: the triggers'
				return reconcile.Done(), errors.New("the database is down")
			}
			return reconcile.Done(), nil
		}}
		e := start(t, rec, func(c *reconcile.Config[*Widget]) { c.NoEvents = true }, widget("a"))
		synctest.Wait() // the list's reconcile
		ctx := context.Background()
		p := trigger.Pointer{Key: opkit.Key{Namespace: "ns", Name: "a"}}
		first, err := ticketOf(e.ctrl.Trigger().Intake(ctx, p, trigger.IntakeOptions{Track: trigger.Tracked}))
		if err != nil {
			t.Fatal(err)
		}
		final, err := ticketOf(e.ctrl.Trigger().Intake(ctx, p, trigger.IntakeOptions{Track: trigger.FinalOnly}))
		if err != nil {
			t.Fatal(err)
		}
		o, err := first.Wait(ctx)
		if err != nil || o.State != trigger.Failed || o.Error != "the database is down" || o.Attempts != 1 {
			t.Fatalf("the tracked trigger's outcome: %+v, %v; want failed with the error", o, err)
		}
		o, err = final.Wait(ctx)
		if err != nil || o.State != trigger.Succeeded || o.Attempts != 2 {
			t.Fatalf("the final-only trigger's outcome: %+v, %v; want succeeded on the retry", o, err)
		}
	})
}

// A tracked trigger still waiting when the term ends is Unknown at once.
func TestATrackedTriggerIsUnknownWhenTheTermEnds(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		rec := &recorder{}
		e := start(t, rec, func(c *reconcile.Config[*Widget]) { c.NoEvents = true }, widget("a"))
		synctest.Wait()
		p := trigger.Pointer{Key: opkit.Key{Namespace: "ns", Name: "a"}, Delay: time.Hour}
		tk, err := ticketOf(e.ctrl.Trigger().Intake(context.Background(), p, trigger.IntakeOptions{Track: trigger.Tracked}))
		if err != nil {
			t.Fatal(err)
		}
		e.cancel() // the process (so the term) ends before the delayed reconcile
		o, err := tk.Wait(context.Background())
		if err != nil || o.State != trigger.Unknown {
			t.Fatalf("outcome %+v, %v; want unknown", o, err)
		}
	})
}
