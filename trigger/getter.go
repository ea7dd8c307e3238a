package trigger

import (
	"context"
	"strings"
	"unicode"
	"unicode/utf8"

	"k8s.io/apimachinery/pkg/api/validation/path"
	"k8s.io/apimachinery/pkg/util/validation"

	"github.com/opkit/opkit"
)

// Getter re-fetches one object from the API server. It must return API
// errors unchanged (or wrapped) so that apierrors.IsNotFound and
// apierrors.IsTimeout work on them. An object counts as gone only when the
// NotFound status names it (as the API server's and client-go's fake
// clients' do): a NotFound without the object's name is the API server not
// serving the resource (a CRD not installed yet, a version not served), and
// the trigger is retried (consumer) or answered 502 (handler) rather than
// dropped. The default Getter (Config.Dynamic) is a typed client.
type Getter[T opkit.Object] func(ctx context.Context, key opkit.Key) (T, error)

// MaxNameLen is the longest object name a trigger accepts, in bytes: the
// longest a DNS-1123 subdomain, which most resources' names are, may be.
const MaxNameLen = validation.DNS1123SubdomainMaxLength

// validateKey checks a namespace and name against the resource's scope
// and against what the API server accepts as a name: the namespace must
// be a DNS-1123 label for namespaced resources and empty for
// cluster-scoped ones; the name must be non-empty, at most MaxNameLen
// bytes, UTF-8 text without control characters (opkit's limits), and a
// valid path segment (not "." or "..", no "/" or "%": the rule the API
// server applies to every resource's names). Stricter rules of
// a resource (most want a DNS-1123 subdomain; RBAC roles take names such
// as "system:aggregate-to-admin") are left to the API server, which
// answers NotFound for a name it could not hold. Errors wrap ErrInvalid.
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
	return CheckName(key.Name)
}

// CheckName reports, with an error wrapping [ErrInvalid], whether name is
// not one a trigger accepts: it must be non-empty, at most [MaxNameLen]
// bytes of UTF-8 text without control characters, and a valid path
// segment (not "." or "..", no "/" or "%"). A producer can check a name
// with it before sending a trigger.
func CheckName(name string) error {
	if name == "" {
		return invalid("a name is required")
	}
	if len(name) > MaxNameLen {
		return invalid("name %.40q...: longer than %d bytes", name, MaxNameLen)
	}
	if errs := path.IsValidPathSegmentName(name); len(errs) > 0 {
		return invalid("name %q: %s", name, strings.Join(errs, "; "))
	}
	if !utf8.ValidString(name) || strings.IndexFunc(name, unicode.IsControl) >= 0 {
		return invalid("name %q: must be UTF-8 text without control characters", name)
	}
	return nil
}
