package trigger_test

import (
	"context"
	"fmt"
	"testing"

	corev1 "k8s.io/api/core/v1"

	"github.com/opkit/opkit"
	"github.com/opkit/opkit/queue"
	"github.com/opkit/opkit/trigger"
)

// Intake decides in one place, for a trigger that passed its checks:
// schedule it here, forward it to the replica that works on the object, or
// drop it. With one shard it needs no read to know where; with several it
// reads the object once to learn its shard.
func TestIntakeDecidesLocalForwardOrDrop(t *testing.T) {
	key := opkit.Key{Namespace: "ns", Name: "a"}
	for _, tc := range []struct {
		shards    int
		held      bool   // this replica works on ns/a's shard
		endpoint  string // the holder's, as its Lease publishes it
		noForward bool
		// want
		outcome  queue.Outcome // zero: forwarded
		forward  bool
		reads    int
		holdered bool // the decision names the holder
	}{
		{shards: 1, held: true, outcome: queue.Queued, reads: 1},
		{shards: 1, endpoint: "http://holder:8080", forward: true, reads: 0, holdered: true},
		{shards: 1, endpoint: "http://holder:8080", noForward: true, outcome: queue.DroppedSuspended, reads: 0, holdered: true},
		{shards: 1, outcome: queue.DroppedSuspended, reads: 0, holdered: true},
		{shards: 8, held: true, outcome: queue.Queued, reads: 1},
		{shards: 8, endpoint: "http://holder:8080", forward: true, reads: 1, holdered: true},
		{shards: 8, endpoint: "http://holder:8080", noForward: true, outcome: queue.DroppedSuspended, reads: 1, holdered: true},
		{shards: 8, outcome: queue.DroppedSuspended, reads: 1, holdered: true},
	} {
		name := fmt.Sprintf("S=%d/held=%v/endpoint=%q/noForward=%v", tc.shards, tc.held, tc.endpoint, tc.noForward)
		t.Run(name, func(t *testing.T) {
			api := newFakeAPI()
			q := newCMQueue()
			r := &shardsRouter{n: tc.shards, held: map[int]queue.Adder[opkit.Key, opkit.Cause[*corev1.ConfigMap]]{}, endpoint: tc.endpoint}
			if tc.held {
				r.held[opkit.ShardOf("uid-a", tc.shards)] = q
			}
			tr, err := trigger.New(trigger.Config[*corev1.ConfigMap]{Router: r, Resource: configMaps, Get: api.get, Logger: discard})
			if err != nil {
				t.Fatal(err)
			}
			d, err := tr.Intake(context.Background(), trigger.Pointer{Key: key, Reason: "deployed"}, trigger.IntakeOptions{NoForward: tc.noForward})
			if err != nil {
				t.Fatalf("Intake: %v", err)
			}
			if d.Outcome != tc.outcome || (d.Endpoint != "") != tc.forward || len(api.read) != tc.reads {
				t.Fatalf("decision %+v after %d reads; want outcome %v, forward %v, %d reads", d, len(api.read), tc.outcome, tc.forward, tc.reads)
			}
			if want := fmt.Sprintf("holder-%d", opkit.ShardOf("uid-a", tc.shards)); tc.holdered && d.Holder != want {
				t.Errorf("holder %q, want %q", d.Holder, want)
			}
			if tc.held != (q.Len() == 1) {
				t.Errorf("queued here: %d entries, want one only when held", q.Len())
			}
			if tc.forward && tc.shards > 1 && d.Object == nil {
				t.Errorf("a forward after a read carries no object")
			}
		})
	}
}
