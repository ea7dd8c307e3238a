package typed

// How the trigger's intake, handler and consumer tell an API server's
// failures apart. The watcher (its metrics' Reasons) and the elector (a
// 409 is an election's normal answer) sort failures for other ends and
// keep their own small classifiers.

import (
	"context"
	"errors"
	"net"
	"strings"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	utilnet "k8s.io/apimachinery/pkg/util/net"
)

// The classes of an API call's failure, as metrics and logs name them.
const (
	// Transient: the API server did not answer, or answered that it
	// cannot now (refused or reset connections, timeouts, 5xx, 429), as
	// during its restart: worth a retry soon.
	Transient = "APITransient"
	// Refused: it answered 401 or 403: a server whose authorizer has not
	// synced yet after a start, or a missing permission, which only the
	// operator's RBAC fixes. Counted apart so that the two show.
	Refused = "APIRefused"
	// Failed: any other answer (a bad request, a resource not served, an
	// object of another kind): retrying the same call changes nothing soon.
	Failed = "APIError"
)

// Class is the class of err, an API call's failure.
func Class(err error) string {
	var netErr net.Error
	switch {
	case apierrors.IsUnauthorized(err), apierrors.IsForbidden(err):
		return Refused
	case errors.Is(err, context.DeadlineExceeded), apierrors.IsTimeout(err), apierrors.IsServerTimeout(err),
		apierrors.IsTooManyRequests(err), apierrors.IsInternalError(err), apierrors.IsServiceUnavailable(err),
		utilnet.IsConnectionRefused(err), utilnet.IsConnectionReset(err),
		utilnet.IsProbableEOF(err), errors.As(err, &netErr):
		return Transient
	}
	var status apierrors.APIStatus
	if errors.As(err, &status) && status.Status().Code >= 500 {
		return Transient
	}
	return Failed
}

// Timeout reports whether err says an API call ran out of time: the
// context's deadline, the API server's timeout statuses, or client-go's
// client-side rate limiter refusing to wait past the deadline (its error,
// from golang.org/x/time/rate, wraps nothing: only its text says so).
func Timeout(err error) bool {
	return errors.Is(err, context.DeadlineExceeded) || apierrors.IsTimeout(err) || apierrors.IsServerTimeout(err) ||
		strings.Contains(err.Error(), "would exceed context deadline")
}
