package reconcile

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"strconv"
	"time"
	"unicode/utf8"

	corev1 "k8s.io/api/core/v1"
	eventsv1 "k8s.io/api/events/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/client-go/dynamic"
	"k8s.io/client-go/kubernetes"

	"github.com/opkit/opkit"
)

// Event types for [Recorder.Record].
const (
	EventNormal  = corev1.EventTypeNormal
	EventWarning = corev1.EventTypeWarning
)

// EventsResource is the resource Events are written to.
var EventsResource = schema.GroupVersionResource{Group: "events.k8s.io", Version: "v1", Resource: "events"}

// DefaultEventTimeout bounds one Event write when RecorderConfig.Timeout is zero.
const DefaultEventTimeout = 5 * time.Second

// RecorderConfig configures a [Recorder].
type RecorderConfig struct {
	// Dynamic is the client Events are created with, as events.k8s.io/v1
	// objects (the controller's dynamic client will do, and reconciletest's
	// fake records them). One of Dynamic and Kube is required.
	Dynamic dynamic.Interface
	// Kube, if set, creates the Events through its EventsV1 client
	// instead of Dynamic.
	Kube kubernetes.Interface
	// Controller is the reporting controller, e.g. "demo.opkit.dev/demo-operator".
	// Required.
	Controller string
	// Instance is the reporting instance (e.g. the pod name). Default: the
	// Controller name.
	Instance string
	// Resource supplies the apiVersion and kind of objects whose TypeMeta is
	// empty (typed objects decoded by client-go often have none). Optional.
	Resource opkit.Resource
	// Timeout bounds each Event write. Zero means [DefaultEventTimeout].
	Timeout time.Duration
}

// Recorder records Kubernetes Events (events.k8s.io/v1) about objects.
//
// Recording is synchronous: Record creates the Event with one API call,
// bounded by the configured timeout, on the caller's goroutine. There is no
// broadcaster, no goroutine per object or per recorder, and nothing to stop;
// the caller decides whether an Event is worth the wait. Events are not
// aggregated into series: opkit records them only for rare occurrences
// (the last failed retry, a terminal error, an external trigger).
//
// A nil *Recorder is valid and records nothing. A Recorder is safe for
// concurrent use.
type Recorder struct {
	cfg RecorderConfig
}

// NewRecorder validates cfg and returns a recorder.
func NewRecorder(cfg RecorderConfig) (*Recorder, error) {
	if cfg.Dynamic == nil && cfg.Kube == nil {
		return nil, errors.New("reconcile: recorder needs a dynamic or a kubernetes client")
	}
	if cfg.Controller == "" {
		return nil, errors.New("reconcile: recorder needs a Controller name")
	}
	if cfg.Timeout < 0 {
		return nil, fmt.Errorf("reconcile: recorder: negative Timeout %v", cfg.Timeout)
	}
	if cfg.Timeout == 0 {
		cfg.Timeout = DefaultEventTimeout
	}
	if cfg.Instance == "" {
		cfg.Instance = cfg.Controller
	}
	return &Recorder{cfg: cfg}, nil
}

// EventSpec is what an Event says.
type EventSpec struct {
	// Type is EventNormal or EventWarning (default EventNormal).
	Type string
	// Reason is a short UpperCamelCase machine-readable reason, e.g. "ReconcileFailed".
	Reason string
	// Action is what was done or failed, e.g. "Reconcile".
	Action string
	// Note is the human-readable message (truncated to 1 KiB).
	Note string
}

// Record creates an Event about obj. Cluster-scoped objects get their Events
// in the "default" namespace. It returns the API error, if any; a nil
// Recorder returns nil at once.
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
	if r.cfg.Kube != nil {
		if _, err := r.cfg.Kube.EventsV1().Events(ev.Namespace).Create(ctx, ev, metav1.CreateOptions{}); err != nil {
			return fmt.Errorf("reconcile: record event %s on %s: %w", spec.Reason, opkit.KeyOf(obj), err)
		}
		return nil
	}
	m, err := runtime.DefaultUnstructuredConverter.ToUnstructured(ev)
	if err != nil {
		return fmt.Errorf("reconcile: record event: %w", err)
	}
	u := &unstructured.Unstructured{Object: m}
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
	ns := obj.GetNamespace()
	if ns == "" {
		ns = metav1.NamespaceDefault
	}
	typ := spec.Type
	if typ == "" {
		typ = EventNormal
	}
	note := spec.Note
	if len(note) > 1024 {
		// Cut on a character boundary: a cut character would be sent as
		// U+FFFD (3 bytes) and take the note over the API server's limit.
		n := 1021
		for n > 0 && !utf8.RuneStart(note[n]) {
			n--
		}
		note = note[:n] + "..."
	}
	apiVersion, kind := gvk.GroupVersion().String(), gvk.Kind
	if gvk.Version == "" {
		apiVersion = ""
	}
	return &eventsv1.Event{
		ObjectMeta: metav1.ObjectMeta{
			// Unique per call: the object's name plus time and randomness.
			Name:      obj.GetName() + "." + strconv.FormatInt(now.UnixNano(), 36) + strconv.FormatUint(rand.Uint64()&0xffff, 36),
			Namespace: ns,
		},
		EventTime:           metav1.NewMicroTime(now),
		ReportingController: r.cfg.Controller,
		ReportingInstance:   r.cfg.Instance,
		Action:              spec.Action,
		Reason:              spec.Reason,
		Type:                typ,
		Note:                note,
		Regarding: corev1.ObjectReference{
			APIVersion:      apiVersion,
			Kind:            kind,
			Namespace:       obj.GetNamespace(),
			Name:            obj.GetName(),
			UID:             obj.GetUID(),
			ResourceVersion: obj.GetResourceVersion(),
		},
	}
}
