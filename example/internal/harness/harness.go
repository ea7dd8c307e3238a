// Package harness runs the demo operator for real on a local control plane:
// it installs the manifests, mints ServiceAccount tokens, builds the
// operator binary and runs replicas and a NATS server as child processes.
// The demo program (hack/demo) and the end-to-end test share it.
//
// Every process it starts is tied to the calling process (SIGKILL when the
// parent dies) and is stopped by Process.Stop or Process.Kill; nothing is
// left behind. A Process owns one goroutine that waits for the child.
package harness

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"syscall"
	"time"

	authnv1 "k8s.io/api/authentication/v1"
	coordv1 "k8s.io/api/coordination/v1"
	corev1 "k8s.io/api/core/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/client-go/dynamic"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/clientcmd"
	clientcmdapi "k8s.io/client-go/tools/clientcmd/api"

	"github.com/opkit/opkit/example/config"
	"github.com/opkit/opkit/example/operator"
)

// kinds maps the kinds in config/ to their resources.
var kinds = map[string]schema.GroupVersionResource{
	"Namespace":                {Version: "v1", Resource: "namespaces"},
	"ServiceAccount":           {Version: "v1", Resource: "serviceaccounts"},
	"Service":                  {Version: "v1", Resource: "services"},
	"CustomResourceDefinition": {Group: "apiextensions.k8s.io", Version: "v1", Resource: "customresourcedefinitions"},
	"ClusterRole":              {Group: "rbac.authorization.k8s.io", Version: "v1", Resource: "clusterroles"},
	"ClusterRoleBinding":       {Group: "rbac.authorization.k8s.io", Version: "v1", Resource: "clusterrolebindings"},
	"Role":                     {Group: "rbac.authorization.k8s.io", Version: "v1", Resource: "roles"},
	"RoleBinding":              {Group: "rbac.authorization.k8s.io", Version: "v1", Resource: "rolebindings"},
	"Deployment":               {Group: "apps", Version: "v1", Resource: "deployments"},
	"NetworkPolicy":            {Group: "networking.k8s.io", Version: "v1", Resource: "networkpolicies"},
	"PodDisruptionBudget":      {Group: "policy", Version: "v1", Resource: "poddisruptionbudgets"},
}

// Install applies every manifest of config/ (server-side apply, so it is
// idempotent) and waits until the CRD is established. It returns one line
// per object, for display.
func Install(ctx context.Context, dyn dynamic.Interface) ([]string, error) {
	objs, err := config.Objects()
	if err != nil {
		return nil, err
	}
	var lines []string
	for _, u := range objs {
		gvr, ok := kinds[u.GetKind()]
		if !ok {
			return lines, fmt.Errorf("install: no resource known for kind %s", u.GetKind())
		}
		var ri dynamic.ResourceInterface = dyn.Resource(gvr)
		if ns := u.GetNamespace(); ns != "" {
			ri = dyn.Resource(gvr).Namespace(ns)
		}
		if _, err := ri.Apply(ctx, u.GetName(), u, metav1.ApplyOptions{FieldManager: "opkit-demo", Force: true}); err != nil {
			return lines, fmt.Errorf("install %s %s: %w", u.GetKind(), u.GetName(), err)
		}
		lines = append(lines, fmt.Sprintf("%s/%s", strings.ToLower(u.GetKind()), u.GetName()))
	}
	crds := dyn.Resource(kinds["CustomResourceDefinition"])
	err = Poll(ctx, 30*time.Second, func() (bool, error) {
		u, err := crds.Get(ctx, "demoentities.demo.opkit.dev", metav1.GetOptions{})
		if err != nil {
			return false, err
		}
		conds, _, _ := unstructured.NestedSlice(u.Object, "status", "conditions")
		for _, c := range conds {
			m, _ := c.(map[string]any)
			if m["type"] == "Established" && m["status"] == "True" {
				return true, nil
			}
		}
		return false, nil
	})
	return lines, err
}

// Fatal wraps an error that makes Poll give up at once.
func Fatal(err error) error { return fatalError{err} }

