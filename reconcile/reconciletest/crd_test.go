package reconciletest_test

import (
	"strings"
	"testing"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/opkit/opkit/reconcile/reconciletest"
)

// widgetCRD is the CRD of Widget, with replace's replacements applied
// (old, new pairs, as strings.NewReplacer takes them).
func widgetCRD(replace ...string) []byte {
	crd := `
apiVersion: apiextensions.k8s.io/v1
kind: CustomResourceDefinition
metadata:
  name: widgets.test.opkit.dev
spec:
  group: test.opkit.dev
  names: {kind: Widget, plural: widgets}
  scope: Namespaced
  versions:
    - name: v1
      served: true
      storage: true
      schema:
        openAPIV3Schema:
          type: object
          properties:
            apiVersion: {type: string}
            kind: {type: string}
            metadata: {type: object}
            spec:
              type: object
              properties:
                size: {type: integer}
            status:
              type: object
              properties:
                observedGeneration: {type: integer}
                phase: {type: string}
`
	return []byte(strings.NewReplacer(replace...).Replace(crd))
}

// Gauge has what CheckCRD must look into, and what it must not: a list of
// conditions, a map, a time, an embedded struct.
type Gauge struct {
	metav1.TypeMeta   `json:",inline"`
	metav1.ObjectMeta `json:"metadata,omitempty"`
	Spec              struct {
		Limits map[string]struct {
			Max int `json:"max"`
		} `json:"limits,omitempty"`
		Base `json:",inline"`
	} `json:"spec"`
	Status struct {
		Conditions []metav1.Condition `json:"conditions,omitempty"`
		Since      *metav1.Time       `json:"since,omitempty"`
	} `json:"status,omitempty"`
}

type Base struct {
	Unit string `json:"unit"`
}

func TestCheckCRDNamesEveryFieldOneSideLacks(t *testing.T) {
	for _, tc := range []struct {
		name string
		crd  []byte
		want []string // in the error; none: no error
	}{
		{"the same fields", widgetCRD(), nil},
		{"a field the schema lacks", widgetCRD("                phase: {type: string}\n", ""),
			[]string{"status.phase: in the Go type, not in the schema (the API server prunes it)"}},
		{"a field the Go type lacks", widgetCRD("size: {type: integer}", "size: {type: integer}\n                color: {type: string}"),
			[]string{"spec.color: in the schema, not in the Go type (never read)"}},
		{"a version it does not have", widgetCRD("- name: v1", "- name: v2"), []string{`no version "v1"`}},
		{"not YAML", []byte("spec: [versions"), []string{"CRD:"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			err := reconciletest.CheckCRD[*Widget](tc.crd, "v1")
			if (err == nil) != (len(tc.want) == 0) {
				t.Fatalf("CheckCRD = %v, want an error with %q", err, tc.want)
			}
			for _, w := range tc.want {
				if !strings.Contains(err.Error(), w) {
					t.Errorf("CheckCRD = %v, want it to say %q", err, w)
				}
			}
		})
	}
}

func TestCheckCRDLooksIntoListsMapsAndEmbeddedStructsNotTimes(t *testing.T) {
	crd := []byte(`
spec:
  versions:
    - name: v1
      schema:
        openAPIV3Schema:
          type: object
          properties:
            spec:
              type: object
              properties:
                unit: {type: string}
                limits:
                  type: object
                  additionalProperties:
                    type: object
                    properties:
                      min: {type: integer}
            status:
              type: object
              properties:
                since: {type: string, format: date-time}
                conditions:
                  type: array
                  items:
                    type: object
                    properties:
                      type: {type: string}
                      status: {type: string}
                      observedGeneration: {type: integer}
                      lastTransitionTime: {type: string, format: date-time}
                      reason: {type: string}
                      message: {type: string}
`)
	err := reconciletest.CheckCRD[*Gauge](crd, "v1")
	if err == nil {
		t.Fatal("CheckCRD found nothing, want the map's values' max and min")
	}
	for _, w := range []string{"spec.limits{}.max: in the Go type", "spec.limits{}.min: in the schema"} {
		if !strings.Contains(err.Error(), w) {
			t.Errorf("CheckCRD = %v, want it to say %q", err, w)
		}
	}
	if strings.Count(err.Error(), "\n") != 2 {
		t.Errorf("CheckCRD = %v, want those two lines alone (conditions, the time and the inlined unit match)", err)
	}
}
