package watcher

import (
	"cmp"
	"errors"
	"fmt"
	"log/slog"
	"reflect"
	"slices"
	"time"

	"k8s.io/client-go/dynamic"

	"github.com/opkit/opkit"
	"github.com/opkit/opkit/queue"
)

// Defaults applied by [New] to zero fields of [Config] and [Backoff].
const (
	// DefaultListPriority is the priority of entries produced by a (re)list
	// when Config.ListPriority is nil: below watch events (priority 0), so a
	// resync never delays fresh changes.
	DefaultListPriority = -1
	// DefaultPageSize is the number of objects per list page.
	DefaultPageSize int64 = 500
	// DefaultIdleTimeout is how long a watch may stay silent (no event, no
	// bookmark) before it is restarted. An API server with its watch cache
	// on sends a bookmark about once a minute on an open watch, so five
	// minutes is several missed bookmarks: a dead connection, not a quiet
	// resource. (With the watch cache off a quiet watch gets no bookmarks
	// and is restarted every IdleTimeout: a cheap resume, not a relist.)
	DefaultIdleTimeout = 5 * time.Minute
	// DefaultBackoffBase is the first retry delay after a failure.
	DefaultBackoffBase = 500 * time.Millisecond
	// DefaultBackoffCap is the longest retry delay for transient failures.
	DefaultBackoffCap = 30 * time.Second
	// DefaultBackoffReset is how long a watch that delivers nothing must
	// stay open for the failure count to return to zero (a list that
	// succeeds, or a watch event, resets it at once).
	DefaultBackoffReset = time.Minute
	// DefaultBackoffTransient is the longest retry delay after a failure
	// that an API server's restart causes (a refused or reset connection,
	// a 5xx, a watch closed early, a 401/403 while its authorizer syncs):
	// such a retry costs the server little, and the watcher is back within
	// about a second of the server's return.
	DefaultBackoffTransient = time.Second
	// DefaultBackoffSlow is the retry delay for permission (403) and
	// missing-resource (404) errors.
	DefaultBackoffSlow = 30 * time.Second
	// DefaultBackoffStalled is how long a watcher fails to list or watch
	// before it logs an error (once per outage).
	DefaultBackoffStalled = 10 * time.Second
	// DefaultMaxFinalStates is how many unsettled deletes keep their final
	// state when Config.MaxFinalStates is zero.
	DefaultMaxFinalStates = 1000
	// DefaultMaxDeletesPerKey is how many unsettled deletes one key may
	// hold when Config.MaxDeletesPerKey is zero.
	DefaultMaxDeletesPerKey = 16
	// DefaultRequestAnnotation is the annotation reconcile's controller
	// watches for durable triggers (Config.RequestAnnotation); Flux's
	// "reconcile.fluxcd.io/requestedAt" works the same way.
	DefaultRequestAnnotation = "reconcile.opkit.dev/requestedAt"
)

// Backoff is the retry policy for failed list and watch calls. The zero
// value means the defaults above.
//
// After the n-th consecutive failure (n >= 1) the watcher waits a random
// duration in [d/2, d], where d = min(Base * 2^(n-1), Cap) (a
// [queue.Backoff] with Jitter 0.5), and at most Transient after any
// failure an API server's restart causes: a refused or reset connection,
// a 5xx or another error, a watch closed early, and a 401 or 403 among the
// first [queue.TransientRefusals] in a row (an API server that has just
// started refuses until its authorizer has synced). A 429 waits at least
// its Retry-After. A 404, and a 401 or 403 once TransientRefusals of them
// came in a row, wait a random duration in [Slow/2, Slow]. The failure
// count returns to zero once a list succeeds, a watch delivers an event
// or a bookmark, or a watch has stayed open for Reset.
//
// Worst cases with the defaults: once an API server answers again, the
// watcher is back within Transient (1s), and a permission granted while
// the watcher was refused is seen within Slow (30s). A watcher that has
// not resumed for Stalled (10s) says so once in its log, and Check
// reports since when.
type Backoff struct {
	Base      time.Duration // first delay; default DefaultBackoffBase
	Cap       time.Duration // longest delay; default DefaultBackoffCap
	Reset     time.Duration // watch time without events that forgets failures; default DefaultBackoffReset
	Slow      time.Duration // delay for a lasting 401/403, and for 404; default DefaultBackoffSlow
	Transient time.Duration // longest delay after a failure a restart causes; default DefaultBackoffTransient
	Stalled   time.Duration // how long a failing watcher waits before it logs an error; default DefaultBackoffStalled
}

