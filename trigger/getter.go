package trigger

import (
	"context"
	"errors"
	"strings"

	"k8s.io/apimachinery/pkg/util/validation"
	"k8s.io/client-go/dynamic"

	"github.com/opkit/opkit"
	"github.com/opkit/opkit/internal/typed"
)

// Getter re-fetches one object from the API server. It must return API
// errors unchanged (or wrapped) so that apierrors.IsNotFound and
// apierrors.IsTimeout work on them. An object counts as gone only when the
// NotFound status names it (as the API server's and client-go's fake
// clients' do): a NotFound without the object's name is the API server not
// serving the resource (a CRD not installed yet, a version not served), and
// the trigger is retried (consumer) or answered 502 (handler) rather than
// dropped. The default Getter is a typed client over a dynamic.Interface.
type Getter[T opkit.Object] func(ctx context.Context, key opkit.Key) (T, error)

// getterFor returns get, or the default getter over dyn.
func getterFor[T opkit.Object](get Getter[T], dyn dynamic.Interface, res opkit.Resource) (Getter[T], error) {
	if get != nil {
		return get, nil
	}
	if dyn == nil {
		return nil, errors.New("either Get or Dynamic is required")
	}
	return typed.New[T](dyn, res).Get, nil
}

// validateKey checks a namespace and name taken from outside (a URL, a
// message) against the resource's scope: the namespace must be a DNS-1123
// label for namespaced resources and empty for cluster-scoped ones, the
// name a DNS-1123 subdomain. Errors wrap ErrInvalid.
func validateKey(res opkit.Resource, key opkit.Key) error {
	if res.Namespaced {
		if key.Namespace == "" {
			return invalid("%s is namespaced: a namespace is required", res.Resource)
		}
		if errs := validation.IsDNS1123Label(key.Namespace); len(errs) > 0 {
			return invalid("namespace %q: %s", key.Namespace, strings.Join(errs, "; "))
		}
	} else if key.Namespace != "" {
		return invalid("%s is cluster-scoped: no namespace may be given (got %q)", res.Resource, key.Namespace)
	}
	if key.Name == "" {
		return invalid("a name is required")
	}
	if errs := validation.IsDNS1123Subdomain(key.Name); len(errs) > 0 {
		return invalid("name %q: %s", key.Name, strings.Join(errs, "; "))
	}
	return nil
}
