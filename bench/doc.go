// Package bench holds opkit's side-by-side benchmarks against its peers
// (client-go's workqueue, informers and leaderelection, controller-runtime's
// priorityqueue, source.Channel and Owns, and its manager in convergence:
// the same reconcile under both controllers), and the measurements that have no
// peer (floods: the trigger endpoint under the floods of issue 22). It is a
// separate module so that those peers never become dependencies of the SDK.
//
// Run them with `make bench`; results and the commands that produced them
// are in docs/benchmarks.md.
package bench

// The peers every benchmark in this module is measured against; imported
// here so the module graph holds them even before a benchmark uses them.
import (
	_ "k8s.io/client-go/tools/leaderelection"
	_ "k8s.io/client-go/util/workqueue"
	_ "sigs.k8s.io/controller-runtime/pkg/controller/priorityqueue"
	_ "sigs.k8s.io/controller-runtime/pkg/source"

	_ "github.com/opkit/opkit"
)
