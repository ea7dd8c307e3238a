package reconcile_test

import (
	"context"
	"strings"
	"testing"

	eventsv1 "k8s.io/api/events/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime"

	"github.com/opkit/opkit/reconcile"
)

func TestRecorderCreatesAnEventsV1EventAboutTheObject(t *testing.T) {
	dyn := newFakeDynamic(t)
	r, err := reconcile.NewRecorder(reconcile.RecorderConfig{Dynamic: dyn, Controller: "test.opkit.dev/widgets", Instance: "pod-1", Resource: widgets})
	if err != nil {
		t.Fatal(err)
	}
	w := widget("a", func(w *Widget) { w.TypeMeta = metav1.TypeMeta{} }) // as decoded by some clients
	long := strings.Repeat("x", 2000)
	if err := r.Record(context.Background(), w, reconcile.EventSpec{Type: reconcile.EventWarning, Reason: "ReconcileFailed", Action: "Reconcile", Note: long}); err != nil {
		t.Fatal(err)
	}
	l, err := dyn.Resource(reconcile.EventsResource).Namespace("ns").List(context.Background(), metav1.ListOptions{})
	if err != nil || len(l.Items) != 1 {
		t.Fatalf("events: %v, %v", l, err)
	}
	var ev eventsv1.Event
	if err := runtime.DefaultUnstructuredConverter.FromUnstructured(l.Items[0].Object, &ev); err != nil {
		t.Fatal(err)
	}
	ref := ev.Regarding
	if ref.APIVersion != "test.opkit.dev/v1" || ref.Kind != "Widget" || ref.Name != "a" || ref.Namespace != "ns" || ref.UID != w.UID {
		t.Errorf("regarding = %+v", ref)
	}
	if ev.Type != "Warning" || ev.Reason != "ReconcileFailed" || ev.ReportingController != "test.opkit.dev/widgets" || ev.ReportingInstance != "pod-1" || ev.EventTime.IsZero() || len(ev.Note) != 1024 {
		t.Errorf("event = %+v (note length %d)", ev, len(ev.Note))
	}
}

func TestNilRecorderRecordsNothing(t *testing.T) {
	var r *reconcile.Recorder
	if err := r.Record(context.Background(), widget("a"), reconcile.EventSpec{Reason: "X"}); err != nil {
		t.Fatal(err)
	}
}

func TestNewRecorderValidatesItsConfig(t *testing.T) {
	if _, err := reconcile.NewRecorder(reconcile.RecorderConfig{Controller: "c"}); err == nil {
		t.Error("no client accepted")
	}
	if _, err := reconcile.NewRecorder(reconcile.RecorderConfig{Dynamic: newFakeDynamic(t)}); err == nil {
		t.Error("no controller name accepted")
	}
}

func TestRecorderPutsEventsOfClusterScopedObjectsInDefault(t *testing.T) {
	dyn := newFakeDynamic(t)
	r, err := reconcile.NewRecorder(reconcile.RecorderConfig{Dynamic: dyn, Controller: "test.opkit.dev/widgets", Resource: widgets})
	if err != nil {
		t.Fatal(err)
	}
	cluster := widget("c")
	cluster.Namespace = "" // cluster-scoped objects get their Events in "default"
	if err := r.Record(context.Background(), cluster, reconcile.EventSpec{Reason: "Triggered", Note: "by CI"}); err != nil {
		t.Fatal(err)
	}
	l, err := dyn.Resource(reconcile.EventsResource).Namespace("default").List(context.Background(), metav1.ListOptions{})
	if err != nil || len(l.Items) != 1 {
		t.Fatalf("events %+v, %v", l, err)
	}
	if reason, _, _ := unstructured.NestedString(l.Items[0].Object, "reason"); reason != "Triggered" {
		t.Fatalf("event %+v", l.Items[0].Object)
	}
	if name, _, _ := unstructured.NestedString(l.Items[0].Object, "regarding", "name"); name != "c" {
		t.Fatalf("event %+v", l.Items[0].Object)
	}
}
