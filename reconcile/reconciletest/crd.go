package reconciletest

// The check of a CRD's schema against the Go type it is read into.

import (
	"bytes"
	"encoding"
	"encoding/json"
	"fmt"
	"reflect"
	"slices"
	"strings"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/yaml"

	"github.com/opkit/opkit"
	"github.com/opkit/opkit/internal/typed"
)

// CheckCRD compares the schema of version of the CustomResourceDefinition
// crd (YAML or JSON, as applied) with the Go type T, field by field, and
// returns an error naming every field that one has and the other lacks:
// a field of T missing from the schema is pruned by the API server
// without an error (what the reconciler writes there is lost), and a
// field of the schema missing from T is never read. The object's
// apiVersion, kind and metadata are the API server's and not compared;
// nor is what lies under a field whose schema preserves unknown fields,
// or a field whose type marshals itself (metav1.Time, resource.Quantity,
// intstr.IntOrString...). Call it from a unit test:
//
//	crd, _ := os.ReadFile("config/crd/widgets.yaml")
//	if err := reconciletest.CheckCRD[*Widget](crd, "v1"); err != nil {
//		t.Fatal(err)
//	}
func CheckCRD[T opkit.Object](crd []byte, version string) error {
	var doc struct {
		Spec struct {
			Versions []crdVersion `json:"versions"`
		} `json:"spec"`
	}
	if err := yaml.NewYAMLOrJSONDecoder(bytes.NewReader(crd), 4096).Decode(&doc); err != nil {
		return fmt.Errorf("reconciletest: CRD: %w", err)
	}
	i := slices.IndexFunc(doc.Spec.Versions, func(v crdVersion) bool { return v.Name == version })
	if i < 0 || doc.Spec.Versions[i].Schema.OpenAPIV3Schema == nil {
		return fmt.Errorf("reconciletest: CRD has no version %q with an openAPIV3Schema", version)
	}
	var diffs []string
	compare(reflect.TypeFor[T]().Elem(), doc.Spec.Versions[i].Schema.OpenAPIV3Schema, "", &diffs)
	if len(diffs) > 0 {
		slices.Sort(diffs)
		return fmt.Errorf("reconciletest: the CRD's schema (version %s) and %s differ:\n  %s", version, reflect.TypeFor[T]().Elem(), strings.Join(diffs, "\n  "))
	}
	return nil
}

// crdVersion is a version of a CustomResourceDefinition, with its schema.
type crdVersion struct {
	Name   string `json:"name"`
	Schema struct {
		OpenAPIV3Schema *schemaNode `json:"openAPIV3Schema"`
	} `json:"schema"`
}

// schemaNode is the part of an OpenAPI v3 schema CheckCRD compares.
type schemaNode struct {
	Type                 string                 `json:"type"`
	Properties           map[string]*schemaNode `json:"properties"`
	Items                *schemaNode            `json:"items"`
	AdditionalProperties json.RawMessage        `json:"additionalProperties"`
	PreserveUnknown      bool                   `json:"x-kubernetes-preserve-unknown-fields"`
}

// metaFields are the object's fields the API server owns.
var metaFields = []string{"apiVersion", "kind", "metadata"}

// compare adds to diffs what differs between the Go type t and the schema
// s at path.
func compare(t reflect.Type, s *schemaNode, path string, diffs *[]string) {
	for t.Kind() == reflect.Pointer {
		t = t.Elem()
	}
	if s == nil || s.PreserveUnknown || marshalsItself(t) {
		return
	}
	switch t.Kind() {
	case reflect.Slice, reflect.Array:
		if t.Elem().Kind() != reflect.Uint8 { // []byte is a base64 string
			compare(t.Elem(), s.Items, path+"[]", diffs)
		}
	case reflect.Map:
		var elem schemaNode
		if json.Unmarshal(s.AdditionalProperties, &elem) == nil {
			compare(t.Elem(), &elem, path+"{}", diffs)
		}
	case reflect.Struct:
		compareStruct(t, s, path, diffs)
	}
}

// compareStruct compares the json fields of struct t with the properties
// of s.
func compareStruct(t reflect.Type, s *schemaNode, path string, diffs *[]string) {
	fields := typed.JSONFields(t)
	for name, ft := range fields {
		if path == "" && slices.Contains(metaFields, name) {
			continue
		}
		if p, ok := s.Properties[name]; ok {
			compare(ft, p, join(path, name), diffs)
		} else {
			*diffs = append(*diffs, join(path, name)+": in the Go type, not in the schema (the API server prunes it)")
		}
	}
	for name := range s.Properties {
		if _, ok := fields[name]; !ok && !(path == "" && slices.Contains(metaFields, name)) {
			*diffs = append(*diffs, join(path, name)+": in the schema, not in the Go type (never read)")
		}
	}
}

// marshalsItself reports whether t has a JSON form of its own (time, a
// quantity...), whose schema CheckCRD does not look into.
func marshalsItself(t reflect.Type) bool {
	p := reflect.PointerTo(t)
	return t.Implements(reflect.TypeFor[json.Marshaler]()) || p.Implements(reflect.TypeFor[json.Unmarshaler]()) ||
		t.Implements(reflect.TypeFor[encoding.TextMarshaler]()) || t == reflect.TypeFor[metav1.Time]()
}

func join(path, name string) string {
	if path == "" {
		return name
	}
	return path + "." + name
}
