package reconcile

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"runtime/debug"
	"slices"
	"strings"
	"sync"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/client-go/dynamic"
	"k8s.io/client-go/rest"

	"golang.org/x/sync/errgroup"

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

	// Concurrency is the number of workers that take every entry.
	// ReservedWorkers more take only entries at TriggerPriority or above,
	// so that a trigger never waits for a backlog reconcile: zero means 1
	// when Concurrency > 1, else none; negative means none.
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
	// Queue (leave them zero), a nil Logger, TriggerPriority, and an empty
	// RequestAnnotation to watcher.DefaultRequestAnnotation (durable
	// triggers: "-" for none).
	Watch watcher.Config[T]
	// Owns lists the resources of the objects the reconciler creates and
	// controls (children, with a controller reference to their owner): a
	// change of one, its deletion included, reconciles the owner (see
	// watcher.OwnedBy). Watches lists other related resources, each with
	// the mapping of its objects to the keys they concern. Their changes
	// join the keys' entries as source APIServer at the watch's priority,
	// naming the resource in Request.Related; a term's start lists them
	// without reconciling anything (the controller's own list reconciles
	// every object). Each runs its own watcher in the watch's namespace
	// when the resource is namespaced, keeping per object only its key,
	// resourceVersion and the keys it maps to: no cache of the objects.
	Owns    []opkit.Resource
	Watches []Watch
	// Leader, if set, runs the watcher, the workers and the term work only
	// while this replica holds the Lease, under a context that ends with
	// the term; the controller sets Gate (leave it nil) and a nil Logger.
	Leader *leader.Config

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
// goroutine it starts. When Run's context ends, in-flight reconciles get
// ShutdownTimeout to finish and the queue is abandoned (the next start
// lists everything); when a leadership term ends, they are cancelled.
type Controller[T opkit.Object] struct {
	cfg     Config[T]
	log     *slog.Logger
	queue   *queue.Queue[opkit.Key, opkit.Cause[T]]
	client  *typed.Client[T]
	watch   *watcher.Watcher[T]
	related []*watcher.Related[T] // Config.Owns, then Config.Watches
	// sharedRelated are a Sharded replica's related watchers, run and
	// checked by it for all its shards: the workers wait for their first
	// list as for the controller's own.
	sharedRelated []*watcher.Related[T]
	slots         chan struct{} // shared by a Sharded replica's controllers; nil: none
	// tickets are the shards whose triggers' tickets the controller
	// answers: a Sharded replica's shard controller answers only its
	// own shard's on the shared trigger; the zero Shards, every ticket.
	tickets opkit.Shards
	leader  *leader.Elector // nil without Config.Leader
	trig    *trigger.Trigger[T]
	sel     labels.Selector // the watch's label selector (everything for none)
	rec     *Recorder       // nil with NoEvents
	retries retries         // the retry policy: failed turns per key
	written writtenKeys     // the operator's own last write per key

	mu       sync.Mutex
	running  bool
	termWork []Runnable
}

// buildDynamic sets Dynamic, when it is nil, to a client built from
// RESTConfig (with the default rate when it has none).
func (cfg *Config[T]) buildDynamic() error {
	if cfg.Dynamic != nil || cfg.RESTConfig == nil {
		return nil
	}
	d, err := dynamic.NewForConfig(WithDefaultRate(cfg.RESTConfig))
	if err != nil {
		return fmt.Errorf("%w: RESTConfig: %w", ErrInvalidConfig, err)
	}
	cfg.Dynamic = d
	return nil
}

