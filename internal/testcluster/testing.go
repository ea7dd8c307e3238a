package testcluster

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"fmt"
	"os"
	"os/signal"
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
)

// live holds every cluster New started and Stop has not stopped yet, so that
// Main's signal handler can stop private clusters too.
var live struct {
	mu       sync.Mutex
	clusters map[*Cluster]struct{}
}

func register(c *Cluster) {
	live.mu.Lock()
	defer live.mu.Unlock()
	if live.clusters == nil {
		live.clusters = make(map[*Cluster]struct{})
	}
	live.clusters[c] = struct{}{}
}

func unregister(c *Cluster) {
	live.mu.Lock()
	defer live.mu.Unlock()
	delete(live.clusters, c)
}

func stopAll() {
	live.mu.Lock()
	cs := make([]*Cluster, 0, len(live.clusters))
	for c := range live.clusters {
		cs = append(cs, c)
	}
	live.mu.Unlock()
	for _, c := range cs {
		_ = c.Stop()
	}
}

// shared is the one cluster of a test binary, started by the first Shared
// call and stopped by Main. Together with live, the package's only global state: a test
// binary has one TestMain.
var shared struct {
	mu      sync.Mutex
	inMain  bool // Main is running
	started bool // start attempted (c or err set)
	c       *Cluster
	err     error
}

// Main is the body of a test binary's TestMain:
//
//	func TestMain(m *testing.M) { testcluster.Main(m) }
//
// It checks that the binaries exist (if not, it prints how to build them and
// exits 1: integration tests fail, they never skip), runs the tests, stops
// the shared cluster (if Shared started one) and exits with the tests' code.
// The shared cluster is also stopped when m.Run panics and on SIGINT or
// SIGTERM (which also stop private clusters); if the process dies otherwise, the kernel kills the processes
// (see the package doc).
func Main(m *testing.M) {
	os.Exit(runMain(m))
}

