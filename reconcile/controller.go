package reconcile

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"runtime/debug"
	"strings"
	"sync"
	"time"

	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/client-go/dynamic"

	"github.com/opkit/opkit"
	"github.com/opkit/opkit/internal/typed"
	"github.com/opkit/opkit/leader"
	"github.com/opkit/opkit/queue"
	"github.com/opkit/opkit/trigger"
	"github.com/opkit/opkit/watcher"
)

// Defaults applied by [NewController] to zero fields of [Config].
const (
	// DefaultConcurrency is the number of worker goroutines.
	DefaultConcurrency = 4
	// DefaultMaxRetries is how many retries in a row the controller makes
	// on its own before it gives up on what keeps failing: with the
	// queue's default backoff (5ms doubling, capped at 5m) about 25
	// minutes of retries.
	DefaultMaxRetries = 20
	// DefaultTimeout bounds one reconcile call.
	DefaultTimeout = 5 * time.Minute
	// DefaultShutdownTimeout is how long in-flight reconciles may run on
	// after shutdown began before their contexts are cancelled.
	DefaultShutdownTimeout = 30 * time.Second
)

// Errors returned by the controller.
var (
	// ErrInvalidConfig wraps every configuration error from NewController.
	ErrInvalidConfig = errors.New("reconcile: invalid config")
	// ErrAlreadyRunning is returned by Run when it is called again.
	ErrAlreadyRunning = errors.New("reconcile: controller already running")
	// ErrPanic is wrapped by the error a panicking reconcile is turned into.
	ErrPanic = errors.New("reconcile: panic")
)

// Config configures a [Controller]. Name, Resource, Dynamic and Reconciler
// are required; every other zero field means its documented default.
type Config[T opkit.Object] struct {
	// Name identifies the controller in logs and as the reporting
	// controller of its Kubernetes Events, e.g. "demo.opkit.dev/demo".
	Name string
	// Resource is the resource T is served as (group, version, plural,
	// kind, scope).
	Resource opkit.Resource
	// Dynamic reads, watches and re-fetches objects.
	Dynamic dynamic.Interface
	// Reconciler is called for every request.
	Reconciler Reconciler[T]

	// Concurrency is the number of worker goroutines that take every
	// entry; default DefaultConcurrency (4).
	Concurrency int
	// ReservedWorkers is the number of additional workers that take only
	// entries of TriggerPriority or higher (queue.GetAtLeast): external
	// triggers, and their retries and requeues-on-error, which keep the
	// trigger's priority. With them a trigger never waits for a backlog
	// reconcile to finish when the Concurrency workers are all busy.
	// Per-key exclusivity still holds across all workers. Zero means 1
	// when Concurrency > 1 and 0 when Concurrency is 1 (a controller
	// configured for one reconcile at a time keeps it); negative means
	// none. Up to Concurrency + ReservedWorkers reconciles may run at once.
	// Entries the watcher produces at or above TriggerPriority (if
	// Watch.Priority is set that high) use the reserved workers too.
	ReservedWorkers int
	// MaxRetries is how many retries in a row the controller makes on its
	// own (turns that no change or trigger asked for) before it gives up
	// on the requests that keep failing (a delete is then settled; the
	// streak ends); default DefaultMaxRetries (20); negative means retry
	// forever. A turn that a change or a trigger asked for is always made,
	// so an object that keeps changing is never given up on. A key given
	// up on waits for its next change: there is no periodic resync (return
	// RequeueAfter to look at an object again periodically). A failing reconcile that itself writes a changing
	// status makes its own events and loops at the speed of the API
	// server: write status only when it changes, or set
	// Watch.SkipStatusOnly.
	MaxRetries int
	// Backoff is the retry delay policy; the zero value means the queue's
	// defaults (queue.DefaultBackoffBase 5ms doubling to
	// queue.DefaultBackoffCap 5m, queue.DefaultBackoffJitter 10%). The
	// delay grows with the key's consecutive failed turns: a change merged
	// into a pending retry is reconciled at once, but when that fails too
	// its retry waits longer than the last one, as with controller-
	// runtime's per-item rate limiter.
	Backoff queue.Backoff
	// Timeout bounds each reconcile call (its context's deadline); default
	// DefaultTimeout (5m); negative means none.
	Timeout time.Duration
	// ShutdownTimeout is how long in-flight reconciles may go on after Run's
	// context is cancelled before their contexts are cancelled too; default
	// DefaultShutdownTimeout (30s). With Leader it is also capped so that
	// the drain ends before another replica may acquire the Lease: one
	// RetryPeriod before the elector's bound, LeaseDuration - ClockSkew
	// after the term's last successful renew ([leader.Elector.WorkDeadline]);
	// at most 12s with the leader defaults, less when renewals were failing.
	ShutdownTimeout time.Duration
	// Watch configures the watcher. Client, Resource and Queue are set by
	// the controller and must be left zero; a nil Logger means the
	// controller's.
	Watch watcher.Config[T]

	// Leader, if set, makes the controller active only while this replica
	// holds the Lease (see package leader): each term runs the watcher
	// (with a fresh list), the workers and the term work, under a context
	// that ends with the term, and every reconcile log line carries the
	// term number. Gate is set by the controller (its queue) and must be
	// left nil; Client is required; a nil Logger means the controller's.
	// nil Leader: the controller is always active.
	Leader *leader.Config

	// TriggerPriority is the queue priority of external triggers
	// (Controller.Trigger); zero means trigger.DefaultPriority.
	TriggerPriority int
	// NoEvents turns off Kubernetes Events. By default the controller
	// records a Warning Event (events.k8s.io/v1, through Dynamic) on the
	// object when it gives up on it (after MaxRetries, or on a terminal
	// error); the identity needs "create" on events.events.k8s.io.
	NoEvents bool
	// RecordTriggerEvents also records a Normal Event ("Triggered") on the
	// object for every reconcile requested by an external trigger (source
	// Operator), with the trigger's reason: once per trigger, not for its
	// retries or for the requeues that follow it.
	RecordTriggerEvents bool

	// Logger receives the controller's logs; every line about a reconcile
	// carries key, type, source, retry and term (when leading). nil means
	// slog.Default().
	Logger *slog.Logger
	// Metrics receives the controller's measurements; nil means none.
	Metrics Metrics
	// QueueMetrics receives the queue's measurements; nil means none.
	QueueMetrics queue.Metrics
	// TriggerMetrics receives the measurements of Controller.Trigger
	// (enqueues by outcome, rejected input); nil means none.
	TriggerMetrics trigger.Metrics
}