type fatalError struct{ error }

func (e fatalError) Unwrap() error { return e.error }

// Poll calls cond every 100ms until it returns true, a Fatal error, or
// timeout; other errors are retried (the last one is reported on timeout).
func Poll(ctx context.Context, timeout time.Duration, cond func() (bool, error)) error {
	ctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	var last error
	for {
		ok, err := cond()
		if ok && err == nil {
			return nil
		}
		var fe fatalError
		if errors.As(err, &fe) {
			return fe.error
		}
		if err != nil {
			last = err
		}
		select {
		case <-ctx.Done():
			if last != nil {
				return fmt.Errorf("%w (last error: %v)", ctx.Err(), last)
			}
			return ctx.Err()
		case <-time.After(100 * time.Millisecond):
		}
	}
}

// WriteKubeconfig writes a kubeconfig for cfg's server and CA that
// authenticates with token.
func WriteKubeconfig(path string, cfg *rest.Config, token string) error {
	kc := clientcmdapi.NewConfig()
	kc.Clusters["local"] = &clientcmdapi.Cluster{Server: cfg.Host, CertificateAuthorityData: cfg.CAData, CertificateAuthority: cfg.CAFile}
	kc.AuthInfos["operator"] = &clientcmdapi.AuthInfo{Token: token}
	kc.Contexts["operator"] = &clientcmdapi.Context{Cluster: "local", AuthInfo: "operator"}
	kc.CurrentContext = "operator"
	return clientcmd.WriteToFile(*kc, path)
}

// GrantTrigger creates ServiceAccount ns/name and binds the trigger
// ClusterRole to it in ns, so its tokens may trigger reconciles there.
func GrantTrigger(ctx context.Context, kube kubernetes.Interface, ns, name string) error {
	_, err := kube.CoreV1().ServiceAccounts(ns).Create(ctx, &corev1.ServiceAccount{ObjectMeta: metav1.ObjectMeta{Name: name}}, metav1.CreateOptions{})
	if err != nil && !apierrors.IsAlreadyExists(err) {
		return err
	}
	_, err = kube.RbacV1().RoleBindings(ns).Create(ctx, &rbacv1.RoleBinding{
		ObjectMeta: metav1.ObjectMeta{Name: name + "-trigger"},
		RoleRef:    rbacv1.RoleRef{APIGroup: rbacv1.GroupName, Kind: "ClusterRole", Name: config.TriggerClusterRole},
		Subjects:   []rbacv1.Subject{{Kind: "ServiceAccount", Name: name, Namespace: ns}},
	}, metav1.CreateOptions{})
	if err != nil && !apierrors.IsAlreadyExists(err) {
		return err
	}
	return nil
}

// Token mints a token for ServiceAccount ns/name with the given audience.
func Token(ctx context.Context, kube kubernetes.Interface, ns, name, audience string) (string, error) {
	exp := int64(3600)
	tr := &authnv1.TokenRequest{Spec: authnv1.TokenRequestSpec{ExpirationSeconds: &exp}}
	if audience != "" {
		tr.Spec.Audiences = []string{audience}
	}
	out, err := kube.CoreV1().ServiceAccounts(ns).CreateToken(ctx, name, tr, metav1.CreateOptions{})
	if err != nil {
		return "", fmt.Errorf("token for %s/%s: %w", ns, name, err)
	}
	return out.Status.Token, nil
}

// LeaseHolder returns the current holder of the operator's Lease ("" if none).
func LeaseHolder(ctx context.Context, kube kubernetes.Interface) (string, error) {
	return leaseHolder(ctx, kube, operator.DefaultLeaderElectionID)
}

func leaseHolder(ctx context.Context, kube kubernetes.Interface, name string) (string, error) {
	l, err := kube.CoordinationV1().Leases(config.Namespace).Get(ctx, name, metav1.GetOptions{})
	if apierrors.IsNotFound(err) {
		return "", nil
	}
	if err != nil {
		return "", err
	}
	return holder(l), nil
}

