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

// ApplyConfig configures an [Applier]; Dynamic, FieldManager and Owner
// are required.
type ApplyConfig struct {
	Dynamic dynamic.Interface
	// FieldManager names the controller in the children's managedFields,
	// such as the controller's Config.Name.
	FieldManager string
	// Owner is the resource of the owners: every child gets a controller
	// reference to its owner, so that its changes reach the owner
	// (Config.Owns) and the garbage collector deletes it with the owner.
	Owner opkit.Resource
	// NoForce makes a field another manager owns an error that retrying
	// cannot help (terminal) instead of taking it over. A controller
	// normally forces, as the Kubernetes documentation advises: its
	// desired state wins.
	NoForce bool
}

// Applier writes children with server-side apply: the reconciler states
// the desired child, and one PATCH creates it or brings it back to that
// state (fields the controller set before and no longer states are
// removed), with a controller reference to its owner. A child another
// owner controls is left alone: a terminal error, or a plain one while
// that owner is a deleted predecessor of the same name (its children go
// with it). Reading children goes through the API server: a GET each, no
// cache. The operator needs patch and create on the children's resource
// (an apply that creates an object is authorized as a create too), and
// update on its owners' finalizers where the
// OwnerReferencesPermissionEnforcement admission plugin runs (the
// controller reference blocks the owner's deletion). It is safe for
// concurrent use.
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

// Apply applies child, an object of resource res owned by owner, and
// returns it as the API server stored it. child is the desired state: an
// apply configuration of k8s.io/client-go/applyconfigurations (such as
// corev1ac.ConfigMap(name, ns).WithData(data)), an
// *unstructured.Unstructured, or any value whose JSON is the object. Its
// apiVersion and kind default to res's, its namespace to the owner's (a
// namespaced owner's children must be in its namespace). One request;
// two when another owner controls the child (a GET tells which).
//
// Errors: a child controlled by another owner is a [TerminalError] (the
// name is taken), unless that owner is a deleted object of the owner's
// kind and name (a predecessor whose children the garbage collector or
// its own delete reconcile removes): then a plain error, retried. With
// NoForce, a conflict with another field manager is a TerminalError
// naming the fields. Other API errors are returned wrapped.
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

// Delete deletes the child key of resource res if owner controls it (its
// controller reference names owner's UID), with the child's UID as a
// precondition, and reports whether it did; a child that is gone, or
// controlled by another object (such as a new owner of the same name),
// is left alone. For a reconcile that cleans up after its owner (a
// finalizer, or a Deleted request): it touches only what that object
// ApplyAs is [Applier.Apply] that returns the child as the API server
// stored it in its Go type C, a pointer such as *appsv1.Deployment, so
// that its status reads as fields (d.Status.AvailableReplicas):
//
//	d, err := reconcile.ApplyAs[*appsv1.Deployment](ctx, a, w, deployments, appsv1ac.Deployment(name, "").WithSpec(...))
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

// owned. A GET, and a DELETE when it deletes.
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
