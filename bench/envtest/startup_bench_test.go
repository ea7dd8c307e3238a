package envtestbench

import (
	"context"
	"testing"
	"time"

	crenvtest "sigs.k8s.io/controller-runtime/pkg/envtest"

	"github.com/opkit/opkit/reconcile/envtest"
)

// BenchmarkStartup starts and stops a control plane b.N times with the same
// binaries -- kube-apiserver and etcd from a $KUBEBUILDER_ASSETS laid out
// as setup-envtest does, kube-controller-manager from the cache -- and
// reports the start-up alone as s/start (until the first request can be
// served; for opkit with CRDs, until they are served too) beside the
// whole cycle's ns/op. Run it a few times each:
//
//	cd bench && go test -run '^$' -bench Startup -benchtime 5x ./envtest/
func BenchmarkStartup(b *testing.B) {
	assets := kubebuilderAssets(b)
	ctx := context.Background()
	measure := func(b *testing.B, start func() (stop func() error)) {
		var total time.Duration
		for b.Loop() {
			begin := time.Now()
			stop := start()
			total += time.Since(begin)
			if err := stop(); err != nil {
				b.Fatal(err)
			}
		}
		b.ReportMetric(total.Seconds()/float64(b.N), "s/start")
	}
	opkit := func(opts envtest.Options) func(b *testing.B) {
		return func(b *testing.B) {
			measure(b, func() func() error {
				e, err := envtest.New(ctx, opts)
				if err != nil {
					b.Fatal(err)
				}
				return e.Stop
			})
		}
	}
	b.Run("opkit", opkit(envtest.Options{}))
	b.Run("opkit+CRD", opkit(envtest.Options{CRDs: []string{crds}}))
	b.Run("opkit+controller-manager", opkit(envtest.Options{ControllerManager: true}))
	b.Run("controller-runtime", func(b *testing.B) {
		measure(b, func() func() error {
			te := &crenvtest.Environment{BinaryAssetsDirectory: assets}
			if _, err := te.Start(); err != nil {
				b.Fatal(err)
			}
			return te.Stop
		})
	})
	b.Run("controller-runtime+CRD", func(b *testing.B) {
		measure(b, func() func() error {
			te := &crenvtest.Environment{BinaryAssetsDirectory: assets, CRDDirectoryPaths: []string{crds}, ErrorIfCRDPathMissing: true}
			if _, err := te.Start(); err != nil {
				b.Fatal(err)
			}
			return te.Stop
		})
	})
}
