package reconcile

import (
	"reflect"

	"github.com/opkit/opkit"
	"github.com/opkit/opkit/internal/typed"
)

// isNil reports whether obj is a nil interface or a nil pointer.
func isNil(obj opkit.Object) bool {
	v := reflect.ValueOf(obj) // the zero Value for a nil interface
	return !v.IsValid() || v.Kind() == reflect.Pointer && v.IsNil()
}

// recordsRequests reports whether T's status has the field in which
// Status records the durable trigger it handled
// (status.lastHandledReconcileAt).
func recordsRequests[T opkit.Object]() bool {
	st, ok := typed.JSONFields(reflect.TypeFor[T]())["status"]
	if !ok {
		return false
	}
	_, ok = typed.JSONFields(st)["lastHandledReconcileAt"]
	return ok
}
