package trigger

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"math"
	"reflect"
	"strings"
	"time"
	"unicode"
	"unicode/utf8"

	"k8s.io/apimachinery/pkg/api/validation/path"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/util/validation"
	"k8s.io/client-go/dynamic"
	"k8s.io/client-go/util/flowcontrol"

	"github.com/opkit/opkit"
	"github.com/opkit/opkit/internal/typed"
	"github.com/opkit/opkit/queue"
)

// defaultPriority is the queue priority of triggers when Config.Priority
// is zero: above watch events (0) and relists (-1).
const defaultPriority = 100

// MaxReasonLen is the longest Reason (in bytes) a trigger may carry.
const MaxReasonLen = 1024

// maxNameLen is the longest object name a trigger accepts, in bytes: the
// longest a DNS-1123 subdomain, which most resources' names are, may be.
const maxNameLen = validation.DNS1123SubdomainMaxLength

// ErrInvalid is wrapped by every error that reports bad input to Enqueue,
// Submit, Intake, the HTTP handler's parser and the consumer's message
// decoder. Check it with errors.Is.
var ErrInvalid = errors.New("invalid trigger")

// ErrOutOfScope is wrapped by the errors of Enqueue, Submit and
// [Trigger.Intake] for an object the trigger's controller does not
// handle: in another namespace than Config.Namespace, or, read by Intake
// (or carried by a Deleted trigger), with labels that Config.Selector
// does not match. The HTTP handler answers 404; the consumer hands the
// message back (it may be another controller's that shares the
// subscription).
var ErrOutOfScope = errors.New("object outside the controller's scope")

// ErrNotFound is wrapped by Intake's error when the object does not
// exist. The HTTP handler answers 404; the consumer acknowledges the
// message.
var ErrNotFound = errors.New("object not found")

// ErrBusy is wrapped by the errors that mean "not now, try again later":
// [Trigger.Intake] when the trigger budget (Config.Rate) is spent, and an
// Authenticator that has too many reviews in flight. The HTTP handler
// answers 429 with Retry-After; the consumer hands the message back after
// DroppedDelay.
var ErrBusy = errors.New("busy")

// Defaults of Config.Rate and Config.Burst.
const (
	defaultRate  = 5
	defaultBurst = 20
)

// errNoGetter is what Intake, NewHandler and NewConsumer answer for a
// Trigger that cannot read objects.
var errNoGetter = errors.New("trigger: the Trigger reads objects for the HTTP handler and the consumer: set Config.Get or Config.Dynamic")