func runMain(m *testing.M) int {
	if err := CheckBinaries(DefaultBinDir()); err != nil {
		fmt.Fprintf(os.Stderr, "testcluster: %v\n", err) // says where and how to build
		return 1
	}
	shared.mu.Lock()
	shared.inMain = true
	shared.mu.Unlock()

	sigs := make(chan os.Signal, 1)
	signal.Notify(sigs, syscall.SIGINT, syscall.SIGTERM)
	done := make(chan struct{})
	go func() { // owned by runMain; ends when it returns
		select {
		case s := <-sigs:
			fmt.Fprintf(os.Stderr, "testcluster: %v: stopping every control plane of this test binary\n", s)
			// stopAll first: it does not wait for the shared cluster's
			// lock, which Shared holds while that cluster starts (up to
			// ReadyTimeout per attempt), and it stops a starting cluster.
			stopAll()
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
	if shared.c == nil {
		return
	}
	if showLogs {
		for _, l := range shared.c.logTails(20) {
			fmt.Fprintf(os.Stderr, "--- tail of shared %s log:\n%s\n", l.of, l.tail)
		}
	}
	if err := shared.c.Stop(); err != nil {
		fmt.Fprintf(os.Stderr, "testcluster: stop shared control plane: %v\n", err)
	}
}

// Shared returns the test binary's shared cluster, starting it on first use
// (a few seconds). It fails t if TestMain does not call Main or the cluster
// cannot start. Tests sharing it isolate themselves with Namespace and must
// not stop or restart its API servers or compact it: use Start for that.
func Shared(t testing.TB) *Cluster {
	t.Helper()
	shared.mu.Lock()
	defer shared.mu.Unlock()
	if !shared.inMain {
		t.Fatalf("testcluster.Shared needs TestMain to call testcluster.Main(m)")
	}
	if !shared.started {
		shared.started = true
		shared.c, shared.err = New(context.Background(), Options{})
		if shared.err == nil {
			t.Logf("testcluster: shared control plane ready in %v (%s)", shared.c.StartupDuration().Round(time.Millisecond), shared.c.Dir())
		}
	}
	if shared.err != nil {
		t.Fatalf("testcluster: shared control plane: %v", shared.err)
	}
	return shared.c
}

// Start starts a private cluster for t (a few seconds) and stops it at t's
// cleanup, showing the tail of the logs if t failed. It fails t if the
// cluster cannot start.
func Start(t testing.TB, opts Options) *Cluster {
	t.Helper()
	c, err := New(context.Background(), opts)
	if err != nil {
		t.Fatalf("testcluster: %v", err)
	}
	t.Logf("testcluster: private control plane ready in %v (%s)", c.StartupDuration().Round(time.Millisecond), c.Dir())
	t.Cleanup(func() {
		if t.Failed() {
			for _, l := range c.logTails(20) {
				t.Logf("tail of %s log:\n%s", l.of, l.tail)
			}
		}
		if err := c.Stop(); err != nil {
			t.Errorf("testcluster: %v", err)
		}
	})
	return c
}

// logTail is the end of one process's log.
type logTail struct{ of, tail string }

// logTails returns the last n lines of the log of every API server, of etcd
// and of the controller-manager, if any.
func (c *Cluster) logTails(n int) []logTail {
	var tails []logTail
	for i := range c.APIServers() {
		tails = append(tails, logTail{fmt.Sprintf("kube-apiserver %d", i), c.LogTail(i, n)})
	}
	tails = append(tails, logTail{"etcd", c.LogTail(-1, n)})
	if c.HasControllerManager() {
		tails = append(tails, logTail{"kube-controller-manager", c.ControllerManagerLogTail(n)})
	}
	return tails
}

// firstRunning returns the index of the first running API server, or 0.
func (c *Cluster) firstRunning() int {
	c.mu.Lock()
	defer c.mu.Unlock()
	for i, s := range c.apiservers {
		if s.proc != nil {
			return i
		}
	}
	return 0
}

// Dynamic returns an admin dynamic client for API server 0, failing t if
// it cannot be built.
func (c *Cluster) Dynamic(t testing.TB) *dynamic.DynamicClient {
	t.Helper()
	d, err := dynamic.NewForConfig(c.Config())
	if err != nil {
		t.Fatal(err)
	}
	return d
}

// Namespace creates a namespace with a fresh name derived from t's name and
// returns the name. At cleanup it deletes the namespace; without a
// controller-manager (Options.ControllerManager) it stays Terminating, which
// at least refuses new objects in it, with one it goes away with its
// contents.
func (c *Cluster) Namespace(t testing.TB) string {
	t.Helper()
	client, err := dynamic.NewForConfig(c.ConfigFor(c.firstRunning()))
	if err != nil {
		t.Fatalf("testcluster: client: %v", err)
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
		t.Fatalf("testcluster: create namespace %s: %v", name, err)
	}
	t.Cleanup(func() {
		c.mu.Lock()
		stopped := c.stopped
		c.mu.Unlock()
		if stopped {
			return
		}
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		err := namespaces.Delete(ctx, name, metav1.DeleteOptions{})
		if err != nil && !apierrors.IsNotFound(err) {
			t.Logf("testcluster: delete namespace %s: %v", name, err)
		}
	})
	return name
}

// namespaceName turns a test name into a unique DNS label: lower case
// letters, digits and dashes, at most 63 characters.
func namespaceName(testName string) string {
	var b strings.Builder
	dash := true // no leading dash
	for _, r := range strings.ToLower(testName) {
		switch {
		case r >= 'a' && r <= 'z', r >= '0' && r <= '9':
			b.WriteRune(r)
			dash = false
		case !dash:
			b.WriteByte('-')
			dash = true
		}
		if b.Len() >= 48 {
			break
		}
	}
	base := strings.TrimRight(b.String(), "-")
	if base == "" {
		base = "test"
	}
	suffix := make([]byte, 4)
	if _, err := rand.Read(suffix); err != nil {
		panic("testcluster: crypto/rand failed: " + err.Error())
	}
	return base + "-" + hex.EncodeToString(suffix)
}

// ServiceAccountToken returns a token for ServiceAccount ns/name bound to
// audience (the API server's default audience, Issuer, if empty), creating
// the ServiceAccount if it is missing. The token is valid for an hour.
func (c *Cluster) ServiceAccountToken(ctx context.Context, ns, name, audience string) (string, error) {
	client, err := dynamic.NewForConfig(c.ConfigFor(c.firstRunning()))
	if err != nil {
		return "", fmt.Errorf("testcluster: client: %w", err)
	}
	sas := client.Resource(serviceAccountGVR).Namespace(ns)
	sa := &unstructured.Unstructured{Object: map[string]any{
		"apiVersion": "v1",
		"kind":       "ServiceAccount",
		"metadata":   map[string]any{"name": name, "namespace": ns},
	}}
	if _, err := sas.Create(ctx, sa, metav1.CreateOptions{}); err != nil && !apierrors.IsAlreadyExists(err) {
		return "", fmt.Errorf("testcluster: create service account %s/%s: %w", ns, name, err)
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
		return "", fmt.Errorf("testcluster: token for %s/%s: %w", ns, name, err)
	}
	token, _, _ := unstructured.NestedString(resp.Object, "status", "token")
	if token == "" {
		return "", fmt.Errorf("testcluster: token for %s/%s: empty token in TokenRequest status", ns, name)
	}
	return token, nil
}

var (
	namespaceGVR      = schema.GroupVersionResource{Version: "v1", Resource: "namespaces"}
	serviceAccountGVR = schema.GroupVersionResource{Version: "v1", Resource: "serviceaccounts"}
)
