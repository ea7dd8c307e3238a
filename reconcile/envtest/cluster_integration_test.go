//go:build integration

package envtest_test

import (
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"strings"
	"testing"
	"time"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/watch"

	"github.com/opkit/opkit/reconcile/envtest"
)

// TestSecondAPIServerServesWhileFirstIsDown runs an HA control plane: two API
// servers on one etcd, each serving the other's writes, one serving while the
// other is stopped, and the stopped one coming back on its port.
func TestSecondAPIServerServesWhileFirstIsDown(t *testing.T) {
	c := envtest.Start(t, envtest.Options{})
	ns := c.Namespace(t)
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()

	i, err := c.AddAPIServer()
	if err != nil {
		t.Fatalf("AddAPIServer: %v", err)
	}
	if i != 1 || c.APIServers() != 2 {
		t.Fatalf("AddAPIServer = %d with %d API servers, want 1 with 2", i, c.APIServers())
	}
	if c.ConfigFor(0).Host == c.ConfigFor(1).Host {
		t.Fatalf("both API servers at %s", c.ConfigFor(0).Host)
	}
	leases0 := dyn(t, c.ConfigFor(0)).Resource(leaseGVR).Namespace(ns)
	leases1 := dyn(t, c.ConfigFor(1)).Resource(leaseGVR).Namespace(ns)

	if _, err := leases0.Create(ctx, lease(ns, "via-0", "x"), metav1.CreateOptions{}); err != nil {
		t.Fatalf("create via 0: %v", err)
	}
	if _, err := leases1.Get(ctx, "via-0", metav1.GetOptions{}); err != nil {
		t.Fatalf("read via 1 what 0 wrote: %v", err)
	}

	if err := c.StopAPIServer(0); err != nil {
		t.Fatalf("StopAPIServer(0): %v", err)
	}
	if _, err := leases0.Get(ctx, "via-0", metav1.GetOptions{}); err == nil {
		t.Fatalf("API server 0 still answers after StopAPIServer")
	}
	if _, err := leases1.Create(ctx, lease(ns, "via-1", "y"), metav1.CreateOptions{}); err != nil {
		t.Fatalf("create via 1 while 0 is down: %v", err)
	}

	if err := c.StartAPIServer(0); err != nil {
		t.Fatalf("StartAPIServer(0): %v", err)
	}
	got, err := leases0.Get(ctx, "via-1", metav1.GetOptions{})
	if err != nil {
		t.Fatalf("read via restarted 0 what 1 wrote meanwhile: %v", err)
	}
	if h, _, _ := unstructured.NestedString(got.Object, "spec", "holderIdentity"); h != "y" {
		t.Fatalf("holder = %q, want y", h)
	}

	if err := c.KillAPIServer(1); err != nil {
		t.Fatalf("KillAPIServer(1): %v", err)
	}
	if _, err := leases0.Get(ctx, "via-1", metav1.GetOptions{}); err != nil {
		t.Fatalf("0 serves while 1 is killed: %v", err)
	}
	if err := c.StartAPIServer(9); !errors.Is(err, envtest.ErrNoAPIServer) {
		t.Fatalf("StartAPIServer(9) = %v, want ErrNoAPIServer", err)
	}
}

