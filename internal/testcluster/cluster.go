package testcluster

import (
	"bytes"
	"context"
	"crypto/tls"
	"crypto/x509"
	"encoding/json"
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

	"k8s.io/client-go/rest"
)

// Versions of the binaries hack/controlplane.sh builds; they name the cache
// directory.
const (
	KubernetesVersion = "v1.37.2"
	EtcdVersion       = "v3.6.16"
	NATSVersion       = "v2.15.2"
)

// BinDirEnv, when set, overrides the directory holding the binaries.
const BinDirEnv = "OPKIT_CONTROLPLANE_BIN"

// Issuer is the service-account token issuer of every cluster; it is also the
// default API audience.
const Issuer = "https://kubernetes.default.svc"

var (
	// ErrBinariesMissing is wrapped by the error of New when a binary
	// hack/controlplane.sh builds is not in the bin dir.
	ErrBinariesMissing = errors.New("control plane binaries missing")
	// ErrStopped is returned by methods called after Stop.
	ErrStopped = errors.New("testcluster: cluster stopped")
	// ErrNoAPIServer is returned for an API server index that does not exist.
	ErrNoAPIServer = errors.New("testcluster: no such API server")
)

// DefaultBinDir returns where hack/controlplane.sh caches the binaries:
// $OPKIT_CONTROLPLANE_BIN if set, else
// <user cache dir>/opkit/k8s-<v>_etcd-<v>_nats-<v>/bin. It returns "" when
// there is no user cache dir (neither XDG_CACHE_HOME nor HOME is set), as
// the script then refuses to build; [CheckBinaries] says so.
func DefaultBinDir() string {
	if d := os.Getenv(BinDirEnv); d != "" {
		return d
	}
	cache, err := os.UserCacheDir()
	if err != nil {
		return ""
	}
	return filepath.Join(cache, "opkit",
		fmt.Sprintf("k8s-%s_etcd-%s_nats-%s", KubernetesVersion, EtcdVersion, NATSVersion), "bin")
}

// CheckBinaries returns an error wrapping ErrBinariesMissing unless dir holds
// executable kube-apiserver, kube-controller-manager, etcd and nats-server
// binaries (the last for the example's end-to-end test and demo), all that
// hack/controlplane.sh builds. Its message tells how to build them.
// dir must be absolute: a relative one would be read from each test
// package's own directory, not where the script built it.
func CheckBinaries(dir string) error {
	switch {
	case dir == "":
		return fmt.Errorf("%w: no user cache dir (set HOME, or an absolute XDG_CACHE_HOME, or %s)", ErrBinariesMissing, BinDirEnv)
	case !filepath.IsAbs(dir):
		return fmt.Errorf("%w: bin dir %q is relative; tests run in their package's directory: give %s as an absolute path",
			ErrBinariesMissing, dir, BinDirEnv)
	}
	var missing []string
	for _, b := range []string{"kube-apiserver", "kube-controller-manager", "etcd", "nats-server"} {
		st, err := os.Stat(filepath.Join(dir, b))
		if err != nil || st.IsDir() || st.Mode()&0o111 == 0 {
			missing = append(missing, b)
		}
	}
	if len(missing) > 0 {
		return fmt.Errorf("%w in %s (%s): run `make test` or hack/controlplane.sh build",
			ErrBinariesMissing, dir, strings.Join(missing, ", "))
	}
	return nil
}

