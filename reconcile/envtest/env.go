package envtest

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"

	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/client-go/rest"
)

// Issuer is the service-account token issuer of every environment; it is
// also the API servers' audience.
const Issuer = "https://kubernetes.default.svc"

var (
	// ErrStopped is returned by methods called after Stop.
	ErrStopped = errors.New("envtest: environment stopped")
	// ErrNoAPIServer is returned for an API server index that does not exist.
	ErrNoAPIServer = errors.New("envtest: no such API server")
	// ErrPortInUse is wrapped by the error of New when Options.APIServerPort
	// is taken by another process.
	ErrPortInUse = errors.New("port in use")
)

// Options configure an environment. The zero value is one API server with
// the watch cache on and no controller-manager, from the binaries
// [FindBinaries] finds.
type Options struct {
	// BinDir, if set, holds every binary (see FindBinaries); it replaces
	// the lookup in $KUBEBUILDER_ASSETS and the cache.
	BinDir string
	// CRDs are files or directories of CustomResourceDefinitions (YAML or
	// JSON, several documents a file; a directory's *.yaml, *.yml and
	// *.json files, not its subdirectories) that New installs once the
	// API servers are ready, waiting until each is established and
	// served; see ReadCRDs. They are read before anything starts, so a
	// file that does not parse costs no start-up. Give them here rather
	// than to InstallCRDs later when the garbage collector matters:
	// it knows these from its start, a later one only after its next
	// discovery, up to 30 seconds on.
	CRDs []string
	// APIServers is the number of API servers New starts, all on the same
	// etcd. Default 1. More can be added later with AddAPIServer.
	APIServers int
	// APIServerPort is the port of API server 0 on 127.0.0.1, for a
	// kubeconfig that must not change between runs. Default: a free port.
	// New fails with ErrPortInUse when another process holds it.
	APIServerPort int
	// ReadyTimeout bounds the wait for each API server's /readyz, for the
	// controller-manager's health and first garbage collection, and for
	// the CRDs. Default 60s.
	ReadyTimeout time.Duration
	// DisableWatchCache runs the API servers with --watch-cache=false, so
	// every list and watch is served by etcd. A watch resuming from a
	// resourceVersion that Compact removed then fails with 410 Gone at once;
	// with the watch cache on, the API server answers it from memory while it
	// still holds that version. Chaos tests that need 410 set this.
	DisableWatchCache bool
	// ShardedListAndWatch starts the API servers with the alpha feature
	// gate ShardedListAndWatch (KEP-5866; kube-apiserver v1.36 or later).
	// With the gate, a LIST or WATCH with ListOptions.ShardSelector
	// (e.g. shardRange(object.metadata.uid, '0x0000000000000000',
	// '0x8000000000000000'): the objects whose 64-bit FNV-1a hash of the
	// field is in [start, end)) returns only those objects, and a LIST
	// echoes the selector in ListMeta.ShardInfo; a malformed selector is
	// refused (with a bare HTTP 500 in v1.37.2). Without it the API server
	// ignores ShardSelector altogether: every object, no ShardInfo, no error
	// even for a malformed one. A controller with reconcile.Config.Shards
	// works either way; with the gate each replica receives only its
	// shards' events.
	ShardedListAndWatch bool
	// ControllerManager also starts a kube-controller-manager once the API
	// servers are ready. It runs only what a test bed without nodes or a
	// cloud can use: the garbage collector (dependents of a deleted owner
	// are deleted, foreground deletion completes), the namespace controller
	// (deleted namespaces finish deleting) and the service-account and
	// service-account-token controllers (every namespace gets its default
	// ServiceAccount). It has no leader election, acts as
	// ControllerManagerUser and talks to API server 0 only, so it makes no
	// progress while that one is stopped. New returns once it is healthy and
	// its garbage collector has completed a foreground deletion; Stop kills
	// it with the rest. Without it (the default) none of this happens: tests
	// clean up explicitly. It adds about a second to the start-up.
	ControllerManager bool
	// APIServerFlags are extra kube-apiserver flags ("--name=value"), added
	// after (and so overriding) the defaults. kube-apiserver merges repeated
	// --feature-gates flags, so one here adds to ShardedListAndWatch=true
	// rather than replacing it.
	APIServerFlags []string
	// Logger receives progress messages. Default: a logger that discards.
	Logger *slog.Logger
}

