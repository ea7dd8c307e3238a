package testcluster

import (
	"context"
	"fmt"
	"strings"
	"time"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/client-go/dynamic"
)

// CRD describes a test custom resource for [Cluster.InstallCRD]. Its spec
// and status are free-form (x-kubernetes-preserve-unknown-fields) and
// status is a subresource, so metadata.generation follows spec changes only,
// as with a real operator's CRD.
type CRD struct {
	// Resource is group, version and plural, e.g. widgets.test.opkit.dev/v1.
	Resource schema.GroupVersionResource
	// Kind is the object kind, e.g. "Widget"; its list kind is Kind+"List".
	Kind string
	// Namespaced selects the scope; false means cluster-scoped.
	Namespaced bool
}

var crdResource = schema.GroupVersionResource{Group: "apiextensions.k8s.io", Version: "v1", Resource: "customresourcedefinitions"}

// InstallCRD creates the CustomResourceDefinition for crd through API
// server 0 (one that already exists is fine) and waits until its resource is
// served by each of the given API servers (default: server 0 only; each
// kube-apiserver starts serving a new CRD on its own), polling until ctx
// ends or, without a deadline on ctx, for at most a minute.
func (c *Cluster) InstallCRD(ctx context.Context, crd CRD, servers ...int) error {
	if len(servers) == 0 {
		servers = []int{0}
	}
	if _, ok := ctx.Deadline(); !ok {
		var cancel context.CancelFunc
		ctx, cancel = context.WithTimeout(ctx, time.Minute)
		defer cancel()
	}
	d, err := c.unthrottled(servers[0])
	if err != nil {
		return err
	}
	scope := "Cluster"
	if crd.Namespaced {
		scope = "Namespaced"
	}
	free := map[string]any{"type": "object", "x-kubernetes-preserve-unknown-fields": true}
	obj := &unstructured.Unstructured{Object: map[string]any{
		"apiVersion": "apiextensions.k8s.io/v1",
		"kind":       "CustomResourceDefinition",
		"metadata":   map[string]any{"name": crd.Resource.Resource + "." + crd.Resource.Group},
		"spec": map[string]any{
			"group": crd.Resource.Group,
			"scope": scope,
			"names": map[string]any{
				"plural": crd.Resource.Resource, "singular": strings.ToLower(crd.Kind),
				"kind": crd.Kind, "listKind": crd.Kind + "List",
			},
			"versions": []any{map[string]any{
				"name": crd.Resource.Version, "served": true, "storage": true,
				"subresources": map[string]any{"status": map[string]any{}},
				"schema": map[string]any{"openAPIV3Schema": map[string]any{
					"type":       "object",
					"properties": map[string]any{"spec": free, "status": free},
				}},
			}},
		},
	}}
	if _, err := d.Resource(crdResource).Create(ctx, obj, metav1.CreateOptions{}); err != nil && !apierrors.IsAlreadyExists(err) {
		return fmt.Errorf("testcluster: create CRD %s: %w", obj.GetName(), err)
	}
	// Established is not enough: the first list may still race the handler.
	tick := time.NewTicker(100 * time.Millisecond)
	defer tick.Stop()
	for _, i := range servers {
		si, err := c.unthrottled(i)
		if err != nil {
			return err
		}
		for {
			_, err := si.Resource(crd.Resource).List(ctx, metav1.ListOptions{Limit: 1})
			if err == nil {
				break
			}
			select {
			case <-ctx.Done():
				return fmt.Errorf("testcluster: %s not served by API server %d: %w (last error: %v)", crd.Resource.String(), i, ctx.Err(), err)
			case <-tick.C:
			}
		}
	}
	return nil
}

// unthrottled returns an admin dynamic client for API server i without
// client-side rate limiting.
func (c *Cluster) unthrottled(i int) (*dynamic.DynamicClient, error) {
	cfg := c.ConfigFor(i)
	cfg.QPS, cfg.Burst = -1, 0
	return dynamic.NewForConfig(cfg)
}