// ShardHolders returns the holder of each of the shard Leases of an
// operator run with --shards=shards ("" for none).
func ShardHolders(ctx context.Context, kube kubernetes.Interface, shards int) ([]string, error) {
	out := make([]string, shards)
	for i := range out {
		var err error
		if out[i], err = leaseHolder(ctx, kube, fmt.Sprintf("%s-%d", operator.DefaultLeaderElectionID, i)); err != nil {
			return nil, err
		}
	}
	return out, nil
}

// WaitShared waits until every one of the shards is held by one of live,
// none holding more than its share (⌈shards/len(live)⌉), and returns the
// holders.
func WaitShared(ctx context.Context, kube kubernetes.Interface, shards int, live []string, timeout time.Duration) ([]string, error) {
	share := (shards + len(live) - 1) / len(live)
	var holders []string
	err := Poll(ctx, timeout, func() (bool, error) {
		var err error
		if holders, err = ShardHolders(ctx, kube, shards); err != nil {
			return false, err
		}
		count := map[string]int{}
		for _, h := range holders {
			if count[h]++; !slices.Contains(live, h) || count[h] > share {
				return false, nil
			}
		}
		return true, nil
	})
	if err != nil {
		return nil, fmt.Errorf("the shards were not shared by %v: %w (holders %q)", live, err, holders)
	}
	return holders, nil
}

func holder(l *coordv1.Lease) string {
	if l.Spec.HolderIdentity == nil {
		return ""
	}
	return *l.Spec.HolderIdentity
}

// FreePort returns a loopback port that was free a moment ago.
func FreePort() (int, error) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return 0, err
	}
	defer ln.Close()
	return ln.Addr().(*net.TCPAddr).Port, nil
}

// Build compiles the demo-operator binary into dir and returns its path.
// moduleDir is the example module's directory.
func Build(ctx context.Context, moduleDir, dir string) (string, error) {
	out := filepath.Join(dir, "demo-operator")
	// -buildvcs=false: a checkout owned by another user (a CI container)
	// would make git refuse the version stamp, failing the build.
	cmd := exec.CommandContext(ctx, "go", "build", "-buildvcs=false", "-o", out, "./cmd/demo-operator")
	cmd.Dir = moduleDir
	if b, err := cmd.CombinedOutput(); err != nil {
		return "", fmt.Errorf("go build ./cmd/demo-operator: %w\n%s", err, b)
	}
	return out, nil
}

// Process is a child process with its output in a log file.
type Process struct {
	Name string
	Log  string // path of the output file

	cmd  *exec.Cmd
	done chan struct{}
	mu   sync.Mutex
	err  error
}

// Start runs bin with args; stdout and stderr go to logPath. The child is
// killed if this process dies.
func Start(name, bin string, args []string, logPath string) (*Process, error) {
	f, err := os.Create(logPath)
	if err != nil {
		return nil, err
	}
	cmd := exec.Command(bin, args...)
	cmd.Stdout, cmd.Stderr = f, f
	cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL, Setpgid: true}
	if err := cmd.Start(); err != nil {
		f.Close()
		return nil, fmt.Errorf("start %s: %w", name, err)
	}
	p := &Process{Name: name, Log: logPath, cmd: cmd, done: make(chan struct{})}
	go func() {
		err := cmd.Wait()
		f.Close()
		p.mu.Lock()
		p.err = err
		p.mu.Unlock()
		close(p.done)
	}()
	return p, nil
}

// Pid returns the process id.
func (p *Process) Pid() int { return p.cmd.Process.Pid }

// Exited reports whether the process has exited.
func (p *Process) Exited() bool {
	select {
	case <-p.done:
		return true
	default:
		return false
	}
}

// Kill sends SIGKILL (a crash) and waits for the process to be gone.
func (p *Process) Kill() {
	if !p.Exited() {
		_ = syscall.Kill(-p.cmd.Process.Pid, syscall.SIGKILL)
	}
	<-p.done
}

