package operator

import (
	"log/slog"

	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/kubernetes"

	demov1 "github.com/opkit/opkit/example/api/v1"
	"github.com/opkit/opkit/example/metrics"
	"github.com/opkit/opkit/leader"
	"github.com/opkit/opkit/queue"
	"github.com/opkit/opkit/reconcile"
	"github.com/opkit/opkit/trigger"
)

// work is the operator's controller side: one Controller (with a leader
// elector on the Lease when o.LeaderElect is set: it works only while
// this replica holds the Lease, and its trigger drops adds otherwise), or
// with o.Shards above 1 a Sharded one, whose replicas share the shards.
type work struct {
	controller *reconcile.Controller[*demov1.DemoEntity] // nil when sharded
	sharded    *reconcile.Sharded[*demov1.DemoEntity]    // nil when not
	runnable   reconcile.Runnable
	trigger    *trigger.Trigger[*demov1.DemoEntity]
	// For the HTTP handler (nil when not used) and the queue metrics.
	leader         func() string
	leaderEndpoint func() string
	holderEndpoint func(types.UID) string
	queueStats     func() queue.Stats
}

func newWork(cfg reconcile.Config[*demov1.DemoEntity], kube kubernetes.Interface, o Options, m *metrics.Metrics, logger *slog.Logger) (*work, error) {
	if o.LeaderElect {
		cfg.Leader = &leader.Config{
			Client:        kube,
			Namespace:     o.LeaderElectionNamespace,
			Name:          o.LeaderElectionID,
			Identity:      o.Identity,
			LeaseDuration: o.LeaseDuration,
			RenewDeadline: o.RenewDeadline,
			RetryPeriod:   o.RetryPeriod,
			Metrics:       m.Leader(),
			Logger:        logger,
		}
		if o.TriggerAdvertiseURL != "" {
			cfg.Leader.Annotations = map[string]string{trigger.EndpointAnnotation: o.TriggerAdvertiseURL}
		}
	}
	if o.Shards > 1 {
		s, err := reconcile.NewSharded(cfg, o.Shards)
		if err != nil {
			return nil, err
		}
		return &work{sharded: s, runnable: s.Runnable(), trigger: s.Trigger(), holderEndpoint: s.HolderEndpoint, queueStats: s.QueueStats}, nil
	}
	ctrl, err := reconcile.NewController(cfg)
	if err != nil {
		return nil, err
	}
	w := &work{controller: ctrl, runnable: ctrl.Runnable(), trigger: ctrl.Trigger(), leaderEndpoint: ctrl.LeaderEndpoint, queueStats: ctrl.Queue().Stats,
		leader: func() string { return o.Identity }}
	if e := ctrl.Elector(); e != nil {
		w.leader = e.Leader
	}
	return w, nil
}
