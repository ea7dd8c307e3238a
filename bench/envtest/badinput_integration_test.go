//go:build integration

package envtestbench

import (
	"context"
	"errors"
	"fmt"
	"net"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"

	"github.com/opkit/opkit/reconcile/envtest"
)

// Bad input fails New with an error that says what is wrong and how to fix
// it, and leaves nothing behind: no child process of this test binary and
// nothing in TMPDIR (where environments make their temp dirs), whether
// the failure came before anything started or after the control plane
// was up (the CRD the API server refuses).
func TestBadInputLeavesNothingBehind(t *testing.T) {
	assets := kubebuilderAssets(t)
	dir := t.TempDir()
	write := func(name, data string) string {
		p := filepath.Join(dir, name)
		if err := os.WriteFile(p, []byte(data), 0o600); err != nil {
			t.Fatal(err)
		}
		return p
	}
	onlyEtcd := filepath.Join(dir, "only-etcd")
	if err := os.Mkdir(onlyEtcd, 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.Symlink(filepath.Join(assets, "etcd"), filepath.Join(onlyEtcd, "etcd")); err != nil {
		t.Fatal(err)
	}
	emptyCache := filepath.Join(dir, "empty-cache")
	if err := os.Mkdir(emptyCache, 0o755); err != nil {
		t.Fatal(err)
	}
	unparsable := write("unparsable.yaml", "apiVersion: apiextensions.k8s.io/v1\nkind: CustomResourceDefinition\nmetadata:\n  name: [oops\n")
	refused := write("refused.yaml", `apiVersion: apiextensions.k8s.io/v1
kind: CustomResourceDefinition
metadata:
  name: gadgets.example.com
spec:
  group: example.com
  scope: Everywhere
  names: {plural: gadgets, kind: Gadget}
  versions: [{name: v1, served: true, storage: true, schema: {openAPIV3Schema: {type: object}}}]
`)
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	taken := l.Addr().(*net.TCPAddr).Port

	for _, tc := range []struct {
		name string
		env  map[string]string
		opts envtest.Options
		is   error
		says []string
	}{
		{name: "kube-apiserver missing from KUBEBUILDER_ASSETS", env: map[string]string{envtest.AssetsEnv: onlyEtcd},
			is: envtest.ErrBinariesMissing, says: []string{"no kube-apiserver in $KUBEBUILDER_ASSETS=" + onlyEtcd, "setup-envtest use -p path", envtest.BuildCommand}},
		{name: "kube-controller-manager in neither KUBEBUILDER_ASSETS nor the cache", env: map[string]string{envtest.BinDirEnv: emptyCache},
			opts: envtest.Options{ControllerManager: true}, is: envtest.ErrBinariesMissing,
			says: []string{"kube-controller-manager is in neither $KUBEBUILDER_ASSETS=" + assets, emptyCache, envtest.BuildCommand + " -binaries kube-controller-manager"}},
		{name: "CRD file that does not parse", opts: envtest.Options{CRDs: []string{unparsable}},
			says: []string{unparsable, "document 1"}},
		{name: "CRD the API server refuses", opts: envtest.Options{CRDs: []string{refused}},
			says: []string{"install CRD gadgets.example.com", "spec.scope"}},
		{name: "port in use", opts: envtest.Options{APIServerPort: taken},
			is: envtest.ErrPortInUse, says: []string{"127.0.0.1:" + strconv.Itoa(taken), "address already in use"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			tmp := t.TempDir()
			t.Setenv("TMPDIR", tmp)
			for k, v := range tc.env {
				t.Setenv(k, v)
			}
			e, err := envtest.New(context.Background(), tc.opts)
			if err == nil {
				e.Stop()
				t.Fatal("New succeeded")
			}
			t.Logf("New: %v", err)
			if tc.is != nil && !errors.Is(err, tc.is) {
				t.Errorf("error %v, want %v", err, tc.is)
			}
			for _, want := range tc.says {
				if !strings.Contains(err.Error(), want) {
					t.Errorf("error does not say %q", want)
				}
			}
			if kids := children(t); len(kids) > 0 {
				t.Errorf("child processes left: %v", kids)
			}
			if left, _ := os.ReadDir(tmp); len(left) > 0 {
				t.Errorf("left in TMPDIR: %v", left)
			}
		})
	}
}

// children returns "pid: command line" of every process whose parent is
// this test binary. Stop waits for its processes, so there is no delay to
// allow for.
func children(t *testing.T) []string {
	t.Helper()
	entries, err := os.ReadDir("/proc")
	if err != nil {
		t.Fatalf("read /proc: %v", err)
	}
	me := strconv.Itoa(os.Getpid())
	var found []string
	for _, e := range entries {
		stat, err := os.ReadFile(filepath.Join("/proc", e.Name(), "stat"))
		if err != nil || e.Name()[0] < '0' || e.Name()[0] > '9' {
			continue
		}
		// pid (comm) state ppid ...: comm may hold spaces, so split after ')'.
		rest := string(stat[strings.LastIndexByte(string(stat), ')')+1:])
		if f := strings.Fields(rest); len(f) > 1 && f[1] == me {
			cmdline, _ := os.ReadFile(filepath.Join("/proc", e.Name(), "cmdline"))
			found = append(found, fmt.Sprintf("%s: %.100s", e.Name(), strings.ReplaceAll(string(cmdline), "\x00", " ")))
		}
	}
	return found
}
