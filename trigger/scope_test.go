package trigger_test

import (
	"context"
	"errors"
	"net/http"
	"strings"
	"sync"
	"testing"
	"testing/synctest"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/labels"

	"github.com/opkit/opkit"
	"github.com/opkit/opkit/trigger"
)

// The specification here: a trigger reaches only what its controller
// watches. Scoped to namespace "ns" and label shard=1, it refuses another
// namespace, an object Intake just read whose labels do not match, and a
// Deleted trigger's object whose labels do not match, with ErrOutOfScope
// (not ErrInvalid: the request is well formed, it is for another
// controller). Labels of a caller's copy submitted for another type are
// left to the controller, which checks the object it reconciles. The HTTP
// handler answers 404; the consumer hands the message back (never
// acknowledges it: another controller sharing the subscription may own
// it); neither reads an object from another namespace.

var shard1 = map[string]string{"shard": "1"}

func labelled(ns, name string, l map[string]string) *corev1.ConfigMap {
	o := cm(ns, name)
	o.Labels = l
	return o
}

// newScopedTrigger returns a trigger scoped to namespace "ns" and label
// shard=1, reading through get (nil: none).
func newScopedTrigger(t *testing.T, get func(context.Context, opkit.Key) (*corev1.ConfigMap, error)) (*trigger.Trigger[*corev1.ConfigMap], *cmQueue) {
	t.Helper()
	return newCMTriggerWith(t, trigger.Config[*corev1.ConfigMap]{Get: get, Namespace: "ns", Selector: labels.SelectorFromSet(shard1)})
}

func TestTriggerRefusesObjectsOutsideItsScope(t *testing.T) {
	tr, q := newScopedTrigger(t, nil)
	accepted := 0
	for _, tc := range []struct {
		name  string
		obj   *corev1.ConfigMap
		typ   opkit.Type
		scope bool // refused as out of scope
	}{
		{"in the namespace, labels match", labelled("ns", "a", shard1), opkit.Modified, false},
		{"another namespace", labelled("other", "a", shard1), opkit.Modified, true},
		{"another namespace, a teardown", labelled("other", "a", shard1), opkit.Deleted, true},
		{"a teardown, labels do not match", labelled("ns", "b", map[string]string{"shard": "2"}), opkit.Deleted, true},
		{"a teardown, no labels", cm("ns", "c"), opkit.Deleted, true},
		{"a teardown, labels match", labelled("ns", "f", shard1), opkit.Deleted, false},
		{"a caller's copy: its labels may be stale", labelled("ns", "d", map[string]string{"shard": "2"}), opkit.Modified, false},
		{"a caller's key-only copy", cm("ns", "e"), opkit.Added, false},
	} {
		o, err := tr.Submit(context.Background(), trigger.Request[*corev1.ConfigMap]{Object: tc.obj, Type: tc.typ, Source: opkit.Operator})
		if tc.scope != errors.Is(err, trigger.ErrOutOfScope) || errors.Is(err, trigger.ErrInvalid) || o.Accepted() == tc.scope {
			t.Errorf("%s: Submit = %v, %v; want out of scope %v (and never ErrInvalid)", tc.name, o, err, tc.scope)
		}
		if o.Accepted() {
			accepted++
		}
	}
	if q.Len() != accepted || accepted != 4 {
		t.Errorf("queue len %d, %d accepted; want 4", q.Len(), accepted)
	}
}

// Intake checks the namespace on the key, before it reads, and the labels
// on the object it read, whatever the trigger's type.
func TestIntakeRefusesKeysAndObjectsOutsideItsScope(t *testing.T) {
	var read []opkit.Key
	get := func(_ context.Context, key opkit.Key) (*corev1.ConfigMap, error) {
		read = append(read, key)
		switch key.Name {
		case "a":
			return labelled(key.Namespace, key.Name, shard1), nil
		case "b":
			return labelled(key.Namespace, key.Name, map[string]string{"shard": "2"}), nil
		}
		return cm(key.Namespace, key.Name), nil // no labels
	}
	tr, q := newScopedTrigger(t, get)
	for _, tc := range []struct {
		ns, name string
		typ      opkit.Type
		scope    bool
		read     bool
	}{
		{"ns", "a", opkit.Modified, false, true},
		{"other", "a", opkit.Modified, true, false},
		{"ns", "b", opkit.Modified, true, true},
		{"ns", "c", opkit.Added, true, true},
		{"ns", "b", opkit.Deleted, true, true},
	} {
		read = nil
		key := opkit.Key{Namespace: tc.ns, Name: tc.name}
		_, o, err := intake(tr, context.Background(), trigger.Pointer{Key: key, Type: tc.typ}, trigger.IntakeOptions{})
		if tc.scope != errors.Is(err, trigger.ErrOutOfScope) || errors.Is(err, trigger.ErrInvalid) || o.Accepted() == tc.scope {
			t.Errorf("%v (%v): Intake = %v, %v; want out of scope %v (and never ErrInvalid)", key, tc.typ, o, err, tc.scope)
		}
		if (len(read) == 1) != tc.read || len(read) > 1 {
			t.Errorf("%v (%v): read %v, want read %v", key, tc.typ, read, tc.read)
		}
	}
	if q.Len() != 1 {
		t.Errorf("queue len %d, want only ns/a", q.Len())
	}
}

func TestTriggerScopeConfigIsValidated(t *testing.T) {
	q := newCMQueue()
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
	e := newHandlerEnvWith(t, func(c *trigger.Config[*corev1.ConfigMap]) {
		c.Namespace, c.Selector = "ns", labels.SelectorFromSet(shard1)
	}, nil)
	q := e.q
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

func TestConsumerHandsBackMessagesOutsideTheScope(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
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
		e := newConsumerEnvWith(t, func(c *trigger.Config[*corev1.ConfigMap]) {
			c.Get, c.Namespace, c.Selector = get, "ns", labels.SelectorFromSet(shard1)
		}, nil)
		q := e.q
		other := e.b.Publish([]byte(`{"namespace":"other","name":"a"}`))
		unlabelled := e.b.Publish([]byte(`{"namespace":"ns","name":"b"}`))
		inScope := e.b.Publish([]byte(`{"namespace":"ns","name":"a"}`))
		stop := e.run(t)
		synctest.Wait()
		stop()
		for id, want := range map[uint64]string{other: "Nack", unlabelled: "Nack", inScope: "Ack"} {
			if got := ops(e.b.Events(id)); !strings.HasPrefix(got, want) {
				t.Errorf("message %d settled %q, want %s", id, got, want)
			}
		}
		if e.m.nacked["OutOfScope"] < 2 || e.m.acked["Scheduled"] != 1 || q.Len() != 1 || len(deadLetters(e.b)) != 0 {
			t.Errorf("nacked %v, acked %v, queue len %d, dead letters %d; want the 2 out of scope handed back, 1 scheduled, none dead",
				e.m.nacked, e.m.acked, q.Len(), len(deadLetters(e.b)))
		}
		for _, k := range read {
			if k.Namespace != "ns" {
				t.Errorf("read %v: a key in another namespace", k)
			}
		}
	})
}
