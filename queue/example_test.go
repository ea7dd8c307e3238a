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
	q.Add("default/web", "modified again", queue.AddOptions{}) // merged: newest payload wins
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
	// default/web modified again
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

// A worker's loop: every item is Done, and a failure is retried with
// the retry count carried by the entry.
func ExampleQueue_Get() {
	q := queue.New[string, int](queue.Config[int]{})
	b := queue.Backoff{Base: time.Millisecond, Jitter: -1}
	q.Add("default/web", 0, queue.AddOptions{})

	for attempt := 0; attempt < 3; attempt++ {
		it, err := q.Get(context.Background())
		if err != nil {
			return
		}
		failed := it.Retries < 2 // pretend the first two reconciles fail
		if failed {
			next := it.Retries + 1
			q.Add(it.Key, it.Value, queue.AddOptions{Retries: next, Delay: b.Delay(next)})
		}
		fmt.Println(it.Key, "retries", it.Retries, "failed", failed)
		q.Done(it.Key)
	}
	q.ShutDown()
	// Output:
	// default/web retries 0 failed true
	// default/web retries 1 failed true
	// default/web retries 2 failed false
}