func (o Options) withDefaults() (Options, error) {
	if o.APIServers < 0 {
		return o, fmt.Errorf("envtest: Options.APIServers is %d, want >= 0 (0 means 1)", o.APIServers)
	}
	if o.APIServers == 0 {
		o.APIServers = 1
	}
	if o.APIServerPort < 0 || o.APIServerPort > 65535 {
		return o, fmt.Errorf("envtest: Options.APIServerPort is %d, want a port or 0 (a free one)", o.APIServerPort)
	}
	if o.ReadyTimeout < 0 {
		return o, fmt.Errorf("envtest: Options.ReadyTimeout is %v, want >= 0 (0 means 60s)", o.ReadyTimeout)
	}
	if o.ReadyTimeout == 0 {
		o.ReadyTimeout = 60 * time.Second
	}
	for _, f := range o.APIServerFlags {
		if !strings.HasPrefix(f, "--") {
			return o, fmt.Errorf("envtest: API server flag %q does not start with --", f)
		}
	}
	if o.Logger == nil {
		o.Logger = slog.New(slog.DiscardHandler)
	}
	return o, nil
}

// Environment is a running etcd with one or more kube-apiservers on it and,
// if asked, a kube-controller-manager. Its methods are safe for concurrent
// use.
type Environment struct {
	opts       Options
	bins       Binaries
	dir        string
	pki        *pki
	kubeconfig string
	etcdURL    string
	startup    time.Duration
	watchdog   *watchdog // nil if it could not start

	mu         sync.Mutex // guards everything below
	etcd       *process
	apiservers []*apiServer
	kcm        *process // nil without Options.ControllerManager
	stopped    bool
}

// New starts an environment in a fresh temp dir and returns once every API
// server reports ready, the controller-manager (if asked) works and the
// CRDs of Options.CRDs are served. On error nothing is left running and
// the temp dir is gone. The caller must call Stop; tests use [Start],
// which does.
func New(ctx context.Context, opts Options) (*Environment, error) {
	opts, err := opts.withDefaults()
	if err != nil {
		return nil, err
	}
	bins, err := FindBinaries(opts.BinDir, opts.ControllerManager)
	if err != nil {
		return nil, err
	}
	crds, err := ReadCRDs(opts.CRDs...)
	if err != nil {
		return nil, err
	}
	begin := time.Now()
	// Free ports are found by binding :0 and releasing it, so another
	// process can take one before etcd or the API server binds it; retry
	// with new ports when that happens.
	const attempts = 3
	for attempt := 1; ; attempt++ {
		e, err := newOnce(ctx, opts, bins, crds)
		if err == nil {
			e.startup = time.Since(begin)
			opts.Logger.Info("control plane ready", "dir", e.dir, "apiservers", opts.APIServers,
				"startup", e.startup.Round(time.Millisecond))
			return e, nil
		}
		if attempt == attempts || errors.Is(err, ErrPortInUse) || !strings.Contains(err.Error(), "address already in use") {
			return nil, err
		}
		opts.Logger.Warn("port taken during start-up, retrying", "attempt", attempt, "err", err)
	}
}

// newOnce is one attempt of New, with the ports it finds free: it starts
// everything, waits for it to be ready and, on error, stops what it started.
func newOnce(ctx context.Context, opts Options, bins Binaries, crds []*unstructured.Unstructured) (_ *Environment, err error) {
	// The fixed port is checked first: kube-apiserver would only say so
	// in its log, after etcd started.
	if err := checkPortFree(opts.APIServerPort); err != nil {
		return nil, err
	}
	dir, err := os.MkdirTemp("", "opkit-envtest-")
	if err != nil {
		return nil, fmt.Errorf("envtest: create temp dir: %w", err)
	}
	e := &Environment{opts: opts, bins: bins, dir: dir}
	// Registered from the start, so that Main's signal handler also stops
	// an environment that is still starting.
	live.Store(e, nil)
	defer func() {
		if err != nil {
			_ = e.Stop()
		}
	}()
	if e.watchdog, err = startWatchdog(dir); err != nil {
		// Stop and Pdeathsig still do their part; only a crash would leave
		// the temp dir behind.
		opts.Logger.Warn("no watchdog for the temp dir", "err", err)
		err = nil
	}
	kcmPort, err := e.startProcesses()
	if err != nil {
		return nil, err
	}
	for i := range opts.APIServers {
		if err := e.waitReady(ctx, i); err != nil {
			return nil, err
		}
	}
	// The CRDs go first: the controller-manager's garbage collector
	// discovers resources when it starts and then every 30 seconds only,
	// and it cannot collect the dependents of an owner of a resource it
	// does not know yet. They have ReadyTimeout too.
	if len(crds) > 0 {
		ctx, cancel := context.WithTimeout(ctx, opts.ReadyTimeout)
		defer cancel()
		if err := e.InstallCRDs(ctx, crds...); err != nil {
			return nil, err
		}
	}
	if opts.ControllerManager {
		if err := e.startControllerManager(ctx, kcmPort); err != nil {
			return nil, err
		}
	}
	return e, nil
}

