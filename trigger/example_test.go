package trigger_test

import (
	"context"
	"fmt"
	"net/http"
	"net/http/httptest"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/opkit/opkit"
	"github.com/opkit/opkit/queue"
	"github.com/opkit/opkit/trigger"
	"github.com/opkit/opkit/trigger/brokertest"
)

// A trigger bound to a controller's queue: scheduled, dropped, refused.
func ExampleTrigger_Enqueue() {
	q := queue.New[opkit.Key](queue.Config[opkit.Cause[*corev1.ConfigMap]]{Merge: (*opkit.Cause[*corev1.ConfigMap]).Merge})
	t, err := trigger.New(trigger.Config[*corev1.ConfigMap]{Queue: q, Resource: configMaps, Logger: discard})
	if err != nil {
		panic(err)
	}
	ctx := context.Background()
	obj := &corev1.ConfigMap{ObjectMeta: metav1.ObjectMeta{Namespace: "demo", Name: "settings"}}

	ok, err := t.Enqueue(ctx, obj, opkit.Modified, opkit.Operator, 0, 0)
	fmt.Println("leader:", ok, err)

	q.Suspend() // what the leader elector does on a follower
	ok, err = t.Enqueue(ctx, obj, opkit.Modified, opkit.Operator, 0, 0)
	fmt.Println("follower:", ok, err)
	o, _ := t.Submit(ctx, trigger.Request[*corev1.ConfigMap]{Object: obj, Type: opkit.Modified, Source: opkit.Operator})
	fmt.Println("why:", o)

	_, err = t.Enqueue(ctx, obj, opkit.Modified, opkit.APIServer, 0, 0)
	fmt.Println("APIServer source:", err != nil)
	// Output:
	// leader: true <nil>
	// follower: false <nil>
	// why: DroppedSuspended
	// APIServer source: true
}

// The HTTP endpoint. In production, leave Authenticator nil and set
// Reviews to the operator's clientset: callers then need a token for the
// "opkit-trigger" audience and RBAC permission to update the object.
func ExampleNewHandler() {
	q := queue.New[opkit.Key](queue.Config[opkit.Cause[*corev1.ConfigMap]]{Merge: (*opkit.Cause[*corev1.ConfigMap]).Merge})
	t, _ := trigger.New(trigger.Config[*corev1.ConfigMap]{
		Queue:    q,
		Resource: configMaps,
		// Get stands in for the API server here; by default the trigger
		// reads through Dynamic.
		Get: func(_ context.Context, k opkit.Key) (*corev1.ConfigMap, error) {
			return &corev1.ConfigMap{ObjectMeta: metav1.ObjectMeta{Namespace: k.Namespace, Name: k.Name, UID: "1234", ResourceVersion: "42"}}, nil
		},
		Logger: discard,
	})
	h, err := trigger.NewHandler(t, trigger.HandlerConfig{
		InsecureSkipAuth: true, // for the example only
		Logger:           discard,
	})
	if err != nil {
		panic(err)
	}
	w := httptest.NewRecorder()
	h.ServeHTTP(w, httptest.NewRequest(http.MethodPost, "/reconcile/demo/settings?reason=deployed", nil))
	fmt.Print(w.Code, " ", w.Body)
	// Output:
	// 202 {"key":"demo/settings","namespace":"demo","name":"settings","uid":"1234","resourceVersion":"42","delay":"0s","outcome":"Queued"}
}

// A message-bus consumer over the in-memory broker; a real deployment
// plugs in an adapter for its broker (the reference operator has one for
// NATS JetStream).
func ExampleNewConsumer() {
	q := queue.New[opkit.Key](queue.Config[opkit.Cause[*corev1.ConfigMap]]{Merge: (*opkit.Cause[*corev1.ConfigMap]).Merge})
	t, _ := trigger.New(trigger.Config[*corev1.ConfigMap]{
		Queue:    q,
		Resource: configMaps,
		Get: func(_ context.Context, k opkit.Key) (*corev1.ConfigMap, error) {
			return &corev1.ConfigMap{ObjectMeta: metav1.ObjectMeta{Namespace: k.Namespace, Name: k.Name}}, nil
		},
		Logger: discard,
	})
	b := brokertest.New()
	c, err := trigger.NewConsumer(trigger.ConsumerConfig[*corev1.ConfigMap]{
		Broker:  b,
		Trigger: t,
		Logger:  discard,
	})
	if err != nil {
		panic(err)
	}
	b.Publish([]byte(`{"namespace":"demo","name":"settings","reason":"config pushed"}`))

	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	go func() { _ = c.Run(ctx) }() // in an operator: alongside the controller, until shutdown
	it, _ := q.Get(ctx)            // a worker picks up the reconcile
	fmt.Println("reconcile", it.Key, "because", it.Value.Reasons)
	// Output:
	// reconcile demo/settings because [config pushed]
}
