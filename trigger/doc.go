// Package trigger lets systems outside the watch stream ask for a reconcile:
// a [Trigger] puts requests into a controller's queue, an HTTP endpoint
// ([NewHandler], served by a [Server]) answers POST
// /reconcile/{namespace}/{name}, and a [Consumer] turns messages from any
// broker ([Broker]) into reconciles. Package brokertest holds an in-memory
// Broker for tests.
//
// # What a trigger queues
//
// The controller's queue holds keys, each with an [opkit.Cause]. A trigger
// adds its object's key with source Operator, its reason and the object
// it carries; a trigger of type Added marks the cause Added, and one of
// type Deleted asks for a teardown, a mark on the key's entry (see
// [Trigger.Enqueue]). The causes of one key merge as a join, so the order
// in which they arrive never matters: sources and reasons unite (at most
// [opkit.MaxReasons], 8, distinct reasons are kept), the newest object by
// resourceVersion is kept, and the entry takes the earliest due time and
// the highest priority. A delay is therefore an upper bound, not a "not
// before": another event for the object in the meantime reconciles it
// sooner, once. Triggers rank above watch events (0) and relists (-1)
// (Config.Priority, 100 by default), so they are not stuck behind a relist backlog.
//
// [Trigger.Enqueue] and [Trigger.Submit] never block and tell "scheduled",
// "dropped" (the queue is suspended on a follower, or shut down) and "not
// scheduled" (an error: bad input wraps [ErrInvalid], an object the
// controller does not handle [ErrOutOfScope], an ended context its error)
// apart. Source APIServer is
// refused: it is reserved for the watch stream.
//
// The HTTP handler and the consumer never trust a payload: both take
// [Trigger.Intake], which validates the pointer (key, type, delay, reason),
// calls an authorization hook, checks the scope, reads the object from the
// API server and submits what it read. The object read travels with the
// key, and the controller reconciles it without reading it again when it
// is still the latest state its watch has seen. A Trigger without
// Config.Get or Config.Dynamic cannot read: NewHandler and NewConsumer
// refuse it.
//
// What an acknowledgement (or a 202) promises: the trigger is in the
// leader's queue, not yet reconciled. If the leader's term ends first, the
// queue is cleared and the next leader's full list reconciles every object
// instead, without the trigger's reason (or teardown mark). Three ways to
// learn more, or to outlive the term:
//
//   - Tracked triggers ([IntakeOptions].Track): the outcome of the
//     reconcile that serves the trigger arrives on its [Ticket] (an HTTP
//     caller's ?wait=, below); the end of the term resolves it as Unknown.
//   - The consumer's AckAfterReconcile: a message is acknowledged only
//     once its reconcile succeeded or failed for good, so the broker
//     redelivers it to the next leader if the term ends first.
//   - Durable triggers through the API server: the annotation
//     reconcile.opkit.dev/requestedAt (watcher.DefaultRequestAnnotation)
//     asks for a reconcile, at trigger priority and source Operator, until
//     reconcile.Status records it in status.lastHandledReconcileAt, across
//     leader changes and restarts, with RBAC on the object as the only
//     permission: `kubectl annotate --overwrite widget/w
//     reconcile.opkit.dev/requestedAt="$(date +%s)"` then `kubectl wait
//     --for=jsonpath='{.status.lastHandledReconcileAt}'=...`.
//
// Goroutines: a Trigger owns none; the HTTP handler runs on net/http's
// request goroutines; a Consumer's Run and a Server's Serve own theirs and
// return only after all of them have finished. Every API call and every
// Ack, Nack, Term, Lag and Release has a timeout. The handler never
// blocks on the queue: a caller's ?wait= waits on its ticket, holding no
// in-flight slot.
//
// # The HTTP endpoint
//
// [NewHandler] refuses to build without an [Authenticator] unless
// HandlerConfig.InsecureSkipAuth is set. The Kubernetes-native one
// ([NewKubeAuthenticator], or just HandlerConfig.Reviews) checks the
// bearer token with a TokenReview for the endpoint's own audience
// ([DefaultAudience]) and the caller's permission with a
// SubjectAccessReview (default: verb update on the object), caching both
// briefly and never logging tokens. The operator's ServiceAccount needs
// create on tokenreviews and subjectaccessreviews (the
// system:auth-delegator ClusterRole) and get on the resource; a caller
// gets a token with `kubectl create token SA --audience opkit-trigger`.
// Serve it over HTTPS with [NewServer] and restrict who can reach it.
//
// The handler checks the route and method, its rate limit and the
// client's failed authentications, then reads the query and the body
// (within BodyTimeout), takes an in-flight slot, and only then checks the
// key, authenticates and authorizes the caller, joins the entry waiting
// for the key or takes a token of the trigger budget, reads the object
// and enqueues it: one decision, [Trigger.Intake]'s. When the Trigger's
// [Router] says another replica works on the object (a follower; with
// shards, the object read names its shard), the handler forwards the
// request with the caller's credentials to that replica's endpoint (which
// checks them again) and passes its answer on; a forwarded request is not
// forwarded again. With
// ?wait=D (at most MaxWait) the caller waits, holding no in-flight slot,
// for the outcome of the reconcile that serves its trigger:
//
//	200            the reconcile finished within the wait: an [Outcome] {id, state (succeeded, requeued, failed, terminal, skipped), error, attempts, duration, replica, term}; also the answer of GET .../triggers/{id} (pending or unknown included)
//	202            scheduled: an [Accepted] {key, namespace, name, uid, resourceVersion, delay, outcome}; no uid and resourceVersion when it joined a waiting entry; with a wait that ended first, the trigger's id and statusPath to GET
//	400, 408       an invalid key ([CheckName]), delay, reason, query or body, a path with empty, "." or ".." segments; 408: the body came too late
//	401            no valid bearer token for the audience (WWW-Authenticate: Bearer, error="invalid_token" if sent)
//	403            the SubjectAccessReview denied the caller
//	404            no such object, an object outside the controller's scope (ErrOutOfScope), or no such route
//	405            a method other than POST (GET for .../triggers/{id}; Allow says which)
//	413, 415, 431  a body over HandlerConfig.MaxBodyBytes; a body that is not application/json; headers over ServerConfig.MaxHeaderBytes
//	429            the rate or in-flight limit, the trigger budget, the reviews in flight, or the client's failed authentications (Retry-After)
//	502, 504       the API server failed or returned an object of another kind, or the leader's endpoint is plain HTTP for a TLS request; 504: a call timed out (APITimeout)
//	503            no replica can take the trigger now (Retry-After, X-Opkit-Leader and "leader" in the body when the holder is known), the term ended or the server stopped while the caller waited, the holder's endpoint does not answer (it is likely gone), or the caller left first
//
// What holds under floods: a trigger for a key that already waits costs
// no read and no reconcile, and the others start at most Config.Rate
// reconciles a second (each one read), at most half of them one caller's
// (an authenticated user, or an address without authentication), so a
// flood from one identity leaves the others their triggers; a slow body holds no in-flight
// slot, and an answer given before the body was read closes the
// connection rather than wait for it; reviews of the same token or
// decision are shared, at most KubeAuthConfig.MaxReviews run at once, and
// a client address that keeps failing authentication
// (HandlerConfig.MaxAuthFailures) is refused before any review; refusals
// are logged at most once per status code every 10s, with a count.
//
// A review an authorizer failed to evaluate (not allowed, with an
// EvaluationError) and a resource the API server does not serve (a CRD not
// installed) are 502s. Every error body is a [Status] shaped like a
// Kubernetes metav1.Status, and never carries an internal error or an
// address (the log has them). Answers about the object (401, 403, its
// 404, 502, 503, 504) name it in Details; 400, 408, 413, 415 and 431
// carry no Details.
//
// # The consumer
//
// A message is a JSON object {"namespace": ..., "name": ..., "reason": ...}
// (reason optional, namespace only for namespaced resources) of at most
// ConsumerConfig.MaxMessageBytes; member names match exactly, at most once,
// and unknown members are malformed unless AllowUnknownFields.
//
//	message                           settled as (reason)
//	too large, malformed, invalid      Term (TooLarge, Malformed, Invalid): dead-lettered
//	object not found                   Ack (NotFound), logged as a warning
//	scheduled                          Ack (Scheduled); with AckAfterReconcile, Ack (Reconciled) once the reconcile succeeded or failed for good (InProgress meanwhile, the Outcome replied), Nack (TermEnded) when the term ends first
//	object outside the scope           Nack (OutOfScope) after DroppedDelay: another controller on the subscription may own it
//	API server error, another kind     Nack (APIError) after RetryBase*2^(deliveries-1), at most RetryCap
//	enqueue dropped, or ErrBusy        Nack (Dropped) after DroppedDelay, never Ack
//	received while Run is stopping     Nack (Stopping) at once
//	a Nack the broker dead-letters     counted as Term (MaxDeliveries), see [DeadLetterer]
//
// Before each receive the consumer takes a token of the trigger budget
// (Config.Rate), waiting for one if need be, so a backlog waits in the
// broker and drains at Rate messages a second. Before each receive, and
// every PausePoll while a Receive blocks, the
// consumer asks ConsumerConfig.Paused (by default: the queue is suspended
// or shut down). While paused it receives nothing, so triggers wait in the
// broker for the leader instead of spending deliveries on followers, and a
// broker that implements [Releaser] hands back what it buffered. A
// sharded controller's replica pauses while it holds no shard; one that
// holds some takes any message, and hands back (after DroppedDelay) one
// whose object is of a shard it does not hold, for the broker to deliver
// to another replica. A failing
// Receive is retried with backoff. Broker failures are classified by the
// adapter as a [BrokerError] (Disconnected, Permission, Quota, NotFound)
// and reported by that name in logs, [Metrics] and
// [Consumer.Check].
package trigger
