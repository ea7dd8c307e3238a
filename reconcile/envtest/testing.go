package envtest

import (
	"context"
	"fmt"
	"os"
	"os/signal"
	"regexp"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/client-go/dynamic"
	"k8s.io/client-go/rest"
)

// live holds, as keys, every *Environment New started and Stop has not
// stopped yet, so that Main's signal handler can stop them all.
var live sync.Map

// shared is the one environment of a test binary, started by the first
// Shared call and stopped by Main. Together with live, the package's only
// global state: a test binary has one TestMain.
var shared struct {
	mu      sync.Mutex
	inMain  bool // Main is running
	opts    Options
	started bool // start attempted (e or err set)
	e       *Environment
	err     error
}

// Main is the body of a test binary's TestMain when its tests share one
// environment, which [Shared] starts with opts on first use:
//
//	func TestMain(m *testing.M) {
//		envtest.Main(m, envtest.Options{CRDs: []string{"../config/crd"}})
//	}
//
// It checks that the binaries exist (if not, it prints where it looked and
// how to build them and exits 1: the tests fail rather than skip), runs
// the tests, stops the shared environment (if Shared started one, showing
// the tail of its logs if a test failed) and exits with the tests' code.
// The shared environment is also stopped when m.Run panics, and on SIGINT
// or SIGTERM, which also stop every other environment of the binary; if
// the process dies otherwise, the kernel kills the processes and a
// watchdog removes the temp dirs (see the package doc).
func Main(m *testing.M, opts Options) {
	os.Exit(runMain(m, opts))
}

func runMain(m *testing.M, opts Options) int {
	if _, err := FindBinaries(opts.BinDir, opts.ControllerManager); err != nil {
		fmt.Fprintln(os.Stderr, err) // says where it looked and how to build
		return 1
	}
	shared.mu.Lock()
	shared.inMain = true
	shared.opts = opts
	shared.mu.Unlock()

	sigs := make(chan os.Signal, 1)
	signal.Notify(sigs, syscall.SIGINT, syscall.SIGTERM)
	done := make(chan struct{})
	go func() { // owned by runMain; ends when it returns
		select {
		case s := <-sigs:
			fmt.Fprintf(os.Stderr, "envtest: %v: stopping every control plane of this test binary\n", s)
			// Every environment first: this does not wait for the shared
			// environment's lock, which Shared holds while that
			// environment starts (up to ReadyTimeout per attempt), and it
			// stops a starting one.
			live.Range(func(e, _ any) bool {
				_ = e.(*Environment).Stop() // deletes e from live, as Range allows
				return true
			})
			stopShared(false)
			os.Exit(1)
		case <-done:
		}
	}()
	code := 1
	defer func() {
		signal.Stop(sigs)
		close(done)
		// Runs on a panic too, which then continues.
		stopShared(code != 0)
	}()
	code = m.Run()
	return code
}

func stopShared(showLogs bool) {
	shared.mu.Lock()
	defer shared.mu.Unlock()
	shared.inMain = false
	if shared.e == nil {
		return
	}
	if showLogs {
		fmt.Fprint(os.Stderr, "envtest: the shared control plane's logs:\n", shared.e.logTails(20))
	}
	if err := shared.e.Stop(); err != nil {
		fmt.Fprintf(os.Stderr, "envtest: stop shared control plane: %v\n", err)
	}
}

// Shared returns the test binary's shared environment, starting it with
// Main's Options on first use (a few seconds). It fails t if TestMain does
// not call Main or the environment cannot start. Tests sharing it isolate
// themselves with Namespace and must not stop or restart its API servers
// or compact it: use Start for that.
func Shared(t testing.TB) *Environment {
	t.Helper()
	shared.mu.Lock()
	defer shared.mu.Unlock()
	if !shared.inMain {
		t.Fatalf("envtest.Shared needs TestMain to call envtest.Main(m, opts)")
	}
	if !shared.started {
		shared.started = true
		shared.e, shared.err = New(context.Background(), shared.opts)
		if shared.err == nil {
			t.Logf("envtest: shared control plane ready in %v (%s)", shared.e.StartupDuration().Round(time.Millisecond), shared.e.Dir())
		}
	}
	if shared.err != nil {
		t.Fatalf("envtest: shared control plane: %v", shared.err)
	}
	return shared.e
}

