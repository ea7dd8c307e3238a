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
	"github.com/opkit/opkit/queue"
	"github.com/opkit/opkit/trigger"
)

// The specification here: a trigger reaches only what its controller
// watches. Scoped to namespace "ns" and label shard=1, it refuses another
// namespace, and an object just read (Fetched) whose labels do not match,
// with ErrOutOfScope (not ErrInvalid: the request is well formed, it is
// for another controller). Labels of a copy not just read are left to the
// controller, which checks the object it reads for the reconcile. The HTTP
// handler answers 404; the consumer hands the message back (never
// acknowledges it: another controller sharing the subscription may own
// it); neither reads an object from another namespace.

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
	accepted := 0
	for _, tc := range []struct {
		name    string
		obj     *corev1.ConfigMap
		fetched bool
		scope   bool // refused as out of scope
	}{
		{"in the namespace, labels match", labelled("ns", "a", shard1), true, false},
		{"another namespace", labelled("other", "a", shard1), false, true},
		{"another namespace, just read", labelled("other", "a", shard1), true, true},
		{"just read, labels do not match", labelled("ns", "b", map[string]string{"shard": "2"}), true, true},
		{"just read, no labels", cm("ns", "c"), true, true},
		{"a caller's copy: its labels may be stale", labelled("ns", "d", map[string]string{"shard": "2"}), false, false},
		{"a caller's key-only copy", cm("ns", "e"), false, false},
	} {
		o, err := tr.Submit(context.Background(), trigger.Request[*corev1.ConfigMap]{Object: tc.obj, Type: opkit.Modified, Source: opkit.Operator, Fetched: tc.fetched})
		if tc.scope != errors.Is(err, trigger.ErrOutOfScope) || errors.Is(err, trigger.ErrInvalid) || o.Accepted() == tc.scope {
			t.Errorf("%s: Submit = %v, %v; want out of scope %v (and never ErrInvalid)", tc.name, o, err, tc.scope)
		}
		if o.Accepted() {
			accepted++
		}
	}
	if q.Len() != accepted || accepted != 3 {
		t.Errorf("queue len %d, %d accepted; want 3", q.Len(), accepted)
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

func TestConsumerHandsBackMessagesOutsideTheScope(t *testing.T) {
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
		for id, want := range map[uint64]string{other: "Nack", unlabelled: "Nack", inScope: "Ack"} {
			if got := ops(e.b.EventsFor(id)); !strings.HasPrefix(got, want) {
				t.Errorf("message %d settled %q, want %s", id, got, want)
			}
		}
		if e.m.nacked[trigger.NackOutOfScope] < 2 || e.m.acked[trigger.AckScheduled] != 1 || q.Len() != 1 || len(e.b.DeadLetters()) != 0 {
			t.Errorf("nacked %v, acked %v, queue len %d, dead letters %d; want the 2 out of scope handed back, 1 scheduled, none dead",
				e.m.nacked, e.m.acked, q.Len(), len(e.b.DeadLetters()))
		}
		for _, k := range read {
			if k.Namespace != "ns" {
				t.Errorf("read %v: a key in another namespace", k)
			}
		}
	})
}
