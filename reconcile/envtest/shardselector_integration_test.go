//go:build integration

package envtest_test

import (
	"context"
	"fmt"
	"hash/fnv"
	"maps"
	"slices"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/watch"
	typedcorev1 "k8s.io/client-go/kubernetes/typed/core/v1"

	"github.com/opkit/opkit/reconcile/envtest"
)

// The two halves of the 64-bit FNV-1a hash space of metadata.uid, as shard
// selectors (KEP-5866): ranges are [start, end), bounds 0x-prefixed with 16
// hex digits, and the end of the space is written 2^64.
const (
	lowerHalf = "shardRange(object.metadata.uid, '0x0000000000000000', '0x8000000000000000')"
	upperHalf = "shardRange(object.metadata.uid, '0x8000000000000000', '0x10000000000000000')"
)

// inLowerHalf tells, as the API server computes it, whether an object with
// uid falls in lowerHalf.
func inLowerHalf(uid types.UID) bool {
	h := fnv.New64a()
	h.Write([]byte(uid))
	return h.Sum64() < 1<<63
}

// TestShardSelectorWithGate: with the ShardedListAndWatch gate (which this
// package's TestMain asks for), a LIST with a shard selector returns exactly the objects whose
// UID hashes into the range and echoes the selector in ShardInfo, the two
// halves partition the collection, a WATCH with the selector delivers only
// objects in the range, and a malformed selector is refused.
func TestShardSelectorWithGate(t *testing.T) {
	c := envtest.Shared(t)
	if !c.ShardedListAndWatch() {
		t.Fatalf("shared environment: ShardedListAndWatch() = false, want the gate on as TestMain asked")
	}
	ctx, configMaps, all := listedConfigMaps(t, c)

	lower, err := configMaps.List(ctx, metav1.ListOptions{ShardSelector: lowerHalf})
	if err != nil {
		t.Fatalf("list lower half: %v", err)
	}
	if lower.ShardInfo == nil || lower.ShardInfo.Selector != lowerHalf {
		t.Errorf("lower half: ShardInfo = %v, want the selector %q echoed", lower.ShardInfo, lowerHalf)
	}
	wantLower := namesWhere(all, inLowerHalf)
	if got := itemNames(lower.Items); !slices.Equal(got, wantLower) {
		t.Errorf("lower half lists %v, want %v (of %v)", got, wantLower, slices.Sorted(maps.Keys(all)))
	}

	upper, err := configMaps.List(ctx, metav1.ListOptions{ShardSelector: upperHalf})
	if err != nil {
		t.Fatalf("list upper half: %v", err)
	}
	if upper.ShardInfo == nil || upper.ShardInfo.Selector != upperHalf {
		t.Errorf("upper half: ShardInfo = %v, want the selector %q echoed", upper.ShardInfo, upperHalf)
	}
	wantUpper := namesWhere(all, func(uid types.UID) bool { return !inLowerHalf(uid) })
	if got := itemNames(upper.Items); !slices.Equal(got, wantUpper) {
		t.Errorf("upper half lists %v, want %v", got, wantUpper)
	}

	unsharded, err := configMaps.List(ctx, metav1.ListOptions{})
	if err != nil {
		t.Fatalf("list without selector: %v", err)
	}
	if unsharded.ShardInfo != nil {
		t.Errorf("list without selector: ShardInfo = %v, want none", unsharded.ShardInfo)
	}

	delivered, created := watchWhileCreating(ctx, t, configMaps, lower.ResourceVersion, lowerHalf)
	if want := namesWhere(created, inLowerHalf); !slices.Equal(delivered, want) {
		t.Errorf("sharded watch delivered %v, want only those in the lower half: %v (of %v)",
			delivered, want, slices.Sorted(maps.Keys(created)))
	}

	// v1.37.2 answers a malformed selector with a bare 500, not a 400.
	for _, bad := range []string{
		"shardRange(object.metadata.uid, '0x0', '0x8000000000000000')", // bounds need 16 digits
		"shardRange(object.metadata.name, '0x0000000000000000', '0x8000000000000000')",
	} {
		_, err := configMaps.List(ctx, metav1.ListOptions{ShardSelector: bad})
		if err == nil || !strings.Contains(err.Error(), "invalid shard selector") {
			t.Errorf("list with %q: %v, want an invalid shard selector error", bad, err)
		}
		w, err := configMaps.Watch(ctx, metav1.ListOptions{ShardSelector: bad})
		if err == nil {
			w.Stop()
		}
		if err == nil || !strings.Contains(err.Error(), "invalid shard selector") {
			t.Errorf("watch with %q: %v, want an invalid shard selector error", bad, err)
		}
	}
}

