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
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/client-go/dynamic"
	"k8s.io/client-go/rest"

	"github.com/opkit/opkit"
	"github.com/opkit/opkit/internal/typed"
	"github.com/opkit/opkit/leader"
	"github.com/opkit/opkit/queue"
	"github.com/opkit/opkit/trigger"
	"github.com/opkit/opkit/watcher"
)

// Defaults applied by [NewController] to zero fields of [Config] (20
// retries with the default backoff are about 25 minutes). DefaultQPS and
// DefaultBurst are the request rate of a client built from
// Config.RESTConfig whose QPS and Burst are zero, instead of client-go's
// 5 and 10, on which an operator of a thousand objects waits seconds for
// each reconcile: at about three requests a reconcile, DefaultQPS allows
// some 30 reconciles a second.
const (
	DefaultConcurrency     = 4
	DefaultMaxRetries      = 20
	DefaultTimeout         = 5 * time.Minute
	DefaultShutdownTimeout = 30 * time.Second
	DefaultQPS             = 100
	DefaultBurst           = 200
)

// Errors of the controller: ErrInvalidConfig wraps NewController's,
// ErrAlreadyRunning is Run's when called again, and ErrPanic is wrapped by
// the error a panicking reconcile is turned into.
var (
	ErrInvalidConfig  = errors.New("reconcile: invalid config")
	ErrAlreadyRunning = errors.New("reconcile: controller already running")
	ErrPanic          = errors.New("reconcile: panic")
)

// Config configures a [Controller]; a zero field means its default (the
// Default constants).
type Config[T opkit.Object] struct {
	// Name (in logs and as the Events' reporting controller, e.g.
	// "demo.opkit.dev/demo"), Resource, Dynamic and Reconciler: required.
	// Instead of Dynamic, RESTConfig: the controller builds its client
	// from a copy, with QPS and Burst DefaultQPS and DefaultBurst when they
	// are zero (a Dynamic built elsewhere keeps its own limits).
	Name       string
	Resource   opkit.Resource
	Dynamic    dynamic.Interface
	RESTConfig *rest.Config
	Reconciler Reconciler[T]

	// Concurrency is the number of reconciles that run at once (over
	// all the shards this replica works on). ReservedWorkers more (per
	// shard) take only entries at TriggerPriority or above, so that a
	// trigger never waits for a backlog reconcile: zero means 1 when
	// Concurrency > 1, else none; negative means none.
	Concurrency, ReservedWorkers int
	// MaxRetries: once a key failed this many turns in a row, a failure in
	// a retry of the controller's own (no change or trigger asked for the
	// turn) gives up on what failed (a delete is settled); a turn a change
	// or trigger asked for is always made. Negative: retry forever.
	MaxRetries int
	// Backoff turns the key's failed turns into the retry delay (zero
	// fields: the queue's defaults, 5ms doubling to 5m, 10% jitter).
	Backoff queue.Backoff
	// Timeout bounds each reconcile call (negative: none). ShutdownTimeout
	// is how long in-flight reconciles may go on after Run's context ends;
	// with Leader the drain ends a RetryPeriod before another replica may
	// take the Lease ([leader.Elector.WorkDeadline]).
	Timeout, ShutdownTimeout time.Duration
	// Watch configures the watcher; the controller sets Client, Resource,
	// Queue, Shards (leave them zero), a nil Logger, TriggerPriority, and
	// an empty RequestAnnotation to watcher.DefaultRequestAnnotation
	// (durable triggers: "-" for none).
	Watch watcher.Config[T]
	// Owns lists the resources of the objects the reconciler creates and
	// controls (children, with a controller reference to their owner): a
	// change of one, its deletion included, reconciles the owner (see
	// watcher.OwnedBy). Watches lists other related resources, each with
	// the mapping of its objects to the keys they concern. Their changes
	// join the keys' entries as source APIServer at the watch's priority,
	// naming the resource in Request.Related. The replica lists and
	// watches each once, from Run on, in the watch's namespace when the
	// resource is namespaced, keeping per object only its key,
	// resourceVersion and the keys it maps to: no cache of the objects.
	Owns    []opkit.Resource
	Watches []Watch
	// Leader, if set, elects the replica that works on the objects: the
	// watcher, the workers and the term work run only while this replica
	// holds the Lease, under a context that ends with the term. The
	// controller sets Gate (leave it nil) and a nil Logger. An empty
	// Identity is chosen once, for every Lease of the replica.
	Leader *leader.Config
	// Shards splits the objects by the hash of their UID (opkit.Shards)
	// so that replicas share the work: Count shards (0 or 1: one, the
	// whole resource), each with its own queue, watcher (narrowed to the
	// shard) and workers. With Leader each shard is held through its own
	// Lease, Leader.Name + "-i" (Leader.Name, a DNS label of at most 40
	// characters, then names the group of replicas, whose member Leases
	// it prefixes), and a leader.Balancer lets each replica hold at most
	// ⌈Count/N⌉ shards of N live replicas; Held must be empty. Without
	// Leader, Held are the shards this replica works on.
	Shards opkit.Shards

	// TriggerPriority, TriggerRate, TriggerBurst: the triggers'
	// trigger.Config Priority, Rate and Burst (zero: its defaults).
	TriggerPriority, TriggerBurst int
	TriggerRate                   float64
	// NoEvents turns off the Warning Events; RecordTriggerEvents also
	// records a Normal Event ("Triggered") for every turn a trigger asked.
	NoEvents, RecordTriggerEvents bool

	// Logger receives the logs (nil: slog.Default()); Metrics,
	// QueueMetrics and TriggerMetrics the measurements (nil: none).
	Logger         *slog.Logger
	Metrics        Metrics
	QueueMetrics   queue.Metrics
	TriggerMetrics trigger.Metrics
}