// Config configures a [Watcher]. Client, Resource and Queue are required;
// every other zero field means its documented default.
type Config[T opkit.Object] struct {
	// Client talks to the API server. Required.
	Client dynamic.Interface
	// Resource is the watched resource. Required.
	Resource opkit.Resource
	// Namespace restricts a namespaced resource to one namespace; empty
	// means all namespaces. Must be empty for cluster-scoped resources.
	Namespace string
	// LabelSelector and FieldSelector filter the list and the watch, in the
	// API server's syntax. An object that stops matching is seen as deleted.
	LabelSelector string
	FieldSelector string
	// Shards narrows the list and the watch to the objects whose
	// metadata.uid hashes into the held shards (zero: every object). The
	// API server applies it when it runs with the ShardedListAndWatch
	// feature gate; otherwise it sends everything. The watcher checks
	// every object it receives and drops what is not of its shards; when
	// there is any, it says so once in the log and reports it to a
	// Metrics that is a ShardingMetrics.
	Shards opkit.Shards

	// Queue receives the key of every change, with its cause (source
	// APIServer; the object, except for deletes), keyed by opkit.KeyOf.
	// Required.
	Queue queue.Adder[opkit.Key, opkit.Cause[T]]
	// Priority of entries from watch events; default 0.
	Priority int
	// ListPriority is the priority of entries produced by the initial list
	// and by relists. nil means DefaultListPriority (-1), below watch
	// events; set it with new(n) to choose another value (including 0).
	ListPriority *int

	// PageSize is the number of objects per list page; default
	// DefaultPageSize. Pages of one list come from one consistent snapshot.
	PageSize int64

	// SkipStatusOnly drops Modified changes that leave metadata.generation
	// unchanged (status-only updates for resources with a status
	// subresource), unless the deletion timestamp, the finalizers, or one of
	// the labels or annotations named in WatchLabels / WatchAnnotations
	// changed. Objects whose generation is 0 (resources that do not
	// maintain it, such as ConfigMaps) are never skipped. The rule applies
	// to watch events and to the Modified entries of relists alike; the
	// resourceVersion is tracked either way.
	SkipStatusOnly bool
	// WatchLabels and WatchAnnotations name the labels and annotations
	// whose change makes a same-generation update worth a reconcile under
	// SkipStatusOnly (and that the watcher fingerprints).
	WatchLabels      []string
	WatchAnnotations []string
	// RequestAnnotation names the annotation that asks for a reconcile
	// through the API server (a durable trigger: `kubectl annotate ...
	// reconcile.opkit.dev/requestedAt="$(date)"`): while its value is set
	// and differs from the object's status.lastHandledReconcileAt, the
	// object's entries carry source Operator, the reason "requestedAt
	// <value>", and TriggerPriority, and its changes are never
	// status-only. reconcile.Status records the value it handled, which
	// ends the request. Empty: none (reconcile's controller sets
	// DefaultRequestAnnotation).
	RequestAnnotation string
	TriggerPriority   int
	// OwnFinalizers are the finalizers the operator adds and removes
	// itself. Under SkipStatusOnly, adding one is not a change worth a
	// reconcile (it is the operator's own write); removing one from an
	// object that is not being deleted is (someone took it off).
	OwnFinalizers []string

	// Rank says how much an object needs work, for the priority of its
	// entries: 0 when it is up to date, 1 or more when it needs work, more
	// the longer it has waited, at most MaxRank. nil means [DefaultRank]
	// (status.observedGeneration against metadata.generation). A listed
	// object of rank 0 is queued at ListPriority, after everything that
	// needs work; an object of rank r >= 1, listed or from the watch, at
	// Priority + r - 1. So a new term reconciles what needs work first,
	// the furthest behind first, and what is up to date after it.
	Rank func(obj T) int

	// MaxFinalStates bounds the unsettled deletes that keep their final
	// state, in all; beyond it a delete is kept as a tombstone (its
	// identity only: Deleted.FinalStateUnknown). Default
	// DefaultMaxFinalStates (1,000).
	MaxFinalStates int
	// MaxDeletesPerKey bounds the unsettled deletes of one key (objects of
	// one name created and deleted again while their deletes are not
	// settled); beyond it the oldest is dropped, logged at error level and
	// counted (Metrics.Error with ReasonOverflow). Default
	// DefaultMaxDeletesPerKey (16).
	MaxDeletesPerKey int

	// Backoff is the retry policy; zero fields take their defaults.
	Backoff Backoff
	// IdleTimeout restarts a watch that delivered neither an event nor a
	// bookmark for this long; default DefaultIdleTimeout.
	IdleTimeout time.Duration

	// OnSync, if set, is called on Run's goroutine at the start and at the
	// end of every (re)list. It must return quickly.
	OnSync func(SyncEvent)
	// Metrics receives counters and gauges; nil means none.
	Metrics Metrics
	// Logger receives the watcher's logs; nil means slog.Default().
	Logger *slog.Logger
}

// loopConfig is the list-and-watch loop's part of c (defaults applied).
func (c Config[T]) loopConfig() loopConfig {
	gvr := c.Resource.GroupVersionResource
	name := gvr.GroupResource().String() + "/" + gvr.Version
	var res dynamic.ResourceInterface = c.Client.Resource(gvr)
	if c.Namespace != "" {
		res = c.Client.Resource(gvr).Namespace(c.Namespace)
	}
	return loopConfig{res: res, name: name, labelSelector: c.LabelSelector, fieldSelector: c.FieldSelector, shards: c.Shards,
		pageSize: c.PageSize, idleTimeout: c.IdleTimeout, backoff: c.Backoff, metrics: c.Metrics,
		log: c.Logger.With("resource", name, "namespace", c.Namespace)}
}