// TestShardSelectorWithoutGate: an API server without the
// ShardedListAndWatch gate ignores ShardSelector altogether: LIST and WATCH
// return every object, with no ShardInfo, and even a malformed selector is
// no error. A client must check ShardInfo to know whether it got a shard.
func TestShardSelectorWithoutGate(t *testing.T) {
	c := envtest.Start(t, envtest.Options{})
	if c.ShardedListAndWatch() {
		t.Fatalf("ShardedListAndWatch() = true without Options.ShardedListAndWatch")
	}
	ctx, configMaps, all := listedConfigMaps(t, c)

	for _, selector := range []string{lowerHalf, "not a selector ("} {
		list, err := configMaps.List(ctx, metav1.ListOptions{ShardSelector: selector})
		if err != nil {
			t.Fatalf("list with %q: %v, want it ignored", selector, err)
		}
		if list.ShardInfo != nil {
			t.Errorf("list with %q: ShardInfo = %v, want none", selector, list.ShardInfo)
		}
		if got, want := itemNames(list.Items), slices.Sorted(maps.Keys(all)); !slices.Equal(got, want) {
			t.Errorf("list with %q: %v, want every ConfigMap: %v", selector, got, want)
		}
	}

	list, err := configMaps.List(ctx, metav1.ListOptions{})
	if err != nil {
		t.Fatalf("list: %v", err)
	}
	delivered, created := watchWhileCreating(ctx, t, configMaps, list.ResourceVersion, lowerHalf)
	if want := slices.Sorted(maps.Keys(created)); !slices.Equal(delivered, want) {
		t.Errorf("watch with a selector delivered %v, want every ConfigMap created: %v", delivered, want)
	}
}

// listedConfigMaps takes a namespace of c for t and creates ConfigMaps
// listed-NN in it with createSpreadConfigMaps (20 or more). It returns a
// context that ends with t or after 2 minutes, the namespace's ConfigMaps
// and their UIDs by name.
func listedConfigMaps(t testing.TB, c *envtest.Environment) (context.Context, typedcorev1.ConfigMapInterface, map[string]types.UID) {
	t.Helper()
	ctx, cancel := context.WithTimeout(t.Context(), 2*time.Minute)
	t.Cleanup(cancel)
	configMaps := clientset(t, c).CoreV1().ConfigMaps(c.Namespace(t))
	return ctx, configMaps, createSpreadConfigMaps(ctx, t, configMaps, "listed", 20)
}

// createSpreadConfigMaps creates ConfigMaps named prefix-NN, at least n and
// more until both halves of the hash space hold one, and returns their UIDs
// by name.
func createSpreadConfigMaps(ctx context.Context, t testing.TB, configMaps typedcorev1.ConfigMapInterface, prefix string, n int) map[string]types.UID {
	t.Helper()
	uids := make(map[string]types.UID)
	for i := 0; i < n || !spread(uids); i++ {
		cm := createConfigMap(ctx, t, configMaps, &corev1.ConfigMap{ObjectMeta: metav1.ObjectMeta{Name: fmt.Sprintf("%s-%02d", prefix, i)}})
		uids[cm.Name] = cm.UID
	}
	return uids
}

// spread reports whether uids has one in each half of the hash space.
func spread(uids map[string]types.UID) bool {
	var lower, upper bool
	for _, uid := range uids {
		lower = lower || inLowerHalf(uid)
		upper = upper || !inLowerHalf(uid)
	}
	return lower && upper
}

// watchWhileCreating watches configMaps from resourceVersion with selector
// while it creates ConfigMaps spread over both halves of the hash space and
// then more until the last one is in the lower half. Watch events come in
// order, so once that last one's ADDED arrives the watch has delivered all
// it will of the others. It returns the sorted names the watch delivered and
// the UIDs by name of what it created.
func watchWhileCreating(ctx context.Context, t testing.TB, configMaps typedcorev1.ConfigMapInterface, resourceVersion, selector string) ([]string, map[string]types.UID) {
	t.Helper()
	w, err := configMaps.Watch(ctx, metav1.ListOptions{ResourceVersion: resourceVersion, ShardSelector: selector})
	if err != nil {
		t.Fatalf("watch with %q: %v", selector, err)
	}
	defer w.Stop()
	created := createSpreadConfigMaps(ctx, t, configMaps, "watched", 10)
	last := ""
	for i := len(created); last == "" || !inLowerHalf(created[last]); i++ {
		cm := createConfigMap(ctx, t, configMaps, &corev1.ConfigMap{ObjectMeta: metav1.ObjectMeta{Name: fmt.Sprintf("watched-%02d", i)}})
		created[cm.Name] = cm.UID
		last = cm.Name
	}

	var delivered []string
	for {
		select {
		case ev, ok := <-w.ResultChan():
			if !ok {
				t.Fatalf("watch closed before delivering %s; delivered %v", last, delivered)
			}
			cm, isConfigMap := ev.Object.(*corev1.ConfigMap)
			if ev.Type != watch.Added || !isConfigMap {
				t.Fatalf("watch delivered %s %T, want only ADDED ConfigMaps", ev.Type, ev.Object)
			}
			delivered = append(delivered, cm.Name)
			if cm.Name == last {
				slices.Sort(delivered)
				return delivered, created
			}
		case <-ctx.Done():
			t.Fatalf("watch did not deliver %s: %v; delivered %v", last, ctx.Err(), delivered)
		}
	}
}

// namesWhere returns the sorted names in uids whose UID satisfies keep.
func namesWhere(uids map[string]types.UID, keep func(types.UID) bool) []string {
	var names []string
	for name, uid := range uids {
		if keep(uid) {
			names = append(names, name)
		}
	}
	slices.Sort(names)
	return names
}

func itemNames(items []corev1.ConfigMap) []string {
	names := make([]string, 0, len(items))
	for _, it := range items {
		names = append(names, it.Name)
	}
	slices.Sort(names)
	return names
}
