package reconcile

// A shard: the queue, watcher, elector and workers of the objects of one
// range of UIDs (all of them with one shard), and where a trigger or a
// related change of them goes.

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

	"github.com/opkit/opkit"
	"github.com/opkit/opkit/leader"
	"github.com/opkit/opkit/queue"
	"github.com/opkit/opkit/trigger"
	"github.com/opkit/opkit/watcher"
)

// shard is one shard's part of a Controller: its queue and watcher, its
// elector (nil without Leader), and the key-level state of its turns.
// The turns (turn.go) are its methods; the embedded Controller gives
// them the configuration, the client and the trigger.
type shard[T opkit.Object] struct {
	*Controller[T]
	index   int
	scope   opkit.Shards // {Count, [index]}; the zero Shards with one shard
	log     *slog.Logger
	queue   *queue.Queue[opkit.Key, opkit.Cause[T]]
	watch   *watcher.Watcher[T]
	elector *leader.Elector
	retries retries     // the retry policy: failed turns per key
	written writtenKeys // the operator's own last write per key
}

// buildShards builds the shards this replica may work on and, for
// several with Leader, the balancer of their Leases.
func (c *Controller[T]) buildShards() error {
	cfg := c.cfg
	count := cfg.Shards.Count
	c.shards = make([]*shard[T], count)
	var lcfg leader.Config
	var leading *shardsLeading
	if cfg.Leader != nil {
		lcfg = *cfg.Leader
		if lcfg.Identity == "" {
			id, err := leader.DefaultIdentity()
			if err != nil {
				return fmt.Errorf("%w: %w", errInvalidConfig, err)
			}
			lcfg.Identity = id
		}
		if lcfg.Metrics != nil {
			// Gauges add up over the shards: the replica leads while it
			// holds any.
			leading = &shardsLeading{inner: lcfg.Metrics, leading: make([]bool, count), renewed: make([]time.Time, count)}
		}
	}
	if count > 1 && cfg.Leader != nil {
		b, err := leader.NewBalancer(leader.BalancerConfig{Client: lcfg.Client, Namespace: lcfg.Namespace, Group: lcfg.Name, Identity: lcfg.Identity,
			Shards: count, LeaseDuration: lcfg.LeaseDuration, RetryPeriod: lcfg.RetryPeriod, Logger: c.log})
		if err != nil {
			return fmt.Errorf("%w: %w", errInvalidConfig, err)
		}
		c.balancer = b
	}
	tracked := &trackedSum{per: make([]int, count)}
	for i := range count {
		if cfg.Leader == nil && count > 1 && !slices.Contains(cfg.Shards.Held, i) {
			continue // another replica's, statically
		}
		s, err := c.newShard(i, lcfg, leading, tracked)
		if err != nil {
			return err
		}
		c.shards[i] = s
	}
	return nil
}

// newShard builds shard i: its queue, its watcher narrowed to the shard
// and, with Leader, its elector.
func (c *Controller[T]) newShard(i int, lcfg leader.Config, leading *shardsLeading, tracked *trackedSum) (*shard[T], error) {
	cfg := c.cfg
	s := &shard[T]{Controller: c, index: i, log: c.log, retries: retries{backoff: cfg.Backoff, n: map[opkit.Key]int{}}}
	if cfg.Shards.Count > 1 {
		s.scope, s.log = opkit.Shards{Count: cfg.Shards.Count, Held: []int{i}}, c.log.With("shard", i)
	}
	s.queue = queue.New[opkit.Key](queue.Config[opkit.Cause[T]]{Merge: (*opkit.Cause[T]).Merge, Metrics: cfg.QueueMetrics})
	wcfg := cfg.Watch
	wcfg.Client, wcfg.Resource, wcfg.Queue, wcfg.Logger, wcfg.Shards = cfg.Dynamic, cfg.Resource, s.queue, cmp.Or(wcfg.Logger, s.log), s.scope
	wcfg.TriggerPriority = cfg.TriggerPriority
	if wcfg.Metrics != nil {
		wcfg.Metrics = shardWatcherMetrics{Metrics: wcfg.Metrics, sum: tracked, shard: i}
	}
	wcfg.RequestAnnotation = c.requestAnnotation()
	var err error
	if s.watch, err = watcher.New(wcfg); err != nil {
		return nil, fmt.Errorf("%w: %w", errInvalidConfig, err)
	}
	if cfg.Leader == nil {
		return s, nil
	}
	// Closed from the start, not only from the elector's Run: a trigger
	// endpoint or consumer may be serving before Run is called, and this
	// replica does not work on the shard yet.
	s.queue.Suspend()
	lcfg.Gate, lcfg.Logger = s.queue, cmp.Or(lcfg.Logger, s.log)
	if cfg.Shards.Count > 1 {
		lcfg.Name, lcfg.Admit = fmt.Sprintf("%s-%d", lcfg.Name, i), c.balancer.Admit
	}
	if leading != nil {
		lcfg.Metrics = shardLeading{leading, i}
	}
	if s.elector, err = leader.New(lcfg); err != nil {
		return nil, fmt.Errorf("%w: %w", errInvalidConfig, err)
	}
	if c.balancer != nil {
		c.balancer.Add(s.elector)
	}
	return s, nil
}

