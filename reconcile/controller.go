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

// Defaults of the zero fields of Config, and the client-side guard of
// WithClientDefaults (100 requests a second, burst 200) until the API
// server shows it has Priority and Fairness.
const (
	defaultConcurrency     = 4
	defaultMaxRetries      = 20
	defaultTimeout         = 5 * time.Minute
	defaultShutdownTimeout = 30 * time.Second
	defaultQPS             = 100
	defaultBurst           = 200
)

// Errors of the controller: NewController's (invalid config), Run's when
// called again, and the error a panicking reconcile is turned into.
var (
	errInvalidConfig  = errors.New("reconcile: invalid config")
	errAlreadyRunning = errors.New("reconcile: controller already running")
	errPanic          = errors.New("reconcile: panic")
)

// Config configures a [Controller]; a zero field means its default.
type Config[T opkit.Object] struct {
	// Name (in logs and Events), Resource, Dynamic (or RESTConfig: a
	// client of WithClientDefaults) and Reconciler: required.
	Name       string
	Resource   opkit.Resource
	Dynamic    dynamic.Interface
	RESTConfig *rest.Config
	Reconciler Reconciler[T]
	// Concurrency reconciles run at once (zero: 4), and ReservedWorkers
	// more per shard for triggers (zero: 1 if Concurrency > 1).
	Concurrency, ReservedWorkers int
	// After MaxRetries failed turns in a row (zero: 20; negative: none), a
	// retry nothing new asked for gives up. Backoff: 5ms doubling to 5m.
	MaxRetries int
	Backoff    queue.Backoff
	// Timeout bounds a reconcile (zero: 5m; negative: none),
	// ShutdownTimeout the drain after Run's context ends (zero: 30s).
	Timeout, ShutdownTimeout time.Duration
	// Watch configures the watcher but for Client, Resource, Queue, Shards,
	// Logger and TriggerPriority. An empty RequestAnnotation is the
	// default when T's status has lastHandledReconcileAt, else none (Run
	// says so); "-": none.
	Watch watcher.Config[T]
	// Owns lists the resources of the children, Watches other related
	// resources: a change of their objects joins the keys' entries
	// (Request.Related). Each is watched once, without a cache.
	Owns    []opkit.Resource
	Watches []Watch
	// Leader, if set, runs the work only while this replica holds the
	// Lease (the controller sets Gate and Logger).
	Leader *leader.Config
	// Shards splits the objects by UID: with Leader, each has its Lease,
	// Leader.Name + "-i" (Name of at most 40 characters), and a replica
	// holds ⌈Count/N⌉ of N live replicas' at most; without, Held are ours.
	Shards opkit.Shards
	// The trigger's Priority, Rate and Burst (see trigger.Config).
	TriggerPriority, TriggerBurst int
	TriggerRate                   float64
	// NoEvents turns the Warning Events off; RecordTriggerEvents records
	// a Normal one for each turn a trigger asked for.
	NoEvents, RecordTriggerEvents bool
	// Logger (nil: slog.Default()) and the metrics (nil: none).
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

// Controller runs a [Reconciler] over one resource. Two objects of one
// name (deleted, new) may be on two shards: act on children by owner UID.
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

// NewController validates cfg and builds the controller.
func NewController[T opkit.Object](cfg Config[T]) (*Controller[T], error) {
	if err := cfg.validate(); err != nil {
		return nil, fmt.Errorf("%w: %w", errInvalidConfig, err)
	}
	cfg = cfg.withDefaults()
	c := &Controller[T]{cfg: cfg, log: cmp.Or(cfg.Logger, slog.Default()).With("controller", cfg.Name), client: typed.New[T](cfg.Dynamic, cfg.Resource),
		slots: make(chan struct{}, cfg.Concurrency)}
	var err error
	// Triggers reach only what the watch sees: another namespace, or labels
	// the watch's selector leaves out, would be reconciled by a controller
	// not meant to handle them.
	if c.sel, err = labels.Parse(cfg.Watch.LabelSelector); err != nil {
		return nil, fmt.Errorf("%w: Watch.LabelSelector: %w", errInvalidConfig, err)
	}
	if !cfg.NoEvents {
		if c.rec, err = NewRecorder(RecorderConfig{Dynamic: cfg.Dynamic, Controller: cfg.Name, Resource: cfg.Resource}); err != nil {
			return nil, fmt.Errorf("%w: %w", errInvalidConfig, err)
		}
	}
	if c.trig, err = trigger.New(trigger.Config[T]{Router: router[T]{c}, Get: c.client.Get, Resource: cfg.Resource, Namespace: cfg.Watch.Namespace,
		Selector: c.sel, Priority: cfg.TriggerPriority, Rate: cfg.TriggerRate, Burst: cfg.TriggerBurst,
		Metrics: cfg.TriggerMetrics, Logger: c.log}); err != nil {
		return nil, fmt.Errorf("%w: %w", errInvalidConfig, err)
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
		d, err := dynamic.NewForConfig(WithClientDefaults(cfg.RESTConfig))
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
	cfg.Concurrency = cmp.Or(cfg.Concurrency, defaultConcurrency)
	if cfg.ReservedWorkers == 0 && cfg.Concurrency > 1 {
		cfg.ReservedWorkers = 1
	}
	cfg.ReservedWorkers = max(cfg.ReservedWorkers, 0)
	cfg.MaxRetries = cmp.Or(cfg.MaxRetries, defaultMaxRetries)
	cfg.Timeout = cmp.Or(cfg.Timeout, defaultTimeout)
	cfg.ShutdownTimeout = cmp.Or(cfg.ShutdownTimeout, defaultShutdownTimeout)
	cfg.Metrics = cmp.Or[Metrics](cfg.Metrics, noMetrics{})
	cfg.Shards.Count = max(cfg.Shards.Count, 1)
	return cfg
}

// Trigger returns the controller's trigger (the watch's scope, its
// shards' places).
func (c *Controller[T]) Trigger() *trigger.Trigger[T] { return c.trig }

// Runnable returns the controller as a [Group] component.
func (c *Controller[T]) Runnable() Runnable {
	return Runnable{Name: c.cfg.Name, Run: c.Run, Ready: c.Check}
}

// Held returns the number of shards this replica works on now.
func (c *Controller[T]) Held() int {
	n := 0
	for _, s := range c.shards {
		if s != nil && s.open() {
			n++
		}
	}
	return n
}

// Queues returns the shards' queues (nil: never this replica's).
func (c *Controller[T]) Queues() []*queue.Queue[opkit.Key, opkit.Cause[T]] {
	qs := make([]*queue.Queue[opkit.Key, opkit.Cause[T]], len(c.shards))
	for i, s := range c.shards {
		if s != nil {
			qs[i] = s.queue
		}
	}
	return qs
}

// Balancer returns the shards' Leases' balancer, if any.
func (c *Controller[T]) Balancer() *leader.Balancer { return c.balancer }

// QueueStats sums the stats of this replica's shards' queues.
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

// Check is a readiness check: the electors', and the watchers' in use.
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
		err := s.check()
		if err != nil && len(c.shards) > 1 {
			err = fmt.Errorf("shard %d: %w", s.index, err)
		}
		errs = append(errs, err)
	}
	return errors.Join(errs...)
}

