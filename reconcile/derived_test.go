package reconcile_test

import (
	"context"
	"fmt"
	"log/slog"
	"strings"
	"sync"
	"testing"
	"testing/synctest"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/opkit/opkit"
	"github.com/opkit/opkit/internal/logsink"
	"github.com/opkit/opkit/reconcile"
	"github.com/opkit/opkit/watcher"
)

// The controller's own status and finalizer writes, through the Status
// and Finalizer helpers, cause no reconcile, without SkipStatusOnly or
// OwnFinalizers: a reconciler that writes a new status every time is
// reconciled once, not forever; a change by someone else still is.
func TestTheControllersOwnWritesCauseNoReconcile(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		var mu sync.Mutex
		calls := 0
		var status *reconcile.Status[*Widget]
		var fin *reconcile.Finalizer[*Widget]
		r := reconcile.Func[*Widget](func(ctx context.Context, req reconcile.Request[*Widget]) (reconcile.Result, error) {
			mu.Lock()
			calls++
			n := calls
			mu.Unlock()
			if req.Type == opkit.Deleted {
				return reconcile.Done(), nil
			}
			obj, live, err := fin.Handle(ctx, req.Object, func(context.Context, *Widget) error { return nil })
			if err != nil || !live {
				return reconcile.Done(), err
			}
			_, err = status.Update(ctx, obj, func(w *Widget) error { w.Status.Message = fmt.Sprint("reconcile ", n); return nil })
			return reconcile.Done(), err
		})
		e := start(t, &recorder{}, func(c *reconcile.Config[*Widget]) {
			var err error
			if status, err = reconcile.NewStatus[*Widget](reconcile.StatusConfig{Dynamic: c.Dynamic, Resource: widgets}); err != nil {
				t.Fatal(err)
			}
			if fin, err = reconcile.NewFinalizer[*Widget](c.Dynamic, widgets, "test.opkit.dev/cleanup"); err != nil {
				t.Fatal(err)
			}
			c.Reconciler, c.NoEvents = r, true
			bumpResourceVersions(t, c.Dynamic.(*fakeDyn))
		}, widget("a"))
		time.Sleep(time.Minute)
		synctest.Wait()
		mu.Lock()
		n := calls
		mu.Unlock()
		if n != 1 {
			t.Fatalf("%d reconciles of an object whose only changes were the controller's own writes, want 1", n)
		}
		e.update(t, "a", func(w *Widget) { w.Labels = map[string]string{"tier": "gold"} })
		time.Sleep(time.Minute)
		synctest.Wait()
		mu.Lock()
		defer mu.Unlock()
		if calls != 2 {
			t.Fatalf("%d reconciles after a label change by someone else, want 2", calls)
		}
	})
}

// bare is a resource whose status cannot record durable triggers.
type bare struct {
	metav1.TypeMeta   `json:",inline"`
	metav1.ObjectMeta `json:"metadata,omitempty"`
	Status            struct {
		Phase string `json:"phase"`
	} `json:"status"`
}

// runBriefly runs a controller of cfg until its first list is done, and
// stops it.
func runBriefly[T opkit.Object](t *testing.T, cfg reconcile.Config[T]) {
	t.Helper()
	ctrl, err := reconcile.NewController(cfg)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- ctrl.Run(ctx) }()
	synctest.Wait()
	cancel()
	if err := <-done; err != nil {
		t.Fatal(err)
	}
}

// Durable triggers are on by default only when the status can record
// them handled (status.lastHandledReconcileAt); otherwise the controller
// says so once, at start, and warns when they were asked for explicitly.
func TestDurableTriggersNeedAStatusThatRecordsThem(t *testing.T) {
	for _, tc := range []struct {
		name       string
		records    bool
		annotation string
		want       string // the log line about durable triggers; "": none
	}{
		{"recorded, by default", true, "", ""},
		{"not recorded, by default", false, "", "level=INFO msg=\"durable triggers (the annotation reconcile.opkit.dev/requestedAt) are off"},
		{"not recorded, asked for", false, "example.com/requestedAt", "level=WARN msg=\"durable triggers are never recorded handled"},
		{"not recorded, none asked", false, "-", ""},
	} {
		t.Run(tc.name, func(t *testing.T) {
			synctest.Test(t, func(t *testing.T) {
				logs := &logsink.Buffer{}
				log := slog.New(slog.NewTextHandler(logs, nil))
				dyn := newFakeDynamic(t, widget("a"))
				nothing := func(context.Context, any) (reconcile.Result, error) { return reconcile.Done(), nil }
				if tc.records {
					runBriefly(t, reconcile.Config[*Widget]{Name: "w", Resource: widgets, Dynamic: dyn, NoEvents: true, Logger: log,
						Watch: watcherConfig[*Widget](tc.annotation),
						Reconciler: reconcile.Func[*Widget](func(ctx context.Context, _ reconcile.Request[*Widget]) (reconcile.Result, error) {
							return nothing(ctx, nil)
						})})
				} else {
					runBriefly(t, reconcile.Config[*bare]{Name: "w", Resource: widgets, Dynamic: dyn, NoEvents: true, Logger: log,
						Watch: watcherConfig[*bare](tc.annotation),
						Reconciler: reconcile.Func[*bare](func(ctx context.Context, _ reconcile.Request[*bare]) (reconcile.Result, error) {
							return nothing(ctx, nil)
						})})
				}
				got := logs.Lines("durable triggers")
				switch {
				case tc.want == "" && len(got) != 0:
					t.Errorf("log %q, want nothing about durable triggers", got)
				case tc.want != "" && (len(got) != 1 || !strings.Contains(got[0], tc.want)):
					t.Errorf("log %q, want one line with %q", got, tc.want)
				}
			})
		})
	}
}

func watcherConfig[T opkit.Object](annotation string) watcher.Config[T] {
	return watcher.Config[T]{RequestAnnotation: annotation}
}
