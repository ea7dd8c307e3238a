package reconcile

import (
	"reflect"

	"github.com/opkit/opkit"
)

// isNil reports whether obj is a nil interface or a nil pointer.
func isNil(obj opkit.Object) bool {
	v := reflect.ValueOf(obj) // the zero Value for a nil interface
	return !v.IsValid() || v.Kind() == reflect.Pointer && v.IsNil()
}