// Config configures a Trigger. The zero value of every optional field means
// its documented default.
type Config[T opkit.Object] struct {
	// Queue is the one queue triggers go to, for a Trigger used alone;
	// Router, for a controller whose work may be shared over replicas
	// (reconcile.Controller's Trigger sets it). Exactly one is required.
	// Enqueue calls the queue's Add, which never blocks.
	Queue  queue.Adder[opkit.Key, opkit.Cause[T]]
	Router Router[T]
	// Get reads an object for Intake (the HTTP handler and the consumer);
	// reconcile's controller sets its own. If nil, a typed client over
	// Dynamic is used; with neither, Intake fails and NewHandler and
	// NewConsumer refuse the Trigger (Enqueue and Submit read nothing).
	// It must return API errors as they are (or wrapped), for
	// apierrors.IsNotFound and IsTimeout. An object is gone only when the
	// NotFound status names it: one without the name is the API server not
	// serving the resource (a CRD not installed yet), and the trigger is
	// retried (consumer) or answered 502 (handler), not dropped.
	Get func(ctx context.Context, key opkit.Key) (T, error)
	// Dynamic is the client of the default Get.
	Dynamic dynamic.Interface
	// Resource is the resource T is served as (required). Enqueue refuses
	// objects whose kind or group says they belong to another resource, and
	// checks the namespace against Resource.Namespaced.
	Resource opkit.Resource
	// Namespace, when set, is the one namespace the controller handles
	// (its watch's namespace; reconcile's controller sets it): Enqueue and
	// Submit refuse objects in other namespaces with an error wrapping
	// ErrOutOfScope, and the HTTP handler and the consumer check the key
	// before they read the object. Empty means every namespace; it must be
	// empty for a cluster-scoped resource.
	Namespace string
	// Selector, when set, is the label selector of the controller's watch.
	// Intake refuses an object it read, and Submit a Deleted trigger's
	// object, whose labels it does not match (ErrOutOfScope); any other
	// object may be a stale or partial copy, so reconcile's controller
	// checks the object it reconciles instead, and skips it when it does
	// not match. nil means every object. A watch's field selector is not
	// checked.
	Selector labels.Selector
	// Priority is the queue priority of triggered entries. Zero means
	// 100. Because zero means "default", a trigger cannot
	// be configured to rank exactly with watch events; use 1 to rank just
	// above them or a negative value to rank below. It must fit in an
	// int32, the queue's range.
	Priority int
	// Rate and Burst are the trigger budget of Intake (the HTTP handler's
	// and the consumer's path): a trigger that joins an entry already
	// waiting for its key is free (no read, no new reconcile); any other
	// costs a token, then one read of the object and one reconcile. Rate
	// tokens come per second, at most Burst at once; without a token
	// Intake refuses with ErrBusy. So however many callers trigger, they
	// start at most Rate reconciles a second (each costing one read plus
	// what the reconcile sends), and the watch's reconciles keep the rest
	// of the API client's budget: keep Rate × (1 + requests per reconcile)
	// well below the client's QPS. Zero means 5 and 20; a negative
	// Rate means unlimited.
	Rate  float64
	Burst int
	// Metrics receives counts of outcomes; nil means no metrics.
	Metrics Metrics
	// Logger receives the records of dropped (Info: expected on
	// followers) and rejected (Warn) triggers, at most one of each kind
	// every 10s with the number left out; nil means slog.Default().
	Logger *slog.Logger
}

// Trigger puts external reconcile requests into a controller's queue. It
// holds no goroutines; its methods are safe for concurrent use.
type Trigger[T opkit.Object] struct {
	cfg     Config[T]               // validated, defaults applied
	budget  flowcontrol.RateLimiter // nil: unlimited
	shares  *shares                 // the callers' shares of budget; nil with it
	tickets *tickets                // the tracked triggers
	log     *sampler
}

// New validates cfg and returns a Trigger bound to cfg.Queue or cfg.Router.
func New[T opkit.Object](cfg Config[T]) (*Trigger[T], error) {
	resErr, nsErrs := cfg.Resource.Validate(), validation.IsDNS1123Label(cfg.Namespace)
	switch {
	case isNil(cfg.Queue) == isNil(cfg.Router):
		return nil, errors.New("trigger: set one of Config.Queue and Config.Router")
	case resErr != nil:
		return nil, fmt.Errorf("trigger: Config.Resource: %w", resErr)
	case cfg.Namespace != "" && !cfg.Resource.Namespaced:
		return nil, fmt.Errorf("trigger: Config.Namespace %q for cluster-scoped %s", cfg.Namespace, cfg.Resource.Resource)
	case cfg.Namespace != "" && len(nsErrs) > 0:
		return nil, fmt.Errorf("trigger: Config.Namespace %q: %s", cfg.Namespace, strings.Join(nsErrs, "; "))
	case cfg.Priority < math.MinInt32 || cfg.Priority > math.MaxInt32:
		return nil, fmt.Errorf("trigger: Config.Priority %d is outside the queue's priority range (int32)", cfg.Priority)
	case math.IsNaN(cfg.Rate) || math.IsInf(cfg.Rate, 0) || cfg.Burst < 0:
		return nil, errors.New("trigger: Config.Rate must be finite and Config.Burst not negative")
	}
	if cfg.Get == nil && cfg.Dynamic != nil {
		cfg.Get = typed.New[T](cfg.Dynamic, cfg.Resource).Get
	}
	cfg.Priority = cmp.Or(cfg.Priority, defaultPriority)
	cfg.Metrics = cmp.Or[Metrics](cfg.Metrics, nopMetrics{})
	cfg.Logger = cmp.Or(cfg.Logger, slog.Default())
	if cfg.Router == nil {
		cfg.Router = alone[T]{cfg.Queue}
	}
	t := &Trigger[T]{cfg: cfg, tickets: newTickets(), log: newSampler(cfg.Logger)}
	if cfg.Rate >= 0 {
		rate, burst := float32(cmp.Or(cfg.Rate, defaultRate)), cmp.Or(cfg.Burst, defaultBurst)
		t.budget = flowcontrol.NewTokenBucketRateLimiter(rate, burst)
		t.shares = &shares{rate: rate / 2, burst: max(burst/2, 1), of: map[string]flowcontrol.RateLimiter{}}
	}
	return t, nil
}

