package watcher_test

import (
	"context"
	"fmt"
	"slices"
	"strings"
	"testing"
	"testing/synctest"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/dynamic"
	dynfake "k8s.io/client-go/dynamic/fake"

	"github.com/opkit/opkit"
	"github.com/opkit/opkit/internal/logsink"
	"github.com/opkit/opkit/watcher"
)

// shardUID returns the i-th of a series of UUID-like uids. (Uids that
// differ only in their last characters would all share FNV-1a's high
// bits, hence its shard; real ones are random.)
func shardUID(i int) string {
	return fmt.Sprintf("%08x-5e1f-4c2a-9d3b-7a6c5b4e3f2d", uint32(i)*2654435761)
}

// shardWidgets returns n widgets w0..w(n-1) and the names of those in
// shard 0 of 2, sorted.
func shardWidgets(n int) (objs []runtime.Object, inShard0 []string) {
	for i := range n {
		name, uid := fmt.Sprintf("w%d", i), shardUID(i)
		objs = append(objs, widget("ns", name, uid, fmt.Sprint(i+1), 1))
		if opkit.ShardOf(types.UID(uid), 2) == 0 {
			inShard0 = append(inShard0, name)
		}
	}
	slices.Sort(inShard0)
	return objs, inShard0
}

// names returns the sorted names of the records' keys.
func names(recs []record) []string {
	var out []string
	for _, r := range recs {
		out = append(out, r.Key.Name)
	}
	slices.Sort(out)
	return out
}

// shardRun is a watcher of shard 0 of 2 over 16 widgets, run until its
// first list is done.
type shardRun struct {
	ws   *watches
	q    *recorder
	m    *metrics
	logs *logsink.Buffer
	w    *watcher.Watcher[*Widget]
	cfg  watcher.Config[*Widget]
}

// runShard0 starts a shardRun; server, when set, wraps the fake client as
// the API server. It must be called inside a synctest bubble; the watcher
// stops with the test.
func runShard0(t *testing.T, server func(*dynfake.FakeDynamicClient, opkit.Shards) dynamic.Interface) (r shardRun, shard0 []string) {
	objs, shard0 := shardWidgets(16)
	if len(shard0) == 0 || len(shard0) == 16 {
		t.Fatalf("the fixture's uids all fall in one shard: %v", shard0)
	}
	c := newFake(objs...)
	r = shardRun{ws: &watches{}, q: &recorder{}, m: newMetrics(), logs: &logsink.Buffer{}}
	r.ws.install(c)
	r.cfg = config(c, r.q)
	r.cfg.Shards = opkit.Shards{Count: 2, Held: []int{0}}
	if server != nil {
		r.cfg.Client = server(c, r.cfg.Shards)
	}
	r.cfg.Metrics, r.cfg.Logger = r.m, r.logs.Logger()
	r.w = mustNew(t, r.cfg)
	t.Cleanup(start(t, r.w))
	synctest.Wait()
	if got := names(r.q.take()); !slices.Equal(got, shard0) {
		t.Fatalf("listed %v, want shard 0's %v", got, shard0)
	}
	if sel := r.ws.requests[0].ShardSelector; sel != r.cfg.Shards.Selector() {
		t.Fatalf("watch asked for shards %q, want %q", sel, r.cfg.Shards.Selector())
	}
	return r, shard0
}

const ignoredSelector = "ignored the shard selector"

// A sharded watcher asks for its shards on every list and watch. When the
// API server does not apply the selector (no shardInfo echoed: the
// feature gate is off), the watcher filters what it receives itself, on
// the list and on the watch, says so once in the log however often it
// relists, and reports it to Metrics.Sharding.
func TestAShardedWatcherFiltersWhatTheServerDidNotFilter(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		r, _ := runShard0(t, nil)

		// Watch events of the other shard are dropped, the resourceVersion
		// still advances past them.
		var other, mine *unstructured.Unstructured
		for i := 100; other == nil || mine == nil; i++ {
			u := widget("ns", fmt.Sprintf("n%d", i), shardUID(i), fmt.Sprint(i), 1)
			if opkit.ShardOf(u.GetUID(), 2) == 0 {
				mine = u
			} else {
				other = u
			}
		}
		fw := r.ws.last(t)
		fw.Add(other)
		fw.Add(mine)
		gone := other.DeepCopy()
		gone.SetResourceVersion("999")
		fw.Delete(gone)
		synctest.Wait()
		if got := r.q.take(); len(got) != 1 || got[0].Key.Name != mine.GetName() {
			t.Fatalf("watch events gave %v, want only %s (shard 0)", got, mine.GetName())
		}
		fw.Stop() // the server closes the watch: it resumes after the last event, dropped or not
		synctest.Wait()
		if rvs := r.ws.rvs(); len(rvs) != 2 || rvs[1] != "999" {
			t.Fatalf("watches opened at resourceVersions %v, want the second at 999", rvs)
		}

		r.ws.last(t).Error(expired) // a relist: still filtered, still one warning
		synctest.Wait()
		if n := r.logs.Count(ignoredSelector); n != 1 {
			t.Errorf("the log says %q %d times, want once", ignoredSelector, n)
		}
		if got := r.m.shardingCalls(); len(got) != 2 || slices.Contains(got, true) {
			t.Errorf("Metrics.Sharding calls %v, want false after each of the 2 lists", got)
		}
	})
}