// open reports whether this replica works on the shard now: its intake
// is open.
func (s *shard[T]) open() bool { return !s.queue.Suspended() && !s.queue.ShuttingDown() }

// identity names this replica in outcomes: the elector's identity, or ""
// without leader election.
func (s *shard[T]) identity() string {
	if s.elector == nil {
		return ""
	}
	return s.elector.Identity()
}

// check is the shard's readiness: its elector's health, and while this
// replica works on it its watcher's.
func (s *shard[T]) check() error {
	switch {
	case s.elector == nil:
		return s.watch.Check()
	case !s.elector.IsLeader():
		return s.elector.Check()
	}
	return errors.Join(s.elector.Check(), s.watch.Check())
}

// runTerms works on the shard until ctx ends: in every term of its Lease with
// Leader, else for the whole Run. groupCtx ends too when a sibling
// component of the Controller failed.
func (s *shard[T]) runTerms(ctx, groupCtx context.Context, work []Runnable) error {
	defer s.queue.ShutDown()
	if s.elector == nil {
		return s.runTerm(ctx, groupCtx, work)
	}
	return s.elector.Run(groupCtx, func(termCtx context.Context) error {
		return s.runTerm(ctx, termCtx, work)
	})
}

// runTerm runs the watcher, the term work and the workers until termCtx
// ends (or a component fails), then stops them: at once when the term was
// lost, after a drain of up to ShutdownTimeout when runCtx (the process)
// is ending.
func (s *shard[T]) runTerm(runCtx, termCtx context.Context, work []Runnable) error {
	log := s.log
	if term, ok := leader.TermFrom(termCtx); ok {
		log = log.With("term", term.Number)
	}
	// Intake side: the watcher, term work and workers' Get stop with it,
	// and the first component to fail ends it (context.Cause tells).
	g, intakeCtx := errgroup.WithContext(termCtx)
	// Reconciles run under workCtx: it keeps termCtx's values (the term)
	// but is cancelled separately, after the drain.
	workCtx, cancelWork := context.WithCancel(context.WithoutCancel(termCtx))
	defer cancelWork()
	for _, r := range append([]Runnable{{Name: "watcher", Run: s.watch.Run}}, work...) {
		g.Go(func() error {
			if err := r.Run(intakeCtx); err != nil && intakeCtx.Err() == nil {
				return fmt.Errorf("reconcile: %s: %w", r.Name, err)
			}
			return nil
		})
	}
	var workers sync.WaitGroup
	for i := range s.cfg.Concurrency + s.cfg.ReservedWorkers {
		workers.Go(func() { s.worker(intakeCtx, workCtx, log, i >= s.cfg.Concurrency) })
	}
	<-intakeCtx.Done()
	if runCtx.Err() != nil && errors.Is(context.Cause(intakeCtx), context.Canceled) || errors.Is(context.Cause(intakeCtx), leader.ErrYielded) {
		// Graceful shutdown, or a shard handed to another replica: no new
		// intake; in-flight reconciles get the drain.
		drain := s.drain()
		log.Info("controller stopping: draining in-flight reconciles", "deadline", drain)
		defer time.AfterFunc(drain, cancelWork).Stop()
	} else {
		// Term lost or a component failed: stop at once.
		cancelWork()
	}
	workers.Wait()
	cancelWork()
	err := g.Wait()
	// Retries this term could not add (the intake closed) and reconciles
	// it interrupted leave streaks no entry stands for, and the triggers
	// the cleared queue held are not served by this replica.
	s.retries.reset()
	s.trig.Abandon("the leadership term ended before the reconcile: the next leader reconciles every object", s.scope)
	s.written.reset()
	return err
}

