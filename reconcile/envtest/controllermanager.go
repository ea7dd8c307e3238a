package envtest

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
// of Options.ControllerManager runs: those a control plane without nodes or a cloud
// provider can use.
var controllerManagerControllers = []string{
	"garbage-collector-controller",
	"namespace-controller",
	"serviceaccount-controller",
	"serviceaccount-token-controller",
}

// startControllerManager starts the kube-controller-manager, serving HTTPS on
// port, and returns once it is healthy and its garbage collector works.
func (e *Environment) startControllerManager(ctx context.Context, port int) error {
	kubeconfigPath := filepath.Join(e.dir, "controller-manager.kubeconfig")
	if err := os.WriteFile(kubeconfigPath, kubeconfig(hostURL(e.mustPort(0)), e.pki.caPEM, ControllerManagerUser, e.pki.kcmToken), 0o600); err != nil {
		return fmt.Errorf("envtest: write controller-manager kubeconfig: %w", err)
	}
	e.mu.Lock()
	if e.stopped {
		e.mu.Unlock()
		return ErrStopped
	}
	p, err := startProcess("kube-controller-manager", e.bins.ControllerManager,
		filepath.Join(e.dir, "kube-controller-manager.log"), e.controllerManagerArgs(port, kubeconfigPath))
	if err != nil {
		e.mu.Unlock()
		return fmt.Errorf("envtest: %w", err)
	}
	e.kcm = p
	e.mu.Unlock()
	// /healthz is served to anyone (--authorization-always-allow-paths).
	if err := e.waitHealthy(ctx, p, "kube-controller-manager", hostURL(port)+"/healthz", ""); err != nil {
		return err
	}
	return e.waitGarbageCollector(ctx, p)
}

func (e *Environment) controllerManagerArgs(port int, kubeconfigPath string) []string {
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
		"--service-account-private-key-file=" + e.pki.saKeyFile,
		"--root-ca-file=" + e.pki.caFile,
		"--bind-address=127.0.0.1",
		"--secure-port=" + strconv.Itoa(port),
		// The environment's serving certificate is valid for 127.0.0.1, so
		// clients verify the controller-manager with the environment's CA.
		"--tls-cert-file=" + e.pki.certFile,
		"--tls-private-key-file=" + e.pki.keyFile,
		"--profiling=false",
	}
}

// waitGarbageCollector deletes a probe ConfigMap in kube-system with
// propagationPolicy Foreground and waits until it is gone: only the garbage
// collector removes the foregroundDeletion finalizer that such a delete sets,
// once it watches ConfigMaps.
func (e *Environment) waitGarbageCollector(ctx context.Context, kcm *process) error {
	ctx, cancel := context.WithTimeout(ctx, e.opts.ReadyTimeout)
	defer cancel()
	client, err := dynamic.NewForConfig(e.Config())
	if err != nil {
		return fmt.Errorf("envtest: client: %w", err)
	}
	configMaps := client.Resource(configMapGVR).Namespace(metav1.NamespaceSystem)
	const name = "opkit-garbage-collector-probe"
	probe := &unstructured.Unstructured{Object: map[string]any{
		"apiVersion": "v1",
		"kind":       "ConfigMap",
		"metadata":   map[string]any{"name": name},
	}}
	if _, err := configMaps.Create(ctx, probe, metav1.CreateOptions{}); err != nil {
		return fmt.Errorf("envtest: create garbage collector probe: %w", err)
	}
	foreground := metav1.DeletePropagationForeground
	if err := configMaps.Delete(ctx, name, metav1.DeleteOptions{PropagationPolicy: &foreground}); err != nil && !apierrors.IsNotFound(err) {
		return fmt.Errorf("envtest: delete garbage collector probe: %w", err)
	}
	return e.waitFor(ctx, kcm, "kube-controller-manager's garbage collector", func(ctx context.Context) (bool, string) {
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

// HasControllerManager reports whether the environment runs a
// kube-controller-manager (Options.ControllerManager): only then are the
// dependents of deleted owners garbage-collected, do deleted namespaces go
// away and does every namespace get a default ServiceAccount.
func (e *Environment) HasControllerManager() bool { return e.opts.ControllerManager }

// ControllerManagerLogTail returns the last n lines of the
// kube-controller-manager's log, or a note that the environment has none.
func (e *Environment) ControllerManagerLogTail(n int) string {
	e.mu.Lock()
	defer e.mu.Unlock()
	if e.kcm == nil {
		return "(no kube-controller-manager)"
	}
	return e.kcm.tail(n)
}

var configMapGVR = schema.GroupVersionResource{Version: "v1", Resource: "configmaps"}