// elector is what the controller needs of a *leader.Elector.
type elector interface {
	Run(ctx context.Context, work func(ctx context.Context) error) error
	Check() error
	IsLeader() bool
}

// Controller runs a [Reconciler] over one resource: one queue, one watcher,
// optionally a leader elector, Concurrency workers and ReservedWorkers
// workers kept for triggers. Build it with
// [NewController], start it with [Controller.Run].
//
// Goroutines: Run owns all of them — the watcher's Run, the workers, and
// with Leader the elector's campaign (whose terms run the watcher and the
// workers). None is left when Run returns.
//
// Termination: when Run's context is cancelled the controller stops its
// intake (the watcher stops, workers take no more entries), lets the
// reconciles in flight finish for up to ShutdownTimeout, then cancels their
// contexts and waits for them; entries still queued are abandoned (the next
// start relists). When a leadership term ends, in-flight reconciles are
// cancelled at once: another replica may take over.
type Controller[T opkit.Object] struct {
	cfg     Config[T]
	log     *slog.Logger
	metrics Metrics
	queue   *queue.Queue[opkit.Key, opkit.Cause[T]]
	client  *typed.Client[T]
	watch   *watcher.Watcher[T]
	elector elector         // nil without Leader
	leader  *leader.Elector // the same, typed
	// termOf reads the leadership term from a term's context.
	termOf func(context.Context) (int32, bool)
	trig   *trigger.Trigger[T]
	sel    labels.Selector // the watch's label selector; nil for none
	rec    *Recorder
	drain  time.Duration
	// drainMargin is how long before the elector's WorkDeadline a leader's
	// shutdown drain ends: its RetryPeriod.
	drainMargin time.Duration

	retries retries // the retry policy: failed turns per key

	mu        sync.Mutex
	running   bool
	termWork  []Runnable
	termReady map[string]func() error
}

