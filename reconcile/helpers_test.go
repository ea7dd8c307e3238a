package reconcile_test

import (
	"testing"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/types"
	dynfake "k8s.io/client-go/dynamic/fake"

	"github.com/opkit/opkit"
	"github.com/opkit/opkit/internal/typed"
	"github.com/opkit/opkit/queue"
	"github.com/opkit/opkit/reconcile"
	"github.com/opkit/opkit/trigger"
)

// Widget is a custom resource as an operator author writes it: a plain
// struct, no generated code.
type Widget struct {
	metav1.TypeMeta   `json:",inline"`
	metav1.ObjectMeta `json:"metadata,omitempty"`
	Spec              WidgetSpec   `json:"spec,omitempty"`
	Status            WidgetStatus `json:"status,omitempty"`
}

type WidgetSpec struct {
	Size int `json:"size,omitempty"`
}

type WidgetStatus struct {
	ObservedGeneration int64  `json:"observedGeneration,omitempty"`
	Phase              string `json:"phase,omitempty"`
	Message            string `json:"message,omitempty"`
	// LastHandledReconcileAt is the durable trigger handled last.
	LastHandledReconcileAt string `json:"lastHandledReconcileAt,omitempty"`
}

var widgets = opkit.Resource{
	GroupVersionResource: schema.GroupVersionResource{Group: "test.opkit.dev", Version: "v1", Resource: "widgets"},
	Kind:                 "Widget",
	Namespaced:           true,
}

func widget(name string, mutate ...func(*Widget)) *Widget {
	w := &Widget{
		TypeMeta:   metav1.TypeMeta{APIVersion: "test.opkit.dev/v1", Kind: "Widget"},
		ObjectMeta: metav1.ObjectMeta{Namespace: "ns", Name: name, UID: types.UID("uid-" + name), ResourceVersion: "1", Generation: 1},
		Spec:       WidgetSpec{Size: 1},
	}
	for _, m := range mutate {
		m(w)
	}
	return w
}

// newFakeDynamic returns a dynamic fake seeded with objs (Widgets).
func newFakeDynamic(t testing.TB, objs ...*Widget) *dynfake.FakeDynamicClient {
	t.Helper()
	var seed []runtime.Object
	for _, o := range objs {
		u, err := typed.ToUnstructured(o)
		if err != nil {
			t.Fatal(err)
		}
		seed = append(seed, u)
	}
	return dynfake.NewSimpleDynamicClientWithCustomListKinds(runtime.NewScheme(),
		map[schema.GroupVersionResource]string{widgets.GroupVersionResource: "WidgetList", reconcile.EventsResource: "EventList",
			configMaps.GroupVersionResource: "ConfigMapList"}, seed...)
}

// ticketOf is the ticket of an Intake's decision, with its error.
func ticketOf[T opkit.Object](d trigger.Decision[T], err error) (*trigger.Ticket, error) {
	return d.Ticket, err
}

// noTriggerMetrics is a trigger.Metrics that counts nothing: a test's
// trigger metrics embed it and count what the test looks at.
type noTriggerMetrics struct{}

func (noTriggerMetrics) Enqueued(queue.Outcome)             {}
func (noTriggerMetrics) Rejected()                          {}
func (noTriggerMetrics) Request(int, string, time.Duration) {}
func (noTriggerMetrics) Received()                          {}
func (noTriggerMetrics) Acked(string)                       {}
func (noTriggerMetrics) Nacked(string)                      {}
func (noTriggerMetrics) Terminated(string)                  {}
func (noTriggerMetrics) Processed(time.Duration)            {}
func (noTriggerMetrics) Lag(int64)                          {}
func (noTriggerMetrics) BrokerError(string)                 {}
