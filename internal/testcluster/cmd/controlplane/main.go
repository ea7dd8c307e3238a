// Command controlplane starts a local etcd + kube-apiserver (package
// testcluster), and a kube-controller-manager if asked, for exploring by
// hand, prints how to reach it and stops it cleanly on Ctrl-C (SIGINT) or
// SIGTERM.
//
//	go run ./internal/testcluster/cmd/controlplane            # run until Ctrl-C
//	go run ./internal/testcluster/cmd/controlplane -smoke     # show it working, then stop
//	go run ./internal/testcluster/cmd/controlplane -apiservers 2
//	go run ./internal/testcluster/cmd/controlplane -controller-manager  # with garbage collection
//
// The binaries come from hack/controlplane.sh build (make controlplane runs it).
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"log/slog"
	"os"
	"os/signal"
	"syscall"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/client-go/dynamic"

	"github.com/opkit/opkit/internal/testcluster"
)

func main() {
	smoke := flag.Bool("smoke", false, "create a CRD and an object, print them, then stop")
	apiservers := flag.Int("apiservers", 1, "number of kube-apiservers on the one etcd")
	kcm := flag.Bool("controller-manager", false,
		"also run a kube-controller-manager (garbage collector, namespace and service-account controllers) against kube-apiserver 0")
	flag.Parse()
	if err := run(*smoke, *apiservers, *kcm); err != nil {
		fmt.Fprintln(os.Stderr, "controlplane:", err)
		os.Exit(1)
	}
}

func run(smoke bool, apiservers int, kcm bool) error {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	logger := slog.New(slog.NewTextHandler(os.Stderr, nil))
	what := fmt.Sprintf("etcd + %d kube-apiserver(s)", apiservers)
	if kcm {
		what += " + kube-controller-manager"
	}
	fmt.Fprintf(os.Stderr, "starting %s from %s ...\n", what, testcluster.DefaultBinDir())
	c, err := testcluster.New(ctx, testcluster.Options{APIServers: apiservers, ControllerManager: kcm, Logger: logger})
	if err != nil {
		return err
	}
	defer func() {
		fmt.Fprintln(os.Stderr, "stopping the control plane")
		if err := c.Stop(); err != nil {
			fmt.Fprintln(os.Stderr, "controlplane:", err)
		}
	}()

	fmt.Printf("control plane ready in %v\n", c.StartupDuration().Round(time.Millisecond))
	for i := range c.APIServers() {
		fmt.Printf("  kube-apiserver %d: %s\n", i, c.ConfigFor(i).Host)
	}
	fmt.Printf("  etcd:             %s\n", c.EtcdURL())
	if c.HasControllerManager() {
		fmt.Printf("  kube-controller-manager: on kube-apiserver 0 (garbage collector, namespace and service-account controllers)\n")
	}
	fmt.Printf("  logs and data:    %s (removed on exit)\n", c.Dir())
	fmt.Printf("admin kubeconfig: %s\n\n", c.Kubeconfig())
	fmt.Printf("  export KUBECONFIG=%s\n  kubectl get namespaces\n\n", c.Kubeconfig())

	if smoke {
		return showItWorks(ctx, c)
	}
	fmt.Println("press Ctrl-C to stop")
	<-ctx.Done()
	return nil
}

// showItWorks creates a CRD and an object of it, reads them back and prints
// what it did.
func showItWorks(ctx context.Context, c *testcluster.Cluster) error {
	ctx, cancel := context.WithTimeout(ctx, 2*time.Minute)
	defer cancel()
	d, err := dynamic.NewForConfig(c.Config())
	if err != nil {
		return err
	}
	crdGVR := schema.GroupVersionResource{Group: "apiextensions.k8s.io", Version: "v1", Resource: "customresourcedefinitions"}
	crd := &unstructured.Unstructured{Object: map[string]any{
		"apiVersion": "apiextensions.k8s.io/v1",
		"kind":       "CustomResourceDefinition",
		"metadata":   map[string]any{"name": "greetings.demo.opkit.dev"},
		"spec": map[string]any{
			"group": "demo.opkit.dev",
			"scope": "Namespaced",
			"names": map[string]any{"plural": "greetings", "singular": "greeting", "kind": "Greeting"},
			"versions": []any{map[string]any{
				"name": "v1", "served": true, "storage": true,
				"schema": map[string]any{"openAPIV3Schema": map[string]any{
					"type":                                 "object",
					"x-kubernetes-preserve-unknown-fields": true,
				}},
			}},
		},
	}}
	if _, err := d.Resource(crdGVR).Create(ctx, crd, metav1.CreateOptions{}); err != nil {
		return fmt.Errorf("create CRD: %w", err)
	}
	fmt.Println("created CustomResourceDefinition greetings.demo.opkit.dev")
	for {
		got, err := d.Resource(crdGVR).Get(ctx, "greetings.demo.opkit.dev", metav1.GetOptions{})
		if err != nil {
			return fmt.Errorf("get CRD: %w", err)
		}
		if established(got) {
			break
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("CRD not established: %w", ctx.Err())
		case <-time.After(100 * time.Millisecond):
		}
	}
	fmt.Println("CRD is Established")

	greetings := d.Resource(schema.GroupVersionResource{Group: "demo.opkit.dev", Version: "v1", Resource: "greetings"}).Namespace("default")
	obj := &unstructured.Unstructured{Object: map[string]any{
		"apiVersion": "demo.opkit.dev/v1",
		"kind":       "Greeting",
		"metadata":   map[string]any{"name": "hello"},
		"spec":       map[string]any{"message": "hello from a real kube-apiserver"},
	}}
	var created *unstructured.Unstructured
	for {
		// Established means served, but the first write can still race the
		// handler's installation.
		created, err = greetings.Create(ctx, obj, metav1.CreateOptions{})
		if err == nil {
			break
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("create Greeting: %w", errors.Join(err, ctx.Err()))
		case <-time.After(100 * time.Millisecond):
		}
	}
	fmt.Printf("created Greeting default/hello (uid %s, resourceVersion %s)\n", created.GetUID(), created.GetResourceVersion())
	list, err := greetings.List(ctx, metav1.ListOptions{})
	if err != nil {
		return fmt.Errorf("list Greetings: %w", err)
	}
	for _, g := range list.Items {
		msg, _, _ := unstructured.NestedString(g.Object, "spec", "message")
		fmt.Printf("listed Greeting %s/%s: spec.message=%q\n", g.GetNamespace(), g.GetName(), msg)
	}
	return nil
}

func established(crd *unstructured.Unstructured) bool {
	conds, _, _ := unstructured.NestedSlice(crd.Object, "status", "conditions")
	for _, c := range conds {
		if m, ok := c.(map[string]any); ok && m["type"] == "Established" && m["status"] == "True" {
			return true
		}
	}
	return false
}
