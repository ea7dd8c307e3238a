package reconcile

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"slices"
	"sync"
	"time"

	"golang.org/x/sync/errgroup"
	"k8s.io/apimachinery/pkg/types"

	"github.com/opkit/opkit"
	"github.com/opkit/opkit/leader"
	"github.com/opkit/opkit/queue"
	"github.com/opkit/opkit/trigger"
	"github.com/opkit/opkit/watcher"
)

// Sharded shares a controller's work over the replicas of a deployment:
// the objects are split into S shards by the hash of their UID
// (opkit.Shards), and each shard has its own Controller, with its own
// Lease, queue, watcher (narrowed to the shard) and workers, which works
// only while this replica holds the shard's Lease. A leader.Balancer lets
// each replica hold at most ⌈S/N⌉ shards of N live replicas and hands
// shards over as replicas come and go, each after its in-flight
// reconciles drained. S = 1 is the single-leader Controller.
//
// The replica lists and watches each related resource (Config.Owns and
// Watches) once for all its shards, from Run on, whatever it holds. A
// change's keys go to every shard it holds (a mapping names keys, not
// UIDs), and a shard whose watch does not see the key's object drops it
// without a read.
//
// As with one leader, a delete made while its shard changes hands is
// seen by no watcher: a reconciler that must clean up after every delete
// keeps a Finalizer. A name can be on two shards at once (a deleted
// object and a new one of the same name have different UIDs), so two
// replicas may reconcile the two objects at the same time: act on
// children by owner UID, never by name alone.
type Sharded[T opkit.Object] struct {
	controllers []*Controller[T]
	balancer    *leader.Balancer
	trig        *trigger.Trigger[T]
	related     []*watcher.Related[T] // Config.Owns and Watches, for all shards
}

// NewSharded returns a Sharded of S shards for cfg, whose Leader is
// required: shard i's Lease is Leader.Name + "-i", and Leader.Name (a DNS
// label of at most 40 characters) names the group of replicas, whose
// member Leases it prefixes. Config.Concurrency is per replica: at most
// that many reconciles run at once over all the shards it holds (each
// shard's ReservedWorkers come on top, for triggers). Leader.Identity,
// when empty, is chosen once for all shards. The controllers share one
// client.
func NewSharded[T opkit.Object](cfg Config[T], shards int) (*Sharded[T], error) {
	if cfg.Leader == nil {
		return nil, fmt.Errorf("%w: sharded: Leader is required", ErrInvalidConfig)
	}
	if shards < 1 || shards > opkit.MaxShards {
		return nil, fmt.Errorf("%w: sharded: %d shards: want 1 to %d", ErrInvalidConfig, shards, opkit.MaxShards)
	}
	if err := cfg.buildDynamic(); err != nil { // once, for every shard
		return nil, err
	}
	id := cfg.Leader.Identity
	if id == "" {
		var err error
		if id, err = leader.DefaultIdentity(); err != nil {
			return nil, fmt.Errorf("%w: sharded: %w", ErrInvalidConfig, err)
		}
	}
	log := cmp.Or(cfg.Logger, slog.Default())
	b, err := leader.NewBalancer(leader.BalancerConfig{Client: cfg.Leader.Client, Namespace: cfg.Leader.Namespace,
		Group: cfg.Leader.Name, Identity: id, Shards: shards, LeaseDuration: cfg.Leader.LeaseDuration,
		RetryPeriod: cfg.Leader.RetryPeriod, Logger: log})
	if err != nil {
		return nil, err
	}
	s := &Sharded[T]{balancer: b}
	// Gauges add up over the shards: the replica leads while it holds
	// any, and tracks what all its watchers track.
	var leading *shardsLeading
	if cfg.Leader.Metrics != nil {
		leading = &shardsLeading{inner: cfg.Leader.Metrics, leading: make([]bool, shards), renewed: make([]time.Time, shards)}
	}
	tracked := &trackedSum{per: make([]int, shards)}
	slots := make(chan struct{}, cmp.Or(cfg.Concurrency, DefaultConcurrency))
	r := router[T]{} // the shards' queues, shard i's at index i
	for i := range shards {
		c := cfg
		c.Owns, c.Watches = nil, nil // the replica's, below
		c.Watch.Shards = opkit.Shards{Count: shards, Held: []int{i}}
		if cfg.Watch.Metrics != nil {
			c.Watch.Metrics = shardWatcherMetrics{Metrics: cfg.Watch.Metrics, sum: tracked, shard: i}
		}
		l := *cfg.Leader
		l.Name, l.Identity, l.Admit = fmt.Sprintf("%s-%d", cfg.Leader.Name, i), id, b.Admit
		if leading != nil {
			l.Metrics = shardLeading{leading, i}
		}
		c.Leader = &l
		c.Logger = log.With("shard", i)
		ctrl, err := NewController(c)
		if err != nil {
			return nil, fmt.Errorf("shard %d: %w", i, err)
		}
		ctrl.slots = slots
		b.Add(ctrl.leader)
		s.controllers, r = append(s.controllers, ctrl), append(r, ctrl.queue)
	}
	// One trigger for the replica: it adds to the queue of the object's
	// shard, and every shard's controller reports to it.
	if s.trig, err = s.controllers[0].newTrigger(r, true, log.With("controller", cfg.Name)); err != nil {
		return nil, err
	}
	// One watcher per related resource for the replica, whatever it
	// holds: a change goes to every held shard's queue, and a shard whose
	// watch does not see the key's object drops it without a read.
	if s.related, err = relatedWatchers(cfg, fanout[T](r), watcher.OwnedBy(cfg.Resource), log.With("controller", cfg.Name)); err != nil {
		return nil, err
	}
	for _, c := range s.controllers {
		c.trig, c.tickets = s.trig, c.cfg.Watch.Shards
		c.sharedRelated = s.related
	}
	return s, nil
}

