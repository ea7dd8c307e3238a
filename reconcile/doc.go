// Package reconcile is the [Reconciler] contract and the [Controller] that
// runs it, and [Operator], which runs a whole operator:
//
//	ctrl, _ := reconcile.NewController(reconcile.Config[*Widget]{Name: "example.com/widgets",
//		Resource: widgets, RESTConfig: cfg, Reconciler: r,
//		Leader: &leader.Config{Client: kube, Namespace: "ops", Name: "widgets"}})
//	op, _ := reconcile.NewOperator(reconcile.OperatorConfig{Controllers: []reconcile.Part{ctrl},
//		Triggers: &reconcile.TriggerEndpoint{Handler: trigger.HandlerConfig{Reviews: kube}}, HealthAddr: ":8081"})
//	err := op.Run(ctx) // until SIGTERM: servers first, then the controller drains and releases its Lease
//
// A Controller works on its objects in shards (one unless Config.Shards
// says more), each with a queue, a watcher, workers and, with Leader, a
// Lease; Controller.Run owns every goroutine. Helpers: [Applier]
// (children), [Finalizer], [Status], [Recorder] (Events) and [Group] (a
// process's components as one unit). Package reconcile/reconciletest
// unit-tests reconcilers with fakes.
//
// Guarantees:
//   - Level-based. The queue holds keys; a worker's turn for a key
//     reconciles its unsettled deletes (from the watcher's ledger, oldest
//     first, each with its final state), then the object that has the name
//     now: as the watch last saw it when the key's cause carries that
//     state, else as read from the API server (a retry and a requeue read
//     it). Objects outside the watch's label selector are skipped. No
//     order of events changes what a turn sees.
//   - One turn at a time per key; different keys run concurrently.
//   - Every delete the watch saw is reconciled until it succeeds (or is a
//     terminal error, or is given up on), also across leader terms of this
//     replica: the ledger outlives the term's queue. Another replica taking
//     over never saw it: a reconciler that must clean up after every
//     delete uses a [Finalizer].
//   - A trigger never waits for a backlog reconcile: Config.ReservedWorkers
//     take only entries at trigger priority or above.
//   - Every outcome is defined (the table on [Reconciler]); a panic in the
//     reconciler is an error, retried like any other.
//   - Shutdown stops the intake, lets in-flight reconciles finish up to a
//     deadline, then cancels them.
//
// T is a pointer to a plain struct that embeds metav1.TypeMeta and
// metav1.ObjectMeta with json tags, or a built-in type such as
// *corev1.ConfigMap, bound to its resource by an [opkit.Resource]: no code
// generation, no scheme. The controller records a Warning Event when it
// gives up on a request (terminal, or MaxRetries).
package reconcile
