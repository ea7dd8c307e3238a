package trigger

// How the intake and the consumer tell an API server's failures apart.

import (
	"context"
	"errors"
	"net"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	utilnet "k8s.io/apimachinery/pkg/util/net"
)

// The classes of an API call's failure, as metrics and logs name them.
const (
	// apiTransient: the API server did not answer, or answered that it
	// cannot now (refused or reset connections, timeouts, 5xx, 429), as
	// during its restart: worth a retry soon.
	apiTransient = "APITransient"
	// apiRefused: it answered 401 or 403: a server whose authorizer has
	// not synced yet after a start, or a missing permission, which only
	// the operator's RBAC fixes. Counted apart so that the two show.
	apiRefused = "APIRefused"
	// apiError: any other answer (a bad request, a resource not served, an
	// object of another kind): retrying the same call changes nothing soon.
	apiError = "APIError"
)

// apiClass is the class of err, an API call's failure.
func apiClass(err error) string {
	var netErr net.Error
	switch {
	case apierrors.IsUnauthorized(err), apierrors.IsForbidden(err):
		return apiRefused
	case errors.Is(err, context.DeadlineExceeded), apierrors.IsTimeout(err), apierrors.IsServerTimeout(err),
		apierrors.IsTooManyRequests(err), apierrors.IsInternalError(err), apierrors.IsServiceUnavailable(err),
		utilnet.IsConnectionRefused(err), utilnet.IsConnectionReset(err),
		utilnet.IsProbableEOF(err), errors.As(err, &netErr):
		return apiTransient
	}
	var status apierrors.APIStatus
	if errors.As(err, &status) && status.Status().Code >= 500 {
		return apiTransient
	}
	return apiError
}

// unchecked reports whether err, an authorization's, says only that this
// replica could not ask its API server (it did not answer, or refused
// the review itself): the caller was not judged, and the replica that
// works on the object, which checks every caller, may still be asked.
func unchecked(err error) bool {
	switch {
	case err == nil, errors.Is(err, ErrUnauthenticated), errors.Is(err, ErrForbidden), errors.Is(err, ErrBusy), errors.Is(err, ErrInvalid):
		return false
	}
	return apiClass(err) != apiError
}
