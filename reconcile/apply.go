package reconcile

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"strings"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	utiljson "k8s.io/apimachinery/pkg/util/json"
	"k8s.io/client-go/dynamic"

	"github.com/opkit/opkit"
	"github.com/opkit/opkit/internal/typed"
)

// ApplyConfig configures an [Applier] (all required but NoForce: a field
// another manager owns is then a terminal error).
type ApplyConfig struct {
	Dynamic      dynamic.Interface
	FieldManager string
	Owner        opkit.Resource
	NoForce      bool
}

// Applier writes children with server-side apply, with a controller
// reference to their owner (their changes reach it; they go with it): it
// needs patch and create on them, and update on the owners' finalizers
// under OwnerReferencesPermissionEnforcement.
type Applier struct {
	dyn dynamic.Interface
	cfg ApplyConfig
}

// NewApplier validates cfg and returns an Applier.
func NewApplier(cfg ApplyConfig) (*Applier, error) {
	switch err := cfg.Owner.Validate(); {
	case cfg.Dynamic == nil || cfg.FieldManager == "":
		return nil, errors.New("reconcile: applier needs a dynamic client and a field manager")
	case err != nil:
		return nil, fmt.Errorf("reconcile: applier: %w", err)
	}
	return &Applier{dyn: cfg.Dynamic, cfg: cfg}, nil
}

// Apply applies child, the desired state of an object of res owned by
// owner (an apply configuration, an *unstructured.Unstructured, or its
// JSON; apiVersion, kind and namespace default to res's and owner's), and
// returns it as stored. Another owner's child is a [TerminalError], or a
// plain one while that owner is a deleted predecessor of the name.
func (a *Applier) Apply(ctx context.Context, owner opkit.Object, res opkit.Resource, child any) (*unstructured.Unstructured, error) {
	u, err := a.desired(owner, res, child)
	if err != nil {
		return nil, err
	}
	force := !a.cfg.NoForce
	out, err := a.resource(res, u.GetNamespace()).Apply(ctx, u.GetName(), u, metav1.ApplyOptions{FieldManager: a.cfg.FieldManager, Force: force})
	switch {
	case err == nil:
		return out, nil
	case apierrors.IsConflict(err) && !force:
		return nil, TerminalError(fmt.Errorf("apply %s %s: fields another manager owns: %w", res.Resource, opkit.KeyOf(u), err))
	case apierrors.IsInvalid(err) && strings.Contains(err.Error(), "Only one reference can have Controller set to true"):
		return nil, a.controlledElsewhere(ctx, owner, res, opkit.KeyOf(u), err)
	}
	return nil, fmt.Errorf("apply %s %s: %w", res.Resource, opkit.KeyOf(u), err)
}

// ApplyAs is [Applier.Apply] that returns the child in its Go type C (a
// pointer such as *appsv1.Deployment), so that its status reads as fields.
func ApplyAs[C opkit.Object](ctx context.Context, a *Applier, owner opkit.Object, res opkit.Resource, child any) (C, error) {
	var none C
	u, err := a.Apply(ctx, owner, res, child)
	if err != nil {
		return none, err
	}
	out, err := typed.FromUnstructured[C](u)
	if err != nil {
		return none, fmt.Errorf("apply %s %s: the API server's answer as %T: %w", res.Resource, opkit.KeyOf(u), none, err)
	}
	return out, nil
}

// Delete deletes the child key of res if owner (by UID) controls it, and
// reports whether it did.
func (a *Applier) Delete(ctx context.Context, owner opkit.Object, res opkit.Resource, key opkit.Key) (bool, error) {
	ri := a.resource(res, key.Namespace)
	cur, err := ri.Get(ctx, key.Name, metav1.GetOptions{})
	switch {
	case apierrors.IsNotFound(err):
		return false, nil
	case err != nil:
		return false, fmt.Errorf("get %s %s: %w", res.Resource, key, err)
	}
	if ref := metav1.GetControllerOfNoCopy(cur); ref == nil || ref.UID != owner.GetUID() {
		return false, nil
	}
	uid := cur.GetUID()
	err = ri.Delete(ctx, key.Name, metav1.DeleteOptions{Preconditions: &metav1.Preconditions{UID: &uid}})
	switch {
	case apierrors.IsNotFound(err) || apierrors.IsConflict(err): // gone, or another object of the name now
		return false, nil
	case err != nil:
		return false, fmt.Errorf("delete %s %s: %w", res.Resource, key, err)
	}
	return true, nil
}

