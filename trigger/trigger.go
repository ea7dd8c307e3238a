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

	"k8s.io/apimachinery/pkg/api/validate/content"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/util/validation"
	"k8s.io/client-go/dynamic"

	"github.com/opkit/opkit"
	"github.com/opkit/opkit/internal/typed"
	"github.com/opkit/opkit/queue"
)

// defaultPriority is the queue priority of triggers when Config.Priority
// is zero: above watch events (0) and relists (-1).
const defaultPriority = 100

// MaxReasonLen is the longest reason a trigger may carry, in bytes.
const MaxReasonLen = 1024

// maxNameLen is the longest object name a trigger accepts, in bytes: the
// longest a DNS-1123 subdomain, which most resources' names are, may be.
const maxNameLen = validation.DNS1123SubdomainMaxLength

// The errors of a trigger, for errors.Is: bad input, an object out of the
// controller's scope, no such object, "not now" (the budget or the reviews
// are spent); an Authenticator's no valid token, and not allowed.
var (
	ErrInvalid         = errors.New("invalid trigger")
	ErrOutOfScope      = errors.New("object outside the controller's scope")
	ErrNotFound        = errors.New("object not found")
	ErrBusy            = errors.New("busy")
	ErrUnauthenticated = errors.New("unauthenticated")
	ErrForbidden       = errors.New("forbidden")
)

// Defaults of Config.Rate and Config.Burst.
const (
	defaultRate  = 5
	defaultBurst = 20
)

// errNoGetter is what Intake, NewHandler and NewConsumer answer for a
// Trigger that cannot read objects.
var errNoGetter = errors.New("trigger: the Trigger reads objects for the HTTP handler and the consumer: set Config.Get or Config.Dynamic")

// Config configures a Trigger; a zero field means its default.
// reconcile.Controller builds its own.
type Config[T opkit.Object] struct {
	// Queue (a Trigger used alone) or Router: exactly one is required.
	Queue  queue.Adder[opkit.Key, opkit.Cause[T]]
	Router Router[T]
	// Get reads an object for Intake (default: a typed client over
	// Dynamic; without either, NewHandler and NewConsumer refuse the
	// Trigger). A NotFound that does not name the object (a CRD not
	// installed yet) is an API failure, not a gone object.
	Get     func(ctx context.Context, key opkit.Key) (T, error)
	Dynamic dynamic.Interface
	// Resource is the resource T is served as (required).
	Resource opkit.Resource
	// Namespace and Selector are the scope of the controller's watch
	// (empty: everything). Intake checks the namespace before it reads,
	// and the labels of what it read.
	Namespace string
	Selector  labels.Selector
	// Priority is the queue priority of the entries, within int32 (zero:
	// 100; watch events have 0).
	Priority int
	// Rate and Burst are Intake's trigger budget (zero: 5 and 20;
	// negative Rate: none): a trigger that joins an entry waiting for its
	// key is free, any other takes a token for its read and its
	// reconcile, or gets ErrBusy. The smallest askers go first. Keep 1.5
	// × Rate × (1 + requests per reconcile) well below the API's QPS.
	Rate  float64
	Burst int
	// Metrics (nil: none) and Logger (nil: slog.Default()).
	Metrics Metrics
	Logger  *slog.Logger
}

// Trigger puts external reconcile requests into a controller's queue. Its
// methods are safe for concurrent use.
type Trigger[T opkit.Object] struct {
	cfg     Config[T]            // validated, defaults applied
	budget  *budget              // nil: unlimited
	tickets *tickets             // the tracked triggers
	uids    *ttlCache[types.UID] // the UIDs of objects read lately, by key: the consumer's routing
	log     *sampler
}

// New validates cfg and returns a Trigger.
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
	t := &Trigger[T]{cfg: cfg, tickets: newTickets(), uids: newTTLCache[types.UID](4096), log: newSampler(cfg.Logger)}
	if cfg.Rate >= 0 {
		t.budget = newBudget(cmp.Or(cfg.Rate, defaultRate), cmp.Or(cfg.Burst, defaultBurst))
	}
	return t, nil
}

// Priority returns the queue priority of triggered entries.
func (t *Trigger[T]) Priority() int { return t.cfg.Priority }

// Request is what [Trigger.Submit] takes: Enqueue's arguments and a
// Reason ([Pointer.Check]), carried into the reconcile's Reasons (logs,
// Events).
type Request[T opkit.Object] struct {
	Object  T
	Type    opkit.Type
	Source  opkit.Source
	Delay   time.Duration
	Retries int
	Reason  string
}