// Priority returns the queue priority of triggered entries.
func (t *Trigger[T]) Priority() int { return t.cfg.Priority }

// Request is one reconcile request for [Trigger.Submit].
type Request[T opkit.Object] struct {
	// Object is the object to reconcile (required: namespace and name per
	// the resource's scope). Pass the state just read from the API server:
	// the controller reconciles it as is when its resourceVersion is the
	// latest its watch has seen, and reads the object again otherwise.
	Object T
	// Type is Modified for a plain "reconcile this", Added for the same
	// with Request.Type Added, or Deleted for a teardown (see
	// [Trigger.Enqueue]). The zero value is invalid so that a forgotten
	// field is caught.
	Type opkit.Type
	// Source must be opkit.Operator: APIServer is reserved for the watch
	// stream. The zero value is invalid.
	Source opkit.Source
	// Delay before the entry is due; zero means now, negative is invalid.
	// It is an upper bound: merged with another entry for the key, the
	// earlier due time wins (see the package documentation).
	Delay time.Duration
	// Retries seeds the key's retry count (>= 0): the controller's next
	// reconcile of the key counts at least this many failures.
	Retries int
	// Reason is an optional human-readable reason, carried into the
	// reconcile's Reasons (logs, Kubernetes Events); at most MaxReasonLen
	// bytes of valid UTF-8.
	Reason string
}

// Enqueue asks for a reconcile of obj on behalf of something outside the
// operator (source Operator: a pipeline, a message, an admin). It never
// blocks. typ Deleted asks for a teardown: the key's next reconcile is of
// type Deleted, with the object as it then is (if the watch's selector
// matches it; else nothing is reconciled), or, if it is gone, with
// the newest state known (obj, or what the watch saw since), unless a
// delete the watch delivered for the key is reconciled in the same turn.
// A teardown is a mark on the key's queue entry like any other cause: it
// merges, and it is retried until its reconcile succeeds, but, like every
// trigger, it does not outlive the leader's term.
//
//   - (true, nil): scheduled (queued, or merged into a pending entry).
//   - (false, nil): dropped, because the queue's intake is suspended (this
//     replica is not the leader, or leadership is changing) or the queue is
//     shut down. The drop is logged and counted; use [Trigger.Submit] to
//     learn which of the two it was.
//   - error: bad input, wrapping [ErrInvalid] (nil object, missing or
//     invalid name or namespace (see [CheckName]), namespace present for a
//     cluster-scoped resource or missing for a namespaced one, negative
//     delay, retries negative or beyond int32, invalid type or source,
//     source APIServer, an object of another kind, one without a UID
//     when the Router has more than one shard); an object in a
//     namespace the controller does not handle, or a Deleted trigger whose
//     object's labels the watch's selector does not match (wrapping
//     [ErrOutOfScope]; other objects' labels are checked when the object
//     is read for its reconcile); or
//     ctx's error when ctx has already ended. Nothing was queued.
func (t *Trigger[T]) Enqueue(ctx context.Context, obj T, typ opkit.Type, src opkit.Source, delay time.Duration, retries int) (bool, error) {
	o, err := t.Submit(ctx, Request[T]{Object: obj, Type: typ, Source: src, Delay: delay, Retries: retries})
	return o.Accepted(), err
}

