//go:build integration

package reconciletest_test

import (
	"bytes"
	"context"
	"strings"
	"testing"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/util/yaml"
	"k8s.io/client-go/dynamic"

	"github.com/opkit/opkit/internal/testcluster"
	"github.com/opkit/opkit/reconcile/reconciletest"
)

// On a real API server, a field of the Go type that the CRD's schema
// lacks is pruned without an error; CheckCRD names it beforehand.
func TestIntegrationCheckCRDCatchesAFieldTheAPIServerPrunes(t *testing.T) {
	crd := widgetCRD("test.opkit.dev", "crdcheck.test.opkit.dev", "                phase: {type: string}\n", "")
	if err := reconciletest.CheckCRD[*Widget](crd, "v1"); err == nil || !strings.Contains(err.Error(), "status.phase") {
		t.Fatalf("CheckCRD = %v, want it to name status.phase", err)
	}

	c := testcluster.Start(t, testcluster.Options{})
	dyn := dynamic.NewForConfigOrDie(c.Config())
	ctx := context.Background()
	u := &unstructured.Unstructured{}
	if err := yaml.NewYAMLOrJSONDecoder(bytes.NewReader(crd), 4096).Decode(&u.Object); err != nil {
		t.Fatal(err)
	}
	crds := schema.GroupVersionResource{Group: "apiextensions.k8s.io", Version: "v1", Resource: "customresourcedefinitions"}
	if _, err := dyn.Resource(crds).Create(ctx, u, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	widgets := dyn.Resource(schema.GroupVersionResource{Group: "crdcheck.test.opkit.dev", Version: "v1", Resource: "widgets"}).Namespace("default")
	w := &unstructured.Unstructured{Object: map[string]any{
		"apiVersion": "crdcheck.test.opkit.dev/v1", "kind": "Widget",
		"metadata": map[string]any{"name": "blue"},
		"spec":     map[string]any{"size": int64(3)},
		"status":   map[string]any{"phase": "Ready", "observedGeneration": int64(1)},
	}}
	var got *unstructured.Unstructured
	for deadline := time.Now().Add(time.Minute); ; time.Sleep(100 * time.Millisecond) {
		var err error
		if got, err = widgets.Create(ctx, w, metav1.CreateOptions{}); err == nil {
			break
		} else if time.Now().After(deadline) {
			t.Fatalf("the CRD was never served: %v", err)
		}
	}
	if phase, found, _ := unstructured.NestedString(got.Object, "status", "phase"); found {
		t.Fatalf("the API server kept status.phase (%q): the schema lacks it, it should have pruned it", phase)
	}
	if gen, _, _ := unstructured.NestedInt64(got.Object, "status", "observedGeneration"); gen != 1 {
		t.Fatalf("status.observedGeneration %d, want the field the schema has kept", gen)
	}
}
