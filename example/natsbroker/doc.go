// Package natsbroker connects opkit's trigger consumer to NATS JetStream: it
// implements trigger.Broker and trigger.Message over a durable pull consumer,
// and starts an embedded JetStream server for single-replica setups and tests.
//
// Layout on the NATS side (all names configurable, see [Config]):
//
//   - stream DEMO_TRIGGERS, subject demo.reconcile, work-queue retention: a
//     trigger is kept until one replica acknowledges it;
//   - durable pull consumer "opkit-demo" with explicit acknowledgement,
//     shared by every replica of the operator (a follower's consumer pauses
//     and [Broker.Release] hands back what it had prefetched, so the leader
//     gets the messages; an enqueue dropped around a leadership change is
//     nacked and redelivered; a message handed back from a prefetch buffer
//     still counts as a delivery toward MaxDeliver, at most one per
//     leadership change);
//   - stream DEMO_TRIGGERS_DLQ, subject demo.reconcile.dlq: the dead letters.
//     Term copies the message there (with its reason, stream sequence and
//     delivery count as headers) and only then terminates it, so a
//     dead-lettered trigger is never lost. A Nack of delivery MaxDeliver or
//     later dead-letters too, with reason "MaxDeliveries". The limit is the
//     broker's, not the server's (the server consumer has none): JetStream
//     would silently stop redelivering a last delivery whose dead-letter
//     copy failed or whose receiver died, and the trigger would be
//     stranded; without a server limit it comes back after AckWait. So
//     while the dead-letter stream cannot be written, such a message comes
//     back every AckWait (and the consumer reports the failing Nack or
//     Term) until it can.
//
// Errors are returned as *trigger.BrokerError, classified as Disconnected,
// Permission, Quota or NotFound, so the consumer reports them by name.
//
// Goroutines: a [Broker] owns none of its own; the nats.go connection runs its
// reader/flusher goroutines and the pull iterator's goroutine until
// [Broker.Close]. Receive must be called from one goroutine at a time (the
// trigger consumer's receive loop); Message methods may be called
// concurrently for different messages. An [Embedded] server owns the NATS
// server's goroutines until [Embedded.Shutdown].
package natsbroker
