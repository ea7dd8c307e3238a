package queue_test

import (
	"context"
	"testing"

	"github.com/opkit/opkit/queue"
)

func TestSmokeAddGetDone(t *testing.T) {
	q := queue.New[string, int](queue.Config[int]{})
	if got := q.Add("a", 1, queue.AddOptions{}); got != queue.Queued {
		t.Fatalf("Add = %v, want Queued", got)
	}
	if got := q.Add("a", 2, queue.AddOptions{}); got != queue.Merged {
		t.Fatalf("Add = %v, want Merged", got)
	}
	q.Add("b", 3, queue.AddOptions{Priority: 5})
	it, err := q.Get(context.Background())
	if err != nil || it.Key != "b" {
		t.Fatalf("Get = %v, %v; want b", it, err)
	}
	it2, err := q.Get(context.Background())
	if err != nil || it2.Key != "a" || it2.Value != 2 {
		t.Fatalf("Get = %v, %v; want a=2", it2, err)
	}
	q.Done("a")
	q.Done("b")
	if q.Len() != 0 {
		t.Fatalf("Len = %d", q.Len())
	}
	q.ShutDown()
	q.ShutDown()
	if _, err := q.Get(context.Background()); err != queue.ErrShutDown {
		t.Fatalf("Get after shutdown: %v", err)
	}
}
