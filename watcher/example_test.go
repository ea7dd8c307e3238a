package watcher_test

import (
	"context"
	"fmt"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/schema"
	dynfake "k8s.io/client-go/dynamic/fake"

	"github.com/opkit/opkit"
	"github.com/opkit/opkit/queue"
	"github.com/opkit/opkit/watcher"
)

// The watcher adds every object's key to a queue, then the key of every
// change, with its cause; here for ConfigMaps, a built-in type, over a
// fake client.
func Example() {
	scheme := runtime.NewScheme()
	_ = corev1.AddToScheme(scheme)
	client := dynfake.NewSimpleDynamicClient(scheme, &corev1.ConfigMap{
		ObjectMeta: metav1.ObjectMeta{Namespace: "default", Name: "settings", UID: "u1", ResourceVersion: "7"},
		Data:       map[string]string{"mode": "fast"},
	})

	q := queue.New[opkit.Key](queue.Config[opkit.Cause[*corev1.ConfigMap]]{Merge: (*opkit.Cause[*corev1.ConfigMap]).Merge})
	synced := make(chan struct{})
	w, err := watcher.New(watcher.Config[*corev1.ConfigMap]{
		Client: client,
		Resource: opkit.Resource{
			GroupVersionResource: schema.GroupVersionResource{Version: "v1", Resource: "configmaps"},
			Kind:                 "ConfigMap",
			Namespaced:           true,
		},
		Queue: q,
		OnSync: func(e watcher.SyncEvent) {
			if e.Phase == watcher.SyncFinished {
				close(synced)
			}
		},
		Logger: discard,
	})
	if err != nil {
		fmt.Println(err)
		return
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error)
	go func() { done <- w.Run(ctx) }()
	<-synced

	it, _ := q.Get(ctx)
	fmt.Println(it.Key, "added:", it.Value.Added, it.Value.Sources, it.Priority, it.Value.Object.Data["mode"])
	q.Done(it.Key)
	fmt.Println("healthy:", w.Check() == nil)

	cancel()
	fmt.Println("Run returned:", <-done)
	// Output:
	// default/settings added: true APIServer -1 fast
	// healthy: true
	// Run returned: <nil>
}
