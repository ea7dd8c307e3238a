// Package shardsbench measures sharded reconciliation (issue 21) on the
// local control plane: the time 1, 2 and 4 replicas of a sharded
// reconcile.Controller (eight shards, two workers a replica, a reconcile that waits 200 ms to
// stand for real work) take to converge 2,000 changed Widgets, the API
// server's CPU meanwhile, and the bytes each replica receives from the API
// server, with the ShardedListAndWatch gate (the server filters) and
// without it (every shard's watcher receives everything and filters).
// No peer has sharding, so there is no side-by-side figure; the ratios
// are between replica counts. See docs/benchmarks.md.
package shardsbench
