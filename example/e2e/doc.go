// Package e2e holds the demo operator's end-to-end test (build tag
// integration): two replicas as separate processes on a real control
// plane, 50 entities, HTTP and NATS triggers, and the leader killed.
package e2e
