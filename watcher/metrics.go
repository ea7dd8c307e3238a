package watcher

import (
	"time"

	"github.com/opkit/opkit"
	"github.com/opkit/opkit/queue"
)

// Reason names why the watcher relisted, restarted a watch or failed a
// call. Reasons are short, stable, lowercase strings fit for metric labels.
type Reason string

const (
	// ReasonInitial: the first list of a Run.
	ReasonInitial Reason = "initial"
	// ReasonExpired: the server answered 410 Gone (resourceVersion too old,
	// e.g. after etcd compaction); the watcher relists and diffs.
	ReasonExpired Reason = "expired"
	// ReasonClosed: the server (or the network) closed the watch; it is
	// reopened from the last resourceVersion.
	ReasonClosed Reason = "closed"
	// ReasonIdle: no event or bookmark for IdleTimeout; the watch is restarted.
	ReasonIdle Reason = "idle"
	// ReasonError: a network error, a 5xx, or an error event on the watch.
	ReasonError Reason = "error"
	// ReasonUnreachable: the API server refused the connection: it is
	// down or restarting. (A connection reset, or cut off mid-answer, is
	// a ReasonError: the server may be overloaded.)
	ReasonUnreachable Reason = "unreachable"
	// ReasonThrottled: the server answered 429 Too Many Requests.
	ReasonThrottled Reason = "throttled"
	// ReasonForbidden: the server answered 401 or 403: the identity lacks
	// list or watch permission on the resource (or, for the first
	// queue.TransientRefusals in a row, a just-started API server's
	// authorizer has not synced yet).
	ReasonForbidden Reason = "forbidden"
	// ReasonNotFound: the server answered 404; the resource type is not
	// served (e.g. its CRD is not installed).
	ReasonNotFound Reason = "notfound"
	// ReasonDecode: an object could not be decoded into the user's type;
	// it is tracked but produces no entry (a delete's is recorded as a
	// tombstone).
	ReasonDecode Reason = "decode"
	// ReasonOverflow: a key held Config.MaxDeletesPerKey unsettled deletes
	// and the oldest was dropped.
	ReasonOverflow Reason = "overflow"
)

// Metrics receives the watcher's measurements. Methods are called from
// Run's goroutine and must not block. A nil Metrics in [Config] means none.
type Metrics interface {
	// Event is called for every entry handed to the queue, with the
	// queue's answer; a not Accepted outcome is a dropped add.
	Event(t opkit.Type, outcome queue.Outcome)
	// Relist is called when a (re)list starts.
	Relist(reason Reason)
	// WatchRestart is called when an open watch ends and is reopened.
	WatchRestart(reason Reason)
	// Error is called for every failed list or watch call, every object
	// that could not be decoded, and every delete dropped from the ledger
	// (ReasonOverflow).
	Error(reason Reason)
	// Tracked reports what the watcher holds after each change it makes:
	// live objects plus unsettled deletes (a Settle is counted at the next
	// change).
	Tracked(n int)
	// Observed is called with the time of every event or bookmark received
	// from the server; "last event age" is the time since the latest call.
	Observed(at time.Time)
}

// ShardingMetrics is implemented by a Metrics that also wants to know how
// a sharded watcher's (Config.Shards) lists were filtered: Sharding is
// called after every complete list, serverSide false when the list held
// objects of other shards (the API server ignored the shard selector),
// which the watcher dropped itself.
type ShardingMetrics interface {
	Sharding(serverSide bool)
}

type nopMetrics struct{}

func (nopMetrics) Event(opkit.Type, queue.Outcome) {}
func (nopMetrics) Relist(Reason)                   {}
func (nopMetrics) WatchRestart(Reason)             {}
func (nopMetrics) Error(Reason)                    {}
func (nopMetrics) Tracked(int)                     {}
func (nopMetrics) Observed(time.Time)              {}