// Watch is a related resource of Config.Watches: Map maps each of its
// objects to the keys of the controller's objects it concerns (by a
// label, a field, a name); LabelSelector, if set, narrows its watch.
type Watch struct {
	Resource      opkit.Resource
	Map           watcher.MapFunc
	LabelSelector string
}

// Controller runs a [Reconciler] over one resource; its Run owns every
// goroutine it starts. The objects are worked on in shards (one, unless
// Config.Shards says more), each with its own queue, watcher and workers,
// and with Leader only while this replica holds the shard's Lease. When
// Run's context ends, in-flight reconciles get ShutdownTimeout to finish
// and the queues are abandoned (the next start lists everything); when a
// shard's term ends, they are cancelled.
//
// A name can be on two shards at once (a deleted object and a new one of
// the same name have different UIDs), so two replicas may reconcile the
// two objects at the same time: act on children by owner UID, never by
// name alone.
type Controller[T opkit.Object] struct {
	cfg      Config[T]
	log      *slog.Logger
	client   *typed.Client[T]
	shards   []*shard[T]      // shard i at index i; nil: not this replica's (static Shards)
	balancer *leader.Balancer // nil unless the Leases of several shards are balanced
	related  []*watcher.Related[T]
	trig     *trigger.Trigger[T]
	slots    chan struct{}   // the Concurrency reconciles of the replica
	sel      labels.Selector // the watch's label selector (everything for none)
	rec      *Recorder       // nil with NoEvents

	mu       sync.Mutex
	running  bool
	termWork []Runnable
}

