package convergencebench

import (
	"maps"
	"strconv"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	kruntime "k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/schema"

	"github.com/opkit/opkit"
)

// Widget is the benchmark's custom resource, a plain struct for both
// SDKs: opkit reads it as is; controller-runtime needs DeepCopyObject and
// a scheme entry, which a generated type would have.
type Widget struct {
	metav1.TypeMeta   `json:",inline"`
	metav1.ObjectMeta `json:"metadata,omitempty"`
	Spec              WidgetSpec   `json:"spec,omitempty"`
	Status            WidgetStatus `json:"status,omitempty"`
}

type WidgetSpec struct {
	Size int64 `json:"size"`
}

type WidgetStatus struct {
	ObservedGeneration int64 `json:"observedGeneration,omitempty"`
}

func (w *Widget) DeepCopyObject() kruntime.Object {
	c := *w
	w.ObjectMeta.DeepCopyInto(&c.ObjectMeta)
	return &c
}

// WidgetList is what controller-runtime's cache lists into.
type WidgetList struct {
	metav1.TypeMeta `json:",inline"`
	metav1.ListMeta `json:"metadata,omitempty"`
	Items           []Widget `json:"items"`
}

func (l *WidgetList) DeepCopyObject() kruntime.Object {
	c := *l
	l.ListMeta.DeepCopyInto(&c.ListMeta)
	c.Items = make([]Widget, len(l.Items))
	for i := range l.Items {
		c.Items[i] = *l.Items[i].DeepCopyObject().(*Widget)
	}
	return &c
}

var (
	widgets = opkit.Resource{
		GroupVersionResource: schema.GroupVersionResource{Group: "bench.opkit.dev", Version: "v1", Resource: "widgets"},
		Kind:                 "Widget",
		Namespaced:           true,
	}
	configMaps = schema.GroupVersionResource{Version: "v1", Resource: "configmaps"}
)

// The reconcile's logic, shared by both SDKs' reconcilers: the child
// ConfigMap of a Widget, and whether an existing one is up to date. Each
// SDK reads and writes it through its own client (the GET, CREATE and
// UPDATE are all that differs).

// childName is the name of w's child ConfigMap.
func childName(w *Widget) string { return w.Name + "-child" }

// childData is what the child carries: the Widget's spec.size.
func childData(w *Widget) map[string]string {
	return map[string]string{"size": strconv.FormatInt(w.Spec.Size, 10)}
}

// ownerRef is the controller reference from the child to w.
func ownerRef(w *Widget) metav1.OwnerReference {
	return metav1.OwnerReference{
		APIVersion: widgets.GroupVersion().String(), Kind: widgets.Kind,
		Name: w.Name, UID: w.UID, Controller: new(true), BlockOwnerDeletion: new(true),
	}
}

// newChild is the child to create for w.
func newChild(w *Widget) *corev1.ConfigMap {
	cm := &corev1.ConfigMap{ObjectMeta: metav1.ObjectMeta{Namespace: w.Namespace, Name: childName(w)}}
	shapeChild(cm, w)
	return cm
}

// childUpToDate says whether cm carries w's spec and is controlled by w.
func childUpToDate(cm *corev1.ConfigMap, w *Widget) bool {
	ref := metav1.GetControllerOfNoCopy(cm)
	return ref != nil && ref.UID == w.UID && maps.Equal(cm.Data, childData(w))
}

// shapeChild brings cm to w's spec, with w as its only owner.
func shapeChild(cm *corev1.ConfigMap, w *Widget) {
	cm.Data = childData(w)
	cm.OwnerReferences = []metav1.OwnerReference{ownerRef(w)}
}