// TestCompactForcesGone checks that after Compact a watch resuming from a
// compacted resourceVersion fails with 410 Gone: at once with the watch cache
// off, and after an API server restart (which empties its cache) with the
// watch cache on.
func TestCompactForcesGone(t *testing.T) {
	for _, tc := range []struct {
		name    string
		opts    envtest.Options
		restart bool
	}{
		{"watch cache off", envtest.Options{DisableWatchCache: true}, false},
		{"watch cache on, API server restarted", envtest.Options{}, true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			c := envtest.Start(t, tc.opts)
			ns := c.Namespace(t)
			ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
			defer cancel()
			leases := dyn(t, c.Config()).Resource(leaseGVR).Namespace(ns)
			l, err := leases.Create(ctx, lease(ns, "compact", "h0"), metav1.CreateOptions{})
			if err != nil {
				t.Fatalf("create lease: %v", err)
			}
			oldRV := l.GetResourceVersion()
			for _, h := range []string{"h1", "h2", "h3"} {
				if err := unstructured.SetNestedField(l.Object, h, "spec", "holderIdentity"); err != nil {
					t.Fatal(err)
				}
				if l, err = leases.Update(ctx, l, metav1.UpdateOptions{}); err != nil {
					t.Fatalf("update lease: %v", err)
				}
			}
			rev, err := c.Compact(ctx)
			if err != nil {
				t.Fatalf("Compact: %v", err)
			}
			if cur := l.GetResourceVersion(); rev < mustInt(t, cur) {
				t.Fatalf("compacted at %d, below the last write %s", rev, cur)
			}
			if tc.restart {
				if err := c.StopAPIServer(0); err != nil {
					t.Fatal(err)
				}
				if err := c.StartAPIServer(0); err != nil {
					t.Fatal(err)
				}
			}
			err = watchErr(ctx, t, leases, oldRV)
			if !apierrors.IsResourceExpired(err) && !apierrors.IsGone(err) {
				t.Fatalf("watch from compacted resourceVersion %s: %v, want 410 Gone", oldRV, err)
			}
			// Current state is still readable, and a watch from now works.
			if _, err := leases.Get(ctx, "compact", metav1.GetOptions{}); err != nil {
				t.Fatalf("get after compaction: %v", err)
			}
		})
	}
}

func mustInt(t testing.TB, s string) int64 {
	t.Helper()
	var n int64
	for _, r := range s {
		if r < '0' || r > '9' {
			t.Fatalf("resourceVersion %q is not a number", s)
		}
		n = n*10 + int64(r-'0')
	}
	return n
}

// watchErr starts a watch from rv and returns the error it fails with: the
// request's error, or the Status of its first ERROR event.
func watchErr(ctx context.Context, t testing.TB, r interface {
	Watch(context.Context, metav1.ListOptions) (watch.Interface, error)
}, rv string) error {
	t.Helper()
	w, err := r.Watch(ctx, metav1.ListOptions{ResourceVersion: rv})
	if err != nil {
		return err
	}
	defer w.Stop()
	for {
		select {
		case ev, ok := <-w.ResultChan():
			if !ok {
				t.Fatalf("watch from %s closed without an error", rv)
			}
			if ev.Type == watch.Error {
				return apierrors.FromObject(ev.Object)
			}
			t.Logf("watch from %s delivered %s (want an error)", rv, ev.Type)
		case <-ctx.Done():
			t.Fatalf("watch from %s: no error before %v", rv, ctx.Err())
		}
	}
}

// TestUnprivilegedUserIsForbidden checks that UserConfig authenticates but
// RBAC grants it nothing, while the admin may list.
func TestUnprivilegedUserIsForbidden(t *testing.T) {
	c := envtest.Shared(t)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	if _, err := dyn(t, c.Config()).Resource(nsGVR).List(ctx, metav1.ListOptions{}); err != nil {
		t.Fatalf("admin list namespaces: %v", err)
	}
	_, err := dyn(t, c.UserConfig()).Resource(nsGVR).List(ctx, metav1.ListOptions{})
	if !apierrors.IsForbidden(err) {
		t.Fatalf("user list namespaces: %v, want 403 Forbidden", err)
	}
	if !strings.Contains(err.Error(), envtest.UnprivilegedUser) {
		t.Fatalf("forbidden error %q does not name user %s", err, envtest.UnprivilegedUser)
	}
}

