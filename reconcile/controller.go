package reconcile

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"runtime/debug"
	"sync"
	"time"

	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/apimachinery/pkg/types"
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
	// DefaultMaxRetries is how many times a failed reconcile is retried
	// before the controller gives up on it: with the queue's default
	// backoff (5ms doubling, capped at 5m) about 25 minutes of retries, or
	// more (up to MaxRetries times the cap) when the key was already
	// failing before the request began (see Config.Backoff).
	DefaultMaxRetries = 20
	// DefaultTimeout bounds one reconcile call.
	DefaultTimeout = 5 * time.Minute
	// DefaultShutdownTimeout is how long in-flight reconciles may run on
	// after shutdown began before their contexts are cancelled.
	DefaultShutdownTimeout = 30 * time.Second
	// DefaultFreshFor is how long a watch event stays fresh enough to be
	// reconciled without a re-fetch.
	DefaultFreshFor = time.Second
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
	// MaxRetries is how many retries a failing request gets before the
	// controller gives up on it; default DefaultMaxRetries (20); negative
	// means retry forever. The count belongs to the request: a new event
	// for the key (a watch event or a trigger) merged into a pending retry
	// is reconciled at its own due time (at once, unless it was delayed),
	// not the retry's, and starts again from retry 0 (a pending
	// delete keeps its own entry and count: see MergeEvents; the delay keeps
	// growing: see Backoff; a new Deleted trigger merged into a teardown
	// waiting for its retry runs with that count). An object that keeps
	// changing while its reconcile keeps failing is therefore never given
	// up on, but is
	// reconciled about once per change once the delay outgrows the time
	// between changes. A failing reconcile that itself writes a changing
	// status makes its own events and loops at the speed of the API
	// server: write status only when it changes, or set
	// Watch.SkipStatusOnly. A key given up on waits for its next event:
	// there is no periodic resync. For controller-runtime's behaviour
	// (retry until it works) set MaxRetries negative; to look at an object
	// again periodically (drift from external state), return RequeueAfter.
	MaxRetries int
	// Backoff is the retry delay policy; the zero value means the queue's
	// defaults (queue.DefaultBackoffBase 5ms doubling to
	// queue.DefaultBackoffCap 5m, queue.DefaultBackoffJitter 10%). The delay
	// grows with the key's consecutive failures since its last success,
	// not with the request's retries: a new event merged into a pending
	// retry is reconciled at once, but when that fails too its retry waits
	// longer than the last one, as with controller-runtime's per-item rate
	// limiter. A recreated object (another UID) starts again from the
	// shortest delay, and a delete backs off on its own retries alone (a
	// new object of the name does not wait for them: its events go in
	// front of the delete's retry, see MergeEvents).
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
	// FreshFor decides which requests are re-fetched: an Added/Modified
	// entry from the watch, or from a trigger that read its object from the
	// API server just before (opkit.Event.Fetched: the HTTP handler and
	// the consumer) at the resourceVersion the watch has seen last, that
	// was not delayed, not retried and is handed to a worker within
	// FreshFor of its add is reconciled with the object it carries. Every
	// other Added/Modified request (waited in a backlog, delayed, retried,
	// requeued, an unmarked trigger, or one whose object is not the
	// watch's latest) is re-fetched from the API server first. Default
	// DefaultFreshFor (1s); negative means always re-fetch.
	FreshFor time.Duration

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
	queue   *queue.Queue[opkit.Key, opkit.Event[T]]
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

	fails failures // consecutive failures per key, for the backoff

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
	if cfg.FreshFor == 0 {
		cfg.FreshFor = DefaultFreshFor
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
		termReady: map[string]func() error{},
	}
	if c.metrics == nil {
		c.metrics = noMetrics{}
	}
	// Timestamps: needsRefetch reads Item.Enqueued and Item.Due.
	c.queue = queue.New[opkit.Key](queue.Config[opkit.Event[T]]{Merge: MergeEvents[T], Metrics: cfg.QueueMetrics, Timestamps: true})

	wcfg := cfg.Watch
	wcfg.Client, wcfg.Resource, wcfg.Queue = cfg.Dynamic, cfg.Resource, c.queue
	// A delete cleared from the queue at the end of a term, or whose
	// reconcile was interrupted, comes back with the next term's list;
	// afterReconcile settles it.
	wcfg.RetainDeletes = true
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
	tr, err := trigger.New(trigger.Config[T]{Queue: c.queue, Resource: cfg.Resource, Namespace: cfg.Watch.Namespace, Selector: sel,
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
func (c *Controller[T]) Queue() *queue.Queue[opkit.Key, opkit.Event[T]] { return c.queue }

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
	reserved := func(ctx context.Context) (queue.Item[opkit.Key, opkit.Event[T]], error) {
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
	c.fails.reset()
	return failed()
}

// worker takes entries with get until intakeCtx ends and reconciles them
// under workCtx.
func (c *Controller[T]) worker(intakeCtx, workCtx context.Context, log *slog.Logger, get func(context.Context) (queue.Item[opkit.Key, opkit.Event[T]], error)) {
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
		c.process(workCtx, item, log)
		c.queue.Done(item.Key)
	}
}

// needsRefetch applies the FreshFor rule to an Added/Modified item.
func (c *Controller[T]) needsRefetch(item queue.Item[opkit.Key, opkit.Event[T]]) bool {
	ev := item.Value
	if ev.Type == opkit.Deleted {
		return false
	}
	if c.cfg.FreshFor < 0 || item.Retries > 0 || isNil(ev.Object) {
		return true
	}
	if ev.Source != opkit.APIServer {
		// A trigger is trusted only with an object read from the API server
		// (Fetched) that is the latest state the watch has seen: a GET
		// answered before the watch delivered a newer state would otherwise
		// be reconciled after it, and nothing would follow.
		if !ev.Fetched {
			return true
		}
		if rv, ok := c.watch.ResourceVersion(item.Key); !ok || rv != ev.Object.GetResourceVersion() {
			return true
		}
	}
	if item.Due.After(item.Enqueued) { // it was delayed
		return true
	}
	return time.Since(item.Enqueued) > c.cfg.FreshFor
}

func (c *Controller[T]) process(ctx context.Context, item queue.Item[opkit.Key, opkit.Event[T]], log *slog.Logger) {
	ev := item.Value
	log = log.With("key", item.Key.String(), "type", ev.Type.String(), "source", ev.Source.String(), "retry", item.Retries)
	req := Request[T]{
		Key: item.Key, Object: ev.Object, Type: ev.Type, Source: ev.Source,
		Retries: item.Retries, Reason: ev.Reason, Requeued: ev.Requeued, FinalStateUnknown: ev.FinalStateUnknown,
	}
	if ev.Source == opkit.Operator && !ev.Requeued && !ev.Retried && c.cfg.RecordTriggerEvents && !isNil(ev.Object) {
		// Before the re-fetch: a trigger whose first read fails is retried
		// with Retries 1 and would go unrecorded.
		note := "reconcile requested by an external trigger"
		if ev.Reason != "" {
			note += ": " + ev.Reason
		}
		if err := c.rec.Record(ctx, ev.Object, EventSpec{Type: EventNormal, Reason: "Triggered", Action: "Reconcile", Note: note}); err != nil {
			log.Warn("recording the trigger event failed", "err", err)
		}
	}
	if c.needsRefetch(item) {
		c.metrics.Refetched()
		obj, err := c.refetch(ctx, item.Key)
		switch {
		case typed.Gone(err, item.Key.Name):
			log.Debug("object gone before its reconcile: skipped")
			c.metrics.Skipped(SkipGone)
			c.fails.forget(item.Key, "") // no object of the name is left
			return
		case err != nil:
			// Not the reconciler's fault, but retried the same way. The
			// retry carries no object: the one it came with may be of
			// another object of the name (a stale trigger), which must not
			// decide what the retry merges with; it reads the name again
			// (a Warning Event when it is given up on names the key).
			c.afterReconcile(ctx, item, req, Done(), fmt.Errorf("re-fetch: %w", typed.Explain(err, c.cfg.Resource, item.Key.Name)), 0, true, log)
			return
		}
		req.Object = obj
	}
	if c.sel != nil && !isNil(req.Object) && ev.Type != opkit.Deleted &&
		!c.sel.Matches(labels.Set(req.Object.GetLabels())) {
		// The object, as it is now (a trigger's, or one read again for a
		// requeue or a retry), is not one the watch sees: another
		// controller's (a shard selected by label), or one that left the
		// selector, whose Deleted the watch delivers. Deletes are never
		// skipped: the watch's carry an object that left the selector or a
		// tombstone without labels (a Deleted trigger may have taken one),
		// and a Deleted trigger was judged when it was submitted.
		log.Info("object does not match the watch's label selector: skipped", "selector", c.sel.String())
		c.metrics.Skipped(SkipOutOfScope)
		c.fails.forget(item.Key, types.UID(uidOf(req.Object)))
		return
	}
	start := time.Now()
	res, err := c.call(ctx, req, log)
	c.afterReconcile(ctx, item, req, res, err, time.Since(start), false, log)
}

// refetch reads the object from the API server, bounded by the
// per-reconcile timeout so that a hung API server cannot hold a worker
// until the term or the drain ends.
func (c *Controller[T]) refetch(ctx context.Context, key opkit.Key) (T, error) {
	if c.cfg.Timeout > 0 {
		var cancel context.CancelFunc
		ctx, cancel = context.WithTimeout(ctx, c.cfg.Timeout)
		defer cancel()
	}
	return c.client.Get(ctx, key)
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

// afterReconcile applies the decision table of [Reconciler]. With
// readAgain (the re-fetch failed), a re-add carries no object and reads
// the name again.
func (c *Controller[T]) afterReconcile(ctx context.Context, item queue.Item[opkit.Key, opkit.Event[T]], req Request[T], res Result, err error, took time.Duration, readAgain bool, log *slog.Logger) {
	ev := item.Value
	if !isNil(req.Object) {
		ev.Object = req.Object
	}
	// The object's failure streak ends with any outcome but a retry (and
	// an interruption, which the end of the term deals with).
	uid := types.UID(uidOf(req.Object))
	subject := req.Object // what a failure Event is about
	if readAgain {
		// The object it came with may be an earlier one of the name: the
		// re-add reads the name again, the failure counts for the key's
		// streak whatever object it has, and an Event names the key.
		var none T
		ev.Object, uid, subject = none, "", none
	}
	ev.Fetched = false // a re-add is read again (no object, or a retry) in any case
	after, requeue := res.Requeue()
	// The watcher keeps a deleted object's key until its delete is dealt
	// with (done, terminal, given up on), so that the next term's list
	// brings it back if the queue loses it while it is retried, requeued
	// or interrupted.
	settle := func() {
		// Only the watch's deletes: a Deleted trigger's own object is its
		// caller's snapshot, and settling by it could drop a tombstone
		// whose own entry the end of a term then clears (a trigger that
		// took the watch's delete is marked Watched: MergeEvents).
		if ev.Type == opkit.Deleted && watchDelete(ev) && !isNil(ev.Object) {
			c.watch.Settle(item.Key, ev.Object.GetUID(), ev.Object.GetResourceVersion())
		}
	}
	switch {
	case err == nil && !requeue:
		c.fails.forget(item.Key, uid)
		settle()
		c.metrics.Reconciled(OutcomeDone, took)
		log.Debug("reconciled", "took", took)
	case err == nil:
		c.fails.forget(item.Key, uid)
		c.metrics.Reconciled(OutcomeRequeue, took)
		log.Debug("reconciled; requeued", "after", after, "took", took)
		if ev.Type != opkit.Deleted {
			// The object the reconciler saw may be older than its own writes:
			// without an object the next attempt re-fetches (needsRefetch).
			var none T
			ev.Object = none
		}
		ev.Requeued = true
		c.add(item.Key, ev, queue.AddOptions{Delay: after}, log)
	case ctx.Err() != nil:
		// The term ended or the drain ran out: not the reconciler's failure,
		// and nothing may be written any more. The next term (or process)
		// starts with a full list.
		c.metrics.Reconciled(OutcomeInterrupted, took)
		log.Info("reconcile interrupted by shutdown or the end of the term", "err", err)
	case IsTerminal(err):
		c.fails.forget(item.Key, uid)
		settle()
		c.metrics.Reconciled(OutcomeTerminal, took)
		log.Error("reconcile failed with a terminal error: not retried", "err", err)
		c.record(ctx, subjectOf(subject, item.Key), "ReconcileTerminalError", err, log)
	case c.cfg.MaxRetries >= 0 && item.Retries >= c.cfg.MaxRetries:
		c.fails.forget(item.Key, uid)
		settle()
		c.metrics.Reconciled(OutcomeGaveUp, took)
		log.Error("reconcile failed on its last retry: dropped", "err", err, "maxRetries", c.cfg.MaxRetries)
		c.record(ctx, subjectOf(subject, item.Key), "ReconcileFailed", fmt.Errorf("gave up after %d retries: %w", item.Retries, err), log)
	default:
		c.metrics.Reconciled(OutcomeRetry, took)
		retries := item.Retries + 1
		// The key's streak, not the request's retries: a new event that
		// took over a pending retry does not restart the backoff. A delete
		// backs off on its own retries: the object is gone (a new object
		// of its name goes in front of the retry: MergeEvents).
		streak := retries
		if ev.Type == opkit.Deleted {
			c.fails.forget(item.Key, uid)
		} else {
			streak = max(retries, c.fails.fail(item.Key, uid))
		}
		delay := c.cfg.Backoff.Delay(streak)
		if requeue {
			delay = max(delay, after)
		}
		log.Warn("reconcile failed: retrying", "err", err, "after", delay)
		ev.Retried = true
		c.add(item.Key, ev, queue.AddOptions{Delay: delay, Retries: retries, Priority: item.Priority}, log)
	}
}

func (c *Controller[T]) add(key opkit.Key, ev opkit.Event[T], opts queue.AddOptions, log *slog.Logger) {
	if out := c.queue.Add(key, ev, opts); !out.Accepted() {
		log.Debug("requeue dropped", "outcome", out.String())
	}
}

// subjectOf is what a failure Event is about: the request's object, or,
// when its read failed (the object it came with may be an earlier one of
// the name), a reference to the key: the Event then names the object by
// kind, namespace and name.
func subjectOf[T opkit.Object](obj T, key opkit.Key) T {
	if isNil(obj) {
		return typed.Tombstone[T](key, "", "")
	}
	return obj
}

// record writes a Warning Event about a failure on obj; the recorder's own
// timeout bounds it even when ctx has ended.
func (c *Controller[T]) record(ctx context.Context, obj T, reason string, err error, log *slog.Logger) {
	if c.rec == nil || isNil(obj) {
		return
	}
	if rerr := c.rec.Record(context.WithoutCancel(ctx), obj, EventSpec{Type: EventWarning, Reason: reason, Action: "Reconcile", Note: err.Error()}); rerr != nil {
		log.Warn("recording the failure event failed", "err", rerr)
	}
}