// Submit is Enqueue with a reason and the queue's outcome: Queued or Merged
// when scheduled, DroppedSuspended or DroppedShutDown when dropped (then the
// error is nil). On error the outcome is zero and nothing was queued.
func (t *Trigger[T]) Submit(ctx context.Context, req Request[T]) (queue.Outcome, error) {
	if err := ctx.Err(); err != nil {
		return 0, t.rejected(ctx, fmt.Errorf("trigger: enqueue: %w", err))
	}
	if err := t.validate(req); err != nil {
		return 0, t.rejected(ctx, err)
	}
	pl := t.cfg.Router.Place(t.shardOf(req.Object))
	if pl.Queue == nil {
		return t.dropped(ctx, opkit.KeyOf(req.Object), queue.DroppedSuspended), nil
	}
	d, err := t.schedule(ctx, pl.Queue, opkit.KeyOf(req.Object), t.cause(req.Object, req.Type, req.Reason, req.Retries), req.Delay, false, NotTracked)
	return d.Outcome, err
}

// cause is what a trigger puts into the queue for its key: source
// Operator (the only one a trigger may have).
func (t *Trigger[T]) cause(obj T, typ opkit.Type, reason string, retries int) opkit.Cause[T] {
	return opkit.Cause[T]{Object: obj, Sources: opkit.Sources(opkit.Operator), Reasons: opkit.ReasonsOf(reason),
		Added: typ == opkit.Added, Teardown: typ == opkit.Deleted, Retries: retries}
}

// Report hands the outcome o of the reconcile turn of key whose entry
// carried ticket (opkit.Cause.Ticket) to the tickets it serves: those of
// key up to that number whose object is in shards (the zero Shards:
// every object; a sharded controller's turn serves only its shards'
// triggers, as the same name can be on two), or unknown (the controller
// calls it after every turn).
func (t *Trigger[T]) Report(key opkit.Key, ticket uint64, shards opkit.Shards, o Outcome) {
	t.tickets.report(key, ticket, shards, o)
}

// Abandon resolves as Unknown, with why, every ticket still waiting whose
// object is in shards (the zero Shards: every ticket), and any whose
// trigger joined a waiting entry without reading its object: the queue
// that held their entries is cleared (the controller calls it at the end
// of a leadership term, of its shard's term in a sharded controller).
// Their ids are unknown from then on.
func (t *Trigger[T]) Abandon(why string, shards opkit.Shards) { t.tickets.abandon(why, shards) }

// validate checks req as Submit takes it.
func (t *Trigger[T]) validate(req Request[T]) error {
	if isNil(req.Object) {
		return invalid("nil object")
	}
	key := opkit.KeyOf(req.Object)
	var gvk schema.GroupVersionKind
	if kind := req.Object.GetObjectKind(); kind != nil {
		gvk = kind.GroupVersionKind()
	}
	// Kind and group must match when set; the version may differ (the same
	// object served through another version). The group is set only with
	// apiVersion: a kind alone says nothing about it.
	switch err := t.check(key, req.Type, req.Delay, req.Reason); {
	case err != nil:
		return err
	case req.Source != opkit.Operator:
		return invalid("source %v: external triggers use Operator (APIServer is reserved for the watch stream)", req.Source)
	case req.Retries < 0 || req.Retries > math.MaxInt32:
		return invalid("retries %d outside [0, %d]", req.Retries, math.MaxInt32)
	case gvk.Kind != "" && gvk.Kind != t.cfg.Resource.Kind:
		return invalid("object %s is a %s, not a %s", key, gvk.Kind, t.cfg.Resource.Kind)
	case gvk.Version != "" && gvk.Group != t.cfg.Resource.Group:
		return invalid("object %s is in API group %q, not %q", key, gvk.Group, t.cfg.Resource.Group)
	case t.cfg.Router.Shards() > 1 && req.Object.GetUID() == "":
		return invalid("object %s has no UID: the controller is sharded by UID; pass the object as read from the API server", key)
	}
	if err := t.checkNamespace(key); err != nil {
		return err
	}
	// A Deleted trigger is judged on the object it carries: there may be
	// nothing left to read.
	if req.Type == opkit.Deleted {
		return t.checkLabels(req.Object)
	}
	return nil
}

