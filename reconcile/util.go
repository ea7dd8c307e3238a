package reconcile

import (
	"reflect"
	"strings"

	"github.com/opkit/opkit"
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
	st, ok := jsonField(reflect.TypeFor[T](), "status")
	if !ok {
		return false
	}
	_, ok = jsonField(st, "lastHandledReconcileAt")
	return ok
}

// jsonField returns the type of the field encoding/json reads as name in
// t (a struct, or a pointer to one), looking into inlined embedded
// structs.
func jsonField(t reflect.Type, name string) (reflect.Type, bool) {
	for t.Kind() == reflect.Pointer {
		t = t.Elem()
	}
	if t.Kind() != reflect.Struct {
		return nil, false
	}
	for f := range t.Fields() {
		tag, _, _ := strings.Cut(f.Tag.Get("json"), ",")
		switch {
		case tag == name || tag == "" && f.Name == name && f.IsExported():
			return f.Type, true
		case tag == "" && f.Anonymous:
			if ft, ok := jsonField(f.Type, name); ok {
				return ft, true
			}
		}
	}
	return nil, false
}