// Options configure a cluster. The zero value is a single API server with the
// watch cache on, using the binaries in DefaultBinDir.
type Options struct {
	// BinDir holds the binaries (see CheckBinaries). Default: DefaultBinDir().
	BinDir string
	// APIServers is the number of API servers New starts, all on the same
	// etcd. Default 1. More can be added later with AddAPIServer.
	APIServers int
	// ReadyTimeout bounds the wait for each API server's /readyz, and for
	// the controller-manager's health and first garbage collection. Default
	// 60s.
	ReadyTimeout time.Duration
	// DisableWatchCache runs the API servers with --watch-cache=false, so
	// every list and watch is served by etcd. A watch resuming from a
	// resourceVersion that Compact removed then fails with 410 Gone at once;
	// with the watch cache on, the API server answers it from memory while it
	// still holds that version. Chaos tests that need 410 set this.
	DisableWatchCache bool
	// DisableShardedListAndWatch starts the API servers without the alpha
	// feature gate ShardedListAndWatch (KEP-5866), which they otherwise run
	// with. With the gate, a LIST or WATCH with ListOptions.ShardSelector
	// (e.g. shardRange(object.metadata.uid, '0x0000000000000000',
	// '0x8000000000000000'): the objects whose 64-bit FNV-1a hash of the
	// field is in [start, end)) returns only those objects, and a LIST
	// echoes the selector in ListMeta.ShardInfo; a malformed selector is
	// refused (with a bare HTTP 500 in v1.37.2). Without it the API server
	// ignores ShardSelector altogether: every object, no ShardInfo, no error
	// even for a malformed one. Tests of a client-side fallback set this.
	DisableShardedListAndWatch bool
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
	// clean up explicitly.
	ControllerManager bool
	// APIServerFlags are extra kube-apiserver flags ("--name=value"), added
	// after (and so overriding) the defaults. kube-apiserver merges repeated
	// --feature-gates flags, so one here adds to the default
	// ShardedListAndWatch=true (or turns it off) rather than replacing it.
	APIServerFlags []string
	// Logger receives progress messages. Default: a logger that discards.
	Logger *slog.Logger
}

func (o Options) withDefaults() (Options, error) {
	if o.BinDir == "" {
		o.BinDir = DefaultBinDir()
	}
	if o.APIServers < 0 {
		return o, fmt.Errorf("testcluster: Options.APIServers is %d, want >= 0 (0 means 1)", o.APIServers)
	}
	if o.APIServers == 0 {
		o.APIServers = 1
	}
	if o.ReadyTimeout < 0 {
		return o, fmt.Errorf("testcluster: Options.ReadyTimeout is %v, want >= 0 (0 means 60s)", o.ReadyTimeout)
	}
	if o.ReadyTimeout == 0 {
		o.ReadyTimeout = 60 * time.Second
	}
	for _, f := range o.APIServerFlags {
		if !strings.HasPrefix(f, "--") {
			return o, fmt.Errorf("testcluster: API server flag %q does not start with --", f)
		}
	}
	if o.Logger == nil {
		o.Logger = slog.New(slog.DiscardHandler)
	}
	return o, nil
}

// Cluster is a running etcd with one or more kube-apiservers on it.
type Cluster struct {
	opts       Options
	dir        string
	pki        *pki
	kubeconfig string
	etcdURL    string
	startup    time.Duration

	mu         sync.Mutex // guards everything below
	etcd       *process
	apiservers []*apiServer
	kcm        *controllerManager // nil without Options.ControllerManager
	stopped    bool
}

// apiServer is one kube-apiserver slot: its port is kept across restarts.
type apiServer struct {
	port int
	proc *process // nil while stopped
	logs string
}

// New starts a cluster in a fresh temp dir and returns once every API server
// reports ready. On error nothing is left running and the temp dir is gone.
// The caller must call Stop.
func New(ctx context.Context, opts Options) (*Cluster, error) {
	opts, err := opts.withDefaults()
	if err != nil {
		return nil, err
	}
	if err := CheckBinaries(opts.BinDir); err != nil {
		return nil, err
	}
	begin := time.Now()
	// Free ports are found by binding :0 and releasing it, so another
	// process can take one before etcd or the API server binds it; retry
	// with new ports when that happens.
	const attempts = 3
	for attempt := 1; ; attempt++ {
		c, err := newOnce(ctx, opts)
		if err == nil {
			c.startup = time.Since(begin)
			opts.Logger.Info("control plane ready", "dir", c.dir, "apiservers", opts.APIServers,
				"startup", c.startup.Round(time.Millisecond))
			return c, nil
		}
		if attempt == attempts || !strings.Contains(err.Error(), "address already in use") {
			return nil, err
		}
		opts.Logger.Warn("port taken during start-up, retrying", "attempt", attempt, "err", err)
	}
}