// Enqueue asks for a reconcile of obj, as read (the controller reconciles
// it as is while no newer state is known), from outside the operator: src
// is Operator. typ is Modified, Added, or Deleted for a teardown: a turn
// of type Deleted, with the object as it then is (none outside the
// watch's selector) or, if gone, the newest state known; it merges and is
// retried like any cause, within the term. delay (zero: now) is an upper
// bound; retries seeds the key's count of failures. It never blocks, and
// returns true when scheduled (queued or merged), false when dropped (this
// replica does not work on the object now, or is shutting down), or an
// error wrapping [ErrInvalid] (a bad object, key, type, source, delay or
// retries, or no UID with shards), [ErrOutOfScope], or ctx's.
func (t *Trigger[T]) Enqueue(ctx context.Context, obj T, typ opkit.Type, src opkit.Source, delay time.Duration, retries int) (bool, error) {
	o, err := t.Submit(ctx, Request[T]{Object: obj, Type: typ, Source: src, Delay: delay, Retries: retries})
	return o.Accepted(), err
}

// Submit is Enqueue with a reason, and the queue's outcome: Queued or
// Merged, DroppedSuspended or DroppedShutDown, or zero with an error.
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
	d, err := t.schedule(ctx, pl.Queue, opkit.KeyOf(req.Object), t.cause(req.Object, req.Type, req.Reason, req.Retries), req.Delay, false, notTracked)
	return d.Outcome, err
}

// cause is what a trigger puts into the queue for its key: source
// Operator (the only one a trigger may have).
func (t *Trigger[T]) cause(obj T, typ opkit.Type, reason string, retries int) opkit.Cause[T] {
	return opkit.Cause[T]{Object: obj, Sources: opkit.Sources(opkit.Operator), Reasons: opkit.ReasonsOf(reason),
		Added: typ == opkit.Added, Teardown: typ == opkit.Deleted, Retries: retries}
}

// Report hands the outcome of a turn of key whose entry carried ticket
// (opkit.Cause.Ticket) to the tickets of key up to it, of objects in
// shards (zero: all) or not known.
func (t *Trigger[T]) Report(key opkit.Key, ticket uint64, shards opkit.Shards, o Outcome) {
	t.tickets.report(key, ticket, shards, o)
}

// Abandon resolves as Unknown, with why, the waiting tickets of objects
// in shards (zero: all) or not known, when a term ends.
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
	switch err := t.check(Pointer{Key: key, Type: req.Type, Reason: req.Reason, Delay: req.Delay}); {
	case err != nil:
		return err
	case req.Type == 0:
		return invalid("type %v is not Added, Modified or Deleted", req.Type)
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

// check validates what every trigger carries besides the object: p, and
// a namespace that the resource's scope wants. Errors wrap ErrInvalid.
func (t *Trigger[T]) check(p Pointer) error {
	switch res := t.cfg.Resource; {
	case res.Namespaced && p.Key.Namespace == "":
		return invalid("%s is namespaced: a namespace is required", res.Resource)
	case !res.Namespaced && p.Key.Namespace != "":
		return invalid("%s is cluster-scoped: no namespace may be given (got %q)", res.Resource, p.Key.Namespace)
	}
	return p.Check()
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

// Check returns an error wrapping [ErrInvalid] unless every trigger path
// accepts p, but for the resource's scope: a name of at most 253 bytes of
// UTF-8 without control characters, "/" or "%", not "." or ".."; a
// namespace, if any, that is a DNS-1123 label; a valid type or zero; a
// delay not negative; a reason of at most MaxReasonLen bytes of UTF-8.
func (p Pointer) Check() error {
	name, ns := p.Key.Name, p.Key.Namespace
	nameErrs, nsErrs := content.IsPathSegmentName(name), validation.IsDNS1123Label(ns)
	switch {
	case name == "":
		return invalid("a name is required")
	case len(name) > maxNameLen:
		return invalid("name %.40q...: longer than %d bytes", name, maxNameLen)
	case len(nameErrs) > 0:
		return invalid("name %q: %s", name, strings.Join(nameErrs, "; "))
	case !utf8.ValidString(name) || strings.IndexFunc(name, unicode.IsControl) >= 0:
		return invalid("name %q: must be UTF-8 text without control characters", name)
	case ns != "" && len(nsErrs) > 0:
		return invalid("namespace %q: %s", ns, strings.Join(nsErrs, "; "))
	case p.Type != 0 && !p.Type.Valid():
		return invalid("type %v is not Added, Modified or Deleted", p.Type)
	case p.Delay < 0:
		return invalid("negative delay %v", p.Delay)
	case len(p.Reason) > MaxReasonLen || !utf8.ValidString(p.Reason):
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
