// Stats and Len: snapshots of what the queue holds.

package queue

import "time"

// Stats is a snapshot of the queue, for gauges sampled by an exporter
// (unfinished work and longest running are not pushed to Metrics, so that
// no goroutine is needed to update them).
type Stats struct {
	// Ready, Delayed and Parked count held entries: due, not yet due, and
	// waiting behind an entry of the same key. InFlight counts entries
	// handed out and not yet Done.
	Ready, Delayed, Parked, InFlight int
	// LongestRunning is how long the oldest in-flight entry has been in
	// flight; UnfinishedWork is the sum over all in-flight entries. Hand-out
	// times are recorded only when Config.Metrics is set; without it both
	// are zero.
	LongestRunning, UnfinishedWork time.Duration
	// Suspended and ShutDown report the state of the intake.
	Suspended, ShutDown bool
}

// Stats returns a snapshot of the queue. It costs O(entries in flight).
func (q *Queue[K, V]) Stats() Stats {
	q.mu.Lock()
	defer q.mu.Unlock()
	st := Stats{
		Ready: q.nReady, Delayed: q.nDelayed, Parked: q.nParked, InFlight: len(q.inflight),
		Suspended: q.suspended, ShutDown: q.shutdown,
	}
	if q.metrics != nil && len(q.inflight) > 0 {
		now := q.clock()
		for _, f := range q.inflight {
			d := time.Duration(now - q.sl(f.idx).due)
			st.UnfinishedWork += d
			st.LongestRunning = max(st.LongestRunning, d)
		}
	}
	return st
}

// Len returns the number of entries held and not in flight: pending (due
// or delayed) and parked.
func (q *Queue[K, V]) Len() int {
	q.mu.Lock()
	defer q.mu.Unlock()
	return q.nReady + q.nDelayed + q.nParked
}
