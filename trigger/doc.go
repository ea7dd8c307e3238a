// Package trigger lets systems outside the watch stream ask for a reconcile:
// a [Trigger] puts requests into a controller's queue, an HTTP endpoint
// ([NewHandler], served by a [Server]) answers POST
// /reconcile/{namespace}/{name}, and a [Consumer] turns messages from any
// broker ([Broker]) into reconciles.
//
// Goroutines: a Trigger owns none. The HTTP handler runs on net/http's
// request goroutines. A Consumer's Run owns its receive loop, its handler
// goroutines (at most ConsumerConfig.Concurrency) and the lag poller, and
// returns only after all of them have finished. A Server's Serve owns the
// net/http server goroutines until it returns. Package brokertest holds an
// in-memory Broker for tests.
//
// Guarantees:
//
//   - Enqueue never blocks and tells "scheduled" (true), "dropped" (false;
//     [Trigger.Submit] gives the queue's reason, a queue.Outcome) and "not
//     scheduled" (an error: bad input wraps [ErrInvalid], an object the
//     controller does not handle [ErrOutOfScope], a context already ended
//     its error) apart. Source APIServer is refused: it is reserved for the
//     watch stream.
//   - Triggers outrank watch events (0) and relists (-1) in the queue
//     ([DefaultPriority], 100), so they are not stuck behind a relist backlog.
//   - The HTTP handler and the consumer never trust a payload: they re-fetch
//     the object from the API server and enqueue what it returned, marked
//     [Request.Fetched], so that the controller's worker reconciles it
//     without reading it a second time when it starts within
//     reconcile.Config.FreshFor (1s) and the object is still the latest
//     state the controller's watch has seen.
//   - The handler is secure by default: [NewHandler] refuses to build
//     without an [Authenticator] unless HandlerConfig.InsecureSkipAuth is
//     set. The Kubernetes-native one ([NewKubeAuthenticator], or just
//     HandlerConfig.Reviews) checks the bearer token with a TokenReview for
//     the endpoint's own audience ([DefaultAudience]) and the caller's
//     permission with a SubjectAccessReview (default: verb update on the
//     object), caching decisions briefly and never logging tokens.
//   - Every API call and every broker call has a timeout; the handler never
//     waits on the queue.
//   - The consumer never acknowledges a trigger it could not schedule: a
//     dropped enqueue is nacked so the broker redelivers it (to the leader,
//     or later); malformed messages are dead-lettered, messages for objects
//     that no longer exist are acknowledged with a warning. A replica whose
//     queue intake is suspended (a follower) takes no message at all, so
//     triggers wait in the broker for the leader rather than bouncing off
//     followers, and no delivery is spent while no replica leads.
//
// # Deploying the endpoint
//
// The operator's ServiceAccount needs create on tokenreviews and
// subjectaccessreviews (the system:auth-delegator ClusterRole) and get on
// the resource. A caller gets a token for the endpoint with
// `kubectl create token SA --audience opkit-trigger` (or a projected
// ServiceAccount token volume with that audience) and RBAC permission to
// update the object (or the verb/subresource configured in
// KubeAuthConfig). Serve it over HTTPS with [NewServer] and restrict who can
// reach it with a NetworkPolicy.
//
// # HTTP status codes
//
//	202 scheduled; JSON [Accepted] {key, namespace, name, uid, resourceVersion, delay, outcome}
//	400 invalid namespace (DNS-1123 label) or name (see [CheckName]), a path with empty, "." or ".." segments,
//	    invalid delay, reason, query parameter or JSON body
//	    (the path is checked before authentication, the rest after it)
//	401 missing, invalid or wrong-audience bearer token (WWW-Authenticate: Bearer,
//	    with error="invalid_token" when a token was presented)
//	403 the SubjectAccessReview denied the caller
//	404 the object does not exist, or is outside the controller's scope (another
//	    namespace, labels its selector does not match: ErrOutOfScope), or no such
//	    route (a resource the API server does not serve, e.g. a CRD not
//	    installed, is a 502)
//	405 a method other than POST (Allow: POST)
//	413 a body larger than HandlerConfig.MaxBodyBytes
//	415 a body whose Content-Type is not application/json
//	429 the rate or in-flight limit is exceeded (Retry-After)
//	500 the API server returned an object the trigger refuses (another kind)
//	502 the API server failed (re-fetch, TokenReview or SubjectAccessReview, including
//	    a review an authorizer failed to evaluate: not allowed, with an EvaluationError)
//	503 the enqueue was dropped: Retry-After, X-Opkit-Leader and "leader" in the body;
//	    or the caller went away before the enqueue (nothing was queued)
//	504 an API call timed out (HandlerConfig.APITimeout)
//
// Every error body is a [Status], a JSON object shaped like a Kubernetes
// metav1.Status ({"kind":"Status","apiVersion":"v1","status":"Failure",
// "reason","message","code"}).
//
// # Consumer semantics
//
// A message is a JSON object {"namespace": ..., "name": ..., "reason": ...}
// (reason optional; namespace only for namespaced resources) of at most
// ConsumerConfig.MaxMessageBytes.
//
//	malformed or invalid message  Term (dead-letter), counted by TermReason, logged
//	object not found              Ack, logged as a warning
//	object outside the scope      Nack after DroppedDelay (ErrOutOfScope: another controller
//	                              sharing the subscription may own it), logged as a warning
//	API server error              Nack, delay RetryBase*2^(deliveries-1) up to RetryCap
//	enqueue dropped               Nack after DroppedDelay (never Ack)
//	scheduled                     Ack
//	a Nack the broker turns into  counted as terminated (TermMaxDeliveries), not as a
//	a dead letter (DeadLetterer)  nack, logged as a warning
//
// Before each receive the consumer asks ConsumerConfig.Paused (by default
// the queue's Suspended or ShuttingDown): while it is paused it receives nothing and a
// broker that implements [Releaser] hands back what it had buffered. Drops
// then happen only around a leadership change, for messages received just
// before it.
//
// A scheduled trigger is one queue entry among the others for its object,
// merged by the controller's rule (reconcile.MergeEvents): a watch event
// for the object while the trigger waits keeps the trigger's source and
// reason; a second trigger while the first waits replaces it (one
// reconcile, the newer reason), except that a Deleted trigger does not
// replace a pending change of its object (both run, or it merges into a
// Deleted trigger held before); a trigger that arrives while the object
// is being reconciled gets a reconcile of its own after that one, which
// the controller's retry or requeue of the running one does not replace
// (the retry or requeue of a delete runs after it); a trigger for an
// object whose delete has not run yet (pending, or parked behind the
// running reconcile) merges into that delete, and the trigger's source,
// reason and type give way to the delete's (a Deleted trigger merged into
// another Deleted trigger gives way to it too, unless that one is a
// re-add), except that a Deleted trigger meeting the watch's delete of
// its object keeps an entry of its own, and one waiting when the watch's
// delete arrives takes that delete in; a trigger does not wait for a
// delete's retry or requeue due later than itself: it runs in front of it
// (see reconcile.MergeEvents).
// A Deleted trigger (a teardown) is not dropped when its object leaves the
// watch's label selector and comes back.
// A delay is an upper bound, not a promise of "not before": entries for a
// key merge to the earliest due time, so another event for the object in
// the meantime reconciles it sooner, once, and nothing runs again at the
// delay. A caller that needs a reconcile at a given time, whatever happens
// before, asks for it then.
//
// What an acknowledgement (or a 202) promises: the trigger is in the
// leader's queue, not yet reconciled. If that replica loses its term before
// a worker takes the entry, the queue is cleared with everything else the
// term held, and the trigger's reconcile comes from the next leader instead:
// a new term starts the watcher with a full list, which reconciles every
// existing object (source APIServer, so the trigger's reason is not
// carried). No object is left unreconciled after a trigger; only the
// attribution can be lost: in a failover, to a newer trigger, or to a
// waiting delete (above). A Deleted trigger (a teardown) of an object that
// still exists loses its type in a failover too: the next term's list
// reconciles the object as it is, so a caller whose teardown was
// acknowledged just before a leadership change must ask again (or mark the
// object, e.g. by deleting it). Callers that need the reason to
// survive a crash must make it part of the object (a field or an
// annotation) rather than of the trigger. The example module's
// TestFlipLosesNoTriggerOverNATS checks this against a real JetStream
// server while leadership flips.
//
// Broker failures are classified by the adapter as a [BrokerError]
// (Disconnected, Permission, Quota, NotFound) and reported by that name in
// logs, [ConsumerMetrics] and [Consumer.Check]; a failing Receive is
// retried with backoff.
package trigger
