// Package trigger lets systems outside the watch stream ask for a
// reconcile: Go code through a [Trigger], HTTP callers through
// [NewHandler] (served by [NewServer]), messages of any [Broker] through a
// [Consumer]. reconcile.Controller.Trigger returns a controller's
// Trigger, and reconcile.Operator serves its handler; by hand:
//
//	ok, err := ctrl.Trigger().Enqueue(ctx, obj, opkit.Modified, opkit.Operator, 0, 0)
//	h, err := trigger.NewHandler(ctrl.Trigger(), trigger.HandlerConfig{Reviews: kube}) // POST /reconcile/{namespace}/{name}
//	c, err := trigger.NewConsumer(trigger.ConsumerConfig[*Widget]{Broker: b, Trigger: ctrl.Trigger()})
//	err = c.Run(ctx) // {"namespace": ..., "name": ..., "reason": ...} messages
//
// Package brokertest holds an in-memory Broker for tests.
//
// # What a trigger queues
//
// A trigger adds its object's key to the controller's queue with an
// [opkit.Cause] of source Operator, its reason and the object (type Added
// marks the cause Added; Deleted asks for a teardown, see
// [Trigger.Enqueue]). The causes of one key merge as a join, in any
// order: sources and reasons unite (at most [opkit.MaxReasons]), the
// newest object by resourceVersion is kept, and the entry takes the
// earliest due time and the highest priority. So a delay is an upper
// bound: another event reconciles the object sooner, once. Triggers rank
// above watch events and relists, so no relist backlog holds them up.
//
// The HTTP handler and the consumer never trust a payload: a message or a
// request only points at an object, and [Trigger.Intake] checks the
// pointer, authorizes the caller, reads the object and queues what it
// read (which the controller then need not read again).
//
// An acknowledgement (or a 202) promises the trigger is in the queue of
// the replica that works on the object, not that it was reconciled: if
// that replica's term ends first, its queue is cleared and the next
// holder's full list reconciles every object, without the trigger's
// reason. To learn more, or to outlive the term:
//
//   - A tracked trigger ([IntakeOptions].Track; an HTTP caller's ?wait=)
//     gets the outcome of the reconcile that serves it on its [Ticket];
//     the end of the term resolves it as Unknown.
//   - The consumer's AckAfterReconcile acknowledges a message only once its
//     reconcile succeeded or failed for good: the broker redelivers it to
//     the next leader otherwise.
//   - The annotation reconcile.opkit.dev/requestedAt (the watcher's
//     RequestAnnotation) asks for a reconcile, at trigger priority and
//     source Operator, until reconcile.Status records it in
//     status.lastHandledReconcileAt: durable across leaders and restarts,
//     with RBAC on the object as the only permission (`kubectl annotate
//     --overwrite widget/w reconcile.opkit.dev/requestedAt="$(date +%s)"`).
//
// A Trigger owns no goroutine, the handler runs on net/http's, and a
// Consumer's Run and a Server's Serve return only after theirs. Every API
// call and every broker call has a timeout, and nothing blocks on the
// queue.
//
// # The HTTP endpoint
//
// NewHandler needs an [Authenticator] (or InsecureSkipAuth). The
// Kubernetes-native one ([NewKubeAuthenticator], or just
// HandlerConfig.Reviews) checks the bearer token with a TokenReview for
// the audience [DefaultAudience] and the caller's permission (default:
// update on the object) with a SubjectAccessReview, and caches both
// briefly. The operator's ServiceAccount needs create on tokenreviews and
// subjectaccessreviews (the system:auth-delegator ClusterRole) and get on
// the resource; a caller gets a token with `kubectl create token SA
// --audience opkit-trigger`. Serve it over HTTPS and restrict who can
// reach it.
//
// The handler checks the route and method, its rate limit and the
// client's failed authentications, reads the query and the body (within
// BodyTimeout), takes an in-flight slot, and hands the rest to Intake
// (key, authorization, scope, budget, read, enqueue). When another replica
// works on the object, it forwards the request there with the caller's
// credentials (checked again there), marked X-Opkit-Forwarded so that it
// goes no further, and passes the answer on. With ?wait=D the caller waits
// for the outcome, holding no in-flight slot:
//
//	200            the reconcile finished within the wait: an [Outcome]; also the answer of GET .../triggers/{id} (pending or unknown too)
//	202            scheduled: an [Accepted]; with a wait that ended first, the trigger's id and statusPath to GET
//	400, 408       an invalid key ([Pointer.Check]), delay, reason, query, body or path (empty, "." or ".." segments); 408: the body came too late
//	401            no valid bearer token for the audience (WWW-Authenticate: Bearer, error="invalid_token" if one was sent)
//	403            the SubjectAccessReview denied the caller
//	404            no such object or route, or an object outside the controller's scope
//	405            a method other than POST (GET for .../triggers/{id}; Allow says which)
//	413, 415, 431  a body over MaxBodyBytes, or not application/json; headers over ServerConfig.MaxHeaderBytes
//	429            a rate, in-flight or waiting limit, the trigger budget, the reviews in flight, or the client's failed authentications (Retry-After)
//	502, 504       the API server failed, returned another kind or does not serve the resource, a review could not be evaluated, or the holder's endpoint is plain HTTP for a TLS request; 504: a call timed out
//	503            no replica can take the trigger now (Retry-After; X-Opkit-Leader and "leader" name the holder when known), the term ended or the server stopped while the caller waited, the holder does not answer, or the caller left
//
// Every error body is a [Status] without internal errors or addresses (the
// log has them); the answers about the object (401, 403, its 404, 502,
// 503, 504) name it in Details.
//
// Under floods: a trigger for a key that already waits costs no read and
// no reconcile; the others start at most Config.Rate reconciles a second,
// at most half of them one caller's (a user, or an address without
// authentication); a slow body holds no slot, and an answer given before
// the body was read closes the connection; reviews of one token or
// decision are shared and bounded (KubeAuthConfig.MaxReviews); an address
// that keeps failing authentication is refused before any review; and
// refusals are logged at most once per status code every 10s.
//
// # The consumer
//
// A message is a JSON object {"namespace", "name", "reason"} (reason
// optional, namespace only for a namespaced resource) of at most
// MaxMessageBytes, with each member at most once and named exactly;
// another member makes it malformed unless AllowUnknownFields. The
// consumer settles it, and counts it in [Metrics], for a reason:
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
// (Config.Rate), so a backlog waits in the broker. While Paused (by
// default: this replica works on no shard) it receives nothing, and a
// [Releaser] broker hands back what it buffered; a replica that works on
// some shards hands back the messages of the others. A failing Receive is
// retried with backoff, and broker failures are reported by their
// [BrokerError] kind in logs, Metrics and [Consumer.Check].
package trigger
