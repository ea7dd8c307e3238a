// annotations.go holds what the holder publishes on the Lease and what replicas read of it.

package leader

import (
	"maps"
	"slices"
	"strings"

	coordinationv1 "k8s.io/api/coordination/v1"
)

func annotationsOf(l *coordinationv1.Lease) map[string]string {
	if holderOf(l) == "" {
		return nil
	}
	return l.Annotations
}

// LeaderAnnotation returns the annotation name of the Lease as last
// observed while someone held it (see Config.Annotations), "" when it
// has none or no one holds it.
func (e *Elector) LeaderAnnotation(name string) string {
	e.mu.Lock()
	defer e.mu.Unlock()
	return e.annotations[name]
}

// PublishedAnnotation lists, comma-separated, the annotation names the
// holder published on the Lease (Config.Annotations), so that the next
// holder removes them even when the previous one died without releasing
// the Lease and the new one does not publish the same names.
const PublishedAnnotation = "leader.opkit.dev/published"

// publish removes from l the annotations its previous holder published
// and adds own, recording their names in PublishedAnnotation.
func publish(l *coordinationv1.Lease, own map[string]string) {
	for _, k := range strings.Split(l.Annotations[PublishedAnnotation], ",") {
		delete(l.Annotations, k)
	}
	delete(l.Annotations, PublishedAnnotation)
	if len(own) == 0 {
		return
	}
	if l.Annotations == nil {
		l.Annotations = map[string]string{}
	}
	maps.Copy(l.Annotations, own)
	l.Annotations[PublishedAnnotation] = strings.Join(slices.Sorted(maps.Keys(own)), ",")
}