// SyncPhase tells whether a [SyncEvent] marks the start or the end of a list.
type SyncPhase uint8

const (
	// SyncStarted: a (re)list attempt begins.
	SyncStarted SyncPhase = iota + 1
	// SyncFinished: the (re)list completed and every entry it produced
	// (including tombstones for vanished objects) was handed to the queue.
	SyncFinished
)

// String returns "SyncStarted" or "SyncFinished".
func (p SyncPhase) String() string {
	switch p {
	case SyncStarted:
		return "SyncStarted"
	case SyncFinished:
		return "SyncFinished"
	}
	return fmt.Sprintf("SyncPhase(%d)", uint8(p))
}

// SyncEvent marks the start or the end of a (re)list. A SyncStarted that is
// not followed by SyncFinished means the attempt failed; the retry reports
// SyncStarted again.
type SyncEvent struct {
	// Phase is SyncStarted or SyncFinished.
	Phase SyncPhase
	// Initial is true for the first list of a Run, which emits every object
	// as Added; false for relists, which emit only the differences.
	Initial bool
	// Reason is ReasonInitial for a Run's first list, otherwise why the
	// watcher relisted (ReasonExpired).
	Reason Reason
	// Counts of entries emitted (set on SyncFinished): Added, Modified and
	// Deleted (objects the list found gone); Unchanged counts listed
	// objects that produced no entry.
	Added, Modified, Deleted, Unchanged int
	// ResourceVersion the watch continues from (set on SyncFinished).
	ResourceVersion string
}

// ErrInvalidConfig wraps every configuration error returned by New.
var ErrInvalidConfig = errors.New("watcher: invalid config")

// withDefaults validates c and returns it with its defaults applied.
func (c Config[T]) withDefaults() (Config[T], error) {
	bad := func(format string, args ...any) (Config[T], error) {
		return c, fmt.Errorf("%w: "+format, append([]any{ErrInvalidConfig}, args...)...)
	}
	b, typ := &c.Backoff, reflect.TypeFor[T]()
	switch err := c.Resource.Validate(); {
	case c.Client == nil:
		return bad("Client is nil")
	case c.Queue == nil:
		return bad("Queue is nil")
	case err != nil:
		return bad("%v", err)
	case !c.Resource.Namespaced && c.Namespace != "":
		return bad("resource %s is cluster-scoped but Namespace is %q", c.Resource.GroupVersionResource, c.Namespace)
	case c.Shards.Validate() != nil:
		return bad("%v", c.Shards.Validate())
	case c.PageSize < 0 || c.IdleTimeout < 0 || c.MaxFinalStates < 0 || c.MaxDeletesPerKey < 0:
		return bad("PageSize, IdleTimeout, MaxFinalStates and MaxDeletesPerKey must not be negative")
	case b.Base < 0 || b.Cap < 0 || b.Reset < 0 || b.Slow < 0 || b.Transient < 0 || b.Stalled < 0:
		return bad("Backoff has a negative duration: %+v", *b)
	case typ.Kind() != reflect.Pointer || typ.Elem().Kind() != reflect.Struct:
		return bad("type parameter %v is not a pointer to a struct", typ)
	}
	b.Base = cmp.Or(b.Base, DefaultBackoffBase)
	b.Cap = cmp.Or(b.Cap, max(DefaultBackoffCap, b.Base))
	b.Reset, b.Slow = cmp.Or(b.Reset, DefaultBackoffReset), cmp.Or(b.Slow, DefaultBackoffSlow)
	b.Transient = cmp.Or(b.Transient, DefaultBackoffTransient)
	b.Stalled = cmp.Or(b.Stalled, DefaultBackoffStalled)
	if b.Base > b.Cap {
		return bad("Backoff.Base %v exceeds Backoff.Cap %v", b.Base, b.Cap)
	}
	if c.ListPriority == nil {
		c.ListPriority = new(DefaultListPriority)
	}
	c.PageSize, c.IdleTimeout = cmp.Or(c.PageSize, DefaultPageSize), cmp.Or(c.IdleTimeout, DefaultIdleTimeout)
	c.MaxFinalStates = cmp.Or(c.MaxFinalStates, DefaultMaxFinalStates)
	c.MaxDeletesPerKey = cmp.Or(c.MaxDeletesPerKey, DefaultMaxDeletesPerKey)
	c.WatchLabels, c.WatchAnnotations = slices.Clone(c.WatchLabels), slices.Clone(c.WatchAnnotations)
	if c.RequestAnnotation != "" {
		c.WatchAnnotations = append(c.WatchAnnotations, c.RequestAnnotation)
	}
	c.OwnFinalizers = slices.Clone(c.OwnFinalizers)
	c.Metrics, c.Logger = cmp.Or(c.Metrics, Metrics(nopMetrics{})), cmp.Or(c.Logger, slog.Default())
	if c.OnSync == nil {
		c.OnSync = func(SyncEvent) {}
	}
	return c, nil
}