func newOnce(ctx context.Context, opts Options) (_ *Cluster, err error) {
	dir, err := os.MkdirTemp("", "opkit-testcluster-")
	if err != nil {
		return nil, fmt.Errorf("testcluster: create temp dir: %w", err)
	}
	c := &Cluster{opts: opts, dir: dir}
	// Registered from the start, so that Main's signal handler also stops a
	// cluster that is still starting.
	register(c)
	defer func() {
		if err != nil {
			_ = c.Stop()
		}
	}()
	// Held while processes start (Stop waits for it); released to wait.
	c.mu.Lock()
	unlock := sync.OnceFunc(c.mu.Unlock)
	defer unlock()
	if c.pki, err = writePKI(dir); err != nil {
		return nil, fmt.Errorf("testcluster: %w", err)
	}
	// etcd's client and peer ports, the API servers' and, last, the
	// controller-manager's.
	nPorts := 2 + opts.APIServers
	if opts.ControllerManager {
		nPorts++
	}
	ports, err := freePorts(nPorts)
	if err != nil {
		return nil, err
	}
	apiPorts := ports[2 : 2+opts.APIServers]
	c.etcdURL = "http://127.0.0.1:" + strconv.Itoa(ports[0])
	peerURL := "http://127.0.0.1:" + strconv.Itoa(ports[1])
	c.etcd, err = startProcess("etcd", filepath.Join(opts.BinDir, "etcd"), filepath.Join(dir, "etcd.log"), []string{
		"--name=opkit",
		"--data-dir=" + filepath.Join(dir, "etcd-data"),
		"--listen-client-urls=" + c.etcdURL,
		"--advertise-client-urls=" + c.etcdURL,
		"--listen-peer-urls=" + peerURL,
		"--initial-advertise-peer-urls=" + peerURL,
		"--initial-cluster=opkit=" + peerURL,
		"--unsafe-no-fsync=true", // throwaway data: durability buys nothing
		"--log-level=warn",
	})
	if err != nil {
		return nil, fmt.Errorf("testcluster: %w", err)
	}
	c.kubeconfig = filepath.Join(dir, "kubeconfig")
	if err := os.WriteFile(c.kubeconfig, kubeconfig(hostURL(apiPorts[0]), c.pki.caPEM, AdminUser, c.pki.adminToken), 0o600); err != nil {
		return nil, fmt.Errorf("testcluster: write kubeconfig: %w", err)
	}
	// Start every API server first, then wait: they come up in parallel.
	for _, port := range apiPorts {
		if _, err := c.startAPIServerLocked(port); err != nil {
			return nil, err
		}
	}
	unlock()
	for i := range apiPorts {
		if err := c.waitReady(ctx, i); err != nil {
			return nil, err
		}
	}
	if opts.ControllerManager {
		if err := c.startControllerManager(ctx, ports[len(ports)-1]); err != nil {
			return nil, err
		}
	}
	return c, nil
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
			return nil, fmt.Errorf("testcluster: find a free port: %w", err)
		}
		ls = append(ls, l)
		ports = append(ports, l.Addr().(*net.TCPAddr).Port)
	}
	return ports, nil
}