// NewController validates cfg and builds the controller; it starts
// nothing.
func NewController[T opkit.Object](cfg Config[T]) (*Controller[T], error) {
	if err := cfg.validate(); err != nil {
		return nil, fmt.Errorf("%w: %w", ErrInvalidConfig, err)
	}
	cfg = cfg.withDefaults()
	c := &Controller[T]{cfg: cfg, log: cmp.Or(cfg.Logger, slog.Default()).With("controller", cfg.Name), client: typed.New[T](cfg.Dynamic, cfg.Resource),
		slots: make(chan struct{}, cfg.Concurrency)}
	var err error
	// Triggers reach only what the watch sees: another namespace, or labels
	// the watch's selector leaves out, would be reconciled by a controller
	// not meant to handle them.
	if c.sel, err = labels.Parse(cfg.Watch.LabelSelector); err != nil {
		return nil, fmt.Errorf("%w: Watch.LabelSelector: %w", ErrInvalidConfig, err)
	}
	if !cfg.NoEvents {
		if c.rec, err = NewRecorder(RecorderConfig{Dynamic: cfg.Dynamic, Controller: cfg.Name, Resource: cfg.Resource}); err != nil {
			return nil, fmt.Errorf("%w: %w", ErrInvalidConfig, err)
		}
	}
	if c.trig, err = trigger.New(trigger.Config[T]{Router: router[T]{c}, Get: c.client.Get, Resource: cfg.Resource, Namespace: cfg.Watch.Namespace,
		Selector: c.sel, Priority: cfg.TriggerPriority, Rate: cfg.TriggerRate, Burst: cfg.TriggerBurst,
		Metrics: cfg.TriggerMetrics, Logger: c.log}); err != nil {
		return nil, fmt.Errorf("%w: %w", ErrInvalidConfig, err)
	}
	c.cfg.TriggerPriority = c.trig.Priority() // its default for a zero one
	if err := c.buildShards(); err != nil {
		return nil, err
	}
	if c.related, err = relatedWatchers(c.cfg, fanout[T]{c}, c.log); err != nil {
		return nil, err
	}
	return c, nil
}

// validate checks what NewController cannot default, building Dynamic
// from RESTConfig when it is nil.
func (cfg *Config[T]) validate() error {
	if cfg.Dynamic == nil && cfg.RESTConfig != nil {
		d, err := dynamic.NewForConfig(WithDefaultRate(cfg.RESTConfig))
		if err != nil {
			return fmt.Errorf("RESTConfig: %w", err)
		}
		cfg.Dynamic = d
	}
	count := max(cfg.Shards.Count, 1)
	switch err := cfg.Resource.Validate(); {
	case cfg.Name == "" || cfg.Dynamic == nil || cfg.Reconciler == nil:
		return errors.New("Name, Dynamic (or RESTConfig) and Reconciler are required")
	case err != nil:
		return err
	case cfg.Watch.Client != nil || cfg.Watch.Queue != nil || cfg.Watch.Resource != (opkit.Resource{}) || cfg.Watch.Shards.Count != 0:
		return errors.New("Watch.Client, Watch.Resource, Watch.Queue and Watch.Shards are set by the controller (see Config.Shards)")
	case cfg.Leader != nil && cfg.Leader.Gate != nil:
		return errors.New("Leader.Gate is set by the controller")
	case cfg.RecordTriggerEvents && cfg.NoEvents:
		return errors.New("RecordTriggerEvents contradicts NoEvents")
	case cfg.Concurrency < 0 || cfg.ShutdownTimeout < 0:
		return errors.New("negative Concurrency or ShutdownTimeout")
	case count > 1 && cfg.Leader != nil && len(cfg.Shards.Held) > 0:
		return errors.New("Shards.Held is decided by the shards' Leases with Leader: leave it empty")
	case count > 1 && cfg.Leader == nil && len(cfg.Shards.Held) == 0:
		return fmt.Errorf("%d shards without Leader: Shards.Held names the ones this replica works on", count)
	case count > 1 && cfg.Leader != nil && len(cfg.Leader.Name) > 40:
		return fmt.Errorf("Leader.Name %q: with shards, at most 40 characters (it prefixes the shards' Leases)", cfg.Leader.Name)
	}
	if count > 1 && cfg.Leader != nil {
		return opkit.Shards{Count: count, Held: []int{0}}.Validate() // the count; the Leases hold
	}
	return cfg.Shards.Validate()
}