// check validates what every trigger carries besides the object: the key
// (see [CheckName]; the namespace must be a DNS-1123 label for a
// namespaced resource and empty for a cluster-scoped one), the type, the
// delay and the reason ([CheckReason]). Errors wrap ErrInvalid.
func (t *Trigger[T]) check(key opkit.Key, typ opkit.Type, delay time.Duration, reason string) error {
	res, nsErrs := t.cfg.Resource, validation.IsDNS1123Label(key.Namespace)
	switch {
	case res.Namespaced && key.Namespace == "":
		return invalid("%s is namespaced: a namespace is required", res.Resource)
	case !res.Namespaced && key.Namespace != "":
		return invalid("%s is cluster-scoped: no namespace may be given (got %q)", res.Resource, key.Namespace)
	case key.Namespace != "" && len(nsErrs) > 0:
		return invalid("namespace %q: %s", key.Namespace, strings.Join(nsErrs, "; "))
	case !typ.Valid():
		return invalid("type %v is not Added, Modified or Deleted", typ)
	case delay < 0:
		return invalid("negative delay %v", delay)
	}
	return cmp.Or(CheckName(key.Name), CheckReason(reason))
}

// checkNamespace returns an error wrapping ErrOutOfScope when key is in a
// namespace the controller does not handle (Config.Namespace).
func (t *Trigger[T]) checkNamespace(key opkit.Key) error {
	if t.cfg.Namespace != "" && key.Namespace != t.cfg.Namespace {
		return fmt.Errorf("trigger: %w: %s %s is not in namespace %q, the only one this controller handles", ErrOutOfScope, t.cfg.Resource.Resource, key, t.cfg.Namespace)
	}
	return nil
}

// checkLabels returns an error wrapping ErrOutOfScope when obj's labels do
// not match the controller's label selector (Config.Selector).
func (t *Trigger[T]) checkLabels(obj T) error {
	if t.cfg.Selector != nil && !t.cfg.Selector.Matches(labels.Set(obj.GetLabels())) {
		return fmt.Errorf("trigger: %w: %s %s does not match the controller's label selector %q", ErrOutOfScope, t.cfg.Resource.Resource, opkit.KeyOf(obj), t.cfg.Selector)
	}
	return nil
}

// rejected counts and logs a refused trigger, and returns err.
func (t *Trigger[T]) rejected(ctx context.Context, err error) error {
	t.cfg.Metrics.Rejected()
	t.log.Log(ctx, slog.LevelWarn, "rejected", "trigger rejected", slog.String("resource", t.cfg.Resource.GroupVersionResource.String()), slog.Any("error", err))
	return err
}

// CheckName reports, with an error wrapping [ErrInvalid], whether name is
// not one a trigger accepts: it must be non-empty, at most 253
// bytes of UTF-8 text without control characters, and a valid path
// segment (not "." or "..", no "/" or "%": the rule the API server applies
// to every resource's names). Stricter rules of a resource (most want a
// DNS-1123 subdomain; RBAC roles take names such as
// "system:aggregate-to-admin") are left to the API server, which answers
// NotFound for a name it could not hold. A producer can check a name with
// it before sending a trigger.
func CheckName(name string) error {
	errs := path.IsValidPathSegmentName(name)
	switch {
	case name == "":
		return invalid("a name is required")
	case len(name) > maxNameLen:
		return invalid("name %.40q...: longer than %d bytes", name, maxNameLen)
	case len(errs) > 0:
		return invalid("name %q: %s", name, strings.Join(errs, "; "))
	case !utf8.ValidString(name) || strings.IndexFunc(name, unicode.IsControl) >= 0:
		return invalid("name %q: must be UTF-8 text without control characters", name)
	}
	return nil
}

// CheckReason returns an error wrapping ErrInvalid unless reason is valid
// UTF-8 of at most MaxReasonLen bytes: the reason every trigger path (Submit,
// the HTTP handler, the consumer) accepts. A publisher can check with it
// before sending what a consumer would otherwise dead-letter.
func CheckReason(reason string) error {
	if len(reason) > MaxReasonLen || !utf8.ValidString(reason) {
		return invalid("reason must be valid UTF-8 of at most %d bytes", MaxReasonLen)
	}
	return nil
}

func invalid(format string, args ...any) error {
	return fmt.Errorf("trigger: %w: "+format, append([]any{ErrInvalid}, args...)...)
}

// isNil reports whether v is nil or a nil pointer.
func isNil(v any) bool {
	rv := reflect.ValueOf(v)
	return !rv.IsValid() || rv.Kind() == reflect.Pointer && rv.IsNil()
}
