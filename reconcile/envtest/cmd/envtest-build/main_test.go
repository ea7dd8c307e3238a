package main

import (
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/opkit/opkit/reconcile/envtest"
)

// The command builds where envtest looks, the versions envtest names.
func TestDefaultsAreEnvtests(t *testing.T) {
	if defaultKubernetes != envtest.KubernetesVersion || defaultEtcd != envtest.EtcdVersion {
		t.Errorf("defaults %s, %s; envtest's %s, %s", defaultKubernetes, defaultEtcd, envtest.KubernetesVersion, envtest.EtcdVersion)
	}
	t.Setenv("XDG_CACHE_HOME", t.TempDir())
	for _, bin := range []string{"", "/elsewhere"} {
		t.Setenv(envtest.BinDirEnv, bin)
		b, err := newBuilder(defaultKubernetes, defaultEtcd, "", "", "etcd")
		if err != nil {
			t.Fatal(err)
		}
		if b.out != envtest.DefaultBinDir() {
			t.Errorf("%s=%q: builds into %s, envtest looks in %s", envtest.BinDirEnv, bin, b.out, envtest.DefaultBinDir())
		}
	}
	// Other versions go into their own directory, beside the default one.
	b, err := newBuilder("v1.36.3", defaultEtcd, "", "", "etcd")
	if err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(b.out, "k8s-v1.36.3_etcd-"+defaultEtcd) || b.work != filepath.Join(filepath.Dir(filepath.Dir(filepath.Dir(b.out))), "opkit", "build") {
		t.Errorf("v1.36.3: out %s, work %s", b.out, b.work)
	}
}

func TestNewBuilderRefusesBadFlags(t *testing.T) {
	for _, tc := range []struct{ k8s, etcd, bins, says string }{
		{"1.37.2", defaultEtcd, "etcd", "-kubernetes"},
		{"v2.0.0", defaultEtcd, "etcd", "-kubernetes"},
		{defaultKubernetes, "v3.6", "etcd", "-etcd"},
		{defaultKubernetes, defaultEtcd, "etcd,kubectl", `unknown binary "kubectl"`},
	} {
		if _, err := newBuilder(tc.k8s, tc.etcd, "/o", "/w", tc.bins); err == nil || !strings.Contains(err.Error(), tc.says) {
			t.Errorf("%+v: %v, want an error saying %s", tc, err, tc.says)
		}
	}
	b, err := newBuilder(defaultKubernetes, defaultEtcd, "/o", "/w", " kube-controller-manager,kube-controller-manager")
	if err != nil || !slices.Equal(b.binaries, []string{"kube-controller-manager"}) {
		t.Errorf("one binary twice: %+v, %v", b, err)
	}
}

func TestKubernetesBuildModule(t *testing.T) {
	gomod := []byte(`module k8s.io/kubernetes

go 1.25.0

require (
	k8s.io/api v0.0.0
	k8s.io/apiserver v0.0.0
)

replace (
	k8s.io/api => ./staging/src/k8s.io/api
	k8s.io/apiserver => ./staging/src/k8s.io/apiserver
	github.com/some/fork => github.com/other/fork v1.0.0
)

replace k8s.io/kubelet => ./staging/src/k8s.io/kubelet
`)
	staged := stagingModules(gomod)
	if want := []string{"k8s.io/api", "k8s.io/apiserver", "k8s.io/kubelet"}; !slices.Equal(staged, want) {
		t.Fatalf("stagingModules = %v, want %v", staged, want)
	}
	got := kubernetesGoMod("v1.37.2", staged)
	for _, want := range []string{
		"module opkit.local/controlplane/kubernetes\n",
		"require k8s.io/kubernetes v1.37.2\n",
		"\tk8s.io/api => k8s.io/api v0.37.2\n",
		"\tk8s.io/kubelet => k8s.io/kubelet v0.37.2\n",
	} {
		if !strings.Contains(got, want) {
			t.Errorf("go.mod lacks %q:\n%s", want, got)
		}
	}
	if got := kubernetesLDFlags("v1.37.2"); !strings.Contains(got, "version.gitVersion=v1.37.2") || !strings.Contains(got, "version.gitMinor=37 ") {
		t.Errorf("ldflags %q", got)
	}
	if got := etcdGoMod("v3.6.16"); !strings.HasSuffix(got, "require go.etcd.io/etcd/server/v3 v3.6.16\n") {
		t.Errorf("etcd go.mod %q", got)
	}
}
