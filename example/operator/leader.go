package operator

import (
	"log/slog"

	"k8s.io/client-go/kubernetes"

	demov1 "github.com/opkit/opkit/example/api/v1"
	"github.com/opkit/opkit/example/metrics"
	"github.com/opkit/opkit/leader"
	"github.com/opkit/opkit/reconcile"
)

// newController builds the controller, with a leader elector on the Lease
// when o.LeaderElect is set.
func newController(cfg reconcile.Config[*demov1.DemoEntity], kube kubernetes.Interface, o Options, m *metrics.Metrics, logger *slog.Logger) (*reconcile.Controller[*demov1.DemoEntity], *leader.Elector, error) {
	// TODO(leader): wire the elector once reconcile.Config has its field.
	ctrl, err := reconcile.NewController(cfg)
	return ctrl, nil, err
}