// NewController validates cfg, applies its defaults and builds the queue,
// the watcher, the trigger and (with Leader) the elector. It starts nothing.
func NewController[T opkit.Object](cfg Config[T]) (*Controller[T], error) {
	bad := func(format string, args ...any) (*Controller[T], error) {
		return nil, fmt.Errorf("%w: %s", ErrInvalidConfig, fmt.Sprintf(format, args...))
	}
	switch {
	case cfg.Name == "":
		return bad("Name is required")
	case cfg.Dynamic == nil:
		return bad("Dynamic is required")
	case cfg.Reconciler == nil:
		return bad("Reconciler is required")
	case cfg.Watch.Client != nil || cfg.Watch.Queue != nil || cfg.Watch.Resource != (opkit.Resource{}):
		return bad("Watch.Client, Watch.Resource and Watch.Queue are set by the controller")
	case cfg.Leader != nil && cfg.Leader.Gate != nil:
		return bad("Leader.Gate is set by the controller")
	case cfg.RecordTriggerEvents && cfg.NoEvents:
		return bad("RecordTriggerEvents contradicts NoEvents")
	case cfg.Concurrency < 0:
		return bad("negative Concurrency %d", cfg.Concurrency)
	case cfg.ShutdownTimeout < 0:
		return bad("negative ShutdownTimeout %v", cfg.ShutdownTimeout)
	}
	if err := cfg.Resource.Validate(); err != nil {
		return bad("%v", err)
	}
	if cfg.Concurrency == 0 {
		cfg.Concurrency = DefaultConcurrency
	}
	switch {
	case cfg.ReservedWorkers < 0:
		cfg.ReservedWorkers = 0
	case cfg.ReservedWorkers == 0 && cfg.Concurrency > 1:
		cfg.ReservedWorkers = 1
	}
	if cfg.TriggerPriority == 0 {
		cfg.TriggerPriority = trigger.DefaultPriority
	}
	if cfg.MaxRetries == 0 {
		cfg.MaxRetries = DefaultMaxRetries
	}
	if cfg.Timeout == 0 {
		cfg.Timeout = DefaultTimeout
	}
	if cfg.ShutdownTimeout == 0 {
		cfg.ShutdownTimeout = DefaultShutdownTimeout
	}
	log := cfg.Logger
	if log == nil {
		log = slog.Default()
	}
	log = log.With("controller", cfg.Name)
	c := &Controller[T]{
		cfg:       cfg,
		log:       log,
		metrics:   cfg.Metrics,
		client:    typed.New[T](cfg.Dynamic, cfg.Resource),
		drain:     cfg.ShutdownTimeout,
		retries:   retries{backoff: cfg.Backoff},
		termReady: map[string]func() error{},
	}
	if c.metrics == nil {
		c.metrics = noMetrics{}
	}
	c.queue = queue.New[opkit.Key](queue.Config[opkit.Cause[T]]{Merge: (*opkit.Cause[T]).Merge, Metrics: cfg.QueueMetrics})

	wcfg := cfg.Watch
	wcfg.Client, wcfg.Resource, wcfg.Queue = cfg.Dynamic, cfg.Resource, c.queue
	if wcfg.Logger == nil {
		wcfg.Logger = log
	}
	w, err := watcher.New(wcfg)
	if err != nil {
		return nil, fmt.Errorf("%w: %w", ErrInvalidConfig, err)
	}
	c.watch = w

	// Triggers reach only what the watch sees: another namespace, or labels
	// the watch's selector leaves out, would be reconciled by a controller
	// not meant to handle them (e.g. one shard of several).
	var sel labels.Selector
	if cfg.Watch.LabelSelector != "" {
		if sel, err = labels.Parse(cfg.Watch.LabelSelector); err != nil {
			return nil, fmt.Errorf("%w: Watch.LabelSelector: %w", ErrInvalidConfig, err)
		}
	}
	tr, err := trigger.New(trigger.Config[T]{Queue: c.queue, Get: c.client.Get, Resource: cfg.Resource, Namespace: cfg.Watch.Namespace, Selector: sel,
		Priority: cfg.TriggerPriority, Metrics: cfg.TriggerMetrics, Logger: log})
	if err != nil {
		return nil, fmt.Errorf("%w: %w", ErrInvalidConfig, err)
	}
	c.trig, c.sel = tr, sel

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
		lcfg.Gate = c.queue
		if lcfg.Logger == nil {
			lcfg.Logger = log
		}
		el, err := leader.New(lcfg)
		if err != nil {
			return nil, fmt.Errorf("%w: %w", ErrInvalidConfig, err)
		}
		c.elector, c.leader = el, el
		c.termOf = func(ctx context.Context) (int32, bool) {
			t, ok := leader.TermFrom(ctx)
			return t.Number, ok
		}
		c.drainMargin = cmp.Or(lcfg.RetryPeriod, leader.DefaultRetryPeriod)
	}
	return c, nil
}

