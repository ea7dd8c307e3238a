package trigger_test

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync"
	"testing"
	"testing/synctest"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/apimachinery/pkg/runtime/schema"

	"github.com/opkit/opkit"
	"github.com/opkit/opkit/queue"
	"github.com/opkit/opkit/trigger"
	"github.com/opkit/opkit/trigger/brokertest"
)

// fakeAPI answers reads by name: "a" is in shard 1, "b" in shard 2,
// "secret" is of another kind, "boom" fails, "unserved" is a NotFound that
// names no object (the resource is not served); any other name does not
// exist. It records the keys read.
type fakeAPI struct {
	mu   sync.Mutex
	read []opkit.Key
	objs map[string]*corev1.ConfigMap
}

func newFakeAPI() *fakeAPI {
	secret := labelled("ns", "secret", shard1)
	secret.Kind = "Secret"
	return &fakeAPI{objs: map[string]*corev1.ConfigMap{
		"a":      labelled("ns", "a", shard1),
		"b":      labelled("ns", "b", map[string]string{"shard": "2"}),
		"secret": secret,
	}}
}

func (f *fakeAPI) get(_ context.Context, key opkit.Key) (*corev1.ConfigMap, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.read = append(f.read, key)
	switch key.Name {
	case "boom":
		return nil, apierrors.NewInternalError(errors.New("etcd leader changed"))
	case "unserved":
		return nil, apierrors.NewGenericServerResponse(404, "get", schema.GroupResource{}, "", "404 page not found", 0, true)
	}
	if o, ok := f.objs[key.Name]; ok {
		return o, nil
	}
	return nil, apierrors.NewNotFound(schema.GroupResource{Resource: "configmaps"}, key.Name)
}

func (f *fakeAPI) reads() int {
	f.mu.Lock()
	defer f.mu.Unlock()
	return len(f.read)
}

var errDenied = errors.New("denied by the test's authorizer")

// Intake validates, authorizes, checks the namespace, reads, checks the
// labels and submits, in that order: each refusal stops it before the
// next step, and each is told apart by its error.
func TestIntakeRefusesInOrder(t *testing.T) {
	key := func(ns, name string) opkit.Key { return opkit.Key{Namespace: ns, Name: name} }
	for _, tc := range []struct {
		name       string
		p          trigger.Pointer
		deny       bool
		want       error // errors.Is; nil: see check
		check      func(error) bool
		authorized bool // the authorizer was asked
		read       bool // the object was read
		rejected   bool // counted as a rejected trigger
	}{
		{name: "invalid name", p: trigger.Pointer{Key: key("ns", "a/b")}, want: trigger.ErrInvalid, rejected: true},
		{name: "no namespace", p: trigger.Pointer{Key: key("", "a")}, want: trigger.ErrInvalid, rejected: true},
		{name: "invalid reason", p: trigger.Pointer{Key: key("ns", "a"), Reason: "\xff"}, want: trigger.ErrInvalid, rejected: true},
		{name: "negative delay", p: trigger.Pointer{Key: key("ns", "a"), Delay: -time.Second}, want: trigger.ErrInvalid, rejected: true},
		{name: "invalid type", p: trigger.Pointer{Key: key("ns", "a"), Type: opkit.Type(9)}, want: trigger.ErrInvalid, rejected: true},
		{name: "denied", p: trigger.Pointer{Key: key("ns", "a")}, deny: true, want: errDenied, authorized: true},
		// Who asks is checked before the scope: a caller learns nothing of
		// the controller's namespace without permission.
		{name: "denied, another namespace", p: trigger.Pointer{Key: key("other", "a")}, deny: true, want: errDenied, authorized: true},
		{name: "another namespace", p: trigger.Pointer{Key: key("other", "a")}, want: trigger.ErrOutOfScope, authorized: true, rejected: true},
		{name: "not found", p: trigger.Pointer{Key: key("ns", "gone")}, want: trigger.ErrNotFound, authorized: true, read: true},
		{name: "labels do not match", p: trigger.Pointer{Key: key("ns", "b")}, want: trigger.ErrOutOfScope, authorized: true, read: true, rejected: true},
		{name: "API server failure", p: trigger.Pointer{Key: key("ns", "boom")}, check: apierrors.IsInternalError, authorized: true, read: true},
		{name: "resource not served", p: trigger.Pointer{Key: key("ns", "unserved")}, check: func(err error) bool {
			return apierrors.IsNotFound(err) && strings.Contains(err.Error(), "does not serve configmaps")
		}, authorized: true, read: true},
		// The API server's answer is not the caller's fault: not ErrInvalid.
		{name: "another kind", p: trigger.Pointer{Key: key("ns", "secret")}, check: func(err error) bool { return strings.Contains(err.Error(), "Secret") },
			authorized: true, read: true, rejected: true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			api := newFakeAPI()
			m := newCounting()
			tr, q := newCMTriggerWith(t, trigger.Config[*corev1.ConfigMap]{Get: api.get, Namespace: "ns", Selector: labels.SelectorFromSet(shard1), Metrics: m})
			asked := 0
			authorize := func(_ context.Context, k opkit.Key) (string, error) {
				asked++
				if k != tc.p.Key {
					t.Errorf("authorizer asked about %v, want %v", k, tc.p.Key)
				}
				if tc.deny {
					return "", errDenied
				}
				return "ci", nil
			}
			obj, o, err := intake(tr, context.Background(), tc.p, trigger.IntakeOptions{Authorize: authorize})
			if err == nil || o != 0 {
				t.Fatalf("Intake = (%v, %v, %v), want (_, 0, an error)", obj, o, err)
			}
			// Refused before or by the read: no object. (Refused by Submit,
			// the object read comes back with the error.)
			if obj != nil && tc.name != "another kind" {
				t.Errorf("Intake returned object %v with its error, want none", obj)
			}
			if tc.want != nil && !errors.Is(err, tc.want) || tc.check != nil && !tc.check(err) {
				t.Errorf("Intake error = %v, want one wrapping %v", err, tc.want)
			}
			for _, sentinel := range []error{trigger.ErrInvalid, trigger.ErrOutOfScope, trigger.ErrNotFound, errDenied} {
				if sentinel != tc.want && errors.Is(err, sentinel) {
					t.Errorf("Intake error = %v, which wraps %v too", err, sentinel)
				}
			}
			if (asked > 0) != tc.authorized || asked > 1 {
				t.Errorf("authorizer asked %d times, want asked %v (once)", asked, tc.authorized)
			}
			if n := api.reads(); (n > 0) != tc.read || n > 1 {
				t.Errorf("%d reads, want read %v (once)", n, tc.read)
			}
			if (m.rejected > 0) != tc.rejected {
				t.Errorf("rejected metric = %d, want counted %v", m.rejected, tc.rejected)
			}
			if q.Len() != 0 || len(m.enqueued) != 0 {
				t.Errorf("queue len %d, enqueued %v after a refused Intake; want nothing", q.Len(), m.enqueued)
			}
		})
	}
}

