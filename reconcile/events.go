package reconcile

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"strconv"
	"strings"
	"time"

	corev1 "k8s.io/api/core/v1"
	eventsv1 "k8s.io/api/events/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/client-go/dynamic"

	"github.com/opkit/opkit"
	"github.com/opkit/opkit/internal/typed"
)

// Event types, and the default timeout of one write.
const (
	eventNormal         = corev1.EventTypeNormal
	eventWarning        = corev1.EventTypeWarning
	defaultEventTimeout = 5 * time.Second
)

// EventsResource is the resource of the Events.
var EventsResource = schema.GroupVersionResource{Group: "events.k8s.io", Version: "v1", Resource: "events"}

// RecorderConfig configures a [Recorder]: the client and Controller
// (required), Instance (zero: Controller), the Resource of objects without
// TypeMeta, the Timeout of a write (zero: 5s).
type RecorderConfig struct {
	Dynamic    dynamic.Interface
	Controller string
	Instance   string
	Resource   opkit.Resource
	Timeout    time.Duration
}

// Recorder records Events about objects, with one API call on the
// caller's goroutine: nothing to stop. A nil *Recorder records nothing.
type Recorder struct {
	cfg RecorderConfig
}

// NewRecorder validates cfg and returns a Recorder.
func NewRecorder(cfg RecorderConfig) (*Recorder, error) {
	if cfg.Dynamic == nil || cfg.Controller == "" || cfg.Timeout < 0 {
		return nil, errors.New("reconcile: recorder needs a Dynamic client, a Controller name and a Timeout that is not negative")
	}
	cfg.Timeout, cfg.Instance = cmp.Or(cfg.Timeout, defaultEventTimeout), cmp.Or(cfg.Instance, cfg.Controller)
	return &Recorder{cfg: cfg}, nil
}

// EventSpec is what an Event says: its Type ("Normal", the default, or
// "Warning"), an UpperCamelCase Reason, the Action ("Reconcile"), and a
// Note (cut to 1 KiB).
type EventSpec struct {
	Type, Reason, Action, Note string
}

// Record creates an Event about obj (in "default" for a cluster-scoped
// one).
func (r *Recorder) Record(ctx context.Context, obj opkit.Object, spec EventSpec) error {
	if r == nil {
		return nil
	}
	if isNil(obj) {
		return errors.New("reconcile: record event: nil object")
	}
	ev := r.build(obj, spec, time.Now())
	ctx, cancel := context.WithTimeout(ctx, r.cfg.Timeout)
	defer cancel()
	u, err := typed.ToUnstructured(ev)
	if err != nil {
		return fmt.Errorf("reconcile: record event: %w", err)
	}
	u.SetGroupVersionKind(eventsv1.SchemeGroupVersion.WithKind("Event"))
	if _, err := r.cfg.Dynamic.Resource(EventsResource).Namespace(ev.Namespace).Create(ctx, u, metav1.CreateOptions{}); err != nil {
		return fmt.Errorf("reconcile: record event %s on %s: %w", spec.Reason, opkit.KeyOf(obj), err)
	}
	return nil
}

func (r *Recorder) build(obj opkit.Object, spec EventSpec, now time.Time) *eventsv1.Event {
	gvk := obj.GetObjectKind().GroupVersionKind()
	if gvk.Kind == "" {
		gvk = r.cfg.Resource.GroupVersionKind()
	}
	apiVersion := ""
	if gvk.Version != "" {
		apiVersion = gvk.GroupVersion().String()
	}
	note := spec.Note
	if len(note) > 1024 {
		// Cut on a character boundary (ToValidUTF8 drops the bytes of a
		// cut character): a cut character would be sent as U+FFFD (3
		// bytes) and take the note over the API server's limit.
		note = strings.ToValidUTF8(note[:1021], "") + "..."
	}
	return &eventsv1.Event{
		ObjectMeta: metav1.ObjectMeta{
			// Unique per call: the object's name plus time and randomness.
			Name:      obj.GetName() + "." + strconv.FormatInt(now.UnixNano(), 36) + strconv.FormatUint(rand.Uint64()&0xffff, 36),
			Namespace: cmp.Or(obj.GetNamespace(), metav1.NamespaceDefault),
		},
		EventTime: metav1.NewMicroTime(now), ReportingController: r.cfg.Controller, ReportingInstance: r.cfg.Instance,
		Action: spec.Action, Reason: spec.Reason, Type: cmp.Or(spec.Type, eventNormal), Note: note,
		Regarding: corev1.ObjectReference{APIVersion: apiVersion, Kind: gvk.Kind, Namespace: obj.GetNamespace(),
			Name: obj.GetName(), UID: obj.GetUID(), ResourceVersion: obj.GetResourceVersion()},
	}
}
