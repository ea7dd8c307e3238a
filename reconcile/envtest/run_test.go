package envtest_test

import (
	"context"
	"errors"
	"os"
	"os/exec"
	"strings"
	"sync/atomic"
	"testing"

	"github.com/opkit/opkit/reconcile/envtest"
)

// fakeRunner becomes ready after readyAfter checks, runs until its context
// ends and then returns stopErr; with early set it returns that at once.
type fakeRunner struct {
	checks, readyAfter int32
	stopped            atomic.Bool
	early              error
	stopErr            error
}

func (f *fakeRunner) Run(ctx context.Context) error {
	if f.early != nil {
		return f.early
	}
	<-ctx.Done()
	f.stopped.Store(true)
	return f.stopErr
}

func (f *fakeRunner) Check() error {
	if atomic.AddInt32(&f.checks, 1) <= f.readyAfter {
		return errors.New("not yet")
	}
	return nil
}

func TestRunWaitsForReadinessAndStopsAtCleanup(t *testing.T) {
	f := &fakeRunner{readyAfter: 3}
	t.Run("inner", func(t *testing.T) {
		envtest.Run(t, f)
		if n := atomic.LoadInt32(&f.checks); n != 4 {
			t.Errorf("Run returned after %d checks, want 4 (ready on the fourth)", n)
		}
		if f.stopped.Load() {
			t.Error("stopped before the test ended")
		}
	})
	if !f.stopped.Load() {
		t.Error("not stopped by the cleanup")
	}
}

// Failures are checked in a child test binary, as they fail the test that
// calls Run.
const runHelperEnv = "OPKIT_ENVTEST_RUN_HELPER"

func TestRunHelper(t *testing.T) {
	switch os.Getenv(runHelperEnv) {
	case "":
		t.Skip("run by TestRunReportsFailures")
	case "early":
		envtest.Run(t, &fakeRunner{early: errors.New("bind: address already in use"), readyAfter: 1 << 30})
		t.Log("not reached: Run fails the test")
	case "stop":
		envtest.Run(t, &fakeRunner{stopErr: errors.New("lease not released")})
	}
}

func TestRunReportsFailures(t *testing.T) {
	for mode, want := range map[string]string{
		"early": "*envtest_test.fakeRunner.Run returned before the test ended: bind: address already in use",
		"stop":  "*envtest_test.fakeRunner.Run: lease not released",
	} {
		cmd := exec.Command(os.Args[0], "-test.run=^TestRunHelper$", "-test.v")
		cmd.Env = append(os.Environ(), runHelperEnv+"="+mode)
		out, err := cmd.CombinedOutput()
		if err == nil {
			t.Errorf("%s: the helper passed, want it failed:\n%s", mode, out)
		}
		if !strings.Contains(string(out), want) || strings.Contains(string(out), "not reached") {
			t.Errorf("%s: output does not say %q (or went on after the failure):\n%s", mode, want, out)
		}
	}
}

func TestEventuallyPollsUntilNil(t *testing.T) {
	n := 0
	envtest.Eventually(t, "the third call", func(ctx context.Context) error {
		if n++; n < 3 {
			return errors.New("not yet")
		}
		return nil
	})
	if n != 3 {
		t.Errorf("%d calls, want 3", n)
	}
}