func (c *Cluster) apiServerArgs(port int) []string {
	args := []string{
		"--etcd-servers=" + c.etcdURL,
		"--bind-address=127.0.0.1",
		"--advertise-address=127.0.0.1",
		"--secure-port=" + strconv.Itoa(port),
		"--cert-dir=" + filepath.Join(c.dir, "apiserver-certs"),
		"--tls-cert-file=" + c.pki.certFile,
		"--tls-private-key-file=" + c.pki.keyFile,
		"--client-ca-file=" + c.pki.caFile,
		"--token-auth-file=" + c.pki.tokenFile,
		"--authorization-mode=RBAC",
		"--service-account-issuer=" + Issuer,
		"--service-account-key-file=" + c.pki.saPubFile,
		"--service-account-signing-key-file=" + c.pki.saKeyFile,
		"--api-audiences=" + Issuer,
		"--service-cluster-ip-range=10.0.0.0/24",
		// The endpoint reconcilers refuse loopback addresses, and nothing
		// here routes to the kubernetes Service anyway.
		"--endpoint-reconciler-type=none",
		// ServiceAccount admission waits for default service accounts,
		// which only the controller-manager creates.
		"--disable-admission-plugins=ServiceAccount",
		"--profiling=false",
		"--watch-cache=" + strconv.FormatBool(!c.opts.DisableWatchCache),
	}
	if c.ShardedListAndWatch() {
		// Alpha since v1.36; the binary's own version is emulated, so
		// enabling it takes nothing else.
		args = append(args, "--feature-gates=ShardedListAndWatch=true")
	}
	return append(args, c.opts.APIServerFlags...)
}

// startAPIServerLocked starts an API server on port, in the slot already
// holding that port or in a new one. It does not wait for readiness.
func (c *Cluster) startAPIServerLocked(port int) (int, error) {
	idx := -1
	for i, s := range c.apiservers {
		if s.port == port {
			idx = i
		}
	}
	if idx < 0 {
		idx = len(c.apiservers)
		c.apiservers = append(c.apiservers, &apiServer{
			port: port,
			logs: filepath.Join(c.dir, fmt.Sprintf("kube-apiserver-%d.log", idx)),
		})
	}
	s := c.apiservers[idx]
	p, err := startProcess(fmt.Sprintf("kube-apiserver %d", idx), filepath.Join(c.opts.BinDir, "kube-apiserver"), s.logs, c.apiServerArgs(port))
	if err != nil {
		return idx, fmt.Errorf("testcluster: %w", err)
	}
	s.proc = p
	return idx, nil
}

// waitReady polls API server i's /readyz until it answers ok, the process
// exits, ctx ends or ReadyTimeout passes.
func (c *Cluster) waitReady(ctx context.Context, i int) error {
	c.mu.Lock()
	s := c.apiservers[i]
	proc := s.proc
	c.mu.Unlock()
	if proc == nil {
		return fmt.Errorf("testcluster: API server %d is stopped", i)
	}
	return c.waitHealthy(ctx, proc, fmt.Sprintf("API server %d", i), hostURL(s.port)+"/readyz", c.pki.adminToken)
}

