package reconcile

import (
	"testing"

	"k8s.io/apimachinery/pkg/types"

	"github.com/opkit/opkit"
)

// The streak counts one object's consecutive failures per key: another
// UID starts it again, an unknown UID ("") continues it, forget ends it,
// and reset ends every key's.
func TestFailuresCountAStreakPerObject(t *testing.T) {
	var f failures
	a, b := opkit.Key{Namespace: "ns", Name: "a"}, opkit.Key{Namespace: "ns", Name: "b"}
	for _, step := range []struct {
		key  opkit.Key
		uid  string
		want int
	}{
		{a, "u1", 1},
		{a, "u1", 2},
		{a, "", 3},   // a failed re-fetch: no object, the same streak
		{b, "u9", 1}, // another key has its own
		{a, "u2", 1}, // recreated: starts again
		{a, "u2", 2},
	} {
		if got := f.fail(step.key, types.UID(step.uid)); got != step.want {
			t.Fatalf("fail(%v, %q) = %d, want %d", step.key, step.uid, got, step.want)
		}
	}
	f.forget(a, "u1") // another object's success: u2's streak stays
	if got := f.fail(a, "u2"); got != 3 {
		t.Errorf("after forgetting u1: %d, want u2's streak to go on (3)", got)
	}
	f.forget(a, "u2")
	if got := f.fail(a, "u2"); got != 1 {
		t.Errorf("after forget: %d, want 1", got)
	}
	f.forget(a, "") // unknown: ends any
	if got := f.fail(a, "u2"); got != 1 {
		t.Errorf("after forgetting an unknown object: %d, want 1", got)
	}
	if f.len() != 2 {
		t.Errorf("%d keys failing, want 2", f.len())
	}
	f.reset()
	if f.len() != 0 {
		t.Errorf("%d keys failing after reset, want 0", f.len())
	}
	f.forget(b, "u9") // forgetting a key with no streak is fine
}
