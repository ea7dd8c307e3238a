package reconcile

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"maps"
	"slices"
	"strings"

	"k8s.io/apimachinery/pkg/api/equality"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/dynamic"

	"github.com/opkit/opkit"
	"github.com/opkit/opkit/internal/typed"
)

// StatusConfig configures a [Status] helper (Dynamic and Resource are
// required). Unless SkipObservedGeneration, status.observedGeneration is
// set to metadata.generation when T's status has it.
type StatusConfig struct {
	Dynamic                dynamic.Interface
	Resource               opkit.Resource
	SkipObservedGeneration bool
}

// Status writes the status subresource. A write is one request, a JSON
// patch (RFC 6902) of the status fields mutate changed and nothing else,
// with no resourceVersion precondition: a status says what the reconciler
// made of the state it saw, and the latest reconcile's write is the one
// that counts (one leader reconciles a key at a time), so neither the
// operator's own earlier writes nor a user's spec change make it fail with
// a 409 Conflict. The patch first tests the object's UID: a status
// computed for an object deleted since never lands on a new object of the
// same name (the write fails with a NotFound for the object it was
// computed for; the retry reads the new object). A mutate
// that changes nothing writes nothing. It is safe for concurrent use.
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
	}
	return &Status[T]{client: typed.New[T](cfg.Dynamic, cfg.Resource), cfg: cfg}, nil
}

// Update applies mutate to obj and writes the status fields it changed
// (observedGeneration included), returning the object as written, or obj
// when nothing changed; a mutate error is returned as is, with nothing
// written. obj is changed in place by mutate.
func (s *Status[T]) Update(ctx context.Context, obj T, mutate func(obj T) error) (T, error) {
	if isNil(obj) {
		return obj, errors.New("reconcile: status: nil object")
	}
	key := opkit.KeyOf(obj)
	before, err := statusOf(obj)
	if err != nil {
		return obj, err
	}
	if err := mutate(obj); err != nil {
		return obj, err
	}
	u, err := typed.ToUnstructured(obj)
	if err != nil {
		return obj, err
	}
	if !s.cfg.SkipObservedGeneration {
		if err := unstructured.SetNestedField(u.Object, obj.GetGeneration(), "status", "observedGeneration"); err != nil {
			return obj, fmt.Errorf("reconcile: status of %s: %w", key, err)
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
	ops := patchOps(nil, "/status", before, after)
	if len(ops) == 0 {
		return obj, nil
	}
	if uid := obj.GetUID(); uid != "" {
		ops = append([]patchOp{{Op: "test", Path: "/metadata/uid", Value: uid}}, ops...)
	}
	patch, err := json.Marshal(ops)
	if err != nil {
		return obj, fmt.Errorf("reconcile: status of %s: %w", key, err)
	}
	out, err := s.client.Patch(ctx, key, types.JSONPatchType, patch, "status")
	if apierrors.IsInvalid(err) || apierrors.IsBadRequest(err) {
		// A failed test (or a member the stale read had and the object has
		// no more): say which when the object is another one now.
		if cur, gerr := s.client.Get(ctx, key); gerr == nil {
			if serr := sameObject(s.client.Resource(), obj, cur); serr != nil {
				return obj, fmt.Errorf("reconcile: status: %w", serr)
			}
		}
	}
	if err != nil {
		return obj, fmt.Errorf("reconcile: patch status of %s: %w", key, err)
	}
	return out, nil
}

// patchOp is one operation of a JSON patch.
type patchOp struct {
	Op    string `json:"op"`
	Path  string `json:"path"`
	Value any    `json:"value,omitempty"`
}

// patchOps appends to ops the JSON patch operations that turn before into
// after at path: for two objects, those of each changed member
// (recursively), "remove" for a member gone; for anything else (a list, a
// scalar, an object that was not one before or was empty, which the API
// server may not hold at all), "add" of the whole value (which replaces),
// or "remove".
func patchOps(ops []patchOp, path string, before, after any) []patchOp {
	b, bok := before.(map[string]any)
	a, aok := after.(map[string]any)
	switch {
	case bok && aok && len(b) > 0:
		for _, k := range slices.Sorted(maps.Keys(a)) {
			ops = patchOps(ops, path+"/"+pointerEscape.Replace(k), b[k], a[k])
		}
		for _, k := range slices.Sorted(maps.Keys(b)) {
			if _, kept := a[k]; !kept {
				ops = append(ops, patchOp{Op: "remove", Path: path + "/" + pointerEscape.Replace(k)})
			}
		}
		return ops
	case equality.Semantic.DeepEqual(before, after):
		return ops
	case after == nil:
		return append(ops, patchOp{Op: "remove", Path: path})
	}
	return append(ops, patchOp{Op: "add", Path: path, Value: after})
}

// pointerEscape escapes a member name for a JSON pointer (RFC 6901).
var pointerEscape = strings.NewReplacer("~", "~0", "/", "~1")

// statusOf returns a deep copy of obj's status in unstructured form.
func statusOf(obj opkit.Object) (any, error) {
	u, err := typed.ToUnstructured(obj)
	if err != nil {
		return nil, err
	}
	st, _, _ := unstructured.NestedFieldCopy(u.Object, "status")
	return st, nil
}
