package trigger_test

import (
	"errors"
	"log/slog"
	"testing"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/runtime/schema"

	"github.com/opkit/opkit/trigger"
)

// An ERROR means someone has to act; what a retry mends is a warning.
func TestFailuresAreErrorsOnlyWhenSomeoneHasToAct(t *testing.T) {
	cms := schema.GroupResource{Resource: "configmaps"}
	for _, tc := range []struct {
		name string
		err  error
		want slog.Level
	}{
		{"timeout", apierrors.NewTimeoutError("slow", 1), slog.LevelWarn},
		{"5xx", apierrors.NewInternalError(errors.New("etcd leader changed")), slog.LevelWarn},
		{"throttled", apierrors.NewTooManyRequests("later", 1), slog.LevelWarn},
		{"our RBAC", apierrors.NewForbidden(cms, "a", errors.New("no rule")), slog.LevelError},
		{"our credentials", apierrors.NewUnauthorized("expired"), slog.LevelError},
		{"not served", apierrors.NewNotFound(cms, ""), slog.LevelError},
	} {
		if got := trigger.APILevel(tc.err); got != tc.want {
			t.Errorf("API call failed with %s: level %v, want %v", tc.name, got, tc.want)
		}
	}
	for _, tc := range []struct {
		kind string
		want slog.Level
	}{
		{"Disconnected", slog.LevelWarn},
		{"", slog.LevelWarn},
		{"Permission", slog.LevelError},
		{"Quota", slog.LevelError},
		{"NotFound", slog.LevelError},
	} {
		if got := trigger.BrokerLevel(&trigger.BrokerError{Kind: tc.kind, Err: errors.New("x")}); got != tc.want {
			t.Errorf("broker call failed with %v: level %v, want %v", tc.kind, got, tc.want)
		}
	}
}