// desired turns child into the object to apply, with its identity and
// the controller reference to owner.
func (a *Applier) desired(owner opkit.Object, res opkit.Resource, child any) (*unstructured.Unstructured, error) {
	u, ok := child.(*unstructured.Unstructured)
	if ok {
		u = u.DeepCopy()
	} else {
		data, err := json.Marshal(child)
		if err == nil {
			u = &unstructured.Unstructured{}
			err = utiljson.Unmarshal(data, &u.Object) // integers as int64, as unstructured wants
		}
		if err != nil || u.Object == nil {
			return nil, fmt.Errorf("reconcile: apply: %T is not an object: %v", child, err)
		}
	}
	if u.GetAPIVersion() == "" {
		u.SetAPIVersion(res.GroupVersion().String())
	}
	if u.GetKind() == "" {
		u.SetKind(res.Kind)
	}
	switch ns := owner.GetNamespace(); {
	case u.GetName() == "":
		return nil, errors.New("reconcile: apply: the child has no name")
	case !res.Namespaced && ns != "":
		return nil, fmt.Errorf("reconcile: apply: %s is cluster-scoped; a namespaced %s cannot own it", res.Resource, a.cfg.Owner.Kind)
	case res.Namespaced && u.GetNamespace() == "":
		if ns == "" {
			return nil, fmt.Errorf("reconcile: apply: %s %s needs a namespace", res.Resource, u.GetName())
		}
		u.SetNamespace(ns)
	case res.Namespaced && ns != "" && u.GetNamespace() != ns:
		return nil, fmt.Errorf("reconcile: apply: %s %s/%s is not in its owner's namespace %q", res.Resource, u.GetNamespace(), u.GetName(), ns)
	}
	refs := []metav1.OwnerReference{a.controllerRef(owner)}
	for _, r := range u.GetOwnerReferences() {
		if r.UID != owner.GetUID() {
			refs = append(refs, r)
		}
	}
	u.SetOwnerReferences(refs)
	return u, nil
}

func (a *Applier) controllerRef(owner opkit.Object) metav1.OwnerReference {
	yes := true
	return metav1.OwnerReference{APIVersion: a.cfg.Owner.GroupVersion().String(), Kind: a.cfg.Owner.Kind,
		Name: owner.GetName(), UID: owner.GetUID(), Controller: &yes, BlockOwnerDeletion: &yes}
}

// controlledElsewhere explains an apply the API server refused because
// the child has another controller.
func (a *Applier) controlledElsewhere(ctx context.Context, owner opkit.Object, res opkit.Resource, key opkit.Key, applyErr error) error {
	cur, err := a.resource(res, key.Namespace).Get(ctx, key.Name, metav1.GetOptions{})
	if err != nil {
		return fmt.Errorf("apply %s %s: %w", res.Resource, key, applyErr)
	}
	ref := metav1.GetControllerOfNoCopy(cur)
	switch {
	case ref == nil:
		return fmt.Errorf("apply %s %s: %w", res.Resource, key, applyErr)
	case ref.Kind == a.cfg.Owner.Kind && ref.Name == owner.GetName() && ref.UID != owner.GetUID():
		return fmt.Errorf("apply %s %s: still controlled by a deleted %s of the name (uid %s); it goes with it", res.Resource, key, ref.Kind, ref.UID)
	}
	return TerminalError(fmt.Errorf("apply %s %s: controlled by %s %s (uid %s), not by this %s", res.Resource, key, ref.Kind, ref.Name, ref.UID, a.cfg.Owner.Kind))
}

func (a *Applier) resource(res opkit.Resource, namespace string) dynamic.ResourceInterface {
	if res.Namespaced {
		return a.dyn.Resource(res.GroupVersionResource).Namespace(namespace)
	}
	return a.dyn.Resource(res.GroupVersionResource)
}