// Elector returns the leader elector, or nil without Config.Leader. Use it
// to report the current leader (e.g. in a follower's 503 answers).
func (c *Controller[T]) Elector() *leader.Elector { return c.leader }

// Trigger returns the trigger bound to the controller's queue, for the
// HTTP handler, message consumers and the operator's own code. Its adds are
// dropped (false) while this replica is not the leader. Its scope is the
// watch's: Config.Watch.Namespace and LabelSelector (trigger.ErrOutOfScope).
func (c *Controller[T]) Trigger() *trigger.Trigger[T] { return c.trig }

// Runnable returns the controller as a [Group] component: its Name, Run
// and Check.
func (c *Controller[T]) Runnable() Runnable {
	return Runnable{Name: c.cfg.Name, Run: c.Run, Ready: c.Check}
}

// Queue returns the controller's queue (its length, for diagnostics).
func (c *Controller[T]) Queue() *queue.Queue[opkit.Key, opkit.Cause[T]] { return c.queue }

// Check is a readiness check: nil for a follower standing by; for an
// active controller, the watcher's health (running, synced, connected);
// with Leader also the elector's. It is safe to call from any goroutine.
func (c *Controller[T]) Check() error {
	var errs []error
	if c.elector != nil {
		if err := c.elector.Check(); err != nil {
			errs = append(errs, err)
		}
		if !c.elector.IsLeader() {
			return errors.Join(errs...)
		}
	}
	if err := c.watch.Check(); err != nil {
		errs = append(errs, err)
	}
	return errors.Join(errs...)
}

// AddTermWork registers r to run alongside the watcher and the workers:
// in every leadership term with Leader (its context ends with the term),
// for the whole of Run without. It must be called before Run. Its Ready
// check, if any, is ignored here (a [Group] reports it).
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

// Run runs the controller until ctx is cancelled, then shuts down as
// described on [Controller], and returns nil once every goroutine it
// started has returned. It returns an error if a component fails (the
// watcher, term work, the elector with ExitOnLoss), and ErrAlreadyRunning
// if called twice.
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

	if c.elector == nil {
		return c.runTerm(ctx, ctx, work)
	}
	return c.elector.Run(ctx, func(termCtx context.Context) error {
		return c.runTerm(ctx, termCtx, work)
	})
}

