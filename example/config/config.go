// Package config embeds the demo operator's Kubernetes manifests (the
// kustomize layout in this directory) and decodes them, so that tests and
// the demo harness apply exactly what `kubectl apply -k example/config`
// would. It has no goroutines and no state.
package config

import (
	"embed"
	"fmt"
	"path"
	"slices"

	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"sigs.k8s.io/yaml"
)

// FS holds the manifests.
//
//go:embed kustomization.yaml namespace.yaml crd rbac manager samples
var FS embed.FS

// Namespace is the namespace the operator is installed in.
const Namespace = "opkit-demo"

// ServiceAccount is the operator's ServiceAccount (in Namespace).
const ServiceAccount = "opkit-demo-operator"

// TriggerClusterRole grants callers permission to trigger reconciles.
const TriggerClusterRole = "opkit-demo-trigger"

// clusterScoped lists the kinds of this layout that have no namespace.
var clusterScoped = []string{"Namespace", "CustomResourceDefinition", "ClusterRole", "ClusterRoleBinding"}

// kustomization is the subset of kustomize's file this layout uses.
type kustomization struct {
	Namespace string   `json:"namespace"`
	Resources []string `json:"resources"`
	Labels    []struct {
		Pairs map[string]string `json:"pairs"`
	} `json:"labels"`
}

// Objects decodes the resources listed in kustomization.yaml, in order,
// applying its namespace (to namespaced objects and to ServiceAccount
// subjects of bindings) and its labels, as kustomize does.
func Objects() ([]*unstructured.Unstructured, error) {
	raw, err := FS.ReadFile("kustomization.yaml")
	if err != nil {
		return nil, err
	}
	var k kustomization
	if err := yaml.Unmarshal(raw, &k); err != nil {
		return nil, fmt.Errorf("kustomization.yaml: %w", err)
	}
	var out []*unstructured.Unstructured
	for _, file := range k.Resources {
		u, err := decode(file)
		if err != nil {
			return nil, err
		}
		if k.Namespace != "" {
			if !slices.Contains(clusterScoped, u.GetKind()) {
				u.SetNamespace(k.Namespace)
			}
			setSubjectNamespaces(u, k.Namespace)
		}
		labels := u.GetLabels()
		for _, l := range k.Labels {
			for key, v := range l.Pairs {
				if labels == nil {
					labels = map[string]string{}
				}
				labels[key] = v
			}
		}
		u.SetLabels(labels)
		out = append(out, u)
	}
	return out, nil
}

// Sample returns the sample DemoEntity.
func Sample() (*unstructured.Unstructured, error) { return decode("samples/demoentity.yaml") }

func decode(file string) (*unstructured.Unstructured, error) {
	raw, err := FS.ReadFile(path.Clean(file))
	if err != nil {
		return nil, err
	}
	m := map[string]any{}
	if err := yaml.Unmarshal(raw, &m); err != nil {
		return nil, fmt.Errorf("%s: %w", file, err)
	}
	u := &unstructured.Unstructured{Object: m}
	if u.GetAPIVersion() == "" || u.GetKind() == "" || u.GetName() == "" {
		return nil, fmt.Errorf("%s: missing apiVersion, kind or metadata.name", file)
	}
	return u, nil
}

func setSubjectNamespaces(u *unstructured.Unstructured, ns string) {
	if u.GetKind() != "RoleBinding" && u.GetKind() != "ClusterRoleBinding" {
		return
	}
	subjects, _, _ := unstructured.NestedSlice(u.Object, "subjects")
	for _, s := range subjects {
		if m, ok := s.(map[string]any); ok && m["kind"] == "ServiceAccount" {
			m["namespace"] = ns
		}
	}
	_ = unstructured.SetNestedSlice(u.Object, subjects, "subjects")
}
