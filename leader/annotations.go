// annotations.go holds what the holder publishes on the Lease and what replicas read of it.

package leader

import (
	"maps"
	"slices"
	"strings"

	coordinationv1 "k8s.io/api/coordination/v1"
)

// Publish replaces the annotations this replica publishes on the Lease
// while it holds it (initially Config.Annotations; nil publishes none).
// While this replica holds the Lease, the next renewal that starts after
// the call writes the new set, without a request of its own; otherwise the
// next acquisition does. Names no longer published are removed from the
// Lease at that write. Publish keeps a copy of annotations; it may be
// called from any goroutine, before or during Run.
func (e *Elector) Publish(annotations map[string]string) {
	own := maps.Clone(annotations)
	e.locked(func() { e.published = own })
}

// publishing returns the set of annotations this replica publishes now.
// The map is never modified (Publish replaces it): callers may read it
// without mu, but must not write to it.
func (e *Elector) publishing() map[string]string {
	e.mu.Lock()
	defer e.mu.Unlock()
	return e.published
}

// LeaderAnnotation returns the annotation name of the Lease as last
// observed while someone held it (see Config.Annotations and
// [Elector.Publish]), "" when it has none or no one holds it. On the
// holder it is what its last acquisition or renewal wrote.
func (e *Elector) LeaderAnnotation(name string) string {
	e.mu.Lock()
	defer e.mu.Unlock()
	return e.annotations[name]
}

// annotationsOf returns the annotations of l if someone holds it, nil
// otherwise: what a released Lease still carries is nobody's.
func annotationsOf(l *coordinationv1.Lease) map[string]string {
	if holderOf(l) == "" {
		return nil
	}
	return l.Annotations
}

// PublishedAnnotation lists, comma-separated, the annotation names the
// holder published on the Lease (Config.Annotations, or what
// [Elector.Publish] set), so that the next write removes them: the
// holder's own when it publishes another set, the next holder's even when
// the previous one died without releasing the Lease and the new one does
// not publish the same names.
const PublishedAnnotation = "leader.opkit.dev/published"

// publish removes from l the annotations last published on it (the names
// in its PublishedAnnotation, written by its previous holder or by an
// earlier write of this one) and adds own, recording their names in
// PublishedAnnotation. Annotations that others put on the Lease stay.
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