// fanout is the Adder of a Sharded replica's related watchers: a key goes
// to the queue of every shard the replica holds (a related change names
// keys, not UIDs).
type fanout[T opkit.Object] []*queue.Queue[opkit.Key, opkit.Cause[T]]

func (f fanout[T]) Add(key opkit.Key, c opkit.Cause[T], opts queue.AddOptions) queue.Outcome {
	out := queue.DroppedSuspended
	for _, q := range f {
		if q.Suspended() {
			continue // not held: its next term lists every object anyway
		}
		if o := q.Add(key, c, opts); o.Accepted() || !out.Accepted() {
			out = o
		}
	}
	return out
}

// router is the Adder of a Sharded replica's trigger: shard i's queue is
// at index i. A cause goes to the queue of its object's shard, whose
// intake is open only while this replica holds the shard (else the add
// is dropped: the trigger forwards or hands it back). A cause without an
// object names no shard: it joins no entry (MergeOnly: NotHeld, so the
// trigger reads the object and adds again with it), and is otherwise
// dropped; the trigger refuses objects without a UID.
type router[T opkit.Object] []*queue.Queue[opkit.Key, opkit.Cause[T]]

func (r router[T]) Add(key opkit.Key, c opkit.Cause[T], opts queue.AddOptions) queue.Outcome {
	switch {
	case !isNil(c.Object):
		return r[opkit.ShardOf(c.Object.GetUID(), len(r))].Add(key, c, opts)
	case opts.MergeOnly:
		return queue.NotHeld
	}
	return queue.DroppedSuspended
}

// Suspended reports whether this replica holds no shard (or none now),
// for the consumer, which then takes no message.
func (r router[T]) Suspended() bool {
	return !slices.ContainsFunc(r, func(q *queue.Queue[opkit.Key, opkit.Cause[T]]) bool { return !q.Suspended() })
}

// ShuttingDown reports whether every shard's queue is shut down.
func (r router[T]) ShuttingDown() bool {
	return !slices.ContainsFunc(r, func(q *queue.Queue[opkit.Key, opkit.Cause[T]]) bool { return !q.ShuttingDown() })
}

// Controllers returns the shards' controllers, shard i's at index i.
func (s *Sharded[T]) Controllers() []*Controller[T] { return s.controllers }

// Trigger returns the replica's trigger: it schedules a reconcile of an
// object on its shard's controller, and drops it (Enqueue's false) while
// this replica does not hold the shard. Its objects must carry their UID.
func (s *Sharded[T]) Trigger() *trigger.Trigger[T] { return s.trig }

// HolderEndpoint is trigger.HandlerConfig's HolderEndpoint: the trigger
// endpoint the holder of uid's shard publishes on the shard's Lease
// (trigger.EndpointAnnotation in Config.Leader's Annotations) while this
// replica does not hold it; "" while it does, or no holder is known.
func (s *Sharded[T]) HolderEndpoint(uid types.UID) string {
	return s.controllers[opkit.ShardOf(uid, len(s.controllers))].LeaderEndpoint()
}

