package operator

import (
	"log/slog"

	"k8s.io/client-go/kubernetes"

	demov1 "github.com/opkit/opkit/example/api/v1"
	"github.com/opkit/opkit/example/metrics"
	"github.com/opkit/opkit/leader"
	"github.com/opkit/opkit/reconcile"
	"github.com/opkit/opkit/trigger"
)

// newController builds the controller, with a leader elector on the Lease
// when o.LeaderElect is set (then the controller is active only while this
// replica holds the Lease; its trigger drops adds otherwise).
func newController(cfg reconcile.Config[*demov1.DemoEntity], kube kubernetes.Interface, o Options, m *metrics.Metrics, logger *slog.Logger) (*reconcile.Controller[*demov1.DemoEntity], *leader.Elector, error) {
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
	ctrl, err := reconcile.NewController(cfg)
	if err != nil {
		return nil, nil, err
	}
	return ctrl, ctrl.Elector(), nil
}
