package typed_test

import (
	"context"
	"testing"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/schema"
	dynfake "k8s.io/client-go/dynamic/fake"

	"github.com/opkit/opkit"
	"github.com/opkit/opkit/internal/typed"
)

var configMaps = opkit.Resource{
	GroupVersionResource: schema.GroupVersionResource{Version: "v1", Resource: "configmaps"},
	Kind:                 "ConfigMap",
	Namespaced:           true,
}

func TestGetDecodesIntoTheUsersType(t *testing.T) {
	scheme := runtime.NewScheme()
	_ = corev1.AddToScheme(scheme)
	cm := &corev1.ConfigMap{
		TypeMeta:   metav1.TypeMeta{APIVersion: "v1", Kind: "ConfigMap"},
		ObjectMeta: metav1.ObjectMeta{Namespace: "ns", Name: "a", UID: "u1"},
		Data:       map[string]string{"k": "v"},
	}
	dyn := dynfake.NewSimpleDynamicClient(scheme, cm)
	c := typed.New[*corev1.ConfigMap](dyn, configMaps)
	got, err := c.Get(context.Background(), opkit.Key{Namespace: "ns", Name: "a"})
	if err != nil {
		t.Fatal(err)
	}
	if got.Data["k"] != "v" || got.UID != "u1" {
		t.Fatalf("got %+v, want data k=v and uid u1", got)
	}
}

func TestTombstoneCarriesOnlyIdentity(t *testing.T) {
	ts := typed.Tombstone[*corev1.ConfigMap](opkit.Key{Namespace: "ns", Name: "a"}, "u1", "42")
	if ts.Namespace != "ns" || ts.Name != "a" || ts.UID != "u1" || ts.ResourceVersion != "42" || ts.Data != nil {
		t.Fatalf("tombstone = %+v", ts)
	}
}