// TestServiceAccountToken checks TokenRequest with an audience and
// TokenReview of the token, and that the API server accepts only tokens for
// its own audience.
func TestServiceAccountToken(t *testing.T) {
	c := envtest.Shared(t)
	ns := c.Namespace(t)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	const audience = "opkit-trigger"

	token, err := c.ServiceAccountToken(ctx, ns, "caller", audience)
	if err != nil {
		t.Fatalf("ServiceAccountToken: %v", err)
	}
	// A second call reuses the ServiceAccount.
	if _, err := c.ServiceAccountToken(ctx, ns, "caller", audience); err != nil {
		t.Fatalf("ServiceAccountToken again: %v", err)
	}
	reviews := dyn(t, c.Config()).Resource(schema.GroupVersionResource{Group: "authentication.k8s.io", Version: "v1", Resource: "tokenreviews"})
	review := func(token string, audiences ...any) *unstructured.Unstructured {
		t.Helper()
		tr := &unstructured.Unstructured{Object: map[string]any{
			"apiVersion": "authentication.k8s.io/v1",
			"kind":       "TokenReview",
			"spec":       map[string]any{"token": token, "audiences": audiences},
		}}
		got, err := reviews.Create(ctx, tr, metav1.CreateOptions{})
		if err != nil {
			t.Fatalf("TokenReview: %v", err)
		}
		return got
	}

	got := review(token, audience)
	if ok, _, _ := unstructured.NestedBool(got.Object, "status", "authenticated"); !ok {
		t.Fatalf("TokenReview for audience %s: not authenticated: %v", audience, got.Object["status"])
	}
	wantUser := "system:serviceaccount:" + ns + ":caller"
	if u, _, _ := unstructured.NestedString(got.Object, "status", "user", "username"); u != wantUser {
		t.Fatalf("TokenReview user = %q, want %q", u, wantUser)
	}
	if auds, _, _ := unstructured.NestedStringSlice(got.Object, "status", "audiences"); len(auds) != 1 || auds[0] != audience {
		t.Fatalf("TokenReview audiences = %v, want [%s]", auds, audience)
	}
	got = review(token, "someone-else")
	if ok, _, _ := unstructured.NestedBool(got.Object, "status", "authenticated"); ok {
		t.Fatalf("TokenReview for a foreign audience authenticated the token")
	}

	// The API server accepts a token for its own audience only.
	ssr := &unstructured.Unstructured{Object: map[string]any{
		"apiVersion": "authentication.k8s.io/v1",
		"kind":       "SelfSubjectReview",
	}}
	ssrGVR := schema.GroupVersionResource{Group: "authentication.k8s.io", Version: "v1", Resource: "selfsubjectreviews"}
	if _, err := dyn(t, c.TokenConfig(token)).Resource(ssrGVR).Create(ctx, ssr, metav1.CreateOptions{}); !apierrors.IsUnauthorized(err) {
		t.Fatalf("API call with a %s token: %v, want 401 Unauthorized", audience, err)
	}
	apiToken, err := c.ServiceAccountToken(ctx, ns, "caller", "")
	if err != nil {
		t.Fatalf("ServiceAccountToken for the API audience: %v", err)
	}
	me, err := dyn(t, c.TokenConfig(apiToken)).Resource(ssrGVR).Create(ctx, ssr, metav1.CreateOptions{})
	if err != nil {
		t.Fatalf("SelfSubjectReview with an API token: %v", err)
	}
	if u, _, _ := unstructured.NestedString(me.Object, "status", "userInfo", "username"); u != wantUser {
		t.Fatalf("SelfSubjectReview user = %q, want %q", u, wantUser)
	}
}