// NewController validates cfg and builds the controller; it starts
// nothing.
func NewController[T opkit.Object](cfg Config[T]) (*Controller[T], error) {
	bad := func(format string, args ...any) (*Controller[T], error) {
		return nil, fmt.Errorf("%w: %s", ErrInvalidConfig, fmt.Sprintf(format, args...))
	}
	if err := cfg.buildDynamic(); err != nil {
		return nil, err
	}
	switch err := cfg.Resource.Validate(); {
	case cfg.Name == "" || cfg.Dynamic == nil || cfg.Reconciler == nil:
		return bad("Name, Dynamic (or RESTConfig) and Reconciler are required")
	case err != nil:
		return bad("%v", err)
	case cfg.Watch.Client != nil || cfg.Watch.Queue != nil || cfg.Watch.Resource != (opkit.Resource{}):
		return bad("Watch.Client, Watch.Resource and Watch.Queue are set by the controller")
	case cfg.Leader != nil && cfg.Leader.Gate != nil:
		return bad("Leader.Gate is set by the controller")
	case cfg.RecordTriggerEvents && cfg.NoEvents:
		return bad("RecordTriggerEvents contradicts NoEvents")
	case cfg.Concurrency < 0 || cfg.ShutdownTimeout < 0:
		return bad("negative Concurrency or ShutdownTimeout")
	}
	cfg.Concurrency = cmp.Or(cfg.Concurrency, DefaultConcurrency)
	if cfg.ReservedWorkers == 0 && cfg.Concurrency > 1 {
		cfg.ReservedWorkers = 1
	}
	cfg.ReservedWorkers = max(cfg.ReservedWorkers, 0)
	cfg.TriggerPriority = cmp.Or(cfg.TriggerPriority, trigger.DefaultPriority)
	cfg.MaxRetries = cmp.Or(cfg.MaxRetries, DefaultMaxRetries)
	cfg.Timeout = cmp.Or(cfg.Timeout, DefaultTimeout)
	cfg.ShutdownTimeout = cmp.Or(cfg.ShutdownTimeout, DefaultShutdownTimeout)
	cfg.Metrics = cmp.Or[Metrics](cfg.Metrics, noMetrics{})
	log := cmp.Or(cfg.Logger, slog.Default()).With("controller", cfg.Name)
	c := &Controller[T]{cfg: cfg, log: log, client: typed.New[T](cfg.Dynamic, cfg.Resource), retries: retries{backoff: cfg.Backoff, n: map[opkit.Key]int{}}}
	c.queue = queue.New[opkit.Key](queue.Config[opkit.Cause[T]]{Merge: (*opkit.Cause[T]).Merge, Metrics: cfg.QueueMetrics})
	wcfg := cfg.Watch
	wcfg.Client, wcfg.Resource, wcfg.Queue, wcfg.Logger = cfg.Dynamic, cfg.Resource, c.queue, cmp.Or(wcfg.Logger, log)
	wcfg.TriggerPriority = cfg.TriggerPriority
	switch wcfg.RequestAnnotation {
	case "":
		wcfg.RequestAnnotation = watcher.DefaultRequestAnnotation
	case "-":
		wcfg.RequestAnnotation = ""
	}
	var err error
	if c.watch, err = watcher.New(wcfg); err != nil {
		return nil, fmt.Errorf("%w: %w", ErrInvalidConfig, err)
	}
	if c.related, err = relatedWatchers(cfg, c.queue, ownedIn(cfg.Resource, cfg.Watch.Shards), wcfg.Logger); err != nil {
		return nil, err
	}
	// Triggers reach only what the watch sees: another namespace, or labels
	// the watch's selector leaves out, would be reconciled by a controller
	// not meant to handle them (e.g. one shard of several).
	if c.sel, err = labels.Parse(cfg.Watch.LabelSelector); err != nil {
		return nil, fmt.Errorf("%w: Watch.LabelSelector: %w", ErrInvalidConfig, err)
	}
	if c.trig, err = c.newTrigger(c.queue, false, log); err != nil {
		return nil, err
	}
	if !cfg.NoEvents {
		if c.rec, err = NewRecorder(RecorderConfig{Dynamic: cfg.Dynamic, Controller: cfg.Name, Resource: cfg.Resource}); err != nil {
			return nil, fmt.Errorf("%w: %w", ErrInvalidConfig, err)
		}
	}
	if cfg.Leader != nil {
		// Closed from the start, not only from the elector's Run: a trigger
		// endpoint or consumer may be serving before Run is called, and this
		// replica does not lead yet.
		c.queue.Suspend()
		lcfg := *cfg.Leader
		lcfg.Gate, lcfg.Logger = c.queue, cmp.Or(lcfg.Logger, log)
		if c.leader, err = leader.New(lcfg); err != nil {
			return nil, fmt.Errorf("%w: %w", ErrInvalidConfig, err)
		}
	}
	return c, nil
}

