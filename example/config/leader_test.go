package config_test

import (
	"context"
	"testing"
	"testing/synctest"
	"time"

	kubefake "k8s.io/client-go/kubernetes/fake"

	"github.com/opkit/opkit/example/config"
	"github.com/opkit/opkit/example/operator"
	"github.com/opkit/opkit/leader"
)

// exerciseLeader campaigns, leads and releases the Lease on a fake.
func exerciseLeader(t *testing.T, rec *recorder) {
	synctest.Test(t, func(t *testing.T) {
		kube := kubefake.NewClientset()
		el, err := leader.New(leader.Config{Client: kube, Namespace: config.Namespace, Name: operator.DefaultLeaderElectionID, Identity: "replica-1", Logger: discard()})
		if err != nil {
			t.Fatal(err)
		}
		ctx, cancel := context.WithCancel(context.Background())
		done := make(chan error)
		led := make(chan struct{})
		go func() {
			done <- el.Run(ctx, func(ctx context.Context) error { close(led); <-ctx.Done(); return nil })
		}()
		<-led
		time.Sleep(10 * time.Second) // a few renewals
		cancel()
		<-done
		rec.add(kube.Actions())
	})
}
