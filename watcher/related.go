package watcher

import (
	"cmp"
	"context"
	"fmt"
	"log/slog"
	"slices"
	"strings"
	"sync"
	"time"

	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/client-go/dynamic"

	"github.com/opkit/opkit"
	"github.com/opkit/opkit/queue"
)

// MapFunc maps an object of a related resource to the keys of the primary
// objects it concerns (none, one or several). It is called from the Run
// goroutine of a [Related] for every object listed and every change: it
// must be quick and must not block.
type MapFunc func(obj *unstructured.Unstructured) []opkit.Key

// OwnedBy returns the MapFunc of owned objects (children): an object
// maps to the owner its controller reference names when that owner is
// of resource owner (same API group and kind), in the object's namespace
// for a namespaced owner. An object without such a reference maps to
// nothing.
func OwnedBy(owner opkit.Resource) MapFunc {
	return func(obj *unstructured.Unstructured) []opkit.Key {
		for _, ref := range obj.GetOwnerReferences() {
			if ref.Controller == nil || !*ref.Controller {
				continue
			}
			gv, err := schema.ParseGroupVersion(ref.APIVersion)
			if err != nil || gv.Group != owner.Group || ref.Kind != owner.Kind {
				return nil
			}
			k := opkit.Key{Name: ref.Name}
			if owner.Namespaced {
				k.Namespace = obj.GetNamespace()
			}
			return []opkit.Key{k}
		}
		return nil
	}
}

// RelatedConfig configures a [Related]. Client, Resource, Map and Queue
// are required; every other zero field means the default of the same
// field of [Config].
type RelatedConfig[T opkit.Object] struct {
	Client dynamic.Interface
	// Resource is the related resource (Kind may be empty).
	Resource opkit.Resource
	// Namespace, LabelSelector and FieldSelector narrow the watch as in
	// Config.
	Namespace, LabelSelector, FieldSelector string
	// Map maps each related object to the primary keys it concerns;
	// OwnedBy(primary) for owned objects.
	Map MapFunc
	// Queue is the primary controller's queue: each change adds the keys
	// it maps to, with a cause of source APIServer whose Related names
	// this resource ("configmaps", "deployments.apps").
	Queue queue.Adder[opkit.Key, opkit.Cause[T]]
	// Priority of the adds; default 0, the watch's.
	Priority    int
	PageSize    int64
	IdleTimeout time.Duration
	Backoff     Backoff
	Metrics     Metrics
	Logger      *slog.Logger
}

// Related lists and watches a resource related to a controller's primary
// resource (owned children, or anything a MapFunc relates) and adds the
// primary keys each change maps to. It remembers, per related object that
// maps to a key, only its resourceVersion and the keys it mapped to, never
// the object,
// so that a deleted object still reaches the keys it mapped to, and an
// object whose mapping changed reaches its old keys as well as its new
// ones.
//
// A Run's first list adds nothing (whoever runs it lists the primary
// objects anyway: a new leader reconciles every owner once, not once per
// related resource); it only learns the mappings. Later relists (after a
// 410 Gone) add the keys of what changed or vanished meanwhile. The list,
// watch, resume, relist and backoff behaviour is the Watcher's (package
// documentation), and so are Check, Synced and WaitSynced.
type Related[T opkit.Object] struct {
	cfg     RelatedConfig[T]
	loop    *loop
	related []string // the cause's Related: this resource's name

	// Owned by Run's goroutine.
	epoch    uint32
	interned interner

	mu      sync.RWMutex // guards objects; Run's goroutine writes
	objects map[opkit.Key]relatedObject
}

// relatedObject is what a Related remembers of one related object.
type relatedObject struct {
	rv    string
	keys  []opkit.Key // the primary keys it maps to
	epoch uint32
}

// NewRelated validates cfg and returns a Related. It starts nothing.
func NewRelated[T opkit.Object](cfg RelatedConfig[T]) (*Related[T], error) {
	if cfg.Map == nil {
		return nil, fmt.Errorf("%w: related %s: Map is nil", ErrInvalidConfig, cfg.Resource.GroupResource())
	}
	// The rest takes Config's validation and defaults (a Kind is not
	// needed: the related objects are never decoded).
	c, err := Config[T]{Client: cfg.Client, Queue: cfg.Queue,
		Resource:  opkit.Resource{GroupVersionResource: cfg.Resource.GroupVersionResource, Kind: cmp.Or(cfg.Resource.Kind, "Related"), Namespaced: cfg.Resource.Namespaced},
		Namespace: cfg.Namespace, LabelSelector: cfg.LabelSelector, FieldSelector: cfg.FieldSelector,
		PageSize: cfg.PageSize, IdleTimeout: cfg.IdleTimeout, Backoff: cfg.Backoff, Metrics: cfg.Metrics, Logger: cfg.Logger,
	}.withDefaults()
	if err != nil {
		return nil, fmt.Errorf("related %s: %w", cfg.Resource.GroupResource(), err)
	}
	cfg.Metrics = c.Metrics
	return &Related[T]{cfg: cfg, loop: newLoop(c.loopConfig()), related: []string{cfg.Resource.GroupResource().String()},
		objects: make(map[opkit.Key]relatedObject)}, nil
}