// runTerm runs the watcher, the term work and the workers until termCtx
// ends (or a component fails), then stops them: at once when the term was
// lost, after a drain of up to c.drain when runCtx (the process) is ending.
func (c *Controller[T]) runTerm(runCtx, termCtx context.Context, work []Runnable) error {
	log := c.log
	if c.termOf != nil {
		if term, ok := c.termOf(termCtx); ok {
			log = log.With("term", term)
		}
	}
	// Intake side: the watcher, term work and workers' Get stop with it.
	intakeCtx, stopIntake := context.WithCancel(termCtx)
	defer stopIntake()
	// Reconciles run under workCtx: it keeps termCtx's values (the term)
	// but is cancelled separately, after the drain.
	workCtx, cancelWork := context.WithCancel(context.WithoutCancel(termCtx))
	defer cancelWork()

	var (
		wg       sync.WaitGroup
		errMu    sync.Mutex
		firstErr error
	)
	fail := func(err error) {
		errMu.Lock()
		if firstErr == nil {
			firstErr = err
		}
		errMu.Unlock()
		stopIntake()
	}
	failed := func() error {
		errMu.Lock()
		defer errMu.Unlock()
		return firstErr
	}
	wg.Go(func() {
		if err := c.watch.Run(intakeCtx); err != nil {
			fail(fmt.Errorf("reconcile: watcher: %w", err))
		}
	})
	for _, r := range work {
		wg.Go(func() {
			if err := r.Run(intakeCtx); err != nil && intakeCtx.Err() == nil {
				fail(fmt.Errorf("reconcile: %s: %w", r.Name, err))
			}
		})
	}
	var workers sync.WaitGroup
	for range c.cfg.Concurrency {
		workers.Go(func() { c.worker(intakeCtx, workCtx, log, c.queue.Get) })
	}
	reserved := func(ctx context.Context) (queue.Item[opkit.Key, opkit.Cause[T]], error) {
		return c.queue.GetAtLeast(ctx, c.cfg.TriggerPriority)
	}
	for range c.cfg.ReservedWorkers {
		workers.Go(func() { c.worker(intakeCtx, workCtx, log, reserved) })
	}

	<-intakeCtx.Done()
	if runCtx.Err() != nil && failed() == nil {
		// Graceful shutdown: no new intake; in-flight reconciles get the drain.
		if c.elector == nil {
			c.queue.ShutDown()
		}
		drain := c.drain
		if c.leader != nil {
			// Measured from the term's last successful renew, not from now:
			// when renewals were failing the Lease expires sooner.
			drain = max(0, min(drain, time.Until(c.leader.WorkDeadline().Add(-c.drainMargin))))
		}
		log.Info("controller stopping: draining in-flight reconciles", "deadline", drain)
		t := time.AfterFunc(drain, cancelWork)
		defer t.Stop()
	} else {
		// Term lost or a component failed: stop at once.
		cancelWork()
	}
	workers.Wait()
	cancelWork()
	wg.Wait()
	// Retries this term could not add (the intake closed) and reconciles
	// it interrupted leave streaks no entry stands for.
	c.retries.reset()
	return failed()
}

// worker takes entries with get until intakeCtx ends and runs their turns
// under workCtx.
func (c *Controller[T]) worker(intakeCtx, workCtx context.Context, log *slog.Logger, get func(context.Context) (queue.Item[opkit.Key, opkit.Cause[T]], error)) {
	for {
		item, err := get(intakeCtx)
		if err != nil {
			return
		}
		if intakeCtx.Err() != nil {
			// Handed out as the intake closed: abandoned like the queued ones.
			c.queue.Done(item.Key)
			return
		}
		c.runTurn(workCtx, item, log)
		c.queue.Done(item.Key)
	}
}

// turn is one hand-out of a key: the reconciles of its unsettled deletes,
// then of its live object, and what the key needs next.
type turn[T opkit.Object] struct {
	key     opkit.Key
	retries int           // the key's failed turns before this one
	asked   opkit.Sources // who asked for the turn: none for a retry of the controller's own
	log     *slog.Logger
	// What the outcomes leave to do.
	failed      bool          // a request failed and is retried
	floor       time.Duration // the longest RequeueAfter of a failed request
	requeue     bool          // a request asked to be run again after
	after       time.Duration // the shortest such delay
	interrupted bool          // the term or the drain ended
	again       opkit.Cause[T]
}