// withDefaults applies the Default constants to cfg's zero fields.
func (cfg Config[T]) withDefaults() Config[T] {
	cfg.Concurrency = cmp.Or(cfg.Concurrency, DefaultConcurrency)
	if cfg.ReservedWorkers == 0 && cfg.Concurrency > 1 {
		cfg.ReservedWorkers = 1
	}
	cfg.ReservedWorkers = max(cfg.ReservedWorkers, 0)
	cfg.MaxRetries = cmp.Or(cfg.MaxRetries, DefaultMaxRetries)
	cfg.Timeout = cmp.Or(cfg.Timeout, DefaultTimeout)
	cfg.ShutdownTimeout = cmp.Or(cfg.ShutdownTimeout, DefaultShutdownTimeout)
	cfg.Metrics = cmp.Or[Metrics](cfg.Metrics, noMetrics{})
	cfg.Shards.Count = max(cfg.Shards.Count, 1)
	return cfg
}

// WithDefaultRate returns a copy of cfg whose zero QPS and Burst are
// DefaultQPS and DefaultBurst, for the other clients of an operator (its
// leader election's, say).
func WithDefaultRate(cfg *rest.Config) *rest.Config {
	cfg = rest.CopyConfig(cfg)
	if cfg.QPS == 0 && cfg.Burst == 0 {
		cfg.QPS, cfg.Burst = DefaultQPS, DefaultBurst
	}
	return cfg
}

// Trigger returns the controller's trigger: it schedules a reconcile of
// an object on the shard the object is of while this replica works on
// it, names the replica that does otherwise (HTTP triggers are forwarded
// there), and has the watch's namespace and label selector as its scope.
func (c *Controller[T]) Trigger() *trigger.Trigger[T] { return c.trig }

// Runnable returns the controller as a [Group] component.
func (c *Controller[T]) Runnable() Runnable {
	return Runnable{Name: c.cfg.Name, Run: c.Run, Ready: c.Check}
}

// Held returns the number of shards this replica works on now (with one
// shard: 1 while it leads, or always without Leader).
func (c *Controller[T]) Held() int {
	n := 0
	for _, s := range c.shards {
		if s != nil && s.open() {
			n++
		}
	}
	return n
}

// Queues returns the shards' queues, shard i's at index i (nil for one
// this replica never works on), for diagnostics and benchmarks.
func (c *Controller[T]) Queues() []*queue.Queue[opkit.Key, opkit.Cause[T]] {
	qs := make([]*queue.Queue[opkit.Key, opkit.Cause[T]], len(c.shards))
	for i, s := range c.shards {
		if s != nil {
			qs[i] = s.queue
		}
	}
	return qs
}

// Balancer returns the balancer of the shards' Leases: nil unless there
// are several shards and Leader.
func (c *Controller[T]) Balancer() *leader.Balancer { return c.balancer }

// QueueStats is the replica's queue over its shards' queues: the counts
// and UnfinishedWork add up, LongestRunning is the longest, Suspended
// while it works on no shard and ShutDown once every queue is. An entry
// a shard's worker took and that waits for one of the replica's
// Concurrency slots counts as in flight.
func (c *Controller[T]) QueueStats() queue.Stats {
	sum := queue.Stats{Suspended: true, ShutDown: true}
	for _, s := range c.shards {
		if s == nil {
			continue
		}
		st := s.queue.Stats()
		sum.Ready, sum.Delayed, sum.Parked, sum.InFlight = sum.Ready+st.Ready, sum.Delayed+st.Delayed, sum.Parked+st.Parked, sum.InFlight+st.InFlight
		sum.LongestRunning, sum.UnfinishedWork = max(sum.LongestRunning, st.LongestRunning), sum.UnfinishedWork+st.UnfinishedWork
		sum.Suspended, sum.ShutDown = sum.Suspended && st.Suspended, sum.ShutDown && st.ShutDown
	}
	return sum
}

// Check is a readiness check: the electors' health and the watchers'
// (running, synced, connected) of the shards this replica works on, and
// the related watchers'.
func (c *Controller[T]) Check() error {
	var errs []error
	if c.balancer != nil {
		errs = append(errs, c.balancer.Check())
	}
	for _, r := range c.related {
		if err := r.Check(); err != nil {
			errs = append(errs, fmt.Errorf("related %s: %w", r.Name(), err))
		}
	}
	for _, s := range c.shards {
		if s == nil {
			continue
		}
		if err := s.check(); err != nil && len(c.shards) > 1 {
			errs = append(errs, fmt.Errorf("shard %d: %w", s.index, err))
		} else {
			errs = append(errs, err)
		}
	}
	return errors.Join(errs...)
}