// AddTermWork registers r, before Run, to run in the first shard's terms.
func (c *Controller[T]) AddTermWork(r Runnable) error {
	if r.Run == nil || r.Name == "" {
		return errors.New("reconcile: term work needs a Name and a Run func")
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.running {
		return errAlreadyRunning
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

// requestAnnotation is the watchers' RequestAnnotation: Watch's ("-":
// none); when Watch leaves it empty, watcher.DefaultRequestAnnotation if
// T's status can record what it handled (status.lastHandledReconcileAt,
// which Status writes), else none.
func (c *Controller[T]) requestAnnotation() string {
	switch a := c.cfg.Watch.RequestAnnotation; {
	case a == "-":
		return ""
	case a != "":
		return a
	case recordsRequests[T]():
		return watcher.DefaultRequestAnnotation
	}
	return ""
}

// sayWhyRequestsAreNotRecorded logs, at start, why durable triggers are
// off, or are on and never recorded handled.
func (c *Controller[T]) sayWhyRequestsAreNotRecorded() {
	var zero T
	switch a := c.cfg.Watch.RequestAnnotation; {
	case a == "-" || recordsRequests[T]():
	case a == "":
		c.log.Info("durable triggers (the annotation "+watcher.DefaultRequestAnnotation+") are off: the status has no lastHandledReconcileAt field to record them handled in",
			"type", fmt.Sprintf("%T", zero))
	default:
		c.log.Warn("durable triggers are never recorded handled: the status has no lastHandledReconcileAt field, so every change of an annotated object counts as a trigger",
			"annotation", a, "type", fmt.Sprintf("%T", zero))
	}
}

// Run runs the controller until ctx ends and returns nil, or the error of
// a component that failed.
func (c *Controller[T]) Run(ctx context.Context) error {
	c.mu.Lock()
	if c.running {
		c.mu.Unlock()
		return errAlreadyRunning
	}
	c.running = true
	work := c.termWork
	c.mu.Unlock()
	c.sayWhyRequestsAreNotRecorded()

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
	for _, s := range c.shards {
		if s == nil {
			continue
		}
		w := work
		work = nil // the term work runs in the first shard's terms only
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
			return nil, fmt.Errorf("%w: %w", errInvalidConfig, err)
		}
		if slices.ContainsFunc(out, func(o *watcher.Related[T]) bool { return o.Name() == r.Name() }) {
			return nil, fmt.Errorf("%w: related resource %s named twice in Owns and Watches", errInvalidConfig, r.Name())
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