// checkPortFree fails with ErrPortInUse when port (Options.APIServerPort)
// is not 0 and cannot be bound on 127.0.0.1.
func checkPortFree(port int) error {
	if port == 0 {
		return nil
	}
	l, err := net.Listen("tcp", "127.0.0.1:"+strconv.Itoa(port))
	if err != nil {
		return fmt.Errorf("envtest: Options.APIServerPort: %w: 127.0.0.1:%d: %v", ErrPortInUse, port, err)
	}
	l.Close()
	return nil
}

// startProcesses writes the PKI and the kubeconfig and starts etcd and every
// API server on free ports, without waiting for them to be ready. It holds
// e.mu meanwhile (Stop waits for it) and returns the port it sets aside for
// the controller-manager, which Options.ControllerManager starts later.
func (e *Environment) startProcesses() (kcmPort int, err error) {
	e.mu.Lock()
	defer e.mu.Unlock()
	if e.pki, err = writePKI(e.dir); err != nil {
		return 0, fmt.Errorf("envtest: %w", err)
	}
	// etcd's client and peer ports, the controller-manager's (used only if
	// it is asked for), then the API servers'.
	ports, err := freePorts(3 + e.opts.APIServers)
	if err != nil {
		return 0, err
	}
	apiPorts := ports[3:]
	if e.opts.APIServerPort != 0 {
		apiPorts[0] = e.opts.APIServerPort
	}
	if err := e.startEtcd(ports[0], ports[1]); err != nil {
		return 0, err
	}
	e.kubeconfig = filepath.Join(e.dir, "kubeconfig")
	if err := os.WriteFile(e.kubeconfig, kubeconfig(hostURL(apiPorts[0]), e.pki.caPEM, AdminUser, e.pki.adminToken), 0o600); err != nil {
		return 0, fmt.Errorf("envtest: write kubeconfig: %w", err)
	}
	// Start every API server first, then wait: they come up in parallel.
	for _, port := range apiPorts {
		if _, err := e.addAPIServerLocked(port); err != nil {
			return 0, err
		}
	}
	return ports[2], nil
}

func hostURL(port int) string { return "https://127.0.0.1:" + strconv.Itoa(port) }

// freePorts returns n distinct loopback ports that were free a moment ago.
func freePorts(n int) ([]int, error) {
	ports := make([]int, 0, n)
	var ls []net.Listener
	defer func() {
		for _, l := range ls {
			l.Close()
		}
	}()
	for range n {
		l, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			return nil, fmt.Errorf("envtest: find a free port: %w", err)
		}
		ls = append(ls, l)
		ports = append(ports, l.Addr().(*net.TCPAddr).Port)
	}
	return ports, nil
}

// waitHealthy polls url (a health endpoint of proc, which errors call what)
// with token, if any, until it answers ok; see waitFor.
func (e *Environment) waitHealthy(ctx context.Context, proc *process, what, url, token string) error {
	client, err := rest.HTTPClientFor(&rest.Config{
		BearerToken:     token,
		TLSClientConfig: rest.TLSClientConfig{CAData: e.pki.caPEM},
		Timeout:         5 * time.Second,
	})
	if err != nil {
		return fmt.Errorf("envtest: HTTP client: %w", err)
	}
	return e.waitFor(ctx, proc, what, func(ctx context.Context) (bool, string) {
		req, err := http.NewRequestWithContext(ctx, http.MethodGet, url, nil)
		if err != nil {
			return false, err.Error()
		}
		resp, err := client.Do(req)
		if err != nil {
			return false, err.Error()
		}
		body, _ := io.ReadAll(io.LimitReader(resp.Body, 4096))
		resp.Body.Close()
		if resp.StatusCode == http.StatusOK && strings.TrimSpace(string(body)) == "ok" {
			return true, ""
		}
		tail := strings.ReplaceAll(lastLines(string(body), 8), "\n", " | ")
		return false, fmt.Sprintf("%s: HTTP %d: %s", url, resp.StatusCode, tail)
	})
}

// waitFor calls check every 100ms until it reports done, proc (which errors
// call what) or etcd exits, ctx ends or ReadyTimeout passes. When not done,
// check says what it saw, for the error.
func (e *Environment) waitFor(ctx context.Context, proc *process, what string, check func(context.Context) (done bool, saw string)) error {
	ctx, cancel := context.WithTimeout(ctx, e.opts.ReadyTimeout)
	defer cancel()
	last := "nothing yet"
	for {
		done, saw := check(ctx)
		if done {
			return nil
		}
		last = saw
		if e.etcd.exited() {
			return fmt.Errorf("envtest: %w: etcd (%v) while waiting for %s; etcd log tail:\n%s",
				errProcessExited, e.etcd.err, what, e.etcd.tail(30))
		}
		select {
		case <-proc.done:
			return fmt.Errorf("envtest: %w: %s (%v); log tail:\n%s",
				errProcessExited, what, proc.err, proc.tail(30))
		case <-ctx.Done():
			return fmt.Errorf("envtest: %s not ready after %v (last saw %s): %w; log tail:\n%s",
				what, e.opts.ReadyTimeout, last, ctx.Err(), proc.tail(30))
		case <-time.After(100 * time.Millisecond):
		}
	}
}

