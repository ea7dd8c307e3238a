package reconcile_test

import (
	"context"
	"encoding/json"
	"strings"
	"testing"
	"unicode/utf8"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"

	"github.com/opkit/opkit/reconcile"
)

// A long note is cut on a character boundary: a character cut in two would
// be sent as U+FFFD (3 bytes per stray byte, by encoding/json) and take the
// note over the API server's 1024-byte limit for events.k8s.io/v1 notes,
// and the Event would be refused (422).
func TestRecorderCutsALongNoteOnACharacterBoundary(t *testing.T) {
	dyn := newFakeDynamic(t)
	r, err := reconcile.NewRecorder(reconcile.RecorderConfig{Dynamic: dyn, Controller: "test.opkit.dev/widgets", Resource: widgets})
	if err != nil {
		t.Fatal(err)
	}
	note := "xx" + strings.Repeat("é", 1000) // é is 2 bytes: byte 1021 falls inside one
	if err := r.Record(context.Background(), widget("a"), reconcile.EventSpec{Type: reconcile.EventWarning, Reason: "ReconcileFailed", Note: note}); err != nil {
		t.Fatal(err)
	}
	l, err := dyn.Resource(reconcile.EventsResource).Namespace("ns").List(context.Background(), metav1.ListOptions{})
	if err != nil || len(l.Items) != 1 {
		t.Fatalf("events: %v, %v", l, err)
	}
	got, _, _ := unstructured.NestedString(l.Items[0].Object, "note")
	if !utf8.ValidString(got) {
		t.Errorf("note is not valid UTF-8 (len %d): ...%q", len(got), got[len(got)-6:])
	}
	b, _ := json.Marshal(got)
	var wire string
	_ = json.Unmarshal(b, &wire)
	if len(wire) > 1024 {
		t.Errorf("note as the API server decodes it is %d bytes, over the 1024-byte limit", len(wire))
	}
}
