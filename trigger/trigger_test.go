package trigger_test

import (
	"bytes"
	"context"
	"errors"
	"io"
	"log/slog"
	"math"
	"strconv"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/opkit/opkit"
	"github.com/opkit/opkit/queue"
	"github.com/opkit/opkit/trigger"
)

var discard = slog.New(slog.NewTextHandler(io.Discard, nil))

func TestNewValidatesConfig(t *testing.T) {
	q := newCMQueue()
	for _, tc := range []struct {
		name string
		cfg  trigger.Config[*corev1.ConfigMap]
	}{
		{"no queue", trigger.Config[*corev1.ConfigMap]{Resource: configMaps}},
		{"no resource", trigger.Config[*corev1.ConfigMap]{Queue: q}},
		{"no kind", trigger.Config[*corev1.ConfigMap]{Queue: q, Resource: opkit.Resource{GroupVersionResource: configMaps.GroupVersionResource}}},
		{"nil *queue.Queue", trigger.Config[*corev1.ConfigMap]{Queue: (*cmQueue)(nil), Resource: configMaps}},
		{"priority above int32", trigger.Config[*corev1.ConfigMap]{Queue: q, Resource: configMaps, Priority: int(min(math.MaxInt, int64(math.MaxInt32)+1))}},
		{"priority below int32", trigger.Config[*corev1.ConfigMap]{Queue: q, Resource: configMaps, Priority: int(max(math.MinInt, int64(math.MinInt32)-1))}},
	} {
		if strconv.IntSize == 32 && strings.HasPrefix(tc.name, "priority") {
			continue // an int cannot leave the int32 range
		}
		if _, err := trigger.New(tc.cfg); err == nil {
			t.Errorf("%s: New succeeded, want an error", tc.name)
		}
	}
	tr, err := trigger.New(trigger.Config[*corev1.ConfigMap]{Queue: q, Resource: configMaps})
	if err != nil {
		t.Fatal(err)
	}
	if tr.Priority() != trigger.DefaultPriority {
		t.Errorf("zero Priority gave %d, want DefaultPriority %d", tr.Priority(), trigger.DefaultPriority)
	}
}

