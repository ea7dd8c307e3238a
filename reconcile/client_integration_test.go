//go:build integration

package reconcile_test

import (
	"testing"

	"k8s.io/client-go/kubernetes"

	"github.com/opkit/opkit/internal/testcluster"
	"github.com/opkit/opkit/reconcile"
)

// A real kube-apiserver has API Priority and Fairness on by default: once
// it answered, the client sets no limit of its own.
func TestIntegrationTheClientDropsItsLimitOnARealAPIServer(t *testing.T) {
	c := testcluster.Shared(t)
	cfg := c.Config()
	cfg.QPS, cfg.Burst = 0, 0
	cfg = reconcile.WithClientDefaults(cfg)
	if got := cfg.RateLimiter.QPS(); got != reconcile.DefaultQPS {
		t.Fatalf("before any answer: %v a second, want the guard", got)
	}
	cs, err := kubernetes.NewForConfig(cfg)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := cs.Discovery().ServerVersion(); err != nil {
		t.Fatal(err)
	}
	if got := cfg.RateLimiter.QPS(); got != -1 {
		t.Fatalf("after an answer: %v a second, want none (-1): the server has Priority and Fairness", got)
	}
}
