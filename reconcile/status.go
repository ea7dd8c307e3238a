package reconcile

import (
	"cmp"
	"context"
	"errors"
	"fmt"

	"k8s.io/apimachinery/pkg/api/equality"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/client-go/dynamic"

	"github.com/opkit/opkit"
	"github.com/opkit/opkit/internal/typed"
	"github.com/opkit/opkit/watcher"
)

// StatusConfig configures a [Status] helper (Dynamic and Resource are
// required). Where T's status has them, a write sets observedGeneration
// (unless SkipObservedGeneration) and copies RequestAnnotation (the
// watcher's; empty: its default; "-": none) to lastHandledReconcileAt. It
// is retried after a 409, ConflictRetries times (zero: 5).
type StatusConfig struct {
	Dynamic                dynamic.Interface
	Resource               opkit.Resource
	SkipObservedGeneration bool
	RequestAnnotation      string
	ConflictRetries        int
}

// Status writes the status subresource with optimistic concurrency: on a
// 409 Conflict it reads the object and applies mutate again. It is safe
// for concurrent use.
type Status[T opkit.Object] struct {
	client *typed.Client[T]
	cfg    StatusConfig
}

// NewStatus validates cfg and returns a status helper.
func NewStatus[T opkit.Object](cfg StatusConfig) (*Status[T], error) {
	switch err := cfg.Resource.Validate(); {
	case cfg.Dynamic == nil:
		return nil, errors.New("reconcile: status needs a dynamic client")
	case err != nil:
		return nil, fmt.Errorf("reconcile: status: %w", err)
	case cfg.ConflictRetries < 0:
		return nil, fmt.Errorf("reconcile: status: negative ConflictRetries %d", cfg.ConflictRetries)
	}
	cfg.ConflictRetries = cmp.Or(cfg.ConflictRetries, defaultConflictRetries)
	cfg.RequestAnnotation = cmp.Or(cfg.RequestAnnotation, watcher.DefaultRequestAnnotation)
	return &Status[T]{client: typed.New[T](cfg.Dynamic, cfg.Resource), cfg: cfg}, nil
}

// Update applies mutate to obj (after a conflict, to a fresh copy) and
// writes the status if it changed.
func (s *Status[T]) Update(ctx context.Context, obj T, mutate func(obj T) error) (T, error) {
	if isNil(obj) {
		return obj, errors.New("reconcile: status: nil object")
	}
	return writeRetrying(ctx, s.client, obj, s.cfg.ConflictRetries, "status", func(cur T) (T, error) {
		before, err := statusOf(cur)
		if err != nil {
			return obj, err
		}
		if err := mutate(cur); err != nil {
			return obj, err
		}
		u, err := typed.ToUnstructured(cur)
		if err != nil {
			return obj, err
		}
		if !s.cfg.SkipObservedGeneration {
			if err := unstructured.SetNestedField(u.Object, cur.GetGeneration(), "status", "observedGeneration"); err != nil {
				return obj, fmt.Errorf("reconcile: status of %s: %w", opkit.KeyOf(obj), err)
			}
		}
		if at := cur.GetAnnotations()[s.cfg.RequestAnnotation]; at != "" && s.cfg.RequestAnnotation != "-" {
			if err := unstructured.SetNestedField(u.Object, at, "status", "lastHandledReconcileAt"); err != nil {
				return obj, fmt.Errorf("reconcile: status of %s: %w", opkit.KeyOf(obj), err)
			}
		}
		// Round-trip through T: a field T does not declare (observedGeneration
		// included) is neither compared nor written.
		next, err := typed.FromUnstructured[T](u)
		if err != nil {
			return obj, err
		}
		after, err := statusOf(next)
		if err != nil {
			return obj, err
		}
		if equality.Semantic.DeepEqual(before, after) {
			return cur, nil
		}
		out, err := s.client.UpdateStatus(ctx, next)
		if err != nil {
			return obj, fmt.Errorf("reconcile: update status of %s: %w", opkit.KeyOf(obj), err)
		}
		noteWrite(ctx, out)
		return out, nil
	})
}

// statusOf returns a deep copy of obj's status in unstructured form.
func statusOf(obj opkit.Object) (any, error) {
	u, err := typed.ToUnstructured(obj)
	if err != nil {
		return nil, err
	}
	st, _, _ := unstructured.NestedFieldCopy(u.Object, "status")
	return st, nil
}
