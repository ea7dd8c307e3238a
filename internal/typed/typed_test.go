package typed_test

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"testing"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
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

// notServed are the errors client-go returns for a GET of a resource the
// API server does not serve (TestNotServedAgainstTheAPIServer checks them
// against kube-apiserver): a group/version it does not know answers a
// plain "404 page not found", a known group/version without the resource
// a Status that names no object.
var notServed = []error{
	apierrors.NewGenericServerResponse(404, "get", schema.GroupResource{}, "", "404 page not found", 0, true),
	&apierrors.StatusError{ErrStatus: metav1.Status{Status: metav1.StatusFailure, Code: 404, Reason: metav1.StatusReasonNotFound,
		Message: "the server could not find the requested resource", Details: &metav1.StatusDetails{}}},
}

func TestGoneOnlyForANotFoundThatNamesTheObject(t *testing.T) {
	gr := schema.GroupResource{Resource: "configmaps"}
	missing := apierrors.NewNotFound(gr, "a")
	for _, tc := range []struct {
		name string
		err  error
		gone bool
	}{
		{"the object is missing", missing, true},
		{"wrapped", fmt.Errorf("get: %w", missing), true},
		{"another object is missing", apierrors.NewNotFound(gr, "b"), false},
		{"group/version not served", notServed[0], false},
		{"group/version not served, as a typed clientset reports it", apierrors.NewGenericServerResponse(404, "get", gr, "a", "404 page not found", 0, true), false},
		{"resource not served", notServed[1], false},
		{"a NotFound without details", &apierrors.StatusError{ErrStatus: metav1.Status{Code: 404, Reason: metav1.StatusReasonNotFound}}, false},
		{"another API error", apierrors.NewInternalError(errors.New("etcd")), false},
		{"not an API error", errors.New("dial tcp: refused"), false},
		{"nil", nil, false},
	} {
		if got := typed.Gone(tc.err, "a"); got != tc.gone {
			t.Errorf("%s: Gone = %v, want %v", tc.name, got, tc.gone)
		}
	}
}

func TestExplainNamesTheResourceNotServed(t *testing.T) {
	for _, err := range notServed {
		got := typed.Explain(err, configMaps, "a")
		if !strings.Contains(got.Error(), "does not serve configmaps in v1") || !errors.Is(got, err) {
			t.Errorf("Explain(%v) = %v; want it to name the resource and wrap the error", err, got)
		}
	}
	for _, err := range []error{nil, apierrors.NewNotFound(schema.GroupResource{Resource: "configmaps"}, "a"), apierrors.NewInternalError(errors.New("etcd"))} {
		if got := typed.Explain(err, configMaps, "a"); got != err {
			t.Errorf("Explain(%v) = %v; want it unchanged", err, got)
		}
	}
}
