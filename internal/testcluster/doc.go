// Package testcluster runs a real, throwaway Kubernetes control plane (one etcd,
// one or more kube-apiservers and, if asked, a kube-controller-manager) on
// loopback ports, for opkit's integration tests and for exploring by hand.
//
// Nothing is faked: the binaries are the ones hack/controlplane.sh builds from
// the Go module proxy (kube-apiserver and kube-controller-manager v1.37.2,
// etcd v3.6.16), cached under the user cache dir. A cluster has
//
//   - a self-generated CA and an ECDSA serving certificate, so clients verify
//     TLS for real;
//   - static-token authentication with an admin user (group system:masters),
//     an unprivileged user with no RBAC grants and a user in system:masters
//     for the controller-manager;
//   - service-account signing keys, so TokenRequest and TokenReview work;
//   - RBAC authorization;
//   - the alpha feature gate ShardedListAndWatch, so that LIST and WATCH
//     honour ListOptions.ShardSelector, unless
//     [Options.DisableShardedListAndWatch];
//   - by default no controller-manager: no garbage collection, no default
//     service accounts, and namespaces never finish deleting. Tests create
//     what they need and clean up explicitly. A cluster started with
//     [Options.ControllerManager] runs a kube-controller-manager with the
//     garbage collector and the namespace and service-account controllers
//     (nothing that needs nodes or a cloud); [Cluster.HasControllerManager]
//     tells which kind a cluster is. The shared cluster has none.
//
// # Use in tests
//
// A test binary shares one cluster and isolates its tests by namespace:
//
//	//go:build integration
//
//	func TestMain(m *testing.M) { testcluster.Main(m) }
//
//	func TestSomething(t *testing.T) {
//		c := testcluster.Shared(t)
//		ns := c.Namespace(t)
//		client := kubernetes.NewForConfigOrDie(c.Config())
//		...
//	}
//
// Chaos tests that stop API servers or compact etcd take a private cluster
// with [Start], which is stopped by t.Cleanup. Programs (make controlplane,
// demo harnesses) use [New] and [Cluster.Stop].
//
// # Processes and goroutines
//
// Each etcd, kube-apiserver and kube-controller-manager runs in its own
// process group, with its output in a log file in the cluster's temp dir
// ([Cluster.LogTail], [Cluster.ControllerManagerLogTail]). One goroutine per process, owned by
// the Cluster, waits for it to exit. Stop kills every process group, waits for
// them and removes the temp dir; the processes also receive SIGKILL if the
// thread that started them dies (Pdeathsig), so a test binary that crashes or
// is killed by the go test timeout leaves nothing running. [Main] stops the
// shared cluster when the tests end, on panic, and on SIGINT/SIGTERM.
//
// A Cluster's methods are safe for concurrent use.
package testcluster