func TestEnqueueRejectsBadInput(t *testing.T) {
	ctx := context.Background()
	cancelled, cancel := context.WithCancel(ctx)
	cancel()
	other := cm("ns", "a")
	other.Kind = "Secret"
	otherGroup := cm("ns", "a")
	otherGroup.APIVersion = "demo.opkit.dev/v1"
	for _, tc := range []struct {
		name    string
		ctx     context.Context
		obj     *corev1.ConfigMap
		typ     opkit.Type
		src     opkit.Source
		delay   time.Duration
		retries int
		want    error
	}{
		{"nil object", ctx, nil, opkit.Modified, opkit.Operator, 0, 0, trigger.ErrInvalid},
		{"no name", ctx, cm("ns", ""), opkit.Modified, opkit.Operator, 0, 0, trigger.ErrInvalid},
		{"no namespace for a namespaced resource", ctx, cm("", "a"), opkit.Modified, opkit.Operator, 0, 0, trigger.ErrInvalid},
		{"negative delay", ctx, cm("ns", "a"), opkit.Modified, opkit.Operator, -time.Second, 0, trigger.ErrInvalid},
		{"negative retries", ctx, cm("ns", "a"), opkit.Modified, opkit.Operator, 0, -1, trigger.ErrInvalid},
		{"retries beyond int32", ctx, cm("ns", "a"), opkit.Modified, opkit.Operator, 0, int(min(math.MaxInt, int64(math.MaxInt32)+1)), trigger.ErrInvalid},
		// Keys no object can have: the worker could not read them back, and
		// a Deleted one would reach the reconciler as is.
		{"name with a slash", ctx, cm("ns", "a/b"), opkit.Modified, opkit.Operator, 0, 0, trigger.ErrInvalid},
		{"name climbing out", ctx, cm("ns", "../secrets/x"), opkit.Deleted, opkit.Operator, 0, 0, trigger.ErrInvalid},
		{"name ..", ctx, cm("ns", ".."), opkit.Modified, opkit.Operator, 0, 0, trigger.ErrInvalid},
		{"name with a percent sign", ctx, cm("ns", "a%2Fb"), opkit.Modified, opkit.Operator, 0, 0, trigger.ErrInvalid},
		{"name too long", ctx, cm("ns", strings.Repeat("a", trigger.MaxNameLen+1)), opkit.Modified, opkit.Operator, 0, 0, trigger.ErrInvalid},
		{"namespace not a DNS-1123 label", ctx, cm("Bad_NS", "a"), opkit.Modified, opkit.Operator, 0, 0, trigger.ErrInvalid},
		{"namespace with a slash", ctx, cm("a/b", "a"), opkit.Modified, opkit.Operator, 0, 0, trigger.ErrInvalid},
		{"zero type", ctx, cm("ns", "a"), 0, opkit.Operator, 0, 0, trigger.ErrInvalid},
		{"unknown type", ctx, cm("ns", "a"), opkit.Type(9), opkit.Operator, 0, 0, trigger.ErrInvalid},
		{"zero source", ctx, cm("ns", "a"), opkit.Modified, 0, 0, 0, trigger.ErrInvalid},
		{"unknown source", ctx, cm("ns", "a"), opkit.Modified, opkit.Source(7), 0, 0, trigger.ErrInvalid},
		{"APIServer source is reserved", ctx, cm("ns", "a"), opkit.Modified, opkit.APIServer, 0, 0, trigger.ErrInvalid},
		{"object of another kind", ctx, other, opkit.Modified, opkit.Operator, 0, 0, trigger.ErrInvalid},
		{"object of another group", ctx, otherGroup, opkit.Modified, opkit.Operator, 0, 0, trigger.ErrInvalid},
		{"context already done", cancelled, cm("ns", "a"), opkit.Modified, opkit.Operator, 0, 0, context.Canceled},
	} {
		if strconv.IntSize == 32 && tc.name == "retries beyond int32" {
			continue // an int cannot leave the int32 range
		}
		t.Run(tc.name, func(t *testing.T) {
			m := newCounting()
			var logs bytes.Buffer
			tr, q := newCMTriggerWith(t, trigger.Config[*corev1.ConfigMap]{Metrics: m, Logger: slog.New(slog.NewTextHandler(&logs, nil))})
			ok, err := tr.Enqueue(tc.ctx, tc.obj, tc.typ, tc.src, tc.delay, tc.retries)
			if ok || !errors.Is(err, tc.want) {
				t.Fatalf("Enqueue = (%v, %v), want (false, error wrapping %v)", ok, err, tc.want)
			}
			if !strings.Contains(logs.String(), `level=WARN msg="trigger rejected"`) {
				t.Errorf("no Warn record of the rejection; logs:\n%s", logs.String())
			}
			if q.Len() != 0 {
				t.Errorf("queue holds %d entries after a refused Enqueue, want 0", q.Len())
			}
			if m.rejected != 1 || len(m.enqueued) != 0 {
				t.Errorf("metrics: rejected=%d enqueued=%v, want 1 and none", m.rejected, m.enqueued)
			}
		})
	}
}

func TestEnqueueRejectsNamespaceForClusterScoped(t *testing.T) {
	q := queue.New[opkit.Key](queue.Config[opkit.Cause[*Widget]]{Merge: (*opkit.Cause[*Widget]).Merge})
	tr, err := trigger.New(trigger.Config[*Widget]{Queue: q, Resource: widgets, Logger: discard})
	if err != nil {
		t.Fatal(err)
	}
	w := &Widget{ObjectMeta: metav1.ObjectMeta{Namespace: "ns", Name: "w"}}
	if ok, err := tr.Enqueue(context.Background(), w, opkit.Modified, opkit.Operator, 0, 0); ok || !errors.Is(err, trigger.ErrInvalid) {
		t.Fatalf("Enqueue of a namespaced key for a cluster-scoped resource = (%v, %v), want ErrInvalid", ok, err)
	}
	// Without TypeMeta the kind is not checked; the same object without
	// a namespace is fine.
	w.Namespace = ""
	if ok, err := tr.Enqueue(context.Background(), w, opkit.Modified, opkit.Operator, 0, 0); !ok || err != nil {
		t.Fatalf("Enqueue = (%v, %v), want (true, nil)", ok, err)
	}
	// A kind without apiVersion says nothing about the group: the kind is
	// checked, the group is not.
	w.TypeMeta = metav1.TypeMeta{Kind: widgets.Kind}
	if ok, err := tr.Enqueue(context.Background(), w, opkit.Modified, opkit.Operator, 0, 0); !ok || err != nil {
		t.Fatalf("Enqueue with kind %q and no apiVersion = (%v, %v), want (true, nil)", w.Kind, ok, err)
	}
	w.TypeMeta = metav1.TypeMeta{APIVersion: "v1", Kind: widgets.Kind}
	if ok, err := tr.Enqueue(context.Background(), w, opkit.Modified, opkit.Operator, 0, 0); ok || !errors.Is(err, trigger.ErrInvalid) {
		t.Fatalf("Enqueue with apiVersion v1 (core group) = (%v, %v), want ErrInvalid", ok, err)
	}
}

