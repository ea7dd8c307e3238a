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
// T is a pointer to a plain struct that embeds metav1.TypeMeta and
// metav1.ObjectMeta with json tags, or a built-in type such as
// *corev1.ConfigMap, bound to its resource by an [opkit.Resource]: no code
// generation, no scheme. Helpers: [Applier] (children), [Finalizer],
// [Status], [Recorder] (Events), [Group] (components as one unit);
// package reconciletest unit-tests reconcilers with fakes.
//
// A Controller works on its objects in shards (one unless Config.Shards
// says more), each with a queue, a watcher, workers and, with Leader, a
// Lease. It guarantees:
//   - Level-based turns: the queue holds keys, and a worker's turn for a
//     key reconciles its unsettled deletes, oldest first, with their final
//     states, then the object that has the name now, as the watch last saw
//     it or else as read (objects outside the watch's selector are
//     skipped). No order of events changes what a turn sees.
//   - One turn at a time per key; different keys run concurrently.
//   - Every delete the watch saw is reconciled until settled, across this
//     replica's terms; a replica taking over never saw it: a reconciler
//     that must clean up after every delete uses a [Finalizer].
//   - A trigger never waits for a backlog reconcile (ReservedWorkers).
//   - Shutdown stops the intake, lets in-flight reconciles finish up to a
//     deadline, then cancels them.
package reconcile
