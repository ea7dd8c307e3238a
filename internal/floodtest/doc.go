// Package floodtest floods an HTTP trigger endpoint (trigger.NewHandler
// served by a trigger.Server) the way an attacker or a misbehaving
// pipeline would, for opkit's integration tests and benchmarks. The
// floods of issue 22: valid triggers ([Valid]), bodies sent one byte a
// second ([SlowBodies]) and a new garbage bearer token on every request
// ([GarbageTokens]). Those of issue 33, where a crowd rather than one
// caller floods: valid triggers from many identities, one connection each
// ([ManyIdentities]); garbage tokens spread over many source addresses
// ([GarbageFromAddresses], with [Loopback]); one token on many
// connections triggering random names no object has ([RandomNames]); and
// the neighbour flood, [GarbageTokens] from the address a well-behaved
// caller uses too (a NAT, a node). [Config.Rate] caps any of them but
// SlowBodies at a total rate, [Config.Pace] each of its goroutines (with
// ManyIdentities, each caller) at a rate of its own: a paced crowd.
//
// The handler's authenticator counts failed authentications by client
// address, so a flood and the well-behaved client measured beside it must
// come from different addresses (but in the neighbour flood):
// [Config.LocalIP] and [NewClient] bind the client side of each
// connection to a chosen loopback address (Linux routes all of
// 127.0.0.0/8 to the loopback interface, so 127.0.0.2, 127.0.0.3 or
// 127.0.1.0 need no setup).
//
// [Reviews] wraps the client of the handler's TokenReviews and
// SubjectAccessReviews, and counts them.
//
// Nothing here asserts anything: every flood runs until its context ends
// and returns what it saw, counted by status code.
//
// Goroutines: each flood starts its own (Workers, one per token, or n
// connections with one reader each) and returns only after all of them
// have finished, so a caller that runs a flood in a goroutine of its own
// and waits for it leaves nothing behind. The functions keep no state
// between calls and are safe for concurrent use.
package floodtest
