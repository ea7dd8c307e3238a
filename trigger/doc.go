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
// # What a trigger queues
//
// A trigger adds its object's key to the controller's queue with an
// [opkit.Cause] of source Operator, its reason and the object; the causes
// of one key merge as a join (sources and reasons unite, the newest object,
// the earliest due time and highest priority win). Triggers rank above
// watch events. A request or a message only points at an object:
// [Trigger.Intake] reads it. Package brokertest is a Broker for tests.
//
// An acknowledgement (or a 202) promises the trigger is in the queue of
// the replica that works on the object, not a reconcile: if its term ends
// first, the next holder's list reconciles every object, without the
// reason. A tracked trigger ([IntakeOptions].Track, ?wait=) learns its
// outcome on its [Ticket] (Unknown if the term ends first); the consumer's
// AckAfterReconcile acknowledges only then. The annotation
// reconcile.opkit.dev/requestedAt asks for a reconcile until
// reconcile.Status records it in status.lastHandledReconcileAt: durable
// across leaders and restarts. Every API and broker call has a timeout;
// nothing blocks on the queue.
//
// # The HTTP endpoint
//
// The Kubernetes-native [Authenticator] ([NewKubeAuthenticator], or
// HandlerConfig.Reviews) checks the bearer token with a TokenReview for
// the audience [DefaultAudience], and the caller's permission (update on
// the object) with a SubjectAccessReview. The operator needs create on
// tokenreviews and subjectaccessreviews (system:auth-delegator), get on
// the resource, and reads the issuer's keys (as any ServiceAccount may); a caller gets a token with `kubectl create token SA
// --audience opkit-trigger`. Serve it over HTTPS.
//
// The handler checks the route, method and rate limit, reads the query
// and the body, takes an in-flight slot, and hands the rest to Intake. It
// forwards a trigger that another replica works on there, with the
// caller's credentials, marked X-Opkit-Forwarded (not to go further),
// and passes the answer on. With ?wait=D the caller waits for the
// outcome, holding no slot:
//
//	200            the reconcile finished within the wait: an [Outcome]; also the answer of GET .../triggers/{id} (pending or unknown too)
//	202            scheduled: an [Accepted]; with a wait that ended first, the trigger's id and statusPath to GET
//	400, 408       an invalid key ([Pointer.Check]), delay, reason, query, body or path (empty, "." or ".." segments); 408: the body came too late
//	401            no valid bearer token for the audience (WWW-Authenticate: Bearer, error="invalid_token" if one was sent)
//	403            the SubjectAccessReview denied the caller
//	404            no such object or route, or an object outside the controller's scope
//	405            a method other than POST (GET for .../triggers/{id}; Allow says which)
//	413, 415, 431  a body over MaxBodyBytes, or not application/json; headers over ServerConfig.MaxHeaderBytes
//	429            a rate, in-flight or waiting limit, the trigger budget, a review budget or slot, or the client address's failed authentications (Retry-After)
//	502, 504       this replica's API server answered with an error, returned another kind or does not serve the resource, a review could not be evaluated, or the holder's endpoint is plain HTTP for a TLS request; 504: a call timed out
//	503            no replica can take the trigger now (Retry-After; X-Opkit-Leader and "leader" name the holder when known); this replica's API server does not answer or cannot serve now (with one shard, a replica that does not work on the object forwards the trigger instead: the holder checks the caller; with shards, retry: another replica may take it); the term ended or the server stopped while the caller waited, the holder does not answer, or the caller left
//
// An error body is a [Status], without internal errors (the log has them,
// at most once per code every 10s). Under floods from any number of
// callers, slots and reviews go first to the caller (its user once
// authorized, else its address) holding the fewest, and the trigger
// budget goes first to the callers that ask for least; see
// [KubeAuthConfig] for what a review costs; a slow body holds no slot.
//
// # The consumer
//
// A message is a JSON object {"namespace", "name", "reason"} (reason
// optional; namespace for a namespaced resource), each member named
// exactly and once; another member makes it malformed unless
// AllowUnknownFields. The consumer settles it, and counts it in [Metrics],
// for a reason:
//
//	message                           settled as (reason)
//	too large, malformed, invalid      Term (TooLarge, Malformed, Invalid): dead-lettered
//	object not found                   Ack (NotFound), logged as a warning
//	scheduled                          Ack (Scheduled); with AckAfterReconcile, Ack (Reconciled) once the reconcile succeeded or failed for good (InProgress meanwhile, the Outcome replied), Nack (TermEnded) when the term ends first
//	object outside the scope           Nack (OutOfScope) after DroppedDelay: another controller on the subscription may own it
//	API failure                        Nack after DroppedDelay: APITransient (no answer, 5xx, 429), APIRefused (401/403, first 3 deliveries); else RetryBase*2^(deliveries-1), at most RetryCap (APIRefused, APIError: another kind, a 4xx)
//	enqueue dropped, or ErrBusy        Nack (Dropped) after DroppedDelay, never Ack
//	received while Run is stopping     Nack (Stopping) at once
//	a Nack the broker dead-letters     counted as Term (MaxDeliveries), see [DeadLetterer]
//
// A message that needs a read waits for a token of the trigger budget
// (a backlog waits in the broker). While Paused (by default: this replica
// works on no shard) it receives nothing, and a [Releaser] hands back its
// buffer; a replica hands back other shards' messages (for free if it
// read the object in the last 30s). Broker failures are retried with
// backoff and reported by [BrokerError] kind.
package trigger