// Start starts a private environment for t (a few seconds) and stops it at
// t's cleanup, showing the tail of the logs if t failed. Cleanups run when
// the test fails or panics too; if the test binary dies without them (a
// panic in another goroutine, the go test -timeout), the kernel kills the
// processes and a watchdog removes the temp dir. Start fails t if the
// environment cannot start, with the reason: binaries missing (and the
// command that builds them), a CRD file that does not parse, a port in
// use, a process that exited (with its log's tail), or the test's
// -timeout reached during start-up.
func Start(t testing.TB, opts Options) *Environment {
	t.Helper()
	ctx := context.Background()
	deadline, hasDeadline := testDeadline(t)
	if hasDeadline {
		// Give up a moment before the test binary's -timeout, so that the
		// test fails with the reason rather than the binary with a panic.
		var cancel context.CancelFunc
		ctx, cancel = context.WithDeadline(ctx, deadline.Add(-time.Second))
		defer cancel()
	}
	e, err := New(ctx, opts)
	if err != nil {
		if hasDeadline && ctx.Err() != nil {
			t.Fatalf("%v\n(the test binary's -timeout ends at %s)", err, deadline.Format(time.TimeOnly))
		}
		t.Fatal(err)
	}
	t.Logf("envtest: control plane ready in %v (%s)", e.StartupDuration().Round(time.Millisecond), e.Dir())
	t.Cleanup(func() {
		if t.Failed() {
			t.Log(e.logTails(20))
		}
		if err := e.Stop(); err != nil {
			t.Errorf("envtest: %v", err)
		}
	})
	return e
}

// testDeadline is t's Deadline, if t has one (a *testing.T).
func testDeadline(t testing.TB) (time.Time, bool) {
	if d, ok := t.(interface{ Deadline() (time.Time, bool) }); ok {
		return d.Deadline()
	}
	return time.Time{}, false
}

// logTails returns the last n lines of the log of every API server, of etcd
// and of the controller-manager, if any, each under a heading.
func (e *Environment) logTails(n int) string {
	var b strings.Builder
	for i := range e.APIServers() {
		fmt.Fprintf(&b, "--- tail of kube-apiserver %d log:\n%s\n", i, e.LogTail(i, n))
	}
	fmt.Fprintf(&b, "--- tail of etcd log:\n%s\n", e.LogTail(-1, n))
	if e.HasControllerManager() {
		fmt.Fprintf(&b, "--- tail of kube-controller-manager log:\n%s\n", e.ControllerManagerLogTail(n))
	}
	return b.String()
}

// Namespace creates a namespace with a fresh name derived from t's name and
// returns the name. At cleanup it deletes the namespace; without a
// controller-manager (Options.ControllerManager) it stays Terminating, which
// at least refuses new objects in it, with one it goes away with its
// contents.
func (e *Environment) Namespace(t testing.TB) string {
	t.Helper()
	client, err := dynamic.NewForConfig(e.ConfigFor(e.firstRunning()))
	if err != nil {
		t.Fatalf("envtest: client: %v", err)
	}
	namespaces := client.Resource(namespaceGVR)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	name := namespaceName(t.Name())
	ns := &unstructured.Unstructured{Object: map[string]any{
		"apiVersion": "v1",
		"kind":       "Namespace",
		"metadata":   map[string]any{"name": name},
	}}
	if _, err := namespaces.Create(ctx, ns, metav1.CreateOptions{}); err != nil {
		t.Fatalf("envtest: create namespace %s: %v", name, err)
	}
	t.Cleanup(func() {
		e.mu.Lock()
		stopped := e.stopped
		e.mu.Unlock()
		if stopped {
			return
		}
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		err := namespaces.Delete(ctx, name, metav1.DeleteOptions{})
		if err != nil && !apierrors.IsNotFound(err) {
			t.Logf("envtest: delete namespace %s: %v", name, err)
		}
	})
	return name
}