// AddTermWork registers r, before Run, to run beside the workers: while
// this replica works on the first shard it works on (with Leader: in
// every term of its Lease), or for the whole Run without Leader.
func (c *Controller[T]) AddTermWork(r Runnable) error {
	if r.Run == nil || r.Name == "" {
		return errors.New("reconcile: term work needs a Name and a Run func")
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.running {
		return ErrAlreadyRunning
	}
	c.termWork = append(c.termWork, r)
	return nil
}

// publishEndpoint makes this replica publish url, the base URL of its
// trigger endpoint, on every Lease it holds (EndpointAnnotation),
// so that the other replicas forward triggers of its objects there;
// Operator calls it once its listener is bound. Without Leader it does
// nothing.
func (c *Controller[T]) publishEndpoint(url string) {
	for _, s := range c.shards {
		if s != nil && s.elector != nil {
			s.elector.Publish(map[string]string{EndpointAnnotation: url})
		}
	}
}

// Run runs the controller until ctx ends and returns nil, or the error of
// a component that failed.
func (c *Controller[T]) Run(ctx context.Context) error {
	c.mu.Lock()
	if c.running {
		c.mu.Unlock()
		return ErrAlreadyRunning
	}
	c.running = true
	work := c.termWork
	c.mu.Unlock()

	g, gctx := errgroup.WithContext(ctx)
	if c.balancer != nil {
		g.Go(func() error { return c.balancer.Run(gctx) })
	}
	for _, r := range c.related {
		g.Go(func() error {
			if err := r.Run(gctx); err != nil && gctx.Err() == nil {
				return fmt.Errorf("reconcile: related watcher %s: %w", r.Name(), err)
			}
			return nil
		})
	}
	first := true
	for _, s := range c.shards {
		if s == nil {
			continue
		}
		w := []Runnable(nil)
		if first {
			w, first = work, false
		}
		g.Go(func() error { return s.runTerms(ctx, gctx, w) })
	}
	return g.Wait()
}

// relatedWatchers builds the watchers of cfg.Owns and cfg.Watches,
// adding to q.
func relatedWatchers[T opkit.Object](cfg Config[T], q queue.Adder[opkit.Key, opkit.Cause[T]], log *slog.Logger) ([]*watcher.Related[T], error) {
	watches := slices.Clone(cfg.Watches)
	for _, res := range cfg.Owns {
		watches = append(watches, Watch{Resource: res, Map: watcher.OwnedBy(cfg.Resource)})
	}
	var out []*watcher.Related[T]
	for _, w := range watches {
		ns := ""
		if w.Resource.Namespaced {
			ns = cfg.Watch.Namespace
		}
		r, err := watcher.NewRelated(watcher.RelatedConfig[T]{Client: cfg.Dynamic, Resource: w.Resource, Namespace: ns, LabelSelector: w.LabelSelector,
			Map: w.Map, Queue: q, Priority: cfg.Watch.Priority, Backoff: cfg.Watch.Backoff, Logger: log})
		if err != nil {
			return nil, fmt.Errorf("%w: %w", ErrInvalidConfig, err)
		}
		if slices.ContainsFunc(out, func(o *watcher.Related[T]) bool { return o.Name() == r.Name() }) {
			return nil, fmt.Errorf("%w: related resource %s named twice in Owns and Watches", ErrInvalidConfig, r.Name())
		}
		out = append(out, r)
	}
	return out, nil
}

// takeSlot waits for one of the replica's Concurrency reconciles; false
// if ctx ended first.
func (c *Controller[T]) takeSlot(ctx context.Context) bool {
	select {
	case c.slots <- struct{}{}:
		return true
	case <-ctx.Done():
		return false
	}
}

func (c *Controller[T]) releaseSlot() { <-c.slots }