// TestStopLeavesNoProcesses checks that Stop ends every process of an environment
// (found by the temp dir on their command lines) and removes the dir.
func TestStopLeavesNoProcesses(t *testing.T) {
	c, err := envtest.New(context.Background(), envtest.Options{APIServers: 2, ControllerManager: true})
	if err != nil {
		t.Fatalf("New: %v", err)
	}
	dir := c.Dir()
	if procs := processesIn(t, dir); len(procs) != 4 {
		c.Stop()
		t.Fatalf("running cluster: %d processes in %s, want 4 (etcd, 2 kube-apiservers, kube-controller-manager): %v", len(procs), dir, procs)
	}
	if err := c.Stop(); err != nil {
		t.Fatalf("Stop: %v", err)
	}
	if procs := processesIn(t, dir); len(procs) != 0 {
		t.Fatalf("after Stop: %v", procs)
	}
	if _, err := os.Stat(dir); !os.IsNotExist(err) {
		t.Fatalf("after Stop, %s: %v, want not exist", dir, err)
	}
	if err := c.Stop(); err != nil {
		t.Fatalf("second Stop: %v", err)
	}
	if _, err := c.AddAPIServer(); !errors.Is(err, envtest.ErrStopped) {
		t.Fatalf("AddAPIServer after Stop = %v, want ErrStopped", err)
	}
}

const crashHelperEnv = "OPKIT_ENVTEST_CRASH_HELPER"

// crashHelper runs in a child test binary (see TestMain): it starts an
// environment, prints its dir and crashes from another goroutine -- no
// deferred function or cleanup runs.
func crashHelper() {
	c, err := envtest.New(context.Background(), envtest.Options{ControllerManager: true})
	if err != nil {
		os.Stdout.WriteString("error " + err.Error() + "\n")
		os.Exit(3)
	}
	os.Stdout.WriteString("dir " + c.Dir() + "\n")
	go panic("crash helper: simulated crash with a running environment")
	select {}
}

// TestTimeoutHelper runs in a child test binary with a short -timeout: it
// starts an environment and outlives the timeout.
func TestTimeoutHelper(t *testing.T) {
	if os.Getenv(crashHelperEnv) != "timeout" {
		t.Skip("run by TestDeadTestBinaryLeavesNothing")
	}
	c := envtest.Start(t, envtest.Options{ControllerManager: true})
	os.Stdout.WriteString("dir " + c.Dir() + "\n")
	time.Sleep(time.Hour)
}

// TestDeadTestBinaryLeavesNothing checks that a test binary that dies with a
// running environment, without running its cleanups -- a panic in a
// goroutine, or the go test -timeout -- takes etcd, kube-apiserver and
// kube-controller-manager down with it, and that the watchdog removes the
// temp dir. The child's TMPDIR is a dir of this test's: whether the child
// died before or after its environment was up, nothing may be left there
// and no process may name it.
func TestDeadTestBinaryLeavesNothing(t *testing.T) {
	for _, tc := range []struct {
		mode, says string
		args       []string
	}{
		{"panic", "crash helper: simulated crash", []string{"-test.run=^$"}},
		{"timeout", "panic: test timed out after 20s", []string{"-test.run=^TestTimeoutHelper$", "-test.timeout=20s"}},
	} {
		t.Run(tc.mode, func(t *testing.T) {
			tmp := t.TempDir()
			ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
			defer cancel()
			cmd := exec.CommandContext(ctx, os.Args[0], tc.args...)
			cmd.Env = append(os.Environ(), crashHelperEnv+"="+tc.mode, "TMPDIR="+tmp)
			out, err := cmd.CombinedOutput()
			if err == nil {
				t.Fatalf("helper exited cleanly, want it dead:\n%s", out)
			}
			if !strings.Contains(string(out), tc.says) {
				t.Errorf("helper output does not say %q:\n%s", tc.says, out)
			}
			if !strings.Contains(string(out), "dir "+tmp) {
				t.Logf("the helper died before its environment was up (still checked):\n%s", out)
			}
			// The kernel delivers the death signal asynchronously, and the
			// watchdog retries while the processes let go of the dir.
			eventually(t, 30*time.Second, "processes and temp dir of the dead helper gone", func(context.Context) error {
				if procs := processesIn(t, tmp); len(procs) > 0 {
					return errors.New(strings.Join(procs, "; "))
				}
				if left, _ := os.ReadDir(tmp); len(left) > 0 {
					return fmt.Errorf("left in TMPDIR: %v", left)
				}
				return nil
			})
		})
	}
}
