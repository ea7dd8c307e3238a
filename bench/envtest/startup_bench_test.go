package envtestbench

import (
	"context"
	"testing"
	"time"

	"github.com/go-logr/logr"
	crenvtest "sigs.k8s.io/controller-runtime/pkg/envtest"
	crlog "sigs.k8s.io/controller-runtime/pkg/log"

	"github.com/opkit/opkit/reconcile/envtest"
)

// BenchmarkStartup starts and stops a control plane with opkit's envtest
// and with controller-runtime's, from the same binaries -- kube-apiserver
// and etcd from a $KUBEBUILDER_ASSETS laid out as setup-envtest does,
// kube-controller-manager from the cache -- each variant in turn in every
// iteration, so that a machine's changing load weighs on all of them
// alike. It reports, per variant, the mean start-up (until requests are
// served; with CRDs, until they are served too) as <variant>-start-s and
// the mean stop as <variant>-stop-s; ns/op is the sum of all. Run it a
// few times:
//
//	cd bench && go test -run '^$' -bench Startup -benchtime 5x -count 3 ./envtest/
func BenchmarkStartup(b *testing.B) {
	assets := kubebuilderAssets(b)
	crlog.SetLogger(logr.Discard()) // else it complains, with a stack, that none was set
	ctx := context.Background()
	opkit := func(opts envtest.Options) func() func() error {
		return func() func() error {
			e, err := envtest.New(ctx, opts)
			if err != nil {
				b.Fatal(err)
			}
			return e.Stop
		}
	}
	controllerRuntime := func(crdPaths ...string) func() func() error {
		return func() func() error {
			te := &crenvtest.Environment{BinaryAssetsDirectory: assets, CRDDirectoryPaths: crdPaths, ErrorIfCRDPathMissing: true}
			if _, err := te.Start(); err != nil {
				b.Fatal(err)
			}
			return te.Stop
		}
	}
	variants := []struct {
		name  string
		start func() (stop func() error)
	}{
		{"opkit", opkit(envtest.Options{})},
		{"controller-runtime", controllerRuntime()},
		{"opkit+CRD", opkit(envtest.Options{CRDs: []string{crds}})},
		{"controller-runtime+CRD", controllerRuntime(crds)},
		{"opkit+controller-manager", opkit(envtest.Options{ControllerManager: true})},
	}
	starts := make([]time.Duration, len(variants))
	stops := make([]time.Duration, len(variants))
	for b.Loop() {
		for i, v := range variants {
			begin := time.Now()
			stop := v.start()
			starts[i] += time.Since(begin)
			begin = time.Now()
			if err := stop(); err != nil {
				b.Fatal(err)
			}
			stops[i] += time.Since(begin)
		}
	}
	for i, v := range variants {
		b.ReportMetric(starts[i].Seconds()/float64(b.N), v.name+"-start-s")
		b.ReportMetric(stops[i].Seconds()/float64(b.N), v.name+"-stop-s")
	}
}
