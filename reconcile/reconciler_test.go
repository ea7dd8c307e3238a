package reconcile_test

import (
	"context"
	"errors"
	"fmt"
	"io"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"

	"github.com/opkit/opkit"
	"github.com/opkit/opkit/reconcile"
)

func TestResultIsBuiltOnlyByItsConstructors(t *testing.T) {
	for _, tc := range []struct {
		r       reconcile.Result
		after   time.Duration
		requeue bool
		str     string
	}{
		{reconcile.Result{}, 0, false, "Done"},
		{reconcile.Done(), 0, false, "Done"},
		{reconcile.RequeueAfter(time.Second), time.Second, true, "RequeueAfter(1s)"},
		{reconcile.RequeueAfter(0), 0, true, "RequeueAfter(0s)"},
		{reconcile.RequeueAfter(-time.Second), 0, true, "RequeueAfter(0s)"},
	} {
		after, requeue := tc.r.Requeue()
		if after != tc.after || requeue != tc.requeue || tc.r.String() != tc.str {
			t.Errorf("%v: got (%v, %v, %q), want (%v, %v, %q)", tc.r, after, requeue, tc.r.String(), tc.after, tc.requeue, tc.str)
		}
	}
}

func TestTerminalErrorIsCheckableThroughWrapping(t *testing.T) {
	if reconcile.TerminalError(nil) != nil {
		t.Fatal("TerminalError(nil) != nil")
	}
	cause := io.ErrUnexpectedEOF
	err := fmt.Errorf("reconcile x: %w", reconcile.TerminalError(cause))
	if !reconcile.IsTerminal(err) || !errors.Is(err, reconcile.ErrTerminal) {
		t.Errorf("IsTerminal(%v) = false", err)
	}
	if !errors.Is(err, cause) {
		t.Errorf("errors.Is(%v, cause) = false", err)
	}
	var pe *myErr
	if !errors.As(fmt.Errorf("w: %w", reconcile.TerminalError(&myErr{"bad spec"})), &pe) || pe.s != "bad spec" {
		t.Errorf("errors.As did not find the wrapped error")
	}
	if reconcile.IsTerminal(cause) || reconcile.IsTerminal(nil) {
		t.Error("a plain error is terminal")
	}
}

type myErr struct{ s string }

func (e *myErr) Error() string { return e.s }

func ExampleFunc() {
	var r reconcile.Reconciler[*corev1.ConfigMap] = reconcile.Func[*corev1.ConfigMap](
		func(ctx context.Context, req reconcile.Request[*corev1.ConfigMap]) (reconcile.Result, error) {
			if req.Type == opkit.Deleted {
				return reconcile.Done(), nil
			}
			if req.Object.Data["interval"] == "" {
				// Retrying will not help until the object changes.
				return reconcile.Done(), reconcile.TerminalError(errors.New("spec.interval missing"))
			}
			return reconcile.RequeueAfter(time.Minute), nil
		})
	cm := &corev1.ConfigMap{Data: map[string]string{"interval": "1m"}}
	cm.Namespace, cm.Name = "default", "settings"
	res, err := r.Reconcile(context.Background(), reconcile.Request[*corev1.ConfigMap]{
		Key: opkit.KeyOf(cm), Object: cm, Type: opkit.Modified, Sources: opkit.Sources(opkit.APIServer),
	})
	fmt.Println(res, err)
	// Output: RequeueAfter(1m0s) <nil>
}