// newTrigger returns a trigger of the controller's scope and settings
// that adds to q (by UID: a Sharded replica's shared trigger) and logs
// to log.
func (c *Controller[T]) newTrigger(q queue.Adder[opkit.Key, opkit.Cause[T]], byUID bool, log *slog.Logger) (*trigger.Trigger[T], error) {
	t, err := trigger.New(trigger.Config[T]{Queue: q, Get: c.client.Get, Resource: c.cfg.Resource, Namespace: c.cfg.Watch.Namespace,
		Selector: c.sel, Priority: c.cfg.TriggerPriority, Rate: c.cfg.TriggerRate, Burst: c.cfg.TriggerBurst, UIDRequired: byUID,
		Metrics: c.cfg.TriggerMetrics, Logger: log})
	if err != nil {
		return nil, fmt.Errorf("%w: %w", ErrInvalidConfig, err)
	}
	return t, nil
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

// identity names this replica in outcomes: the elector's identity, or ""
// without leader election.
func (c *Controller[T]) identity() string {
	if c.leader == nil {
		return ""
	}
	return c.leader.Identity()
}

// LeaderEndpoint is trigger.HandlerConfig's LeaderEndpoint for this
// controller: the trigger endpoint the leader publishes on its Lease
// (trigger.EndpointAnnotation in Config.Leader's Annotations) while this
// replica does not lead; "" while it leads, or without leader election.
func (c *Controller[T]) LeaderEndpoint() string {
	if c.leader == nil || c.leader.IsLeader() {
		return ""
	}
	return c.leader.LeaderAnnotation(trigger.EndpointAnnotation)
}

// Elector returns the leader elector, or nil without Config.Leader.
func (c *Controller[T]) Elector() *leader.Elector { return c.leader }

// Trigger returns the trigger bound to the controller's queue, with the
// watch's namespace and label selector as its scope; a Sharded replica's
// shard controllers return the replica's one trigger (Sharded.Trigger).
func (c *Controller[T]) Trigger() *trigger.Trigger[T] { return c.trig }

// Runnable returns the controller as a [Group] component.
func (c *Controller[T]) Runnable() Runnable {
	return Runnable{Name: c.cfg.Name, Run: c.Run, Ready: c.Check}
}

// Queue returns the controller's queue, for diagnostics.
func (c *Controller[T]) Queue() *queue.Queue[opkit.Key, opkit.Cause[T]] { return c.queue }

// Check is a readiness check: the elector's health, and for an active
// controller the watchers' (running, synced, connected).
func (c *Controller[T]) Check() error {
	var errs []error
	if c.leader != nil {
		if errs = append(errs, c.leader.Check()); !c.leader.IsLeader() {
			return errs[0]
		}
	}
	errs = append(errs, c.watch.Check())
	for _, r := range c.related {
		if err := r.Check(); err != nil {
			errs = append(errs, fmt.Errorf("related %s: %w", r.Name(), err))
		}
	}
	return errors.Join(errs...)
}

// AddTermWork registers r, before Run, to run beside the workers: in
// every leadership term, or for the whole Run without Leader.
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
	defer c.queue.ShutDown()

	if c.leader == nil {
		return c.runTerm(ctx, ctx, work)
	}
	return c.leader.Run(ctx, func(termCtx context.Context) error {
		return c.runTerm(ctx, termCtx, work)
	})
}

