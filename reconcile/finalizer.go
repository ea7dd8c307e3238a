package reconcile

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"slices"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/util/validation"
	"k8s.io/client-go/dynamic"

	"github.com/opkit/opkit"
	"github.com/opkit/opkit/internal/typed"
)

// defaultConflictRetries is how often the finalizer and status helpers try
// again after a 409 Conflict.
const defaultConflictRetries = 5

// FinalizeFunc cleans up what an object owns outside Kubernetes before the
// object may go; it is called again after a failure or a crash.
type FinalizeFunc[T opkit.Object] func(ctx context.Context, obj T) error

// Finalizer keeps a finalizer on a resource's objects, and finalizes them
// when deleted (retried after a 409). Adding it reconciles nothing again:
// the controller knows the write as its own.
type Finalizer[T opkit.Object] struct {
	name   string
	client *typed.Client[T]
}

// NewFinalizer returns a helper for the finalizer name (such as
// "demo.opkit.dev/cleanup") on objects of res.
func NewFinalizer[T opkit.Object](dyn dynamic.Interface, res opkit.Resource, name string) (*Finalizer[T], error) {
	switch err, errs := res.Validate(), validation.IsQualifiedName(name); {
	case dyn == nil:
		return nil, errors.New("reconcile: finalizer needs a dynamic client")
	case err != nil:
		return nil, fmt.Errorf("reconcile: finalizer: %w", err)
	case len(errs) > 0:
		return nil, fmt.Errorf("reconcile: finalizer name %q: %v", name, errs)
	}
	return &Finalizer[T]{name: name, client: typed.New[T](dyn, res)}, nil
}

// Handle runs the finalizer protocol and says whether to go on with the
// reconcile (live): an object not being deleted gets the finalizer (live,
// the returned object updated); one being deleted with it is finalized,
// then loses it (unless finalize fails); any other is left alone. A
// Deleted request needs no call.
func (f *Finalizer[T]) Handle(ctx context.Context, obj T, finalize FinalizeFunc[T]) (out T, live bool, err error) {
	if isNil(obj) {
		return obj, false, errors.New("reconcile: finalizer: nil object")
	}
	if obj.GetDeletionTimestamp() == nil {
		switch out, err := f.set(ctx, obj, true); {
		case typed.Gone(err, obj.GetName()):
			return obj, false, nil
		case err != nil:
			return obj, false, err
		case out.GetDeletionTimestamp() == nil:
			return out, true, nil
		default: // it started deleting while set retried after a conflict
			obj = out
		}
	}
	if !slices.Contains(obj.GetFinalizers(), f.name) {
		return obj, false, nil
	}
	if finalize != nil {
		if err := finalize(ctx, obj); err != nil {
			return obj, false, fmt.Errorf("finalize %s: %w", opkit.KeyOf(obj), err)
		}
	}
	out, err = f.set(ctx, obj, false)
	if typed.Gone(err, obj.GetName()) {
		return obj, false, nil
	}
	return out, false, err
}

// set puts the finalizer on obj (on) or takes it off, keeping the
// others, and returns the object as written, or as it is when there is
// nothing to change (the finalizer already so, or, to put it on, obj being
// deleted). After a conflict it decides again on the object read again.
func (f *Finalizer[T]) set(ctx context.Context, obj T, on bool) (T, error) {
	return writeRetrying(ctx, f.client, obj, defaultConflictRetries, "finalizer "+f.name, func(cur T) (T, error) {
		fins := cur.GetFinalizers()
		if slices.Contains(fins, f.name) == on || on && cur.GetDeletionTimestamp() != nil {
			return cur, nil
		}
		fins = slices.DeleteFunc(slices.Clone(fins), func(s string) bool { return s == f.name })
		if on {
			fins = append(fins, f.name)
		}
		patch, err := finalizerPatch(cur.GetResourceVersion(), fins)
		if err != nil {
			return cur, err
		}
		out, err := f.client.Patch(ctx, opkit.KeyOf(obj), types.MergePatchType, patch)
		if err != nil {
			return cur, fmt.Errorf("reconcile: finalizer %s on %s: %w", f.name, opkit.KeyOf(obj), err)
		}
		noteWrite(ctx, out)
		return out, nil
	})
}

// writeRetrying is the optimistic concurrency of the Status and Finalizer
// helpers: it returns write(obj) and, after a 409 Conflict, up to retries
// times, write of the object read again, as long as that is still obj
// (sameObject). what names the helper in errors.
func writeRetrying[T opkit.Object](ctx context.Context, c *typed.Client[T], obj T, retries int, what string, write func(cur T) (T, error)) (T, error) {
	key := opkit.KeyOf(obj)
	cur := obj
	for attempt := 0; ; attempt++ {
		out, err := write(cur)
		if !apierrors.IsConflict(err) || attempt >= retries {
			return out, err
		}
		if cur, err = c.Get(ctx, key); err != nil {
			return obj, fmt.Errorf("reconcile: %s: re-read %s: %w", what, key, err)
		}
		if err := sameObject(c.Resource(), obj, cur); err != nil {
			return obj, fmt.Errorf("reconcile: %s: %w", what, err)
		}
	}
}

// sameObject returns nil if cur, read again after a conflict, is still
// the object obj was (same UID), and otherwise a NotFound for obj: it was
// deleted and another object of the same name took its place, which is
// not the caller's to change.
func sameObject(res opkit.Resource, obj, cur opkit.Object) error {
	if obj.GetUID() == "" || cur.GetUID() == obj.GetUID() {
		return nil
	}
	gone := apierrors.NewNotFound(schema.GroupResource{Group: res.Group, Resource: res.Resource}, obj.GetName())
	return fmt.Errorf("%s was deleted and created again (uid %s, now %s): %w", opkit.KeyOf(obj), obj.GetUID(), cur.GetUID(), gone)
}

// finalizerPatch is a merge patch that replaces metadata.finalizers with fins
// if, and only if, the object is still at resourceVersion rv.
func finalizerPatch(rv string, fins []string) ([]byte, error) {
	meta := map[string]any{"finalizers": fins}
	if rv != "" {
		meta["resourceVersion"] = rv
	}
	return json.Marshal(map[string]any{"metadata": meta})
}