// Stop sends SIGTERM, waits up to grace for a clean exit, then kills.
// It returns the exit error of a process that did not exit cleanly.
func (p *Process) Stop(grace time.Duration) error {
	if p.Exited() {
		return nil
	}
	_ = p.cmd.Process.Signal(syscall.SIGTERM)
	select {
	case <-p.done:
	case <-time.After(grace):
		p.Kill()
		return fmt.Errorf("%s did not stop within %v; killed", p.Name, grace)
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.err
}

// Tail returns the last n lines of the process's output.
func (p *Process) Tail(n int) string {
	f, err := os.Open(p.Log)
	if err != nil {
		return ""
	}
	defer f.Close()
	var lines []string
	sc := bufio.NewScanner(f)
	sc.Buffer(make([]byte, 64<<10), 1<<20)
	for sc.Scan() {
		lines = append(lines, sc.Text())
		if len(lines) > n {
			lines = lines[1:]
		}
	}
	return strings.Join(lines, "\n")
}

// StartNATS runs the nats-server binary with JetStream on a free port.
func StartNATS(bin, dir string) (*Process, string, error) {
	port, err := FreePort()
	if err != nil {
		return nil, "", err
	}
	store := filepath.Join(dir, "nats-store")
	p, err := Start("nats-server", bin, []string{"-a", "127.0.0.1", "-p", fmt.Sprint(port), "-js", "-sd", store, "-n", "opkit-demo-nats"}, filepath.Join(dir, "nats-server.log"))
	if err != nil {
		return nil, "", err
	}
	url := fmt.Sprintf("nats://127.0.0.1:%d", port)
	err = Poll(context.Background(), 15*time.Second, func() (bool, error) {
		if p.Exited() {
			return false, Fatal(errors.New("nats-server exited: " + p.Tail(5)))
		}
		c, err := net.DialTimeout("tcp", fmt.Sprintf("127.0.0.1:%d", port), time.Second)
		if err != nil {
			return false, nil
		}
		c.Close()
		return true, nil
	})
	if err != nil {
		p.Kill()
		return nil, "", err
	}
	return p, url, nil
}

// Replica is one running operator process.
type Replica struct {
	*Process
	Identity                          string
	TriggerURL, HealthURL, MetricsURL string
}

// ReplicaConfig says how to start a replica.
type ReplicaConfig struct {
	Bin, Kubeconfig, NATSURL, Dir string
	Identity                      string
	// Extra flags, e.g. --concurrency=8.
	Args []string
}

// StartReplica runs one operator replica on free ports and waits for its
// health endpoint to answer.
func StartReplica(rc ReplicaConfig) (*Replica, error) {
	var ports [3]int
	for i := range ports {
		p, err := FreePort()
		if err != nil {
			return nil, err
		}
		ports[i] = p
	}
	addr := func(p int) string { return fmt.Sprintf("127.0.0.1:%d", p) }
	args := append([]string{
		"--kubeconfig=" + rc.Kubeconfig,
		"--identity=" + rc.Identity,
		"--leader-election-namespace=" + config.Namespace,
		"--trigger-bind-address=" + addr(ports[0]),
		"--metrics-bind-address=" + addr(ports[1]),
		"--health-probe-bind-address=" + addr(ports[2]),
		"--nats-url=" + rc.NATSURL,
	}, rc.Args...)
	p, err := Start(rc.Identity, rc.Bin, args, filepath.Join(rc.Dir, rc.Identity+".log"))
	if err != nil {
		return nil, err
	}
	r := &Replica{Process: p, Identity: rc.Identity,
		TriggerURL: "http://" + addr(ports[0]), MetricsURL: "http://" + addr(ports[1]) + "/metrics", HealthURL: "http://" + addr(ports[2])}
	err = Poll(context.Background(), 30*time.Second, func() (bool, error) {
		if p.Exited() {
			return false, Fatal(fmt.Errorf("%s exited:\n%s", rc.Identity, p.Tail(20)))
		}
		resp, err := http.Get(r.HealthURL + "/healthz")
		if err != nil {
			return false, nil
		}
		resp.Body.Close()
		return resp.StatusCode == http.StatusOK, nil
	})
	if err != nil {
		p.Kill()
		return nil, err
	}
	return r, nil
}
