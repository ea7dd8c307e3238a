package queue_test

import (
	"context"
	"fmt"
	"time"

	"github.com/opkit/opkit/queue"
)

func ExampleNew() {
	q := queue.New[string, string](queue.Config[string]{})
	defer q.ShutDown()

	q.Add("default/web", "modified", queue.AddOptions{})
	q.Add("default/web", "modified again", queue.AddOptions{}) // merged into the pending entry
	q.Add("default/db", "relisted", queue.AddOptions{Priority: -1})
	q.Add("default/api", "triggered", queue.AddOptions{Priority: 100})

	ctx := context.Background()
	for q.Len() > 0 {
		it, err := q.Get(ctx)
		if err != nil {
			break
		}
		fmt.Println(it.Key, it.Value)
		q.Done(it.Key)
	}
	// Output:
	// default/api triggered
	// default/web modified
	// default/db relisted
}

func ExampleBackoff() {
	b := queue.Backoff{Base: 100 * time.Millisecond, Cap: time.Second, Jitter: -1}
	for retries := 1; retries <= 5; retries++ {
		fmt.Println(retries, b.Delay(retries))
	}
	// Output:
	// 1 100ms
	// 2 200ms
	// 3 400ms
	// 4 800ms
	// 5 1s
}

// A worker's loop: every item is Done, and a failure is retried after a
// backoff that grows with the key's consecutive failures, which the caller
// counts (reconcile's controller keeps them per key).
func ExampleQueue_Get() {
	q := queue.New[string, int](queue.Config[int]{})
	b := queue.Backoff{Base: time.Millisecond, Jitter: -1}
	q.Add("default/web", 0, queue.AddOptions{})

	failures := map[string]int{}
	for attempt := 0; attempt < 3; attempt++ {
		it, err := q.Get(context.Background())
		if err != nil {
			return
		}
		failed := attempt < 2 // pretend the first two reconciles fail
		if failed {
			failures[it.Key]++
			q.Add(it.Key, it.Value, queue.AddOptions{Delay: b.Delay(failures[it.Key])})
		} else {
			delete(failures, it.Key)
		}
		fmt.Println(it.Key, "failed", failed, "failures", failures[it.Key])
		q.Done(it.Key)
	}
	q.ShutDown()
	// Output:
	// default/web failed true failures 1
	// default/web failed true failures 2
	// default/web failed false failures 0
}
