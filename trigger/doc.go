// Package trigger lets systems outside the watch stream ask for a reconcile:
// a [Trigger] puts requests into a controller's queue, an HTTP handler
// (see [NewHandler]) serves POST /reconcile/{namespace}/{name}, and a
// [Consumer] turns messages from any broker into reconciles.
//
// Goroutines: a Trigger owns none. The HTTP handler runs on net/http's
// request goroutines. A Consumer's Run owns its receive loop, its handler
// goroutines (at most ConsumerConfig.Concurrency) and the lag poller, and
// returns only after all of them have finished. A [Server] owns the
// net/http server goroutines between Run's start and return.
//
// Guarantees:
//
//   - Enqueue never blocks and tells "scheduled" (true), "dropped" (false,
//     with the queue's reason from [Trigger.Submit]) and "bad input" (an
//     error wrapping [ErrInvalid]) apart. Source APIServer is refused: it is
//     reserved for the watch stream.
//   - Triggers outrank watch events and relists in the queue
//     ([DefaultPriority]), so they are not stuck behind a relist backlog.
//   - The HTTP handler and the consumer never trust a payload: they re-fetch
//     the object from the API server and enqueue what it returned.
//   - The handler is secure by default: a caller's bearer token is checked
//     with a TokenReview for the endpoint's own audience and the caller must
//     pass a SubjectAccessReview ([NewKubeAuthenticator]); running without
//     authentication needs HandlerConfig.InsecureSkipAuth.
//   - The consumer never acknowledges a trigger it could not schedule: a
//     dropped enqueue is nacked so the broker redelivers it (to the leader,
//     or later); malformed messages are dead-lettered, messages for objects
//     that no longer exist are acknowledged with a warning.
//
// # HTTP status codes
//
//	202 scheduled; JSON {key, namespace, name, uid, resourceVersion, delay, outcome}
//	400 invalid namespace/name (DNS-1123), delay, reason or query parameter
//	401 missing, invalid or wrong-audience bearer token
//	403 the SubjectAccessReview denied the caller
//	404 the object does not exist (or no such route)
//	405 a method other than POST
//	413 a body larger than HandlerConfig.MaxBodyBytes
//	415 a body whose Content-Type is not application/json
//	429 the rate or in-flight limit is exceeded
//	502 the API server failed (re-fetch, TokenReview or SubjectAccessReview)
//	503 the enqueue was dropped; Retry-After, X-Opkit-Leader and "leader" in the body
//	504 the API server timed out
//
// Every error body is a JSON object shaped like a Kubernetes Status
// ({"kind":"Status","apiVersion":"v1","status":"Failure","reason",...}).
//
// # Consumer semantics
//
//	malformed or invalid message  Term (dead-letter), counted by TermReason
//	object not found              Ack, logged as a warning
//	API server error              Nack, delay grows with the delivery count
//	enqueue dropped               Nack (never Ack)
//	scheduled                     Ack
package trigger
