package opkit_test

import (
	"strings"
	"testing"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime/schema"

	"github.com/opkit/opkit"
)

func TestKeyString(t *testing.T) {
	for _, tc := range []struct {
		key  opkit.Key
		want string
	}{
		{opkit.Key{Namespace: "ns", Name: "a"}, "ns/a"},
		{opkit.Key{Name: "cluster-wide"}, "cluster-wide"},
	} {
		if got := tc.key.String(); got != tc.want {
			t.Errorf("%#v.String() = %q, want %q", tc.key, got, tc.want)
		}
	}
}

func TestKeyOf(t *testing.T) {
	cm := &corev1.ConfigMap{ObjectMeta: metav1.ObjectMeta{Namespace: "ns", Name: "a"}}
	if got, want := opkit.KeyOf(cm), (opkit.Key{Namespace: "ns", Name: "a"}); got != want {
		t.Fatalf("KeyOf = %v, want %v", got, want)
	}
}

func TestTypeAndSourceZeroValuesAreInvalid(t *testing.T) {
	var typ opkit.Type
	var src opkit.Source
	if typ.Valid() || src.Valid() {
		t.Fatal("zero Type/Source must be invalid so a forgotten field is caught")
	}
	for _, tc := range []struct {
		valid bool
		str   string
		want  string
	}{
		{opkit.Added.Valid(), opkit.Added.String(), "Added"},
		{opkit.Modified.Valid(), opkit.Modified.String(), "Modified"},
		{opkit.Deleted.Valid(), opkit.Deleted.String(), "Deleted"},
		{opkit.APIServer.Valid(), opkit.APIServer.String(), "APIServer"},
		{opkit.Operator.Valid(), opkit.Operator.String(), "Operator"},
	} {
		if !tc.valid || tc.str != tc.want {
			t.Errorf("got valid=%v %q, want valid %q", tc.valid, tc.str, tc.want)
		}
	}
	if s := opkit.Type(9).String(); s != "Type(9)" {
		t.Errorf("invalid Type prints %q", s)
	}
	if s := opkit.Source(0).String(); s != "Source(0)" {
		t.Errorf("invalid Source prints %q", s)
	}
}

func TestResourceValidate(t *testing.T) {
	ok := opkit.Resource{GroupVersionResource: schema.GroupVersionResource{Group: "g", Version: "v1", Resource: "things"}, Kind: "Thing"}
	if err := ok.Validate(); err != nil {
		t.Fatalf("valid resource: %v", err)
	}
	if gvk := ok.GroupVersionKind(); gvk != (schema.GroupVersionKind{Group: "g", Version: "v1", Kind: "Thing"}) {
		t.Fatalf("GroupVersionKind = %v", gvk)
	}
	for _, tc := range []struct {
		name string
		mut  func(*opkit.Resource)
		want string
	}{
		{"no version", func(r *opkit.Resource) { r.Version = "" }, "no version"},
		{"no resource", func(r *opkit.Resource) { r.Resource = "" }, "no resource"},
		{"no kind", func(r *opkit.Resource) { r.Kind = "" }, "no kind"},
	} {
		r := ok
		tc.mut(&r)
		err := r.Validate()
		if err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("%s: Validate() = %v, want an error containing %q", tc.name, err, tc.want)
		}
	}
}