// drain is how long in-flight reconciles may go on once the intake
// closed: ShutdownTimeout, and with Leader at most until a RetryPeriod
// before the Lease may expire (measured from the term's last successful
// renew, not from now: when renewals were failing it expires sooner).
// Without Leader the queue shuts down.
func (s *shard[T]) drain() time.Duration {
	if s.elector == nil {
		s.queue.ShutDown()
		return s.cfg.ShutdownTimeout
	}
	margin := cmp.Or(s.cfg.Leader.RetryPeriod, leader.DefaultRetryPeriod)
	return max(0, min(s.cfg.ShutdownTimeout, time.Until(s.elector.WorkDeadline().Add(-margin))))
}

// worker takes entries (a reserved one only those at TriggerPriority or
// above) until intakeCtx ends and runs their turns under workCtx. The
// others start once the watchers' first lists are done, so that a term
// begins with what needs work, not with what the list delivered first,
// and take one of the replica's Concurrency slots for each turn.
func (s *shard[T]) worker(intakeCtx, workCtx context.Context, log *slog.Logger, reserved bool) {
	get := s.queue.Get
	if reserved {
		get = func(ctx context.Context) (queue.Item[opkit.Key, opkit.Cause[T]], error) {
			return s.queue.GetAtLeast(ctx, s.cfg.TriggerPriority)
		}
	} else if !s.synced(intakeCtx) {
		return
	}
	for {
		item, err := get(intakeCtx)
		if err != nil {
			return
		}
		if intakeCtx.Err() != nil || !reserved && !s.takeSlot(intakeCtx) {
			// Handed out as the intake closed: abandoned like the queued ones.
			s.queue.Done(item.Key)
			return
		}
		s.runTurn(workCtx, item, log)
		if !reserved {
			s.releaseSlot()
		}
		s.queue.Done(item.Key)
	}
}

// synced waits for the first lists of the shard's watcher and of the
// related watchers (theirs add nothing: a change they see before it is
// done would be missed by a term that started reconciling without them);
// false if ctx ended first.
func (s *shard[T]) synced(ctx context.Context) bool {
	if s.watch.WaitSynced(ctx) != nil {
		return false
	}
	for _, r := range s.related {
		if r.WaitSynced(ctx) != nil {
			return false
		}
	}
	return true
}

// router is the Controller's trigger.Router: shard i is worked on here
// while its intake is open, else by the replica its Lease names.
type router[T opkit.Object] struct{ c *Controller[T] }

func (r router[T]) Shards() int { return len(r.c.shards) }

func (r router[T]) Place(i int) trigger.Place[T] {
	s := r.c.shards[i]
	switch {
	case s == nil:
		return trigger.Place[T]{} // another replica's, statically: unknown
	case s.open() || s.elector == nil:
		return trigger.Place[T]{Queue: s.queue}
	}
	holder := s.elector.Leader()
	if holder == s.elector.Identity() {
		return trigger.Place[T]{Holder: holder} // ours, between terms
	}
	return trigger.Place[T]{Holder: holder, Endpoint: s.elector.LeaderAnnotation(EndpointAnnotation)}
}

// fanout is the Adder of the related watchers: a key goes to the queue of
// every shard the replica works on (a related change names keys, not
// UIDs); a shard whose watch does not see the key's object drops it
// without a read.
type fanout[T opkit.Object] struct{ c *Controller[T] }

func (f fanout[T]) Add(key opkit.Key, c opkit.Cause[T], opts queue.AddOptions) queue.Outcome {
	out := queue.DroppedSuspended
	for _, s := range f.c.shards {
		if s == nil || !s.open() {
			continue // not worked on here: its next term lists every object anyway
		}
		if o := s.queue.Add(key, c, opts); o.Accepted() || !out.Accepted() {
			out = o
		}
	}
	return out
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