// Intake submits the object it read, with source Operator, the pointer's
// reason, type and delay, and returns that object and the queue's outcome.
func TestIntakeSubmitsTheObjectItRead(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		api := newFakeAPI()
		tr, q := newCMTriggerWith(t, trigger.Config[*corev1.ConfigMap]{Get: api.get, Namespace: "ns", Selector: labels.SelectorFromSet(shard1)})
		ctx := context.Background()
		start := time.Now()
		p := trigger.Pointer{Key: opkit.Key{Namespace: "ns", Name: "a"}, Type: opkit.Added, Reason: "pushed", Delay: time.Minute}
		obj, o, err := intake(tr, ctx, p, trigger.IntakeOptions{}) // nil: no authorization
		if err != nil || o != queue.Queued || obj != api.objs["a"] {
			t.Fatalf("Intake = (%v, %v, %v), want (the object read, Queued, nil)", obj, o, err)
		}
		// Type zero means Modified; a second pointer merges into the entry.
		if _, o, err := intake(tr, ctx, trigger.Pointer{Key: p.Key, Reason: "again"}, trigger.IntakeOptions{}); err != nil || o != queue.Merged {
			t.Fatalf("second Intake = (%v, %v), want (Merged, nil)", o, err)
		}
		it, err := q.Get(ctx)
		if err != nil {
			t.Fatal(err)
		}
		want := operatorCause(api.objs["a"], "again", "pushed")
		want.Added = true
		if got := describe(it.Value); got != describe(want) || it.Value.Object != api.objs["a"] {
			t.Errorf("cause = %s\nwant    %s", got, describe(want))
		}
		if it.Priority != trigger.DefaultPriority {
			t.Errorf("priority = %d, want %d", it.Priority, trigger.DefaultPriority)
		}
		// The merged entry is due at the earlier time: the second, undelayed
		// pointer's.
		if d := time.Since(start); d != 0 {
			t.Errorf("handed out after %v, want at once", d)
		}
		q.Done(it.Key)

		// A Deleted pointer asks for a teardown of the object read.
		if _, o, err := intake(tr, ctx, trigger.Pointer{Key: p.Key, Type: opkit.Deleted}, trigger.IntakeOptions{}); err != nil || o != queue.Queued {
			t.Fatalf("Deleted Intake = (%v, %v), want (Queued, nil)", o, err)
		}
		it, err = q.Get(ctx)
		if err != nil || !it.Value.Teardown || it.Value.Added || it.Value.Object != api.objs["a"] {
			t.Errorf("Deleted Intake queued %s (%v), want a teardown of the object read", describe(it.Value), err)
		}
		q.Done(it.Key)

		// A delay alone is honoured.
		if _, _, err := intake(tr, ctx, trigger.Pointer{Key: p.Key, Delay: time.Minute}, trigger.IntakeOptions{}); err != nil {
			t.Fatal(err)
		}
		start = time.Now()
		if _, err := q.Get(ctx); err != nil || time.Since(start) != time.Minute {
			t.Errorf("delayed entry handed out after %v (%v), want 1m", time.Since(start), err)
		}
	})
}

