// Package queuebench drives opkit's queue, client-go's typed rate-limiting
// workqueue and controller-runtime's priorityqueue through the same
// workloads (W1..W5, see queue_bench_test.go) behind one adapter
// interface. The benchmark goroutines own every queue they create and shut
// it down before returning.
package queuebench

import (
	"context"
	"sync/atomic"
	"time"

	"k8s.io/client-go/util/workqueue"
	"sigs.k8s.io/controller-runtime/pkg/controller/priorityqueue"

	"github.com/opkit/opkit/queue"
)

// Queue is what every workload needs from a queue under test. Keys are
// ints; priority is ignored by queues without priorities.
type Queue interface {
	// Add enqueues key with a priority after delay (0: now).
	Add(key, priority int, delay time.Duration)
	// Get blocks for the next key; ok is false once the queue is shut down.
	Get() (key int, ok bool)
	Done(key int)
	// Len is the number of entries waiting to be handed out (for
	// controller-runtime: only those already due). It returns once the
	// queue has taken in every add that returned before it was called
	// (controller-runtime's flushes its add buffer; see flushAdds).
	Len() int
	ShutDown()
}

// Impl names a queue implementation and builds fresh instances of it.
type Impl struct {
	Name string
	New  func() Queue
}

// Impls are the implementations every workload runs against.
var Impls = []Impl{
	{"opkit", func() Queue { return NewOpkit(nil) }},
	{"clientgo", NewClientGo},
	{"crpq", NewPriorityQueue},
}

// payload is what opkit's queue carries with each key: a pointer, as a
// real event payload would be.
type payload struct{ n int }

var shared = &payload{}

// Opkit adapts queue.Queue.
type Opkit struct {
	Q   *queue.Queue[int, *payload]
	ctx context.Context
}

// NewOpkit returns opkit's queue with the given metrics (nil: none).
func NewOpkit(m queue.Metrics) *Opkit {
	return &Opkit{Q: queue.New[int, *payload](queue.Config[*payload]{Metrics: m}), ctx: context.Background()}
}

func (o *Opkit) Add(key, priority int, delay time.Duration) {
	o.Q.Add(key, shared, queue.AddOptions{Priority: priority, Delay: delay})
}

func (o *Opkit) Get() (int, bool) {
	it, err := o.Q.Get(o.ctx)
	return it.Key, err == nil
}

func (o *Opkit) Done(key int) { o.Q.Done(key) }
func (o *Opkit) ShutDown()    { o.Q.ShutDown() }
func (o *Opkit) Len() int     { return o.Q.Len() }

// ClientGo adapts client-go's TypedRateLimitingInterface (no priorities).
type ClientGo struct {
	Q workqueue.TypedRateLimitingInterface[int]
}

// NewClientGo returns client-go's rate-limiting queue with no metrics. They
// are off only because Name is empty: this binary imports controller-runtime
// (for priorityqueue), whose internal metrics package's init installs a
// Prometheus provider with workqueue.SetProvider for every queue created
// afterwards, so a named client-go queue here would record into Prometheus.
func NewClientGo() Queue {
	return &ClientGo{Q: workqueue.NewTypedRateLimitingQueueWithConfig(
		workqueue.DefaultTypedControllerRateLimiter[int](),
		workqueue.TypedRateLimitingQueueConfig[int]{})}
}

func (c *ClientGo) Add(key, _ int, delay time.Duration) {
	if delay > 0 {
		c.Q.AddAfter(key, delay)
		return
	}
	c.Q.Add(key)
}

func (c *ClientGo) Get() (int, bool) {
	k, shutdown := c.Q.Get()
	return k, !shutdown
}

func (c *ClientGo) Done(key int) { c.Q.Done(key) }
func (c *ClientGo) ShutDown()    { c.Q.ShutDown() }
func (c *ClientGo) Len() int     { return c.Q.Len() }

// PriorityQueue adapts controller-runtime's priorityqueue.
type PriorityQueue struct {
	Q     priorityqueue.PriorityQueue[int]
	prios [3]int // -1, 0, 1 .. so that Add passes a pointer without allocating
}

// NewPriorityQueue returns controller-runtime's priorityqueue with no
// metrics. Its metrics are off only for an empty name (as client-go's): a
// named queue keeps its clock reads, add-time maps and unfinished-work
// goroutine whatever the MetricProvider, so the empty name is what gives it
// the same no-op metrics client-go's queue runs with.
func NewPriorityQueue() Queue {
	p := &PriorityQueue{Q: priorityqueue.New[int]("")}
	p.prios = [3]int{-1, 0, 1}
	return p
}

func (p *PriorityQueue) Add(key, priority int, delay time.Duration) {
	var pr *int
	if priority >= -1 && priority <= 1 {
		pr = &p.prios[priority+1]
	} else {
		pr = &priority
	}
	p.Q.AddWithOpts(priorityqueue.AddOpts{After: delay, Priority: pr}, key)
}

func (p *PriorityQueue) Get() (int, bool) {
	k, shutdown := p.Q.Get()
	return k, !shutdown
}

func (p *PriorityQueue) Done(key int) { p.Q.Done(key) }
func (p *PriorityQueue) ShutDown()    { p.Q.ShutDown() }
func (p *PriorityQueue) Len() int     { return p.Q.Len() }

// CountingMetrics is a cheap but real queue.Metrics: atomic counters and
// sums, as an exporter would keep before a scrape.
type CountingMetrics struct {
	added, merged, retried, depth atomic.Int64
	dropped                       [8]atomic.Int64
	waited, worked                atomic.Int64
}

func (m *CountingMetrics) Added(_ int, merged bool) {
	m.added.Add(1)
	if merged {
		m.merged.Add(1)
	}
}
func (m *CountingMetrics) Dropped(o queue.Outcome)       { m.dropped[o&7].Add(1) }
func (m *CountingMetrics) Depth(_ int, d int)            { m.depth.Add(int64(d)) }
func (m *CountingMetrics) Waited(_ int, d time.Duration) { m.waited.Add(int64(d)) }
func (m *CountingMetrics) Worked(d time.Duration)        { m.worked.Add(int64(d)) }
func (m *CountingMetrics) Retried(int)                   { m.retried.Add(1) }