// QueueStats is the replica's queue over its shards' queues: the counts
// and UnfinishedWork add up, LongestRunning is the longest, Suspended
// while it holds no shard and ShutDown once every queue is. An entry a
// shard's worker took and that waits for one of the replica's
// Concurrency slots counts as in flight.
func (s *Sharded[T]) QueueStats() queue.Stats {
	sum := queue.Stats{Suspended: true, ShutDown: true}
	for _, c := range s.controllers {
		st := c.queue.Stats()
		sum.Ready, sum.Delayed, sum.Parked, sum.InFlight = sum.Ready+st.Ready, sum.Delayed+st.Delayed, sum.Parked+st.Parked, sum.InFlight+st.InFlight
		sum.LongestRunning, sum.UnfinishedWork = max(sum.LongestRunning, st.LongestRunning), sum.UnfinishedWork+st.UnfinishedWork
		sum.Suspended, sum.ShutDown = sum.Suspended && st.Suspended, sum.ShutDown && st.ShutDown
	}
	return sum
}

// Balancer returns the balancer of the shards' Leases.
func (s *Sharded[T]) Balancer() *leader.Balancer { return s.balancer }

// Run runs every shard's controller and the balancer until ctx ends, and
// returns nil, or the first error of a controller.
func (s *Sharded[T]) Run(ctx context.Context) error {
	g, gctx := errgroup.WithContext(ctx)
	g.Go(func() error { return s.balancer.Run(gctx) })
	for _, r := range s.related {
		g.Go(func() error {
			if err := r.Run(gctx); err != nil && gctx.Err() == nil {
				return fmt.Errorf("reconcile: related watcher %s: %w", r.Name(), err)
			}
			return nil
		})
	}
	for _, c := range s.controllers {
		g.Go(func() error { return c.Run(gctx) })
	}
	return g.Wait()
}

// Check is the readiness check of the balancer and of every shard's
// controller.
func (s *Sharded[T]) Check() error {
	var errs []error
	if err := s.balancer.Check(); err != nil {
		errs = append(errs, err)
	}
	for _, r := range s.related {
		if err := r.Check(); err != nil {
			errs = append(errs, fmt.Errorf("related %s: %w", r.Name(), err))
		}
	}
	for i, c := range s.controllers {
		if err := c.Check(); err != nil {
			errs = append(errs, fmt.Errorf("shard %d: %w", i, err))
		}
	}
	return errors.Join(errs...)
}

// Runnable returns s as a Group component.
func (s *Sharded[T]) Runnable() Runnable {
	return Runnable{Name: s.controllers[0].cfg.Name + " (sharded)", Run: s.Run, Ready: s.Check}
}

// shardsLeading reports a replica's shard electors as one leader.Metrics
// (one shardLeading each): Leading(true) when the replica comes to hold a
// shard, Leading(false) when it holds none; Renewed with the oldest last
// renewal among the shards it holds, so that one shard that stopped
// renewing shows; the counters pass through.
type shardsLeading struct {
	inner   leader.Metrics
	mu      sync.Mutex
	leading []bool
	renewed []time.Time
}

// shardLeading is one shard elector's Metrics.
type shardLeading struct {
	*shardsLeading
	shard int
}

func (s shardLeading) Leading(leading bool) {
	s.mu.Lock()
	defer s.mu.Unlock()
	before := slices.Contains(s.leading, true)
	s.leading[s.shard], s.renewed[s.shard] = leading, time.Time{}
	if after := slices.Contains(s.leading, true); after != before {
		s.inner.Leading(after)
	}
}

func (s shardLeading) Renewed(at time.Time) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.renewed[s.shard] = at
	oldest := at
	for i, t := range s.renewed {
		if s.leading[i] && !t.IsZero() && t.Before(oldest) {
			oldest = t
		}
	}
	s.inner.Renewed(oldest)
}

func (s shardLeading) RenewFailed() { s.inner.RenewFailed() }
func (s shardLeading) WorkOverran() { s.inner.WorkOverran() }

// trackedSum is what each of the shards' watchers tracks.
type trackedSum struct {
	mu  sync.Mutex
	per []int
}

// shardWatcherMetrics is one shard watcher's Metrics: Tracked reports the
// sum over the shards; the rest passes through.
type shardWatcherMetrics struct {
	watcher.Metrics
	sum   *trackedSum
	shard int
}

func (m shardWatcherMetrics) Tracked(n int) {
	m.sum.mu.Lock()
	defer m.sum.mu.Unlock()
	m.sum.per[m.shard] = n
	total := 0
	for _, k := range m.sum.per {
		total += k
	}
	m.Metrics.Tracked(total)
}

func (m shardWatcherMetrics) Sharding(serverSide bool) {
	if sm, ok := m.Metrics.(watcher.ShardingMetrics); ok {
		sm.Sharding(serverSide)
	}
}