// A dropped enqueue is no error: Intake returns the queue's outcome, and a
// replica whose intake is closed reads nothing (on one queue, which says
// why it dropped).
func TestIntakeReportsDrops(t *testing.T) {
	api := newFakeAPI()
	tr, q := newCMTriggerWith(t, trigger.Config[*corev1.ConfigMap]{Get: api.get, Router: plainQueue{}})
	key := opkit.Key{Namespace: "ns", Name: "a"}
	q.Suspend()
	obj, o, err := intake(tr, context.Background(), trigger.Pointer{Key: key}, trigger.IntakeOptions{})
	if err != nil || o != queue.DroppedSuspended || obj != nil || len(api.read) != 0 {
		t.Fatalf("Intake while suspended = (%v, %v, %v) after %d reads, want (nil, DroppedSuspended, nil) and no read", obj, o, err, len(api.read))
	}
	q.Resume()
	q.ShutDown()
	if _, o, err := intake(tr, context.Background(), trigger.Pointer{Key: key}, trigger.IntakeOptions{}); err != nil || o != queue.DroppedShutDown {
		t.Fatalf("Intake after shutdown = (%v, %v), want (DroppedShutDown, nil)", o, err)
	}
}

// The authorizer and the read get Intake's context: one deadline bounds
// them together.
func TestIntakePassesItsContextOn(t *testing.T) {
	type ctxKey struct{}
	ctx := context.WithValue(context.Background(), ctxKey{}, "mine")
	var seen []string
	tr, _ := newCMTriggerWith(t, trigger.Config[*corev1.ConfigMap]{Get: func(ctx context.Context, k opkit.Key) (*corev1.ConfigMap, error) {
		seen = append(seen, fmt.Sprint("get:", ctx.Value(ctxKey{})))
		return cm(k.Namespace, k.Name), nil
	}})
	_, _, err := intake(tr, ctx, trigger.Pointer{Key: opkit.Key{Namespace: "ns", Name: "a"}}, trigger.IntakeOptions{Authorize: func(ctx context.Context, _ opkit.Key) (string, error) {
		seen = append(seen, fmt.Sprint("authorize:", ctx.Value(ctxKey{})))
		return "ci", nil
	}})
	if err != nil || strings.Join(seen, ",") != "authorize:mine,get:mine" {
		t.Errorf("Intake = %v, calls %q; want the authorizer, then the read, both with the caller's context", err, seen)
	}
}

// A trigger with neither Get nor Dynamic builds (Enqueue and Submit read
// nothing), but its Intake fails without queueing anything, and the HTTP
// handler and the consumer built on it treat that as a failed read.
func TestIntakeWithoutAGetterFails(t *testing.T) {
	tr, q := newCMTrigger(t, nil)
	_, _, err := intake(tr, context.Background(), trigger.Pointer{Key: opkit.Key{Namespace: "ns", Name: "a"}}, trigger.IntakeOptions{})
	if err == nil || errors.Is(err, trigger.ErrInvalid) || errors.Is(err, trigger.ErrNotFound) || errors.Is(err, trigger.ErrOutOfScope) {
		t.Fatalf("Intake without a getter = %v, want a plain error", err)
	}
	if q.Len() != 0 {
		t.Errorf("queue len = %d, want 0", q.Len())
	}
	if _, err := trigger.NewHandler(tr, trigger.HandlerConfig{InsecureSkipAuth: true, Logger: discard}); err == nil {
		t.Error("NewHandler over a Trigger that cannot read: want an error")
	}
	if _, err := trigger.NewConsumer(trigger.ConsumerConfig[*corev1.ConfigMap]{Trigger: tr, Broker: brokertest.New(), Logger: discard}); err == nil {
		t.Error("NewConsumer over a Trigger that cannot read: want an error")
	}
}