// shardingServer wraps a fake dynamic client's widgets as an API server
// with the ShardedListAndWatch gate answers a list: only the selected
// objects, the selector echoed in metadata.shardInfo.
// With echo false it filters without saying so, as kube-apiserver v1.37.2
// does for custom resources.
type shardingServer struct {
	dynamic.Interface
	shards opkit.Shards
	echo   bool
}

func (s shardingServer) Resource(gvr schema.GroupVersionResource) dynamic.NamespaceableResourceInterface {
	return shardingResource{s.Interface.Resource(gvr), s.shards, s.echo}
}

type shardingResource struct {
	dynamic.NamespaceableResourceInterface
	shards opkit.Shards
	echo   bool
}

func (r shardingResource) List(ctx context.Context, opts metav1.ListOptions) (*unstructured.UnstructuredList, error) {
	l, err := r.NamespaceableResourceInterface.List(ctx, opts)
	if err != nil || opts.ShardSelector == "" {
		return l, err
	}
	if opts.ShardSelector != r.shards.Selector() {
		return nil, fmt.Errorf("shard selector %q, want %q", opts.ShardSelector, r.shards.Selector())
	}
	l.Items = slices.DeleteFunc(l.Items, func(u unstructured.Unstructured) bool { return !r.shards.Contains(u.GetUID()) })
	if !r.echo {
		return l, nil
	}
	if err := unstructured.SetNestedField(l.Object, opts.ShardSelector, "metadata", "shardInfo", "selector"); err != nil {
		return nil, err
	}
	return l, nil
}

// When the API server applies the selector, whether it echoes it or not,
// the watcher gets only its shards, warns of nothing and reports
// server-side sharding; an object of another shard that comes all the
// same is dropped.
func TestAShardedWatcherOnAServerThatAppliesTheSelector(t *testing.T) {
	for _, echo := range []bool{true, false} {
		t.Run(fmt.Sprintf("echo=%v", echo), func(t *testing.T) { testServerSideSharding(t, echo) })
	}
}

func testServerSideSharding(t *testing.T, echo bool) {
	synctest.Test(t, func(t *testing.T) {
		r, _ := runShard0(t, func(c *dynfake.FakeDynamicClient, sh opkit.Shards) dynamic.Interface {
			return shardingServer{c, sh, echo}
		})
		if err := r.w.Check(); err != nil {
			t.Fatalf("Check = %v", err)
		}
		if n := r.logs.Count(ignoredSelector); n != 0 {
			t.Errorf("the log says %q %d times, want never", ignoredSelector, n)
		}
		if got := r.m.shardingCalls(); len(got) != 1 || !got[0] {
			t.Errorf("Metrics.Sharding calls %v, want [true]", got)
		}
		// Behind a load balancer the watch may reach a server that
		// ignores the selector even though the list's applied it: every
		// object is checked.
		var other *unstructured.Unstructured
		for i := 100; other == nil; i++ {
			if u := widget("ns", fmt.Sprintf("n%d", i), shardUID(i), fmt.Sprint(i), 1); opkit.ShardOf(u.GetUID(), 2) == 1 {
				other = u
			}
		}
		r.ws.last(t).Add(other)
		synctest.Wait()
		if got := r.q.take(); len(got) != 0 {
			t.Fatalf("a watch event of shard 1 gave %v, want nothing", got)
		}
		if n := r.logs.Count(ignoredSelector); n != 1 {
			t.Errorf("the log says %q %d times after it, want once", ignoredSelector, n)
		}
	})
}

func TestAShardedWatcherNeedsValidShards(t *testing.T) {
	cfg := config(newFake(), &recorder{})
	cfg.Shards = opkit.Shards{Count: 4}
	if _, err := watcher.New(cfg); err == nil || !strings.Contains(err.Error(), "none held") {
		t.Fatalf("New with 4 shards, none held: %v, want an error saying so", err)
	}
}