// Name is the related resource's name in causes and requests
// ("configmaps", "deployments.apps").
func (r *Related[T]) Name() string { return r.related[0] }

// Run lists and watches until ctx ends, as [Watcher.Run].
func (r *Related[T]) Run(ctx context.Context) error { return r.loop.run(ctx, r) }

// Synced reports whether the current Run has finished its first list.
func (r *Related[T]) Synced() bool { return r.loop.isSynced() }

// WaitSynced is [Watcher.WaitSynced].
func (r *Related[T]) WaitSynced(ctx context.Context) error { return r.loop.waitSynced(ctx) }

// Check is [Watcher.Check].
func (r *Related[T]) Check() error { return r.loop.check() }

// Keys returns the primary keys the related object key maps to, as last
// seen, and whether it is tracked.
func (r *Related[T]) Keys(key opkit.Key) ([]opkit.Key, bool) {
	r.mu.RLock()
	defer r.mu.RUnlock()
	o, ok := r.objects[key]
	return slices.Clone(o.keys), ok
}

func (r *Related[T]) begin(bool, Reason) { r.epoch++ }

func (r *Related[T]) object(u *unstructured.Unstructured, listed bool) {
	key := opkit.KeyOf(u)
	keys := r.cfg.Map(u)
	r.mu.RLock()
	old, known := r.objects[key]
	r.mu.RUnlock()
	changed := !known || old.rv != u.GetResourceVersion()
	switch {
	case !changed && slices.Equal(old.keys, keys):
		// Unchanged (a relist, or a replayed event): keep what is there.
		r.mu.Lock()
		old.epoch = r.epoch
		r.objects[r.interned.key(key)] = old
		r.mu.Unlock()
		return
	case listed && !r.loop.isSynced():
		// A Run's first list: learn the mapping, add nothing.
	default:
		// The keys it had (it may have left them) and the keys it has.
		r.add(slices.Concat(old.keys, slices.DeleteFunc(slices.Clone(keys), func(k opkit.Key) bool { return slices.Contains(old.keys, k) })))
	}
	if len(keys) == 0 {
		// It concerns no key: nothing to remember (a ConfigMap no one
		// owns, of which a cluster may hold many).
		if known {
			r.mu.Lock()
			delete(r.objects, key)
			r.mu.Unlock()
		}
		return
	}
	kept := make([]opkit.Key, len(keys))
	for i, k := range keys {
		kept[i] = r.interned.key(k)
	}
	r.mu.Lock()
	r.objects[r.interned.key(key)] = relatedObject{rv: strings.Clone(u.GetResourceVersion()), keys: kept, epoch: r.epoch}
	n := len(r.objects)
	r.mu.Unlock()
	if !listed {
		r.cfg.Metrics.Tracked(n)
	}
}

func (r *Related[T]) deleted(u *unstructured.Unstructured) {
	key := opkit.KeyOf(u)
	r.mu.Lock()
	old, known := r.objects[key]
	delete(r.objects, key)
	n := len(r.objects)
	r.mu.Unlock()
	if !known {
		old.keys = r.cfg.Map(u)
	}
	r.add(old.keys)
	r.cfg.Metrics.Tracked(n)
}

// end forgets the objects a complete list did not return, adding the keys
// they mapped to unless the list is a Run's first.
func (r *Related[T]) end(initial bool, _ string) {
	var gone []relatedObject
	r.mu.Lock()
	for k, o := range r.objects {
		if o.epoch != r.epoch {
			gone = append(gone, o)
			delete(r.objects, k)
		}
	}
	n := len(r.objects)
	r.mu.Unlock()
	if !initial {
		for _, o := range gone {
			r.add(o.keys)
		}
	}
	r.cfg.Metrics.Tracked(n)
	r.interned.prune(func() []string {
		r.mu.RLock()
		defer r.mu.RUnlock()
		var used []string
		for k, o := range r.objects {
			used = append(used, k.Namespace)
			for _, ok := range o.keys {
				used = append(used, ok.Namespace)
			}
		}
		return used
	})
}

// add adds keys to the queue at the configured priority, with a cause
// of source APIServer naming this resource.
func (r *Related[T]) add(keys []opkit.Key) {
	for _, k := range keys {
		out := r.cfg.Queue.Add(k, opkit.Cause[T]{Sources: opkit.Sources(opkit.APIServer), Related: r.related}, queue.AddOptions{Priority: r.cfg.Priority})
		r.cfg.Metrics.Event(opkit.Modified, out)
	}
}
