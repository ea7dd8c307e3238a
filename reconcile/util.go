package reconcile

import (
	"reflect"

	"github.com/opkit/opkit"
)

// isNil reports whether obj is a nil interface or a nil pointer.
func isNil(obj opkit.Object) bool {
	if obj == nil {
		return true
	}
	v := reflect.ValueOf(obj)
	return v.Kind() == reflect.Pointer && v.IsNil()
}
