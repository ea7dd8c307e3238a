package trigger_test

import (
	"context"
	"errors"
	"net/http"
	"sync"
	"testing"
	"testing/synctest"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/labels"

	"github.com/opkit/opkit"
	"github.com/opkit/opkit/queue"
	"github.com/opkit/opkit/trigger"
)

// The specification here: a trigger reaches only what its controller
// watches. Scoped to namespace "ns" and label shard=1, it refuses anything
// else with ErrOutOfScope (not ErrInvalid: the request is well formed, it
// is for another controller); the HTTP handler answers 404 and the
// consumer acknowledges, and neither reads an object from another
// namespace.

var shard1 = map[string]string{"shard": "1"}

func labelled(ns, name string, l map[string]string) *corev1.ConfigMap {
	o := cm(ns, name)
	o.Labels = l
	return o
}

func newScopedTrigger(t *testing.T) (*trigger.Trigger[*corev1.ConfigMap], *cmQueue) {
	t.Helper()
	q := queue.New[opkit.Key](queue.Config[opkit.Event[*corev1.ConfigMap]]{})
	tr, err := trigger.New(trigger.Config[*corev1.ConfigMap]{Queue: q, Resource: configMaps, Namespace: "ns",
		Selector: labels.SelectorFromSet(shard1), Logger: discard})
	if err != nil {
		t.Fatal(err)
	}
	return tr, q
}

func TestTriggerRefusesObjectsOutsideItsScope(t *testing.T) {
	tr, q := newScopedTrigger(t)
	for _, tc := range []struct {
		name  string
		obj   *corev1.ConfigMap
		scope bool // refused as out of scope
	}{
		{"in the namespace, labels match", labelled("ns", "a", shard1), false},
		{"another namespace", labelled("other", "a", shard1), true},
		{"labels do not match", labelled("ns", "b", map[string]string{"shard": "2"}), true},
		{"no labels", cm("ns", "c"), true},
	} {
		ok, err := tr.Enqueue(context.Background(), tc.obj, opkit.Modified, opkit.Operator, 0, 0)
		if tc.scope != errors.Is(err, trigger.ErrOutOfScope) || errors.Is(err, trigger.ErrInvalid) || ok == tc.scope {
			t.Errorf("%s: Enqueue = %v, %v; want out of scope %v (and never ErrInvalid)", tc.name, ok, err, tc.scope)
		}
	}
	if q.Len() != 1 {
		t.Errorf("queue len %d, want 1 (the object in scope)", q.Len())
	}
	if err := tr.CheckScope(opkit.Key{Namespace: "other", Name: "a"}); !errors.Is(err, trigger.ErrOutOfScope) {
		t.Errorf("CheckScope(other/a) = %v", err)
	}
	if err := tr.CheckScope(opkit.Key{Namespace: "ns", Name: "a"}); err != nil {
		t.Errorf("CheckScope(ns/a) = %v", err)
	}
}

func TestTriggerScopeConfigIsValidated(t *testing.T) {
	q := queue.New[opkit.Key](queue.Config[opkit.Event[*corev1.ConfigMap]]{})
	cluster := configMaps
	cluster.Namespaced = false
	for _, cfg := range []trigger.Config[*corev1.ConfigMap]{
		{Queue: q, Resource: cluster, Namespace: "ns"},
		{Queue: q, Resource: configMaps, Namespace: "Not_A_Namespace"},
	} {
		if _, err := trigger.New(cfg); err == nil {
			t.Errorf("New(namespace %q, namespaced %v): no error", cfg.Namespace, cfg.Resource.Namespaced)
		}
	}
}

func TestHandler404OutsideTheScope(t *testing.T) {
	tr, q := newScopedTrigger(t)
	e := newHandlerEnv(t, func(c *trigger.HandlerConfig[*corev1.ConfigMap]) { c.Trigger = tr })
	// Another namespace: refused before the object is read.
	wantStatus(t, post(e, "/reconcile/other/a"), http.StatusNotFound, "NotFound")
	if n := len(e.dyn.Actions()); n != 0 {
		t.Errorf("%d API calls for a key in another namespace, want 0", n)
	}
	// ns/a exists without the shard label: refused once read.
	st := wantStatus(t, post(e, "/reconcile/ns/a"), http.StatusNotFound, "NotFound")
	if q.Len() != 0 || len(e.dyn.Actions()) != 1 {
		t.Errorf("queue len %d, API calls %d (%q); want nothing queued after one read", q.Len(), len(e.dyn.Actions()), st.Message)
	}
}

func TestConsumerAcksMessagesOutsideTheScope(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		tr, q := newScopedTrigger(t)
		var mu sync.Mutex
		var read []opkit.Key
		get := func(_ context.Context, key opkit.Key) (*corev1.ConfigMap, error) {
			mu.Lock()
			read = append(read, key)
			mu.Unlock()
			if key.Name == "a" {
				return labelled(key.Namespace, key.Name, shard1), nil
			}
			return cm(key.Namespace, key.Name), nil // no shard label
		}
		e := newConsumerEnv(t, func(c *trigger.ConsumerConfig[*corev1.ConfigMap]) { c.Trigger, c.Get = tr, get })
		other := e.b.Publish([]byte(`{"namespace":"other","name":"a"}`))
		unlabelled := e.b.Publish([]byte(`{"namespace":"ns","name":"b"}`))
		inScope := e.b.Publish([]byte(`{"namespace":"ns","name":"a"}`))
		stop := e.run(t)
		synctest.Wait()
		stop()
		for _, id := range []uint64{other, unlabelled, inScope} {
			if got := ops(e.b.EventsFor(id)); got != "Ack" {
				t.Errorf("message %d settled %q, want Ack", id, got)
			}
		}
		if e.m.acked[trigger.AckOutOfScope] != 2 || e.m.acked[trigger.AckScheduled] != 1 || q.Len() != 1 || len(e.b.DeadLetters()) != 0 {
			t.Errorf("acked %v, queue len %d, dead letters %d; want 2 out of scope, 1 scheduled, none dead", e.m.acked, q.Len(), len(e.b.DeadLetters()))
		}
		if len(read) != 2 || read[0].Namespace != "ns" || read[1].Namespace != "ns" {
			t.Errorf("read %v; want only the two keys in namespace ns", read)
		}
	})
}