// runTerm runs the watcher, the term work and the workers until termCtx
// ends (or a component fails), then stops them: at once when the term was
// lost, after a drain of up to ShutdownTimeout when runCtx (the process)
// is ending.
func (c *Controller[T]) runTerm(runCtx, termCtx context.Context, work []Runnable) error {
	log := c.log
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
	components := []Runnable{{Name: "watcher", Run: c.watch.Run}}
	for _, r := range c.related {
		components = append(components, Runnable{Name: "related watcher " + r.Name(), Run: r.Run})
	}
	for _, r := range append(components, work...) {
		g.Go(func() error {
			if err := r.Run(intakeCtx); err != nil && intakeCtx.Err() == nil {
				return fmt.Errorf("reconcile: %s: %w", r.Name, err)
			}
			return nil
		})
	}
	var workers sync.WaitGroup
	for i := range c.cfg.Concurrency + c.cfg.ReservedWorkers {
		workers.Go(func() { c.worker(intakeCtx, workCtx, log, i >= c.cfg.Concurrency) })
	}

	<-intakeCtx.Done()
	if runCtx.Err() != nil && errors.Is(context.Cause(intakeCtx), context.Canceled) || errors.Is(context.Cause(intakeCtx), leader.ErrYielded) {
		// Graceful shutdown, or a shard handed to another replica: no new
		// intake; in-flight reconciles get the drain.
		drain := c.cfg.ShutdownTimeout
		if c.leader == nil {
			c.queue.ShutDown()
		} else {
			// Measured from the term's last successful renew, not from now
			// (when renewals were failing the Lease expires sooner), and
			// one RetryPeriod before that bound.
			margin := cmp.Or(c.cfg.Leader.RetryPeriod, leader.DefaultRetryPeriod)
			drain = max(0, min(drain, time.Until(c.leader.WorkDeadline().Add(-margin))))
		}
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
	c.retries.reset()
	c.trig.Abandon("the leadership term ended before the reconcile: the next leader reconciles every object", c.tickets)
	c.written.reset()
	return err
}

// relatedWatchers builds the watchers of cfg.Owns (a child mapped by
// owned) and cfg.Watches, adding to q.
func relatedWatchers[T opkit.Object](cfg Config[T], q queue.Adder[opkit.Key, opkit.Cause[T]], owned watcher.MapFunc, log *slog.Logger) ([]*watcher.Related[T], error) {
	watches := slices.Clone(cfg.Watches)
	for _, res := range cfg.Owns {
		watches = append(watches, Watch{Resource: res, Map: owned})
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

// ownedIn maps a child to the owner its controller reference names, of
// resource owner, when the owner's UID is of shards.
func ownedIn(owner opkit.Resource, shards opkit.Shards) watcher.MapFunc {
	m := watcher.OwnedBy(owner)
	if shards.All() {
		return m
	}
	return func(u *unstructured.Unstructured) []opkit.Key {
		if ref := metav1.GetControllerOfNoCopy(u); ref == nil || !shards.Contains(ref.UID) {
			return nil
		}
		return m(u)
	}
}

// takeSlot waits for one of the turns a Sharded replica runs at once
// (the shards' controllers share Concurrency); false if ctx ended first.
// A controller of its own has no such limit beyond its workers.
func (c *Controller[T]) takeSlot(ctx context.Context) bool {
	if c.slots == nil {
		return true
	}
	select {
	case c.slots <- struct{}{}:
		return true
	case <-ctx.Done():
		return false
	}
}

func (c *Controller[T]) releaseSlot() {
	if c.slots != nil {
		<-c.slots
	}
}

// worker takes entries (a reserved one only those at TriggerPriority or
// above) until intakeCtx ends and runs their turns under workCtx. The
// others start once the watchers' first lists are done, so that a term
// begins with what needs work, not with what the list delivered first.
func (c *Controller[T]) worker(intakeCtx, workCtx context.Context, log *slog.Logger, reserved bool) {
	get := c.queue.Get
	if reserved {
		get = func(ctx context.Context) (queue.Item[opkit.Key, opkit.Cause[T]], error) {
			return c.queue.GetAtLeast(ctx, c.cfg.TriggerPriority)
		}
	} else {
		if c.watch.WaitSynced(intakeCtx) != nil {
			return
		}
		// The related watchers' first lists add nothing: a change they see
		// before theirs is done would be missed by a term that started
		// reconciling without them.
		for _, r := range slices.Concat(c.related, c.sharedRelated) {
			if r.WaitSynced(intakeCtx) != nil {
				return
			}
		}
	}
	for {
		item, err := get(intakeCtx)
		if err != nil {
			return
		}
		if intakeCtx.Err() != nil || !reserved && !c.takeSlot(intakeCtx) {
			// Handed out as the intake closed: abandoned like the queued ones.
			c.queue.Done(item.Key)
			return
		}
		c.runTurn(workCtx, item, log)
		if !reserved {
			c.releaseSlot()
		}
		c.queue.Done(item.Key)
	}
}

// turn is one hand-out of a key: the reconciles of its unsettled deletes,
// then of its live object, and what the key needs next.
type turn[T opkit.Object] struct {
	log *slog.Logger
	// What the outcomes leave to do.
	failed      bool          // a request failed and is retried
	floor       time.Duration // the longest RequeueAfter of a failed request
	requeue     bool          // a request asked to be run again after
	after       time.Duration // the shortest such delay
	interrupted bool          // the term or the drain ended
	again       opkit.Cause[T]
	// What the turn's triggers learn (trigger.Outcome): the worst state
	// of its requests, the error of the one that set it.
	state trigger.State
	err   string
}

// severity orders the states a turn reports: the worst wins.
var severity = map[trigger.State]int{trigger.Skipped: 1, trigger.Succeeded: 2, trigger.Requeued: 3, trigger.Terminal: 4, trigger.Failed: 5}

// note records a request's state in the turn's outcome.
func (t *turn[T]) note(s trigger.State, err error) {
	if severity[s] > severity[t.state] {
		t.state, t.err = s, ""
		if err != nil {
			t.err = err.Error()
		}
	}
}

func (c *Controller[T]) runTurn(ctx context.Context, item queue.Item[opkit.Key, opkit.Cause[T]], log *slog.Logger) {
	key, cause := item.Key, item.Value
	term, _ := leader.TermFrom(ctx)
	base := Request[T]{Key: key, Sources: cause.Sources, Reasons: cause.Reasons, Related: cause.Related, Retries: c.retries.count(key, cause.Retries), Term: term.Number}
	t := &turn[T]{log: log.With("key", key.String())}
	began := time.Now()
	tw := &turnWrites{}
	ctx = context.WithValue(ctx, turnWritesKey{}, tw)
	defer func() {
		if rv := tw.get(); rv != "" {
			c.written.set(key, rv)
		}
	}()
	deletes := c.watch.Deletes(key)
	for _, d := range deletes {
		req := base
		req.Object, req.Type, req.FinalStateUnknown = d.Object, opkit.Deleted, d.FinalStateUnknown
		if c.run(ctx, t, req) {
			c.watch.Settle(key, d.Object.GetUID(), d.Object.GetResourceVersion())
		}
		if t.interrupted {
			return
		}
	}
	c.live(ctx, t, base, cause, len(deletes) > 0)
	if t.interrupted {
		// The next term (or process) starts with a full list, and the
		// ledger brings back what was not settled.
		return
	}
	if t.state == "" {
		t.state = trigger.Skipped
	}
	c.trig.Report(key, cause.Ticket, c.tickets, trigger.Outcome{State: t.state, Error: t.err, Attempts: base.Retries + 1,
		Duration: time.Since(began).Round(time.Microsecond).String(), Replica: c.identity(), Term: term.Number})
	if t.failed {
		delay := max(c.retries.when(key), t.floor)
		t.log.Warn("turn failed: retrying", "after", delay, "failures", base.Retries+1)
		t.again.Ticket = cause.Ticket // tickets waiting for a final outcome follow the retry
		c.add(key, t.again, queue.AddOptions{Delay: delay, Priority: item.Priority}, t.log)
	} else {
		c.retries.forget(key)
	}
	if t.requeue {
		c.add(key, t.again, queue.AddOptions{Delay: t.after, Priority: c.cfg.Watch.Priority}, t.log)
	}
}

// live reconciles the object that has the key's name now, if any: as the
// watch saw it last when the cause carries that state, else as read from
// the API server. A teardown reconciles it as Deleted; when it is gone,
// the teardown is served by the turn's deletes, if any, or reconciles the
// newest state known.
func (c *Controller[T]) live(ctx context.Context, t *turn[T], req Request[T], cause opkit.Cause[T], hadDeletes bool) {
	req.Type = opkit.Modified
	if cause.Added {
		req.Type = opkit.Added
	}
	if cause.Teardown {
		req.Type = opkit.Deleted
	}
	if req.Sources.Has(opkit.Operator) && c.cfg.RecordTriggerEvents {
		// On the object the trigger named (a trigger carries one), before
		// it is read: the trigger is recorded whatever the read finds.
		note := "reconcile requested by an external trigger"
		if len(req.Reasons) > 0 {
			note += ": " + strings.Join(req.Reasons, "; ")
		}
		if err := c.rec.Record(ctx, cause.Object, EventSpec{Type: EventNormal, Reason: "Triggered", Action: "Reconcile", Note: note}); err != nil {
			t.log.Warn("recording the trigger event failed", "err", err)
		}
	}
	obj, err := c.liveObject(ctx, req.Key, cause)
	if err != nil {
		// Not the reconciler's fault, but retried the same way.
		if !c.outcome(ctx, t, req, Done(), fmt.Errorf("re-fetch: %w", typed.Explain(err, c.cfg.Resource, req.Key.Name)), 0) {
			c.retryAs(t, req)
		}
		return
	}
	switch {
	case !isNil(obj) && !c.cfg.Watch.Shards.Contains(obj.GetUID()):
		// Another shard's object (a Watches mapping names keys of every
		// shard): its shard's controller reconciles it.
		t.log.Debug("object of another shard: skipped")
		c.cfg.Metrics.Skipped(SkipOutOfScope)
		return
	case !isNil(obj) && !c.sel.Matches(labels.Set(obj.GetLabels())):
		// Not an object the watch sees (a trigger's for another shard, or
		// one that left the selector, whose delete the watch delivers),
		// also for a teardown: this controller does not handle it.
		t.log.Info("object does not match the watch's label selector: skipped", "selector", c.sel.String())
		c.cfg.Metrics.Skipped(SkipOutOfScope)
		return
	case !isNil(obj):
	case !cause.Teardown:
		if cause.Sources.Has(opkit.Operator) {
			t.log.Debug("triggered object not found: skipped")
			c.cfg.Metrics.Skipped(SkipGone)
		}
		return
	case hadDeletes:
		return // the teardown of an object gone: its delete was reconciled
	case !isNil(cause.Object):
		obj = cause.Object
	default:
		obj, req.FinalStateUnknown = typed.Tombstone[T](req.Key, "", ""), true
	}
	req.Object = obj
	if !c.run(ctx, t, req) {
		c.retryAs(t, req)
	}
}

// retryAs makes the key's next turn reconcile the live object the way
// req did (Added, or a teardown). The turn reads it again: a re-add
// carries no object, and no source or reason (they reached this turn).
func (c *Controller[T]) retryAs(t *turn[T], req Request[T]) {
	t.again.Merge(opkit.Cause[T]{Added: req.Type == opkit.Added, Teardown: req.Type == opkit.Deleted})
}

// liveObject returns the object that has key's name now, or a nil T when
// there is none: the one the cause carries when it is the latest state
// the watch has seen (by resourceVersion) and no older than the last
// turn's own write of it (see writes.go); nothing, without a read, when
// the watch sees no object of the name and no trigger asked; else what
// the API server has.
func (c *Controller[T]) liveObject(ctx context.Context, key opkit.Key, cause opkit.Cause[T]) (T, error) {
	var none T
	rv, seen := c.watch.ResourceVersion(key)
	wrote := c.written.take(key) // the last turn's own write, which the watch may not have delivered
	switch {
	case seen && !isNil(cause.Object) && cause.Object.GetResourceVersion() == rv && !opkit.NewerResourceVersion(wrote, rv):
		return cause.Object, nil
	case !seen && !cause.Sources.Has(opkit.Operator) && !cause.Teardown:
		return none, nil
	}
	c.cfg.Metrics.Refetched()
	ctx, cancel := c.withTimeout(ctx)
	defer cancel()
	obj, err := c.client.Get(ctx, key)
	if typed.Gone(err, key.Name) {
		return none, nil
	}
	return obj, err
}

// run calls the reconciler for req and applies the decision table of
// [Reconciler] to its outcome; it reports whether req is finished (done,
// terminal, or given up on).
func (c *Controller[T]) run(ctx context.Context, t *turn[T], req Request[T]) bool {
	start := time.Now()
	res, err := c.call(ctx, req, t.log)
	return c.outcome(ctx, t, req, res, err, time.Since(start))
}

func (c *Controller[T]) outcome(ctx context.Context, t *turn[T], req Request[T], res Result, err error, took time.Duration) (finished bool) {
	log := t.log.With("type", req.Type.String(), "sources", req.Sources.String(), "retry", req.Retries)
	after, requeue := res.Requeue()
	switch {
	case err == nil && !requeue:
		c.cfg.Metrics.Reconciled(OutcomeDone, took)
		log.Debug("reconciled", "took", took)
		t.note(trigger.Succeeded, nil)
		return true
	case err == nil:
		c.cfg.Metrics.Reconciled(OutcomeRequeue, took)
		log.Debug("reconciled; requeued", "after", after, "took", took)
		if !t.requeue || after < t.after {
			t.requeue, t.after = true, after
		}
		t.note(trigger.Requeued, nil)
		return false
	case ctx.Err() != nil:
		// The term ended or the drain ran out: not the reconciler's failure,
		// and nothing may be written any more.
		c.cfg.Metrics.Reconciled(OutcomeInterrupted, took)
		log.Info("reconcile interrupted by shutdown or the end of the term", "err", err)
		t.interrupted = true
		return false
	case IsTerminal(err):
		c.cfg.Metrics.Reconciled(OutcomeTerminal, took)
		log.Error("reconcile failed with a terminal error: not retried", "err", err)
		c.record(ctx, req, "ReconcileTerminalError", err, log)
		t.note(trigger.Terminal, err)
		return true
	case c.cfg.MaxRetries >= 0 && req.Retries >= c.cfg.MaxRetries && req.Sources == 0: // a retry of the controller's own
		c.cfg.Metrics.Reconciled(OutcomeGaveUp, took)
		log.Error("reconcile failed on its last retry: given up", "err", err, "maxRetries", c.cfg.MaxRetries)
		c.record(ctx, req, "ReconcileFailed", fmt.Errorf("gave up after %d retries: %w", req.Retries, err), log)
		t.note(trigger.Terminal, fmt.Errorf("gave up after %d retries: %w", req.Retries, err))
		return true
	}
	c.cfg.Metrics.Reconciled(OutcomeRetry, took)
	log.Warn("reconcile failed", "err", err)
	t.note(trigger.Failed, err)
	t.failed = true
	if requeue {
		t.floor = max(t.floor, after)
	}
	return false
}

// call runs the reconciler with the per-reconcile timeout and turns a panic
// into an error.
func (c *Controller[T]) call(ctx context.Context, req Request[T], log *slog.Logger) (res Result, err error) {
	ctx, cancel := c.withTimeout(ctx)
	defer cancel()
	defer func() {
		if p := recover(); p != nil {
			c.cfg.Metrics.Panicked()
			log.Error("reconcile panicked", "panic", fmt.Sprint(p), "stack", string(debug.Stack()))
			res, err = Done(), fmt.Errorf("%w: %v", ErrPanic, p)
		}
	}()
	return c.cfg.Reconciler.Reconcile(ctx, req)
}

// withTimeout bounds ctx by the per-reconcile Timeout, unless it is negative.
func (c *Controller[T]) withTimeout(ctx context.Context) (context.Context, context.CancelFunc) {
	if c.cfg.Timeout < 0 {
		return context.WithCancel(ctx)
	}
	return context.WithTimeout(ctx, c.cfg.Timeout)
}

func (c *Controller[T]) add(key opkit.Key, cause opkit.Cause[T], opts queue.AddOptions, log *slog.Logger) {
	if out := c.queue.Add(key, cause, opts); !out.Accepted() {
		log.Debug("requeue dropped", "outcome", out.String())
	}
}

// record writes a Warning Event about a failure of req (none with NoEvents:
// a nil Recorder records nothing): on its object, or on the key when it has
// none (a read that failed); the recorder's own timeout bounds it even when
// ctx has ended.
func (c *Controller[T]) record(ctx context.Context, req Request[T], reason string, err error, log *slog.Logger) {
	obj := req.Object
	if isNil(obj) {
		obj = typed.Tombstone[T](req.Key, "", "")
	}
	if rerr := c.rec.Record(context.WithoutCancel(ctx), obj, EventSpec{Type: EventWarning, Reason: reason, Action: "Reconcile", Note: err.Error()}); rerr != nil {
		log.Warn("recording the failure event failed", "err", rerr)
	}
}