func (c *Controller[T]) runTurn(ctx context.Context, item queue.Item[opkit.Key, opkit.Cause[T]], log *slog.Logger) {
	key, cause := item.Key, item.Value
	t := &turn[T]{key: key, retries: c.retries.count(key, cause.Retries), asked: cause.Sources, log: log.With("key", key.String())}
	var term int32
	if c.termOf != nil {
		term, _ = c.termOf(ctx)
	}
	base := Request[T]{Key: key, Sources: cause.Sources, Reasons: cause.Reasons, Retries: t.retries, Term: term}
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
	if t.failed {
		delay := max(c.retries.when(key), t.floor)
		t.log.Warn("turn failed: retrying", "after", delay, "failures", t.retries+1)
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
	case !isNil(obj) && !cause.Teardown && c.sel != nil && !c.sel.Matches(labels.Set(obj.GetLabels())):
		// Not an object the watch sees (a trigger's for another shard, or
		// one that left the selector, whose delete the watch delivers).
		t.log.Info("object does not match the watch's label selector: skipped", "selector", c.sel.String())
		c.metrics.Skipped(SkipOutOfScope)
		return
	case !isNil(obj):
	case !cause.Teardown:
		if cause.Sources.Has(opkit.Operator) {
			t.log.Debug("triggered object not found: skipped")
			c.metrics.Skipped(SkipGone)
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
// the watch has seen (by resourceVersion); nothing, without a read, when
// the watch sees no object of the name and no trigger asked; else what
// the API server has.
func (c *Controller[T]) liveObject(ctx context.Context, key opkit.Key, cause opkit.Cause[T]) (T, error) {
	var none T
	rv, seen := c.watch.ResourceVersion(key)
	switch {
	case seen && !isNil(cause.Object) && cause.Object.GetResourceVersion() == rv:
		return cause.Object, nil
	case !seen && !cause.Sources.Has(opkit.Operator) && !cause.Teardown:
		return none, nil
	}
	c.metrics.Refetched()
	if c.cfg.Timeout > 0 {
		var cancel context.CancelFunc
		ctx, cancel = context.WithTimeout(ctx, c.cfg.Timeout)
		defer cancel()
	}
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
		c.metrics.Reconciled(OutcomeDone, took)
		log.Debug("reconciled", "took", took)
		return true
	case err == nil:
		c.metrics.Reconciled(OutcomeRequeue, took)
		log.Debug("reconciled; requeued", "after", after, "took", took)
		if !t.requeue || after < t.after {
			t.requeue, t.after = true, after
		}
		return false
	case ctx.Err() != nil:
		// The term ended or the drain ran out: not the reconciler's failure,
		// and nothing may be written any more.
		c.metrics.Reconciled(OutcomeInterrupted, took)
		log.Info("reconcile interrupted by shutdown or the end of the term", "err", err)
		t.interrupted = true
		return false
	case IsTerminal(err):
		c.metrics.Reconciled(OutcomeTerminal, took)
		log.Error("reconcile failed with a terminal error: not retried", "err", err)
		c.record(ctx, req, "ReconcileTerminalError", err, log)
		return true
	case c.cfg.MaxRetries >= 0 && t.retries >= c.cfg.MaxRetries && t.asked == 0:
		c.metrics.Reconciled(OutcomeGaveUp, took)
		log.Error("reconcile failed on its last retry: given up", "err", err, "maxRetries", c.cfg.MaxRetries)
		c.record(ctx, req, "ReconcileFailed", fmt.Errorf("gave up after %d retries: %w", t.retries, err), log)
		return true
	}
	c.metrics.Reconciled(OutcomeRetry, took)
	log.Warn("reconcile failed", "err", err)
	t.failed = true
	if requeue {
		t.floor = max(t.floor, after)
	}
	return false
}

// call runs the reconciler with the per-reconcile timeout and turns a panic
// into an error.
func (c *Controller[T]) call(ctx context.Context, req Request[T], log *slog.Logger) (res Result, err error) {
	if c.cfg.Timeout > 0 {
		var cancel context.CancelFunc
		ctx, cancel = context.WithTimeout(ctx, c.cfg.Timeout)
		defer cancel()
	}
	defer func() {
		if p := recover(); p != nil {
			c.metrics.Panicked()
			log.Error("reconcile panicked", "panic", fmt.Sprint(p), "stack", string(debug.Stack()))
			res, err = Done(), fmt.Errorf("%w: %v", ErrPanic, p)
		}
	}()
	return c.cfg.Reconciler.Reconcile(ctx, req)
}

func (c *Controller[T]) add(key opkit.Key, cause opkit.Cause[T], opts queue.AddOptions, log *slog.Logger) {
	if out := c.queue.Add(key, cause, opts); !out.Accepted() {
		log.Debug("requeue dropped", "outcome", out.String())
	}
}

// record writes a Warning Event about a failure of req: on its object, or
// on the key when it has none (a read that failed); the recorder's own
// timeout bounds it even when ctx has ended.
func (c *Controller[T]) record(ctx context.Context, req Request[T], reason string, err error, log *slog.Logger) {
	if c.rec == nil {
		return
	}
	obj := req.Object
	if isNil(obj) {
		obj = typed.Tombstone[T](req.Key, "", "")
	}
	if rerr := c.rec.Record(context.WithoutCancel(ctx), obj, EventSpec{Type: EventWarning, Reason: reason, Action: "Reconcile", Note: err.Error()}); rerr != nil {
		log.Warn("recording the failure event failed", "err", rerr)
	}
}
