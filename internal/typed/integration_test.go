//go:build integration

package typed_test

import (
	"context"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/runtime/schema"

	"github.com/opkit/opkit"
	"github.com/opkit/opkit/internal/testcluster"
	"github.com/opkit/opkit/internal/typed"
)

func TestMain(m *testing.M) { testcluster.Main(m) }

// TestNotServedAgainstTheAPIServer pins down, on a real kube-apiserver,
// the difference Gone relies on: a missing object is a NotFound naming
// it; a resource the server does not serve (a CRD not installed yet, an
// unknown version or resource) is a NotFound naming nothing. Once the CRD
// is installed, its missing objects are gone like any other.
func TestNotServedAgainstTheAPIServer(t *testing.T) {
	c := testcluster.Shared(t)
	ns := c.Namespace(t)
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	dyn := c.Dynamic(t)
	gadgets := schema.GroupVersionResource{Group: "typed.opkit.dev", Version: "v1", Resource: "gadgets"}
	get := func(gvr schema.GroupVersionResource) error {
		res := opkit.Resource{GroupVersionResource: gvr, Kind: "Anything", Namespaced: true}
		_, err := typed.New[*corev1.ConfigMap](dyn, res).Get(ctx, opkit.Key{Namespace: ns, Name: "absent"})
		return err
	}
	for _, tc := range []struct {
		name string
		gvr  schema.GroupVersionResource
		gone bool
	}{
		{"a missing object of a served resource", schema.GroupVersionResource{Version: "v1", Resource: "configmaps"}, true},
		{"a CRD not installed", gadgets, false},
		{"an unknown resource in a served group/version", schema.GroupVersionResource{Version: "v1", Resource: "gizmos"}, false},
		{"an unknown version of a served group", schema.GroupVersionResource{Group: "apps", Version: "v9", Resource: "deployments"}, false},
	} {
		err := get(tc.gvr)
		if err == nil {
			t.Fatalf("%s: GET succeeded", tc.name)
		}
		if got := typed.Gone(err, "absent"); got != tc.gone {
			t.Errorf("%s: Gone(%v) = %v, want %v", tc.name, err, got, tc.gone)
		}
	}
	if err := c.InstallCRD(ctx, testcluster.CRD{Resource: gadgets, Kind: "Gadget", Namespaced: true}); err != nil {
		t.Fatal(err)
	}
	if err := get(gadgets); !typed.Gone(err, "absent") {
		t.Errorf("after installing the CRD: Gone(%v) = false, want true", err)
	}
}