// Stop kills every process of the environment, waits for them to exit and
// removes the temp dir. It is idempotent and safe to call concurrently.
func (e *Environment) Stop() error {
	e.mu.Lock()
	defer e.mu.Unlock()
	if e.stopped {
		return nil
	}
	e.stopped = true
	// Removed from live only when done, so that a Stop from Main's signal
	// handler waits for one in progress (on e.mu) before the process exits.
	defer live.Delete(e)
	// The data is thrown away: no need for a graceful shutdown. The
	// controller-manager, a client of the API servers, goes first.
	if e.kcm != nil {
		e.kcm.stop(syscall.SIGKILL, 0)
	}
	for _, s := range e.apiservers {
		if s.proc != nil {
			s.proc.stop(syscall.SIGKILL, 0)
			s.proc = nil
		}
	}
	if e.etcd != nil {
		e.etcd.stop(syscall.SIGKILL, 0)
	}
	var err error
	if rmErr := os.RemoveAll(e.dir); rmErr != nil {
		err = fmt.Errorf("envtest: remove %s: %w", e.dir, rmErr)
	}
	if e.watchdog != nil {
		e.watchdog.stop() // it removes what RemoveAll could not, if anything
	}
	return err
}

// ShardedListAndWatch reports whether the API servers run with the feature
// gate ShardedListAndWatch, that is, honour ListOptions.ShardSelector (see
// Options.ShardedListAndWatch). It does not look into APIServerFlags.
func (e *Environment) ShardedListAndWatch() bool { return e.opts.ShardedListAndWatch }

// Dir returns the environment's temp dir (logs, certificates, kubeconfig, etcd
// data). It is removed by Stop.
func (e *Environment) Dir() string { return e.dir }

// Binaries returns the binaries the environment runs.
func (e *Environment) Binaries() Binaries { return e.bins }

// StartupDuration is how long New took until every API server (and the
// controller-manager, if any) was ready.
func (e *Environment) StartupDuration() time.Duration { return e.startup }

// Kubeconfig returns the path of an admin kubeconfig for API server 0,
// written in the temp dir.
func (e *Environment) Kubeconfig() string { return e.kubeconfig }

// EtcdURL returns etcd's client URL (plain HTTP on loopback).
func (e *Environment) EtcdURL() string { return e.etcdURL }

// Config returns an admin (group system:masters) config for API server 0.
// Each call returns a new copy.
func (e *Environment) Config() *rest.Config { return e.ConfigFor(0) }

// ConfigFor returns an admin config for API server i. It panics if i is not
// an API server of the environment (a programming error).
func (e *Environment) ConfigFor(i int) *rest.Config {
	return e.config(e.mustPort(i), e.pki.adminToken)
}

// UserConfig returns a config for API server 0 as UnprivilegedUser, which is
// authenticated but granted nothing by RBAC.
func (e *Environment) UserConfig() *rest.Config {
	return e.config(e.mustPort(0), e.pki.userToken)
}

// TokenConfig returns a config for API server 0 that authenticates with
// token (a ServiceAccount token, for example).
func (e *Environment) TokenConfig(token string) *rest.Config {
	return e.config(e.mustPort(0), token)
}

func (e *Environment) config(port int, token string) *rest.Config {
	return &rest.Config{
		Host:            hostURL(port),
		BearerToken:     token,
		TLSClientConfig: rest.TLSClientConfig{CAData: bytes.Clone(e.pki.caPEM)},
		// Tests burst; client-side throttling would only slow them down.
		QPS:   200,
		Burst: 400,
	}
}

func (e *Environment) mustPort(i int) int {
	e.mu.Lock()
	defer e.mu.Unlock()
	if i < 0 || i >= len(e.apiservers) {
		panic(fmt.Sprintf("envtest: API server %d does not exist (have %d)", i, len(e.apiservers)))
	}
	return e.apiservers[i].port
}

// LogTail returns the last n lines of API server i's log (i >= 0) or of
// etcd's log (i == -1).
func (e *Environment) LogTail(i, n int) string {
	if i == -1 {
		return tailFile(filepath.Join(e.dir, "etcd.log"), n)
	}
	e.mu.Lock()
	defer e.mu.Unlock()
	if i < 0 || i >= len(e.apiservers) {
		return fmt.Sprintf("(no API server %d)", i)
	}
	return tailFile(e.apiservers[i].logs, n)
}
