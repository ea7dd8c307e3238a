package reconcile_test

import (
	"context"
	"log/slog"
	"strings"
	"testing"
	"testing/synctest"
	"time"

	"github.com/opkit/opkit"
	"github.com/opkit/opkit/internal/logsink"
	"github.com/opkit/opkit/reconcile"
	"github.com/opkit/opkit/trigger"
)

// At Info a reconcile shows unless it was a plain success that wrote
// nothing: one that wrote its object, one that asked to be requeued, a
// Deleted one. At Debug every reconcile shows, with its sources,
// reasons and related kinds.
func TestAReconcileIsVisibleAtInfoUnlessNothingHappened(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		logs := &logsink.Buffer{}
		var status *reconcile.Status[*Widget]
		r := reconcile.Func[*Widget](func(ctx context.Context, req reconcile.Request[*Widget]) (reconcile.Result, error) {
			switch {
			case req.Type == opkit.Deleted:
			case req.Key.Name == "writes":
				_, err := status.Update(ctx, req.Object, func(w *Widget) error { w.Status.Phase = "Ready"; return nil })
				return reconcile.Done(), err
			case req.Key.Name == "requeues" && req.Sources.Has(opkit.APIServer):
				return reconcile.RequeueAfter(time.Hour), nil
			}
			return reconcile.Done(), nil
		})
		e := start(t, &recorder{}, func(c *reconcile.Config[*Widget]) {
			var err error
			if status, err = reconcile.NewStatus[*Widget](reconcile.StatusConfig{Dynamic: c.Dynamic, Resource: widgets}); err != nil {
				t.Fatal(err)
			}
			c.Reconciler = r
			c.Logger = slog.New(slog.NewTextHandler(logs, &slog.HandlerOptions{Level: slog.LevelDebug}))
			c.NoEvents = true
		}, widget("plain"), widget("writes"), widget("requeues"))
		synctest.Wait()
		if _, err := e.ctrl.Trigger().Submit(context.Background(), trigger.Request[*Widget]{Object: widget("plain"), Type: opkit.Deleted, Source: opkit.Operator, Reason: "cleanup"}); err != nil {
			t.Fatal(err)
		}
		synctest.Wait()

		info := func(name string) []string { return logs.Lines("level=INFO", "key=ns/"+name, "reconciled") }
		if got := info("writes"); len(got) != 1 || !strings.Contains(got[0], "wrote=true") {
			t.Errorf("Info lines of a reconcile that wrote its status: %q, want one saying so", got)
		}
		if got := info("requeues"); len(got) != 1 || !strings.Contains(got[0], "requeued") {
			t.Errorf("Info lines of a requeue: %q, want one", got)
		}
		if got := info("plain"); len(got) != 1 || !strings.Contains(got[0], "type=Deleted") {
			t.Errorf("Info lines of plain: %q, want only its teardown's", got)
		}
		debug := logs.Lines("level=DEBUG", "key=ns/plain", "reconcile ran")
		if len(debug) != 2 || !strings.Contains(debug[1], "sources=Operator") || !strings.Contains(debug[1], "reasons=[cleanup]") {
			t.Errorf("Debug lines of plain: %q, want its listing's and its teardown's, naming the source and reason", debug)
		}
	})
}
