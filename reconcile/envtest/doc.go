// Package envtest runs a real, throwaway Kubernetes control plane for
// integration tests of an operator: an etcd, one or more kube-apiservers
// and, if asked, a kube-controller-manager, on loopback ports, started in
// a few seconds and stopped with the test. What fakes cannot show is
// real here: the CRD's schema and defaults, RBAC, server-side apply
// conflicts, owner references and garbage collection, watches and their
// resumption, Leases, TokenReview and SubjectAccessReview.
//
//	//go:build integration
//
//	func TestWebsite(t *testing.T) {
//		env := envtest.Start(t, envtest.Options{CRDs: []string{"../config/crd"}, ControllerManager: true})
//		ns := env.Namespace(t)
//		ctrl, err := reconcile.NewController(reconcile.Config[*Website]{
//			Name: "example.com/websites", Resource: websites, RESTConfig: env.Config(),
//			Reconciler: &reconciler{}, Owns: []opkit.Resource{configMaps},
//		})
//		if err != nil {
//			t.Fatal(err)
//		}
//		envtest.Run(t, ctrl) // until the test ends; returns once the controller is ready
//		// create a Website in ns, wait for its child, ...
//	}
//
// [Start] stops everything at the test's cleanup; [Run] runs a controller,
// a whole [reconcile.Operator] or any Runner until then, and [Eventually]
// waits for what it does (a child, a status). Tests that share
// one environment call [Main] from TestMain and [Shared] in each test,
// each in its own [Environment.Namespace]. Programs use [New] and
// [Environment.Stop].
//
// # Binaries
//
// Nothing is faked, so the binaries must be on the machine. [FindBinaries]
// takes them from, in order:
//
//   - $KUBEBUILDER_ASSETS, the directory controller-runtime's setup-envtest
//     lays out (kube-apiserver, etcd, kubectl): `export
//     KUBEBUILDER_ASSETS=$(setup-envtest use -p path)` serves both. It has
//     no kube-controller-manager, which is taken from the cache when
//     Options.ControllerManager asks for it.
//
//   - the cache, ~/.cache/opkit/k8s-v1.37.2_etcd-v3.6.16_nats-v2.15.2/bin
//     ([DefaultBinDir]; $OPKIT_CONTROLPLANE_BIN replaces it), which this
//     command fills by building the three from the Go module proxy, with
//     nothing but Go (no prebuilt binary, no checkout of opkit; about 9
//     minutes on 2 cores the first time):
//
//     go run github.com/opkit/opkit/reconcile/envtest/cmd/envtest-build@latest
//
// Without them New fails with an error that says where it looked and
// which command provides them.
//
// # What an environment has
//
//   - a self-generated CA and an ECDSA serving certificate, so clients
//     verify TLS for real;
//   - static-token authentication with an admin user (group
//     system:masters: [Environment.Config]), an unprivileged user with no
//     RBAC grants ([Environment.UserConfig]) and a user in system:masters
//     for the controller-manager;
//   - service-account signing keys, so TokenRequest and TokenReview work:
//     [Environment.ServiceAccountToken] mints a token of any audience,
//     [Environment.ServiceAccountConfig] a config that acts as a
//     ServiceAccount, which only RBAC grants rights;
//   - RBAC authorization;
//   - the alpha feature gate ShardedListAndWatch if
//     [Options.ShardedListAndWatch] asks for it;
//   - by default no controller-manager: no garbage collection, no default
//     service accounts, and namespaces never finish deleting. With
//     [Options.ControllerManager] a kube-controller-manager runs the
//     garbage collector and the namespace and service-account controllers
//     (nothing that needs nodes or a cloud).
//
// For chaos tests an environment can run several API servers on its etcd
// ([Options.APIServers], [Environment.AddAPIServer]), stop, kill and
// restart them ([Environment.StopAPIServer], [Environment.KillAPIServer],
// [Environment.StartAPIServer]) and compact etcd ([Environment.Compact]).
//
// # Processes and clean-up
//
// Linux only. Each etcd, kube-apiserver and kube-controller-manager runs in
// its own process group, with its output in a log file in the
// environment's temp dir ([Environment.LogTail]; [Start] shows the tails
// when the test failed). One goroutine per process, owned by the
// Environment, waits for it to exit. Stop kills every process group, waits
// for them and removes the temp dir. If the test binary dies without
// running its cleanups (a panic in a goroutine, the go test -timeout, a
// kill), the processes receive SIGKILL from the kernel (Pdeathsig) and a
// small /bin/sh watchdog, which notices the end of the test binary, removes
// the temp dir: nothing is left behind.
package envtest
