package opkit_test

import (
	"fmt"
	"regexp"
	"strings"
	"testing"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/sharding"
	"k8s.io/apimachinery/pkg/types"

	"github.com/opkit/opkit"
)

// rangeRE matches one shardRange term of a selector.
var rangeRE = regexp.MustCompile(`^shardRange\((object\.metadata\.uid), '(0x[0-9a-f]+)', '(0x[0-9a-f]+)'\)$`)

// parse turns a selector opkit wrote into apimachinery's requirements.
func parse(t *testing.T, sel string) sharding.Selector {
	t.Helper()
	if sel == "" {
		return sharding.Everything()
	}
	var reqs []sharding.ShardRangeRequirement
	for _, term := range strings.Split(sel, " || ") {
		m := rangeRE.FindStringSubmatch(term)
		if m == nil {
			t.Fatalf("selector term %q is not a shardRange", term)
		}
		reqs = append(reqs, sharding.ShardRangeRequirement{Key: m[1], Start: m[2], End: m[3]})
	}
	return sharding.NewSelector(reqs...)
}

// Shards agree with the API server's sharding: an object is in the ranges
// a Selector names (as apimachinery's matcher decides) exactly when
// Contains says so, every UID is in exactly one shard, and held shards
// that are neighbours make one range.
func TestShardsAgreeWithTheServersHash(t *testing.T) {
	for _, count := range []int{2, 3, 5, 7, 8, 16} {
		var each []sharding.Selector // shard j's alone
		for j := range count {
			each = append(each, parse(t, (opkit.Shards{Count: count, Held: []int{j}}).Selector()))
		}
		for first := range count {
			held := []int{first, (first + 1) % count, (first + 3) % count}
			s := opkit.Shards{Count: count, Held: held}
			if err := s.Validate(); err != nil {
				t.Fatal(err)
			}
			sel := parse(t, s.Selector())
			for i := range 400 {
				uid := types.UID(fmt.Sprintf("%08x-1d2e-4f00-8a9b-%012x", i*7919+count, i))
				obj := &corev1.ConfigMap{ObjectMeta: metav1.ObjectMeta{UID: uid}}
				matches, err := sel.Matches(obj)
				if err != nil {
					t.Fatal(err)
				}
				if matches != s.Contains(uid) {
					t.Fatalf("%d shards, held %v, uid %s: server's matcher %v, Contains %v (shard %d; selector %s)",
						count, held, uid, matches, s.Contains(uid), opkit.ShardOf(uid, count), s.Selector())
				}
				one := 0
				for _, sel := range each {
					if in, _ := sel.Matches(obj); in {
						one++
					}
				}
				if one != 1 {
					t.Fatalf("uid %s is in %d of %d shards, want 1", uid, one, count)
				}
			}
		}
	}
	if got := (opkit.Shards{Count: 4, Held: []int{2, 1}}).Selector(); got != "shardRange(object.metadata.uid, '0x4000000000000000', '0xc000000000000000')" {
		t.Errorf("shards 1 and 2 of 4: %s, want one range", got)
	}
	if got := (opkit.Shards{Count: 2, Held: []int{1}}).Selector(); !strings.HasSuffix(got, "'0x8000000000000000', '0x10000000000000000')") {
		t.Errorf("the last shard: %s, want it to end at 2^64", got)
	}
}

func TestShardsValidateAndAll(t *testing.T) {
	for _, s := range []opkit.Shards{{}, {Count: 1}, {Count: 1, Held: []int{0}}, {Count: 3, Held: []int{0, 1, 2}}} {
		if err := s.Validate(); err != nil || !s.All() || s.Selector() != "" {
			t.Errorf("%+v: Validate %v, All %v, Selector %q; want valid, everything, no selector", s, err, s.All(), s.Selector())
		}
	}
	for _, s := range []opkit.Shards{{Count: -1}, {Count: opkit.MaxShards + 1, Held: []int{0}}, {Count: 4}, {Count: 4, Held: []int{4}}, {Count: 4, Held: []int{-1}}, {Held: []int{1}}} {
		if err := s.Validate(); err == nil {
			t.Errorf("%+v: valid, want an error", s)
		}
	}
}
