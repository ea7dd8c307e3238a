package convergencebench

import (
	"fmt"
	"slices"
	"sync"
	"time"

	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/client-go/dynamic"
	"k8s.io/client-go/dynamic/dynamicinformer"
	"k8s.io/client-go/tools/cache"
)

// tracker follows the Widgets of one namespace through a watch of the
// benchmark's own (an informer on its unthrottled client), and notes when
// each one's status.observedGeneration last changed: the moment the SDK's
// status write reached the API server, give or take the watch's delivery,
// which is the same for both SDKs.
type tracker struct {
	stop chan struct{}
	done chan struct{}

	mu     sync.Mutex
	objs   map[string]trackedObject
	notify chan struct{} // a buffered wake-up for the waiter
}

type trackedObject struct {
	generation, observed int64
	observedAt           time.Time // when observed last changed
}

// startTracker starts following ns's Widgets and returns once it has
// listed them.
func startTracker(client dynamic.Interface, ns string) (*tracker, error) {
	t := &tracker{stop: make(chan struct{}), done: make(chan struct{}), objs: map[string]trackedObject{}, notify: make(chan struct{}, 1)}
	inf := dynamicinformer.NewFilteredDynamicInformer(client, widgets.GroupVersionResource, ns, 0, cache.Indexers{}, nil).Informer()
	if _, err := inf.AddEventHandler(cache.ResourceEventHandlerFuncs{
		AddFunc:    func(obj any) { t.seen(obj) },
		UpdateFunc: func(_, obj any) { t.seen(obj) },
	}); err != nil {
		return nil, err
	}
	go func() {
		defer close(t.done)
		inf.Run(t.stop)
	}()
	if !cache.WaitForCacheSync(t.stop, inf.HasSynced) {
		t.close()
		return nil, fmt.Errorf("the tracker of %s did not sync", ns)
	}
	return t, nil
}

func (t *tracker) seen(obj any) {
	u, ok := obj.(*unstructured.Unstructured)
	if !ok {
		return
	}
	now := time.Now()
	observed, _, _ := unstructured.NestedInt64(u.Object, "status", "observedGeneration")
	t.mu.Lock()
	o := t.objs[u.GetName()]
	if observed != o.observed {
		o.observed, o.observedAt = observed, now
	}
	o.generation = u.GetGeneration()
	t.objs[u.GetName()] = o
	t.mu.Unlock()
	select {
	case t.notify <- struct{}{}:
	default:
	}
}

// caughtUp returns, once every named object's observedGeneration has
// reached its target generation, the latest moment one of them did. It
// gives up after timeout, saying how many have not. One caller at a time.
func (t *tracker) caughtUp(targets map[string]int64, timeout time.Duration) (time.Time, error) {
	deadline := time.After(timeout)
	tick := time.NewTicker(time.Second) // a safety net: every change also wakes the waiter
	defer tick.Stop()
	for {
		last, behind := t.check(targets)
		if len(behind) == 0 {
			return last, nil
		}
		select {
		case <-t.notify:
		case <-tick.C:
		case <-deadline:
			slices.Sort(behind)
			return time.Time{}, fmt.Errorf("%d of %d objects not caught up within %v (e.g. %v)", len(behind), len(targets), timeout, behind[:min(len(behind), 5)])
		}
	}
}

func (t *tracker) check(targets map[string]int64) (last time.Time, behind []string) {
	t.mu.Lock()
	defer t.mu.Unlock()
	for name, gen := range targets {
		o := t.objs[name]
		if o.observed < gen {
			behind = append(behind, name)
			continue
		}
		if o.observedAt.After(last) {
			last = o.observedAt
		}
	}
	return last, behind
}

func (t *tracker) close() {
	close(t.stop)
	<-t.done
}
