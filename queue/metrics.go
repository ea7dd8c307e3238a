package queue

import "time"

// Metrics receives the queue's measurements. A nil Metrics in [Config]
// means none: the queue then makes no call and reads no clock for them.
// Methods are called synchronously from Add, Get and Done (after the
// queue's lock is released where possible, Depth with it held), possibly
// concurrently: they must be quick, safe for concurrent use, and must not
// call the queue.
type Metrics interface {
	// Added counts an accepted add of the given priority; merged is true
	// when it was merged into (or parked behind) an entry held for its key.
	Added(priority int, merged bool)
	// Dropped counts an add dropped for reason (DroppedSuspended or
	// DroppedShutDown).
	Dropped(reason Outcome)
	// Depth changes the number of pending entries (due or delayed) of a
	// priority by delta.
	Depth(priority int, delta int)
	// Waited observes an entry's time in the queue, from its (earliest)
	// add to its hand-out by Get.
	Waited(priority int, d time.Duration)
	// Worked observes the time from hand-out by Get to Done.
	Worked(d time.Duration)
}
