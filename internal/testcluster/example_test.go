package testcluster_test

import (
	"context"
	"fmt"
	"log"
	"testing"

	"github.com/opkit/opkit/internal/testcluster"
)

// A program (a demo harness, make controlplane) starts a cluster with New and
// must Stop it.
func ExampleNew() {
	c, err := testcluster.New(context.Background(), testcluster.Options{})
	if err != nil {
		log.Fatal(err)
	}
	defer c.Stop()
	fmt.Println("export KUBECONFIG=" + c.Kubeconfig())
}

// An integration test binary shares one cluster; each test takes a namespace.
func ExampleShared() {
	// In a _test.go file carrying //go:build integration:
	//
	//	func TestMain(m *testing.M) { testcluster.Main(m) }
	test := func(t *testing.T) {
		c := testcluster.Shared(t)
		ns := c.Namespace(t)
		_ = c.Config() // admin *rest.Config for API server 0
		_ = ns
	}
	_ = test
}