// Names the API server holds for some resource are accepted although
// they are not DNS-1123 subdomains (RBAC roles, for one); the API server
// answers for the rest.
func TestEnqueueAcceptsPathSegmentNames(t *testing.T) {
	for _, name := range []string{"system:aggregate-to-admin", "Upper_Case", "a.b", strings.Repeat("a", trigger.MaxNameLen)} {
		tr, q := newCMTrigger(t, nil)
		if ok, err := tr.Enqueue(context.Background(), cm("ns", name), opkit.Modified, opkit.Operator, 0, 0); !ok || err != nil {
			t.Errorf("Enqueue(ns/%.30s) = (%v, %v), want (true, nil)", name, ok, err)
		}
		if q.Len() != 1 {
			t.Errorf("queue holds %d entries, want 1", q.Len())
		}
	}
}

func TestEnqueueSchedulesWithTriggerPriorityAndReason(t *testing.T) {
	m := newCounting()
	tr, q := newCMTrigger(t, m)
	ctx := context.Background()
	// A backlog of watch entries (priority 0) and relist entries (-1).
	for i := range 50 {
		q.Add(opkit.Key{Namespace: "ns", Name: "watch-" + string(rune('a'+i%26)) + strings.Repeat("x", i/26)}, opkit.Cause[*corev1.ConfigMap]{Sources: opkit.Sources(opkit.APIServer)}, queue.AddOptions{Priority: i%2 - 1})
	}
	o, err := tr.Submit(ctx, trigger.Request[*corev1.ConfigMap]{Object: cm("ns", "hot"), Type: opkit.Modified, Source: opkit.Operator, Retries: 2, Reason: "deployed v2"})
	if err != nil || o != queue.Queued {
		t.Fatalf("Submit = (%v, %v), want (Queued, nil)", o, err)
	}
	it, err := q.Get(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if it.Key != (opkit.Key{Namespace: "ns", Name: "hot"}) {
		t.Fatalf("first item = %v, want the trigger ahead of the backlog", it.Key)
	}
	if it.Priority != trigger.DefaultPriority {
		t.Errorf("item priority=%d, want %d", it.Priority, trigger.DefaultPriority)
	}
	// A Modified trigger: source Operator, its reason, neither Added nor
	// Teardown, and its retries seeding the key's count.
	want := operatorCause(cm("ns", "hot"), "deployed v2")
	want.Retries = 2
	if got := describe(it.Value); got != describe(want) {
		t.Errorf("cause = %s\nwant    %s", got, describe(want))
	}
	q.Done(it.Key)
	// A second trigger for a pending key merges.
	if ok, err := tr.Enqueue(ctx, cm("ns", "watch-a"), opkit.Modified, opkit.Operator, 0, 0); !ok || err != nil {
		t.Fatalf("Enqueue = (%v, %v)", ok, err)
	}
	if m.enqueued[queue.Queued] != 1 || m.enqueued[queue.Merged] != 1 {
		t.Errorf("enqueued metrics = %v, want one Queued and one Merged", m.enqueued)
	}
	// The merged entry holds the join: the watch's source and the
	// trigger's, and the trigger's object (the watch entry carried none).
	for {
		it, err := q.Get(ctx)
		if err != nil {
			t.Fatal(err)
		}
		q.Done(it.Key)
		if it.Key.Name != "watch-a" {
			continue
		}
		if !it.Value.Sources.Has(opkit.APIServer) || !it.Value.Sources.Has(opkit.Operator) || it.Value.Object == nil || it.Value.Object.Name != "watch-a" {
			t.Errorf("merged cause = %s, want sources APIServer|Operator and the trigger's object", describe(it.Value))
		}
		break
	}
}

// The trigger's type becomes the cause's marks: Added sets Added, Deleted
// sets Teardown, Modified neither.
func TestSubmitTypeBecomesTheCauseMarks(t *testing.T) {
	for _, tc := range []struct {
		typ             opkit.Type
		added, teardown bool
	}{
		{opkit.Modified, false, false},
		{opkit.Added, true, false},
		{opkit.Deleted, false, true},
	} {
		tr, q := newCMTrigger(t, nil)
		o, err := tr.Submit(context.Background(), trigger.Request[*corev1.ConfigMap]{Object: cm("ns", "a"), Type: tc.typ, Source: opkit.Operator, Reason: "why"})
		if err != nil || o != queue.Queued {
			t.Fatalf("%v: Submit = (%v, %v), want (Queued, nil)", tc.typ, o, err)
		}
		it, err := q.Get(context.Background())
		if err != nil {
			t.Fatal(err)
		}
		want := operatorCause(cm("ns", "a"), "why")
		want.Added, want.Teardown = tc.added, tc.teardown
		if got := describe(it.Value); got != describe(want) {
			t.Errorf("%v: cause = %s\nwant        %s", tc.typ, got, describe(want))
		}
	}
}

// Triggers for a pending key merge as a join, whatever their order: both
// reasons (sorted), the newest object by resourceVersion, the highest
// retries, Added and Teardown or-ed.
func TestSubmitsForAPendingKeyJoin(t *testing.T) {
	older, newer := cm("ns", "a"), cm("ns", "a")
	older.ResourceVersion, newer.ResourceVersion = "9", "10" // 10 is newer: a longer number
	reqs := []trigger.Request[*corev1.ConfigMap]{
		{Object: newer, Type: opkit.Modified, Source: opkit.Operator, Reason: "zeta", Retries: 1},
		{Object: older, Type: opkit.Added, Source: opkit.Operator, Reason: "alpha", Retries: 3},
		{Object: older, Type: opkit.Modified, Source: opkit.Operator, Reason: "zeta"},
	}
	want := operatorCause(newer, "alpha", "zeta")
	want.Added, want.Retries = true, 3
	for _, order := range [][]int{{0, 1, 2}, {2, 1, 0}, {1, 2, 0}} {
		tr, q := newCMTrigger(t, nil)
		for n, i := range order {
			o, err := tr.Submit(context.Background(), reqs[i])
			if wantO := map[bool]queue.Outcome{true: queue.Queued, false: queue.Merged}[n == 0]; err != nil || o != wantO {
				t.Fatalf("order %v, Submit %d = (%v, %v), want (%v, nil)", order, i, o, err, wantO)
			}
		}
		if q.Len() != 1 {
			t.Fatalf("order %v: queue len %d, want one entry", order, q.Len())
		}
		it, err := q.Get(context.Background())
		if err != nil {
			t.Fatal(err)
		}
		if got := describe(it.Value); got != describe(want) || it.Value.Object != newer {
			t.Errorf("order %v: cause = %s\nwant             %s", order, got, describe(want))
		}
	}
}

func TestEnqueueDelayIsHonoured(t *testing.T) {
	tr, q := newCMTrigger(t, nil)
	if ok, err := tr.Enqueue(context.Background(), cm("ns", "later"), opkit.Modified, opkit.Operator, time.Hour, 0); !ok || err != nil {
		t.Fatalf("Enqueue = (%v, %v)", ok, err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	if it, err := q.Get(ctx); err == nil {
		t.Fatalf("Get returned %v before its delay", it.Key)
	}
}

func TestEnqueueReportsDrops(t *testing.T) {
	m := newCounting()
	tr, q := newCMTriggerWith(t, trigger.Config[*corev1.ConfigMap]{Metrics: m, Router: plainQueue{}})
	ctx := context.Background()

	q.Suspend()
	ok, err := tr.Enqueue(ctx, cm("ns", "a"), opkit.Modified, opkit.Operator, 0, 0)
	if ok || err != nil {
		t.Fatalf("Enqueue while suspended = (%v, %v), want (false, nil)", ok, err)
	}
	o, err := tr.Submit(ctx, trigger.Request[*corev1.ConfigMap]{Object: cm("ns", "a"), Type: opkit.Modified, Source: opkit.Operator})
	if o != queue.DroppedSuspended || err != nil {
		t.Fatalf("Submit while suspended = (%v, %v), want DroppedSuspended", o, err)
	}
	q.Resume()
	q.ShutDown()
	o, err = tr.Submit(ctx, trigger.Request[*corev1.ConfigMap]{Object: cm("ns", "a"), Type: opkit.Modified, Source: opkit.Operator})
	if o != queue.DroppedShutDown || err != nil {
		t.Fatalf("Submit after shutdown = (%v, %v), want DroppedShutDown", o, err)
	}
	if m.enqueued[queue.DroppedSuspended] != 2 || m.enqueued[queue.DroppedShutDown] != 1 {
		t.Errorf("metrics = %v", m.enqueued)
	}
}

func TestSubmitRejectsOversizedReason(t *testing.T) {
	tr, _ := newCMTrigger(t, nil)
	for _, reason := range []string{strings.Repeat("x", trigger.MaxReasonLen+1), "bad \xff utf8"} {
		_, err := tr.Submit(context.Background(), trigger.Request[*corev1.ConfigMap]{Object: cm("ns", "a"), Type: opkit.Modified, Source: opkit.Operator, Reason: reason})
		if !errors.Is(err, trigger.ErrInvalid) {
			t.Errorf("reason %.20q: err = %v, want ErrInvalid", reason, err)
		}
	}
}

func TestConfiguredPriority(t *testing.T) {
	tr, q := newCMTriggerWith(t, trigger.Config[*corev1.ConfigMap]{Priority: -5})
	q.Add(opkit.Key{Namespace: "ns", Name: "watch"}, opkit.Cause[*corev1.ConfigMap]{Sources: opkit.Sources(opkit.APIServer)}, queue.AddOptions{})
	if ok, _ := tr.Enqueue(context.Background(), cm("ns", "low"), opkit.Modified, opkit.Operator, 0, 0); !ok {
		t.Fatal("not scheduled")
	}
	it, _ := q.Get(context.Background())
	if it.Key.Name != "watch" {
		t.Errorf("first = %v, want the watch entry ahead of a priority -5 trigger", it.Key)
	}
}

// Pointer.Check takes the reasons every trigger path takes, and the
// pointers without a valid name, namespace, type or delay are invalid.
func TestPointerCheck(t *testing.T) {
	for _, tc := range []struct {
		reason string
		ok     bool
	}{
		{"", true},
		{"image pushed: <v1.2> & more", true},
		{strings.Repeat("r", trigger.MaxReasonLen), true},
		{strings.Repeat("r", trigger.MaxReasonLen+1), false},
		{"\xff", false},
	} {
		err := trigger.Pointer{Key: opkit.Key{Namespace: "ns", Name: "a"}, Reason: tc.reason}.Check()
		if (err == nil) != tc.ok || err != nil && !errors.Is(err, trigger.ErrInvalid) {
			t.Errorf("Check of reason %.20q = %v, want ok %v (or ErrInvalid)", tc.reason, err, tc.ok)
		}
	}
	for _, p := range []trigger.Pointer{
		{Key: opkit.Key{Namespace: "ns"}},
		{Key: opkit.Key{Namespace: "ns", Name: ".."}},
		{Key: opkit.Key{Namespace: "ns", Name: strings.Repeat("a", trigger.MaxNameLen+1)}},
		{Key: opkit.Key{Namespace: "Not_A_Label", Name: "a"}},
		{Key: opkit.Key{Name: "a"}, Type: 9},
		{Key: opkit.Key{Name: "a"}, Delay: -time.Second},
	} {
		if err := p.Check(); !errors.Is(err, trigger.ErrInvalid) {
			t.Errorf("Check(%+v) = %v, want ErrInvalid", p, err)
		}
	}
	if err := (trigger.Pointer{Key: opkit.Key{Name: "system:aggregate-to-admin"}, Type: opkit.Deleted}).Check(); err != nil {
		t.Errorf("Check of a valid cluster-scoped pointer = %v", err)
	}
}