// namespaceName turns a test name into a unique DNS label: lower case
// letters, digits and dashes, at most 63 characters.
func namespaceName(testName string) string {
	base := strings.Trim(notDNSLabel.ReplaceAllString(strings.ToLower(testName), "-"), "-")
	base = strings.TrimRight(base[:min(len(base), 48)], "-")
	if base == "" {
		base = "test"
	}
	return base + "-" + randToken()[:8]
}

// notDNSLabel matches the runs of characters a DNS label cannot hold.
var notDNSLabel = regexp.MustCompile(`[^a-z0-9]+`)

// ServiceAccountToken returns a token for ServiceAccount ns/name bound to
// audience, creating the ServiceAccount if it is missing: with an audience
// of your own (a trigger endpoint's, say) the API server itself refuses
// the token but its TokenReview for that audience accepts it; with ""
// (the API server's audience, Issuer) it is a credential for the API, as
// in ServiceAccountConfig. The token is valid for an hour.
func (e *Environment) ServiceAccountToken(ctx context.Context, ns, name, audience string) (string, error) {
	client, err := dynamic.NewForConfig(e.ConfigFor(e.firstRunning()))
	if err != nil {
		return "", fmt.Errorf("envtest: client: %w", err)
	}
	sas := client.Resource(serviceAccountGVR).Namespace(ns)
	sa := &unstructured.Unstructured{Object: map[string]any{
		"apiVersion": "v1",
		"kind":       "ServiceAccount",
		"metadata":   map[string]any{"name": name, "namespace": ns},
	}}
	if _, err := sas.Create(ctx, sa, metav1.CreateOptions{}); err != nil && !apierrors.IsAlreadyExists(err) {
		return "", fmt.Errorf("envtest: create service account %s/%s: %w", ns, name, err)
	}
	spec := map[string]any{"expirationSeconds": int64(3600)}
	if audience != "" {
		spec["audiences"] = []any{audience}
	}
	req := &unstructured.Unstructured{Object: map[string]any{
		"apiVersion": "authentication.k8s.io/v1",
		"kind":       "TokenRequest",
		"metadata":   map[string]any{"name": name, "namespace": ns},
		"spec":       spec,
	}}
	resp, err := sas.Create(ctx, req, metav1.CreateOptions{}, "token")
	if err != nil {
		return "", fmt.Errorf("envtest: token for %s/%s: %w", ns, name, err)
	}
	token, _, _ := unstructured.NestedString(resp.Object, "status", "token")
	if token == "" {
		return "", fmt.Errorf("envtest: token for %s/%s: empty token in TokenRequest status", ns, name)
	}
	return token, nil
}

// ServiceAccountConfig returns a config for the first running API server
// that authenticates as ServiceAccount ns/name (creating it if missing),
// with a token for the API's audience: what RBAC grants that account is
// all it may do, as for an operator's Deployment in a cluster.
func (e *Environment) ServiceAccountConfig(ctx context.Context, ns, name string) (*rest.Config, error) {
	token, err := e.ServiceAccountToken(ctx, ns, name, "")
	if err != nil {
		return nil, err
	}
	return e.config(e.mustPort(e.firstRunning()), token), nil
}

var (
	namespaceGVR      = schema.GroupVersionResource{Version: "v1", Resource: "namespaces"}
	serviceAccountGVR = schema.GroupVersionResource{Version: "v1", Resource: "serviceaccounts"}
)
