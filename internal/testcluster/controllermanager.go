package testcluster

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/client-go/dynamic"
)

// controllerManagerControllers are the controllers the kube-controller-manager
// of Options.ControllerManager runs: those a cluster without nodes or a cloud
// provider can use.
var controllerManagerControllers = []string{
	"garbage-collector-controller",
	"namespace-controller",
	"serviceaccount-controller",
	"serviceaccount-token-controller",
}

// controllerManager is a cluster's kube-controller-manager.
type controllerManager struct {
	port int
	logs string
	proc *process // nil once stopped
}

// startControllerManager starts the kube-controller-manager, serving HTTPS on
// port, and returns once it is healthy and its garbage collector works.
func (c *Cluster) startControllerManager(ctx context.Context, port int) error {
	kubeconfigPath := filepath.Join(c.dir, "controller-manager.kubeconfig")
	if err := os.WriteFile(kubeconfigPath, kubeconfig(hostURL(c.mustPort(0)), c.pki.caPEM, ControllerManagerUser, c.pki.kcmToken), 0o600); err != nil {
		return fmt.Errorf("testcluster: write controller-manager kubeconfig: %w", err)
	}
	c.mu.Lock()
	if c.stopped {
		c.mu.Unlock()
		return ErrStopped
	}
	c.kcm = &controllerManager{port: port, logs: filepath.Join(c.dir, "kube-controller-manager.log")}
	p, err := startProcess("kube-controller-manager", filepath.Join(c.opts.BinDir, "kube-controller-manager"),
		c.kcm.logs, c.controllerManagerArgs(port, kubeconfigPath))
	if err != nil {
		c.mu.Unlock()
		return fmt.Errorf("testcluster: %w", err)
	}
	c.kcm.proc = p
	c.mu.Unlock()
	// /healthz is served to anyone (--authorization-always-allow-paths).
	if err := c.waitHealthy(ctx, p, "kube-controller-manager", hostURL(port)+"/healthz", ""); err != nil {
		return err
	}
	return c.waitGarbageCollector(ctx, p)
}

func (c *Cluster) controllerManagerArgs(port int, kubeconfigPath string) []string {
	return []string{
		"--kubeconfig=" + kubeconfigPath,
		// Requests to its own endpoints (/metrics, say) are authenticated
		// (TokenReview) and authorized (SubjectAccessReview) by the API
		// server, as in a real cluster. No client-certificate CAs to look up
		// in kube-system: the API server has no request-header CA, and the
		// lookup would log an error about it every few seconds.
		"--authentication-kubeconfig=" + kubeconfigPath,
		"--authentication-skip-lookup=true",
		"--authorization-kubeconfig=" + kubeconfigPath,
		"--controllers=" + strings.Join(controllerManagerControllers, ","),
		"--leader-elect=false",
		// Every controller acts as ControllerManagerUser: there are no
		// per-controller ServiceAccounts and RBAC grants to set up.
		"--use-service-account-credentials=false",
		"--service-account-private-key-file=" + c.pki.saKeyFile,
		"--root-ca-file=" + c.pki.caFile,
		"--bind-address=127.0.0.1",
		"--secure-port=" + strconv.Itoa(port),
		// The cluster's serving certificate is valid for 127.0.0.1, so
		// clients verify the controller-manager with the cluster's CA.
		"--tls-cert-file=" + c.pki.certFile,
		"--tls-private-key-file=" + c.pki.keyFile,
		"--profiling=false",
	}
}

// waitGarbageCollector deletes a probe ConfigMap in kube-system with
// propagationPolicy Foreground and waits until it is gone: only the garbage
// collector removes the foregroundDeletion finalizer that such a delete sets,
// once it watches ConfigMaps.
func (c *Cluster) waitGarbageCollector(ctx context.Context, kcm *process) error {
	ctx, cancel := context.WithTimeout(ctx, c.opts.ReadyTimeout)
	defer cancel()
	client, err := dynamic.NewForConfig(c.Config())
	if err != nil {
		return fmt.Errorf("testcluster: client: %w", err)
	}
	configMaps := client.Resource(configMapGVR).Namespace(metav1.NamespaceSystem)
	const name = "opkit-garbage-collector-probe"
	probe := &unstructured.Unstructured{Object: map[string]any{
		"apiVersion": "v1",
		"kind":       "ConfigMap",
		"metadata":   map[string]any{"name": name},
	}}
	if _, err := configMaps.Create(ctx, probe, metav1.CreateOptions{}); err != nil {
		return fmt.Errorf("testcluster: create garbage collector probe: %w", err)
	}
	foreground := metav1.DeletePropagationForeground
	if err := configMaps.Delete(ctx, name, metav1.DeleteOptions{PropagationPolicy: &foreground}); err != nil && !apierrors.IsNotFound(err) {
		return fmt.Errorf("testcluster: delete garbage collector probe: %w", err)
	}
	return c.waitFor(ctx, kcm, "kube-controller-manager's garbage collector", func(ctx context.Context) (bool, string) {
		got, err := configMaps.Get(ctx, name, metav1.GetOptions{})
		switch {
		case apierrors.IsNotFound(err):
			return true, ""
		case err != nil:
			return false, err.Error()
		default:
			return false, fmt.Sprintf("probe ConfigMap still there with finalizers %v", got.GetFinalizers())
		}
	})
}

// HasControllerManager reports whether the cluster runs a
// kube-controller-manager (Options.ControllerManager): only then are the
// dependents of deleted owners garbage-collected, do deleted namespaces go
// away and does every namespace get a default ServiceAccount.
func (c *Cluster) HasControllerManager() bool { return c.opts.ControllerManager }

// ControllerManagerLogTail returns the last n lines of the
// kube-controller-manager's log, or a note that the cluster has none.
func (c *Cluster) ControllerManagerLogTail(n int) string {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.kcm == nil {
		return "(no kube-controller-manager)"
	}
	return tailFile(c.kcm.logs, n)
}

var configMapGVR = schema.GroupVersionResource{Version: "v1", Resource: "configmaps"}
