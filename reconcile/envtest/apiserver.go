package envtest

// The kube-apiservers: their flags and slots, and starting and stopping them.

import (
	"context"
	"fmt"
	"path/filepath"
	"strconv"
	"syscall"
	"time"
)

// apiServer is one kube-apiserver slot: its port is kept across restarts.
type apiServer struct {
	port int
	proc *process // nil while stopped
	logs string
}

// apiServerArgs returns the flags of an API server serving on port:
// the defaults, then Options.APIServerFlags.
func (e *Environment) apiServerArgs(port int) []string {
	args := []string{
		"--etcd-servers=" + e.etcdURL,
		"--bind-address=127.0.0.1",
		"--advertise-address=127.0.0.1",
		"--secure-port=" + strconv.Itoa(port),
		"--cert-dir=" + filepath.Join(e.dir, "apiserver-certs"),
		"--tls-cert-file=" + e.pki.certFile,
		"--tls-private-key-file=" + e.pki.keyFile,
		"--client-ca-file=" + e.pki.caFile,
		"--token-auth-file=" + e.pki.tokenFile,
		"--authorization-mode=RBAC",
		"--service-account-issuer=" + Issuer,
		"--service-account-key-file=" + e.pki.saPubFile,
		"--service-account-signing-key-file=" + e.pki.saKeyFile,
		"--api-audiences=" + Issuer,
		"--service-cluster-ip-range=10.0.0.0/24",
		// The endpoint reconcilers refuse loopback addresses, and nothing
		// here routes to the kubernetes Service anyway.
		"--endpoint-reconciler-type=none",
		// ServiceAccount admission waits for default service accounts,
		// which only the controller-manager creates.
		"--disable-admission-plugins=ServiceAccount",
		"--profiling=false",
		"--watch-cache=" + strconv.FormatBool(!e.opts.DisableWatchCache),
	}
	if e.ShardedListAndWatch() {
		// Alpha since v1.36; the binary's own version is emulated, so
		// enabling it takes nothing else.
		args = append(args, "--feature-gates=ShardedListAndWatch=true")
	}
	return append(args, e.opts.APIServerFlags...)
}

// addAPIServerLocked adds a slot for an API server on port, starts it and
// returns its index. It does not wait for readiness.
func (e *Environment) addAPIServerLocked(port int) (int, error) {
	i := len(e.apiservers)
	e.apiservers = append(e.apiservers, &apiServer{
		port: port,
		logs: filepath.Join(e.dir, fmt.Sprintf("kube-apiserver-%d.log", i)),
	})
	return i, e.startAPIServerLocked(i)
}

// startAPIServerLocked starts API server i on its port. It does not wait
// for readiness.
func (e *Environment) startAPIServerLocked(i int) error {
	s := e.apiservers[i]
	p, err := startProcess(fmt.Sprintf("kube-apiserver %d", i), e.bins.APIServer, s.logs, e.apiServerArgs(s.port))
	if err != nil {
		return fmt.Errorf("envtest: %w", err)
	}
	s.proc = p
	return nil
}

// waitReady polls API server i's /readyz until it answers ok, the process
// exits, ctx ends or ReadyTimeout passes.
func (e *Environment) waitReady(ctx context.Context, i int) error {
	e.mu.Lock()
	s := e.apiservers[i]
	proc := s.proc
	e.mu.Unlock()
	if proc == nil {
		return fmt.Errorf("envtest: API server %d is stopped", i)
	}
	return e.waitHealthy(ctx, proc, fmt.Sprintf("API server %d", i), hostURL(s.port)+"/readyz", e.pki.adminToken)
}

// running returns the indexes of the running API servers.
func (e *Environment) running() []int {
	e.mu.Lock()
	defer e.mu.Unlock()
	var idx []int
	for i, s := range e.apiservers {
		if s.proc != nil {
			idx = append(idx, i)
		}
	}
	return idx
}

// firstRunning returns the index of the first running API server, or 0.
func (e *Environment) firstRunning() int {
	if running := e.running(); len(running) > 0 {
		return running[0]
	}
	return 0
}

// APIServerPID returns the process ID of API server i, or 0 while it is
// stopped: for benchmarks that report its CPU time.
func (e *Environment) APIServerPID(i int) int {
	e.mu.Lock()
	defer e.mu.Unlock()
	if i < 0 || i >= len(e.apiservers) || e.apiservers[i].proc == nil {
		return 0
	}
	return e.apiservers[i].proc.cmd.Process.Pid
}

// APIServers returns the number of API server slots (running or stopped).
func (e *Environment) APIServers() int {
	e.mu.Lock()
	defer e.mu.Unlock()
	return len(e.apiservers)
}

// AddAPIServer starts another kube-apiserver on the same etcd, on a free
// port, and returns its index once it is ready. On error the slot may exist
// with a stopped API server.
func (e *Environment) AddAPIServer() (int, error) {
	ports, err := freePorts(1)
	if err != nil {
		return -1, err
	}
	e.mu.Lock()
	if e.stopped {
		e.mu.Unlock()
		return -1, ErrStopped
	}
	i, err := e.addAPIServerLocked(ports[0])
	e.mu.Unlock()
	if err != nil {
		return i, err
	}
	if err := e.waitReady(context.Background(), i); err != nil {
		e.killAPIServer(i, syscall.SIGKILL, 0)
		return i, err
	}
	return i, nil
}

// StopAPIServer stops API server i gracefully (SIGTERM, then SIGKILL after
// 15s) and returns once it has exited. Its port, certificates and keys are
// kept for StartAPIServer. Stopping a stopped API server does nothing.
func (e *Environment) StopAPIServer(i int) error {
	return e.killAPIServer(i, syscall.SIGTERM, 15*time.Second)
}

// KillAPIServer kills API server i with SIGKILL, like a crash.
func (e *Environment) KillAPIServer(i int) error { return e.killAPIServer(i, syscall.SIGKILL, 0) }

// killAPIServer stops API server i as process.stop does with sig and grace,
// and returns once it has exited; a stopped one is left alone.
func (e *Environment) killAPIServer(i int, sig syscall.Signal, grace time.Duration) error {
	s, err := e.lockAPIServer(i)
	if err != nil {
		return err
	}
	p := s.proc
	s.proc = nil
	e.mu.Unlock()
	if p != nil {
		p.stop(sig, grace)
	}
	return nil
}

// lockAPIServer takes mu and returns API server i, holding mu, or, without
// it, ErrStopped or ErrNoAPIServer.
func (e *Environment) lockAPIServer(i int) (*apiServer, error) {
	e.mu.Lock()
	switch {
	case e.stopped:
		e.mu.Unlock()
		return nil, ErrStopped
	case i < 0 || i >= len(e.apiservers):
		e.mu.Unlock()
		return nil, fmt.Errorf("%w: %d", ErrNoAPIServer, i)
	}
	return e.apiservers[i], nil
}

// StartAPIServer starts the stopped API server i again on its port, with the
// same certificates and keys, and returns once it is ready. Starting a
// running API server does nothing.
func (e *Environment) StartAPIServer(i int) error {
	s, err := e.lockAPIServer(i)
	if err != nil {
		return err
	}
	if s.proc != nil {
		e.mu.Unlock()
		return nil
	}
	err = e.startAPIServerLocked(i)
	e.mu.Unlock()
	if err != nil {
		return err
	}
	return e.waitReady(context.Background(), i)
}
