// Package reconcile is the [Reconciler] contract, the [Controller] that
// runs it, and the [Operator] that runs a whole operator:
//
//	ctrl, _ := reconcile.NewController(reconcile.Config[*Widget]{Name: "example.com/widgets",
//		Resource: widgets, RESTConfig: cfg, Reconciler: r,
//		Leader: &leader.Config{Client: kube, Namespace: "ops", Name: "widgets"}})
//	op, _ := reconcile.NewOperator(reconcile.OperatorConfig{Controllers: []reconcile.Part{ctrl},
//		Triggers: &reconcile.TriggerEndpoint{Handler: trigger.HandlerConfig{Reviews: kube}}, HealthAddr: ":8081"})
//	err := op.Run(ctx) // until SIGTERM: servers first, then the controller drains and releases its Lease
//
// T points to a plain struct with metav1.TypeMeta and metav1.ObjectMeta
// (or a built-in type). Helpers: [Applier], [Finalizer], [Status],
// [Recorder], [Group]; reconciletest and envtest test with fakes and for real.
//
// A Controller works in shards (one unless Config.Shards says more), each
// with a queue, a watcher, workers and, with Leader, a Lease. It
// guarantees:
//   - Level-based turns: a worker's turn for a key reconciles its
//     unsettled deletes, oldest first, then the object that has the name
//     now, as last seen or read. No order of events changes what it sees.
//   - One turn at a time per key; different keys run concurrently.
//   - Every delete the watch saw is reconciled until settled, across this
//     replica's terms (another replica never saw it: use a [Finalizer]).
//   - A trigger never waits for a backlog reconcile (ReservedWorkers).
package reconcile
