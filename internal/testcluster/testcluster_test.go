package testcluster

import (
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// The script builds the versions the package starts: its defaults and the
// package's constants must agree, or tests would run binaries the script
// never builds.
func TestScriptVersionsMatchTheConstants(t *testing.T) {
	script, err := os.ReadFile(filepath.Join("..", "..", "hack", "controlplane.sh"))
	if err != nil {
		t.Fatal(err)
	}
	for name, want := range map[string]string{"K8S_VERSION": KubernetesVersion, "ETCD_VERSION": EtcdVersion, "NATS_VERSION": NATSVersion} {
		line := name + `="${` + name + `:-` + want + `}"`
		if !strings.Contains(string(script), line) {
			t.Errorf("hack/controlplane.sh does not default %s to %s (want the line %s)", name, want, line)
		}
	}
	t.Setenv(BinDirEnv, "")
	if !strings.HasSuffix(DefaultBinDir(), filepath.Join("opkit", "k8s-"+KubernetesVersion+"_etcd-"+EtcdVersion+"_nats-"+NATSVersion, "bin")) {
		t.Errorf("default bin dir %s does not match hack/controlplane.sh's layout", DefaultBinDir())
	}
}

func TestCheckBinariesWantsWhatTheScriptBuilds(t *testing.T) {
	dir := t.TempDir()
	err := CheckBinaries(dir)
	for _, want := range []string{dir, "kube-apiserver", "kube-controller-manager", "etcd", "hack/controlplane.sh build"} {
		if !errors.Is(err, ErrBinariesMissing) || !strings.Contains(err.Error(), want) {
			t.Errorf("empty dir: %v, want ErrBinariesMissing mentioning %q", err, want)
		}
	}
	for _, b := range []string{"kube-apiserver", "kube-controller-manager", "etcd"} {
		if err := os.WriteFile(filepath.Join(dir, b), []byte("#!/bin/sh\n"), 0o755); err != nil {
			t.Fatal(err)
		}
	}
	if err := CheckBinaries(dir); !errors.Is(err, ErrBinariesMissing) || !strings.Contains(err.Error(), "nats-server") {
		t.Errorf("without nats-server: %v", err)
	}
	if err := CheckBinaries(""); !errors.Is(err, ErrBinariesMissing) || !strings.Contains(err.Error(), "no user cache dir") {
		t.Errorf("no dir: %v", err)
	}
}

func TestOptionsTurnTheGateOnUnlessDisabled(t *testing.T) {
	t.Setenv(BinDirEnv, "/cache")
	if o := (Options{}).env(); !o.ShardedListAndWatch || o.BinDir != "/cache" {
		t.Errorf("zero Options: %+v, want the gate on and the cache", o)
	}
	if o := (Options{DisableShardedListAndWatch: true, BinDir: "/x"}).env(); o.ShardedListAndWatch || o.BinDir != "/x" {
		t.Errorf("disabled: %+v", o)
	}
}
