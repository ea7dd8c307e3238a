package opkit

import (
	"errors"
	"fmt"
	"hash/fnv"
	"math/bits"
	"slices"
	"strings"

	"k8s.io/apimachinery/pkg/types"
)

// MaxShards bounds Shards.Count.
const MaxShards = 1024

// Shards names some of Count equal ranges of the 64-bit FNV-1a hash of
// objects' metadata.uid: the API server's sharded list and watch
// (KEP-5866, feature gate ShardedListAndWatch) hashes the same way. Shard
// i holds the UIDs whose hash h has ⌊h·Count/2⁶⁴⌋ = i. The zero Shards,
// and any with Count 1 holding shard 0, is everything.
type Shards struct {
	// Count is the number of shards, fixed per deployment (0 or 1: none).
	Count int
	// Held are the shards taken, each in [0, Count).
	Held []int
}

// Validate says what is wrong with s, if anything.
func (s Shards) Validate() error {
	switch {
	case s.Count < 0 || s.Count > MaxShards:
		return fmt.Errorf("opkit: %d shards: want 0 to %d", s.Count, MaxShards)
	case s.Count <= 1 && len(s.Held) > 0 && !slices.Equal(s.Held, []int{0}):
		return errors.New("opkit: without shards, only shard 0 can be held")
	case s.Count > 1 && len(s.Held) == 0:
		return fmt.Errorf("opkit: %d shards, none held: a replica without shards has nothing to watch", s.Count)
	}
	for _, i := range s.Held {
		if i < 0 || i >= max(s.Count, 1) {
			return fmt.Errorf("opkit: shard %d of %d does not exist", i, s.Count)
		}
	}
	return nil
}

// All reports whether s holds every object: it has no shards, or holds
// them all.
func (s Shards) All() bool {
	if s.Count <= 1 {
		return true
	}
	for i := range s.Count {
		if !slices.Contains(s.Held, i) {
			return false
		}
	}
	return true
}

// ShardOf returns the shard of count that holds uid.
func ShardOf(uid types.UID, count int) int {
	if count <= 1 {
		return 0
	}
	h := fnv.New64a()
	h.Write([]byte(uid))
	hi, _ := bits.Mul64(h.Sum64(), uint64(count))
	return int(hi)
}

// Contains reports whether one of the shards s holds has uid.
func (s Shards) Contains(uid types.UID) bool {
	return s.All() || slices.Contains(s.Held, ShardOf(uid, s.Count))
}

// Selector returns s as a ListOptions.ShardSelector: one shardRange per
// run of adjacent held shards, joined by "||"; "" when s holds everything
// (or is not valid).
func (s Shards) Selector() string {
	if s.All() || s.Validate() != nil {
		return ""
	}
	held := slices.Compact(slices.Sorted(slices.Values(s.Held)))
	var parts []string
	for i := 0; i < len(held); {
		j := i
		for j+1 < len(held) && held[j+1] == held[j]+1 {
			j++
		}
		parts = append(parts, fmt.Sprintf("shardRange(object.metadata.uid, '%s', '%s')", s.start(held[i]), s.start(held[j]+1)))
		i = j + 1
	}
	return strings.Join(parts, " || ")
}

// start returns the first hash of shard i, ⌈i·2⁶⁴/Count⌉ (2⁶⁴ for
// i = Count, the end of the last shard), as a 0x-prefixed hex string of
// 16 digits (17 for 2⁶⁴).
func (s Shards) start(i int) string {
	if i >= s.Count {
		return "0x10000000000000000"
	}
	q, r := bits.Div64(uint64(i), 0, uint64(s.Count))
	if r != 0 {
		q++
	}
	return fmt.Sprintf("0x%016x", q)
}
