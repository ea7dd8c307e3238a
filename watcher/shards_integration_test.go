//go:build integration

package watcher_test

import (
	"context"
	"fmt"
	"slices"
	"testing"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"

	"github.com/opkit/opkit"
	"github.com/opkit/opkit/internal/testcluster"
	"github.com/opkit/opkit/watcher"
)

// Two watchers, one per half of the UID space, on a real API server with
// the ShardedListAndWatch gate and without it: between them they see
// every object and every delete exactly once, each only its own shard's;
// with the gate the server filters (Metrics.Sharding true), without it
// the watchers do.
func TestIntegrationShardedWatchersSplitTheObjects(t *testing.T) {
	for _, gate := range []bool{true, false} {
		t.Run(fmt.Sprintf("gate=%v", gate), func(t *testing.T) {
			var c *testcluster.Cluster
			if gate {
				c = testcluster.Shared(t)
			} else {
				c = testcluster.Start(t, testcluster.Options{DisableShardedListAndWatch: true})
			}
			installWidgets(t, c)
			ns := c.Namespace(t)
			d := dyn(t, c.Config())
			res := d.Resource(widgets.GroupVersionResource).Namespace(ns)
			ctx := context.Background()
			const before, after, deleted = 120, 60, 30
			uids := make([]types.UID, before+after)
			create := func(i int) error {
				u, err := res.Create(ctx, newWidget(ns, name(i), 1), metav1.CreateOptions{})
				if err == nil {
					uids[i] = u.GetUID()
				}
				return err
			}
			parallel(t, before, create)

			recs := []*recorder{{}, {}}
			ms := []*metrics{newMetrics(), newMetrics()}
			for s := range 2 {
				w := mustNew(t, watcher.Config[*Widget]{Client: d, Resource: widgets, Namespace: ns, Queue: recs[s],
					Shards: opkit.Shards{Count: 2, Held: []int{s}}, Metrics: ms[s], Logger: discard})
				stop := start(t, w)
				defer stop()
				waitSynced(t, w)
			}
			parallel(t, after, func(i int) error { return create(before + i) })
			parallel(t, deleted, func(i int) error { return res.Delete(ctx, name(i), metav1.DeleteOptions{}) })

			// Each object's records land with the watcher of its shard only:
			// Added for all, Deleted for the deleted.
			want := func(s int) (adds, dels []string) {
				for i, uid := range uids {
					if opkit.ShardOf(uid, 2) != s {
						continue
					}
					adds = append(adds, name(i))
					if i < deleted {
						dels = append(dels, name(i))
					}
				}
				return adds, dels
			}
			got := func(s int) (adds, dels []string) {
				for _, r := range recs[s].all() {
					switch r.Type {
					case opkit.Added:
						adds = append(adds, r.Key.Name)
					case opkit.Deleted:
						dels = append(dels, r.Key.Name)
					default:
						return nil, []string{"unexpected " + r.String()}
					}
				}
				slices.Sort(adds)
				slices.Sort(dels)
				return adds, dels
			}
			for s := range 2 {
				wantAdds, wantDels := want(s)
				if len(wantAdds) == 0 {
					t.Fatalf("no object fell in shard %d of 2: the test proves nothing", s)
				}
				eventually(t, time.Minute, fmt.Sprintf("shard %d sees its objects", s), func() error {
					adds, dels := got(s)
					if !slices.Equal(adds, wantAdds) || !slices.Equal(dels, wantDels) {
						return fmt.Errorf("added %d %v, deleted %v; want added %d, deleted %v", len(adds), adds, dels, len(wantAdds), wantDels)
					}
					return nil
				})
				calls := ms[s].shardingCalls()
				if len(calls) == 0 || slices.Contains(calls, !gate) {
					t.Errorf("shard %d: Metrics.Sharding calls %v, want only %v (the gate is %v)", s, calls, gate, gate)
				}
			}
		})
	}
}