// waitHealthy polls url (a health endpoint of proc, which errors call what)
// with token, if any, until it answers ok; see waitFor.
func (c *Cluster) waitHealthy(ctx context.Context, proc *process, what, url, token string) error {
	client := c.httpClient()
	return c.waitFor(ctx, proc, what, func(ctx context.Context) (bool, string) {
		req, err := http.NewRequestWithContext(ctx, http.MethodGet, url, nil)
		if err != nil {
			return false, err.Error()
		}
		if token != "" {
			req.Header.Set("Authorization", "Bearer "+token)
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
		return false, fmt.Sprintf("%s: HTTP %d: %s", url, resp.StatusCode, lastLines(string(body), 8))
	})
}

// waitFor calls check every 100ms until it reports done, proc (which errors
// call what) or etcd exits, ctx ends or ReadyTimeout passes. When not done,
// check says what it saw, for the error.
func (c *Cluster) waitFor(ctx context.Context, proc *process, what string, check func(context.Context) (done bool, saw string)) error {
	ctx, cancel := context.WithTimeout(ctx, c.opts.ReadyTimeout)
	defer cancel()
	last := "nothing yet"
	for {
		done, saw := check(ctx)
		if done {
			return nil
		}
		last = saw
		if c.etcd.exited() {
			return fmt.Errorf("testcluster: %w: etcd (%v) while waiting for %s; etcd log tail:\n%s",
				errProcessExited, c.etcd.err, what, c.etcd.tail(30))
		}
		select {
		case <-proc.done:
			return fmt.Errorf("testcluster: %w: %s (%v); log tail:\n%s",
				errProcessExited, what, proc.err, proc.tail(30))
		case <-ctx.Done():
			return fmt.Errorf("testcluster: %s not ready after %v (last saw %s): %w; log tail:\n%s",
				what, c.opts.ReadyTimeout, last, ctx.Err(), proc.tail(30))
		case <-time.After(100 * time.Millisecond):
		}
	}
}

func lastLines(s string, n int) string {
	lines := strings.Split(strings.TrimSpace(s), "\n")
	if len(lines) > n {
		lines = lines[len(lines)-n:]
	}
	return strings.Join(lines, " | ")
}

func (c *Cluster) httpClient() *http.Client {
	pool := x509.NewCertPool()
	pool.AppendCertsFromPEM(c.pki.caPEM)
	return &http.Client{
		Timeout:   5 * time.Second,
		Transport: &http.Transport{TLSClientConfig: &tls.Config{RootCAs: pool, MinVersion: tls.VersionTLS12}},
	}
}

// Stop kills every process of the cluster, waits for them to exit and
// removes the temp dir. It is idempotent and safe to call concurrently.
func (c *Cluster) Stop() error {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.stopped {
		return nil
	}
	c.stopped = true
	// Unregistered only when done, so that a Stop from Main's signal
	// handler waits for one in progress (on c.mu) before the process exits.
	defer unregister(c)
	// The data is thrown away: no need for a graceful shutdown. The
	// controller-manager, a client of the API servers, goes first.
	if c.kcm != nil && c.kcm.proc != nil {
		c.kcm.proc.stop(syscall.SIGKILL, 0)
		c.kcm.proc = nil
	}
	for _, s := range c.apiservers {
		if s.proc != nil {
			s.proc.stop(syscall.SIGKILL, 0)
			s.proc = nil
		}
	}
	if c.etcd != nil {
		c.etcd.stop(syscall.SIGKILL, 0)
	}
	if c.dir != "" {
		if err := os.RemoveAll(c.dir); err != nil {
			return fmt.Errorf("testcluster: remove %s: %w", c.dir, err)
		}
	}
	return nil
}

// ShardedListAndWatch reports whether the API servers run with the feature
// gate ShardedListAndWatch, that is, honour ListOptions.ShardSelector (see
// Options.DisableShardedListAndWatch). It does not look into APIServerFlags.
func (c *Cluster) ShardedListAndWatch() bool { return !c.opts.DisableShardedListAndWatch }

// Dir returns the cluster's temp dir (logs, certificates, kubeconfig, etcd
// data). It is removed by Stop.
func (c *Cluster) Dir() string { return c.dir }

// BinDir returns the directory the binaries were taken from; nats-server is
// there too when hack/controlplane.sh built it.
func (c *Cluster) BinDir() string { return c.opts.BinDir }

// StartupDuration is how long New took until every API server (and the
// controller-manager, if any) was ready.
func (c *Cluster) StartupDuration() time.Duration { return c.startup }

// Kubeconfig returns the path of an admin kubeconfig for API server 0,
// written in the temp dir.
func (c *Cluster) Kubeconfig() string { return c.kubeconfig }

// CAData returns the PEM CA certificate that signed the serving certificate.
func (c *Cluster) CAData() []byte { return bytes.Clone(c.pki.caPEM) }

// EtcdURL returns etcd's client URL (plain HTTP on loopback).
func (c *Cluster) EtcdURL() string { return c.etcdURL }

// Config returns an admin (group system:masters) config for API server 0.
// Each call returns a new copy.
func (c *Cluster) Config() *rest.Config { return c.ConfigFor(0) }

// ConfigFor returns an admin config for API server i. It panics if i is not
// an API server of the cluster (a programming error).
func (c *Cluster) ConfigFor(i int) *rest.Config {
	return c.config(c.mustPort(i), c.pki.adminToken)
}

// UserConfig returns a config for API server 0 as UnprivilegedUser, which is
// authenticated but granted nothing by RBAC.
func (c *Cluster) UserConfig() *rest.Config {
	return c.config(c.mustPort(0), c.pki.userToken)
}

// TokenConfig returns a config for API server 0 that authenticates with
// token (a ServiceAccount token, for example).
func (c *Cluster) TokenConfig(token string) *rest.Config {
	return c.config(c.mustPort(0), token)
}

func (c *Cluster) config(port int, token string) *rest.Config {
	return &rest.Config{
		Host:            hostURL(port),
		BearerToken:     token,
		TLSClientConfig: rest.TLSClientConfig{CAData: bytes.Clone(c.pki.caPEM)},
		// Tests burst; client-side throttling would only slow them down.
		QPS:   200,
		Burst: 400,
	}
}

func (c *Cluster) mustPort(i int) int {
	c.mu.Lock()
	defer c.mu.Unlock()
	if i < 0 || i >= len(c.apiservers) {
		panic(fmt.Sprintf("testcluster: API server %d does not exist (have %d)", i, len(c.apiservers)))
	}
	return c.apiservers[i].port
}

// APIServerPID returns the process ID of API server i, or 0 while it is
// stopped: for benchmarks that report its CPU time.
func (c *Cluster) APIServerPID(i int) int {
	c.mu.Lock()
	defer c.mu.Unlock()
	if i < 0 || i >= len(c.apiservers) || c.apiservers[i].proc == nil {
		return 0
	}
	return c.apiservers[i].proc.cmd.Process.Pid
}

// APIServers returns the number of API server slots (running or stopped).
func (c *Cluster) APIServers() int {
	c.mu.Lock()
	defer c.mu.Unlock()
	return len(c.apiservers)
}

// AddAPIServer starts another kube-apiserver on the same etcd, on a free
// port, and returns its index once it is ready. On error the slot may exist
// with a stopped API server.
func (c *Cluster) AddAPIServer() (int, error) {
	ports, err := freePorts(1)
	if err != nil {
		return -1, err
	}
	c.mu.Lock()
	if c.stopped {
		c.mu.Unlock()
		return -1, ErrStopped
	}
	i, err := c.startAPIServerLocked(ports[0])
	c.mu.Unlock()
	if err != nil {
		return i, err
	}
	if err := c.waitReady(context.Background(), i); err != nil {
		c.killAPIServer(i, syscall.SIGKILL, 0)
		return i, err
	}
	return i, nil
}

// StopAPIServer stops API server i gracefully (SIGTERM, then SIGKILL after
// 15s) and returns once it has exited. Its port, certificates and keys are
// kept for StartAPIServer. Stopping a stopped API server does nothing.
func (c *Cluster) StopAPIServer(i int) error {
	return c.killAPIServer(i, syscall.SIGTERM, 15*time.Second)
}

// KillAPIServer kills API server i with SIGKILL, like a crash.
func (c *Cluster) KillAPIServer(i int) error { return c.killAPIServer(i, syscall.SIGKILL, 0) }

func (c *Cluster) killAPIServer(i int, sig syscall.Signal, grace time.Duration) error {
	c.mu.Lock()
	if c.stopped {
		c.mu.Unlock()
		return ErrStopped
	}
	if i < 0 || i >= len(c.apiservers) {
		c.mu.Unlock()
		return fmt.Errorf("%w: %d", ErrNoAPIServer, i)
	}
	s := c.apiservers[i]
	p := s.proc
	s.proc = nil
	c.mu.Unlock()
	if p != nil {
		p.stop(sig, grace)
	}
	return nil
}

// StartAPIServer starts the stopped API server i again on its port, with the
// same certificates and keys, and returns once it is ready. Starting a
// running API server does nothing.
func (c *Cluster) StartAPIServer(i int) error {
	c.mu.Lock()
	if c.stopped {
		c.mu.Unlock()
		return ErrStopped
	}
	if i < 0 || i >= len(c.apiservers) {
		c.mu.Unlock()
		return fmt.Errorf("%w: %d", ErrNoAPIServer, i)
	}
	if c.apiservers[i].proc != nil {
		c.mu.Unlock()
		return nil
	}
	_, err := c.startAPIServerLocked(c.apiservers[i].port)
	c.mu.Unlock()
	if err != nil {
		return err
	}
	return c.waitReady(context.Background(), i)
}

// LogTail returns the last n lines of API server i's log (i >= 0) or of
// etcd's log (i == -1).
func (c *Cluster) LogTail(i, n int) string {
	if i == -1 {
		return tailFile(filepath.Join(c.dir, "etcd.log"), n)
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	if i < 0 || i >= len(c.apiservers) {
		return fmt.Sprintf("(no API server %d)", i)
	}
	return tailFile(c.apiservers[i].logs, n)
}

// Compact compacts etcd's history up to its current revision and returns that
// revision. It talks to etcd's JSON gateway, with no etcd client library.
//
// Afterwards etcd refuses reads and watches at older revisions, which the API
// server reports as 410 Gone -- but only for requests that reach etcd. With
// the watch cache on (the default) the API server keeps serving a watch or an
// exact list from a compacted resourceVersion out of memory (observed with
// v1.37.2); to make such a watch fail with 410, use a cluster started with
// Options.DisableWatchCache, or restart the API server after Compact (its new
// cache starts at the current revision).
func (c *Cluster) Compact(ctx context.Context) (int64, error) {
	var rng struct {
		Header struct {
			Revision json.Number `json:"revision"`
		} `json:"header"`
	}
	// Any key will do: the header carries the store's current revision.
	if err := c.etcdPost(ctx, "/v3/kv/range", map[string]any{"key": "Lw==", "limit": 1, "keys_only": true}, &rng); err != nil {
		return 0, err
	}
	rev, err := strconv.ParseInt(rng.Header.Revision.String(), 10, 64)
	if err != nil {
		return 0, fmt.Errorf("testcluster: etcd range: bad revision %q: %w", rng.Header.Revision, err)
	}
	if err := c.etcdPost(ctx, "/v3/kv/compaction", map[string]any{"revision": rev, "physical": true}, nil); err != nil {
		return 0, err
	}
	return rev, nil
}

func (c *Cluster) etcdPost(ctx context.Context, path string, in, out any) error {
	body, err := json.Marshal(in)
	if err != nil {
		return err
	}
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, c.etcdURL+path, bytes.NewReader(body))
	if err != nil {
		return err
	}
	req.Header.Set("Content-Type", "application/json")
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return fmt.Errorf("testcluster: etcd %s: %w", path, err)
	}
	defer resp.Body.Close()
	data, err := io.ReadAll(io.LimitReader(resp.Body, 1<<20))
	if err != nil {
		return fmt.Errorf("testcluster: etcd %s: %w", path, err)
	}
	if resp.StatusCode != http.StatusOK {
		return fmt.Errorf("testcluster: etcd %s: HTTP %d: %s", path, resp.StatusCode, data)
	}
	if out != nil {
		if err := json.Unmarshal(data, out); err != nil {
			return fmt.Errorf("testcluster: etcd %s: decode %s: %w", path, data, err)
		}
	}
	return nil
}
