package envtest

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"encoding/pem"
	"errors"
	"fmt"
	"net"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"testing"
)

func TestNamespaceNameIsAUniqueDNSLabel(t *testing.T) {
	label := regexp.MustCompile(`^[a-z0-9]([-a-z0-9]*[a-z0-9])?$`)
	for _, tc := range []struct{ test, prefix string }{
		{"TestSmoke", "testsmoke-"},
		{"TestX/sub_case #2", "testx-sub-case-2-"},
		{"---", "test-"},
		{strings.Repeat("VeryLong", 20), "verylong"},
	} {
		got := namespaceName(tc.test)
		if !label.MatchString(got) || len(got) > 63 {
			t.Errorf("namespaceName(%q) = %q, not a DNS label", tc.test, got)
		}
		if !strings.HasPrefix(got, tc.prefix) {
			t.Errorf("namespaceName(%q) = %q, want prefix %q", tc.test, got, tc.prefix)
		}
		if again := namespaceName(tc.test); again == got {
			t.Errorf("namespaceName(%q) twice = %q both times", tc.test, got)
		}
	}
}

func TestPKIServingCertVerifiesForLoopback(t *testing.T) {
	dir := t.TempDir()
	p, err := writePKI(dir)
	if err != nil {
		t.Fatalf("writePKI: %v", err)
	}
	pool := x509.NewCertPool()
	if !pool.AppendCertsFromPEM(p.caPEM) {
		t.Fatalf("CA PEM does not parse")
	}
	pair, err := tls.LoadX509KeyPair(p.certFile, p.keyFile)
	if err != nil {
		t.Fatalf("load serving pair: %v", err)
	}
	leaf, err := x509.ParseCertificate(pair.Certificate[0])
	if err != nil {
		t.Fatal(err)
	}
	for _, host := range []string{"127.0.0.1", "::1", "localhost"} {
		if _, err := leaf.Verify(x509.VerifyOptions{Roots: pool, DNSName: host}); err != nil {
			t.Errorf("serving cert for %s: %v", host, err)
		}
	}
	if _, err := leaf.Verify(x509.VerifyOptions{Roots: pool, DNSName: "example.com"}); err == nil {
		t.Errorf("serving cert verifies for example.com")
	}
	if _, err := leaf.Verify(x509.VerifyOptions{Roots: x509.NewCertPool(), DNSName: "127.0.0.1"}); err == nil {
		t.Errorf("serving cert verifies without the CA")
	}

	for _, f := range []struct{ path, typ string }{{p.saKeyFile, "EC PRIVATE KEY"}, {p.saPubFile, "PUBLIC KEY"}} {
		data, err := os.ReadFile(f.path)
		if err != nil {
			t.Fatal(err)
		}
		b, _ := pem.Decode(data)
		if b == nil || b.Type != f.typ {
			t.Errorf("%s: PEM block %v, want %s", f.path, b, f.typ)
		}
	}
	tokens, err := os.ReadFile(p.tokenFile)
	if err != nil {
		t.Fatal(err)
	}
	want := p.adminToken + "," + AdminUser + "," + AdminUser + ",\"system:masters\"\n" +
		p.userToken + "," + UnprivilegedUser + "," + UnprivilegedUser + "\n" +
		p.kcmToken + "," + ControllerManagerUser + "," + ControllerManagerUser + ",\"system:masters\"\n"
	if string(tokens) != want {
		t.Errorf("token file:\n%s\nwant:\n%s", tokens, want)
	}
	if p.adminToken == p.userToken || p.kcmToken == p.adminToken || p.kcmToken == p.userToken || len(p.adminToken) < 32 {
		t.Errorf("tokens %q, %q and %q: want distinct random tokens", p.adminToken, p.userToken, p.kcmToken)
	}
}

func TestKubeconfigNamesServerCAUserAndToken(t *testing.T) {
	got := string(kubeconfig("https://127.0.0.1:6443", []byte("CA"), "someone", "tok"))
	for _, want := range []string{
		"server: https://127.0.0.1:6443\n",
		"certificate-authority-data: Q0E=\n",
		"- name: someone\n",
		"user: someone\n",
		"token: tok\n",
		"current-context: opkit\n",
	} {
		if !strings.Contains(got, want) {
			t.Errorf("kubeconfig lacks %q:\n%s", want, got)
		}
	}
}

func TestOptionsDefaultsAndValidation(t *testing.T) {
	o, err := Options{}.withDefaults()
	if err != nil {
		t.Fatalf("zero Options: %v", err)
	}
	if o.APIServers != 1 || o.ReadyTimeout.Seconds() != 60 || o.Logger == nil || o.ShardedListAndWatch || o.ControllerManager {
		t.Errorf("defaults = %+v", o)
	}
	for _, bad := range []Options{{APIServers: -1}, {ReadyTimeout: -1}, {APIServerFlags: []string{"v=4"}}, {APIServerPort: -1}, {APIServerPort: 70000}} {
		if _, err := bad.withDefaults(); err == nil {
			t.Errorf("%+v: no error", bad)
		}
	}
}

func TestAPIServersRunWithShardedListAndWatchOnlyWhenAsked(t *testing.T) {
	const gate = "--feature-gates=ShardedListAndWatch=true"
	for _, tc := range []struct {
		opts Options
		want bool
	}{
		{Options{}, false},
		{Options{ShardedListAndWatch: true}, true},
	} {
		e := &Environment{opts: tc.opts, pki: &pki{}}
		if got := slices.Contains(e.apiServerArgs(6443), gate); got != tc.want {
			t.Errorf("%+v: API server flags contain %s: %v, want %v", tc.opts, gate, got, tc.want)
		}
		if got := e.ShardedListAndWatch(); got != tc.want {
			t.Errorf("%+v: ShardedListAndWatch() = %v, want %v", tc.opts, got, tc.want)
		}
	}
}

// fakeBinaries makes dir hold executables of the given names (scripts that
// fail: nothing here runs them).
func fakeBinaries(t *testing.T, dir string, names ...string) {
	t.Helper()
	for _, n := range names {
		if err := os.WriteFile(filepath.Join(dir, n), []byte("#!/bin/sh\nexit 1\n"), 0o755); err != nil {
			t.Fatal(err)
		}
	}
}

// noAssets clears the variables FindBinaries reads and points the user
// cache dir at an empty temp dir.
func noAssets(t *testing.T) (cache string) {
	t.Helper()
	t.Setenv(AssetsEnv, "")
	t.Setenv(BinDirEnv, "")
	t.Setenv("XDG_CACHE_HOME", t.TempDir())
	cache = DefaultBinDir()
	if err := os.MkdirAll(cache, 0o755); err != nil {
		t.Fatal(err)
	}
	return cache
}

func TestDefaultBinDirIsTheScriptsCache(t *testing.T) {
	xdg := noAssets(t)
	want := filepath.Join(os.Getenv("XDG_CACHE_HOME"), "opkit", "k8s-"+KubernetesVersion+"_etcd-"+EtcdVersion+"_nats-v2.15.2", "bin")
	if xdg != want {
		t.Errorf("DefaultBinDir() = %s, want %s", xdg, want)
	}
	t.Setenv(BinDirEnv, "/somewhere")
	if got := DefaultBinDir(); got != "/somewhere" {
		t.Errorf("DefaultBinDir with %s set = %s", BinDirEnv, got)
	}
	t.Setenv(BinDirEnv, "")
	t.Setenv("XDG_CACHE_HOME", "")
	t.Setenv("HOME", "")
	if got := DefaultBinDir(); got != "" {
		t.Errorf("DefaultBinDir without HOME or XDG_CACHE_HOME = %q, want \"\"", got)
	}
}

func TestFindBinariesLooksInAssetsThenTheCache(t *testing.T) {
	cache := noAssets(t)
	assets := t.TempDir()
	fakeBinaries(t, assets, "kube-apiserver", "etcd", "kubectl") // setup-envtest's layout

	// Nothing anywhere: the error names the cache and the build command.
	_, err := FindBinaries("", false)
	for _, want := range []string{cache, "kube-apiserver", "etcd", BuildCommand, AssetsEnv + " is not set"} {
		if !errors.Is(err, ErrBinariesMissing) || !strings.Contains(err.Error(), want) {
			t.Errorf("empty cache: %v, want ErrBinariesMissing saying %q", err, want)
		}
	}
	fakeBinaries(t, cache, "kube-apiserver", "etcd", "kube-controller-manager")
	b, err := FindBinaries("", true)
	if err != nil || b.APIServer != filepath.Join(cache, "kube-apiserver") || b.ControllerManager != filepath.Join(cache, "kube-controller-manager") {
		t.Errorf("cache: %+v, %v", b, err)
	}

	// KUBEBUILDER_ASSETS comes first; its kube-controller-manager is the
	// cache's, as setup-envtest provides none.
	t.Setenv(AssetsEnv, assets)
	b, err = FindBinaries("", true)
	if err != nil || b.APIServer != filepath.Join(assets, "kube-apiserver") || b.Etcd != filepath.Join(assets, "etcd") ||
		b.ControllerManager != filepath.Join(cache, "kube-controller-manager") {
		t.Errorf("assets: %+v, %v", b, err)
	}
	fakeBinaries(t, assets, "kube-controller-manager")
	if b, err = FindBinaries("", true); err != nil || b.ControllerManager != filepath.Join(assets, "kube-controller-manager") {
		t.Errorf("assets with a controller-manager: %+v, %v", b, err)
	}

	// An explicit dir is all there is.
	dir := t.TempDir()
	fakeBinaries(t, dir, "kube-apiserver", "etcd")
	if b, err = FindBinaries(dir, false); err != nil || b.APIServer != filepath.Join(dir, "kube-apiserver") || b.ControllerManager != "" {
		t.Errorf("BinDir: %+v, %v", b, err)
	}
	if _, err = FindBinaries(dir, true); !errors.Is(err, ErrBinariesMissing) || !strings.Contains(err.Error(), "no kube-controller-manager in Options.BinDir="+dir) {
		t.Errorf("BinDir without a controller-manager: %v", err)
	}
}

// A KUBEBUILDER_ASSETS that lacks a binary is an error, not a reason to
// take another version from the cache.
func TestFindBinariesDoesNotMixAnIncompleteAssetsDir(t *testing.T) {
	cache := noAssets(t)
	fakeBinaries(t, cache, "kube-apiserver", "etcd")
	assets := t.TempDir()
	fakeBinaries(t, assets, "etcd")
	t.Setenv(AssetsEnv, assets)
	_, err := FindBinaries("", false)
	for _, want := range []string{"no kube-apiserver in $" + AssetsEnv + "=" + assets, "setup-envtest use -p path"} {
		if !errors.Is(err, ErrBinariesMissing) || !strings.Contains(err.Error(), want) {
			t.Errorf("%v, want ErrBinariesMissing saying %q", err, want)
		}
	}
	// Without a controller-manager anywhere, asking for one says which
	// command builds it.
	fakeBinaries(t, assets, "kube-apiserver")
	_, err = FindBinaries("", true)
	if !errors.Is(err, ErrBinariesMissing) || !strings.Contains(err.Error(), BuildCommand+" -binaries kube-controller-manager") {
		t.Errorf("no controller-manager: %v", err)
	}
}

func TestFindBinariesRefusesRelativeDirs(t *testing.T) {
	noAssets(t)
	t.Setenv(AssetsEnv, "bin")
	if _, err := FindBinaries("", false); !errors.Is(err, ErrBinariesMissing) || !strings.Contains(err.Error(), "relative") {
		t.Errorf("relative %s: %v", AssetsEnv, err)
	}
	if _, err := FindBinaries("./bin", false); !errors.Is(err, ErrBinariesMissing) || !strings.Contains(err.Error(), "relative") {
		t.Errorf("relative BinDir: %v", err)
	}
}

// New checks what it can before starting anything: with a binary missing,
// a CRD file that does not parse or the fixed port taken, it fails with
// the reason and starts no process (the fake binaries would fail if run)
// and leaves no temp dir.
func TestNewRefusesBadInputBeforeStartingAnything(t *testing.T) {
	noAssets(t)
	tmp := t.TempDir()
	t.Setenv("TMPDIR", tmp)
	bins := t.TempDir()
	fakeBinaries(t, bins, "kube-apiserver", "etcd")
	bad := filepath.Join(t.TempDir(), "bad.yaml")
	if err := os.WriteFile(bad, []byte("apiVersion: apiextensions.k8s.io/v1\nkind: CustomResourceDefinition\nmetadata: [oops\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	taken := l.Addr().(*net.TCPAddr).Port

	for _, tc := range []struct {
		name string
		opts Options
		is   error
		says []string
	}{
		{"missing binary", Options{BinDir: bins, ControllerManager: true}, ErrBinariesMissing,
			[]string{"no kube-controller-manager in Options.BinDir=" + bins, BuildCommand}},
		{"CRD that does not parse", Options{BinDir: bins, CRDs: []string{bad}}, nil, []string{bad, "document 1"}},
		{"port in use", Options{BinDir: bins, APIServerPort: taken}, ErrPortInUse,
			[]string{fmt.Sprintf("127.0.0.1:%d", taken), "address already in use"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			e, err := New(context.Background(), tc.opts)
			if err == nil {
				e.Stop()
				t.Fatal("New succeeded")
			}
			if tc.is != nil && !errors.Is(err, tc.is) {
				t.Errorf("%v, want %v", err, tc.is)
			}
			for _, want := range tc.says {
				if !strings.Contains(err.Error(), want) {
					t.Errorf("%v does not say %q", err, want)
				}
			}
			if left, _ := os.ReadDir(tmp); len(left) > 0 {
				t.Errorf("left in TMPDIR: %v", left)
			}
		})
	}
}

func TestReadCRDs(t *testing.T) {
	dir := t.TempDir()
	write := func(name, data string) string {
		t.Helper()
		p := filepath.Join(dir, name)
		if err := os.MkdirAll(filepath.Dir(p), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(p, []byte(data), 0o600); err != nil {
			t.Fatal(err)
		}
		return p
	}
	crd := func(name string) string {
		return "apiVersion: apiextensions.k8s.io/v1\nkind: CustomResourceDefinition\nmetadata:\n  name: " + name + "\n"
	}
	write("crds/b.yaml", crd("bs.example.com")+"---\n---\n"+crd("cs.example.com"))
	write("crds/a.json", `{"apiVersion": "apiextensions.k8s.io/v1", "kind": "CustomResourceDefinition", "metadata": {"name": "as.example.com"}}`)
	write("crds/kustomization.yaml", "resources: [b.yaml]\n")
	write("crds/README.md", "not read")
	write("crds/nested/d.yaml", crd("ds.example.com"))
	got, err := ReadCRDs(filepath.Join(dir, "crds"))
	if err != nil {
		t.Fatal(err)
	}
	var names []string
	for _, u := range got {
		names = append(names, u.GetName())
	}
	if want := []string{"as.example.com", "bs.example.com", "cs.example.com"}; !slices.Equal(names, want) {
		t.Errorf("ReadCRDs(dir) = %v, want %v (files in name order, not nested dirs)", names, want)
	}

	for _, tc := range []struct{ path, says string }{
		{write("broken.yaml", crd("x.example.com")+"---\nkind: [\n"), "broken.yaml, document 2"},
		{write("beta.yaml", strings.Replace(crd("y.example.com"), "/v1", "/v1beta1", 1)), `"apiextensions.k8s.io/v1beta1"`},
		{write("anonymous.yaml", "apiVersion: apiextensions.k8s.io/v1\nkind: CustomResourceDefinition\n"), "without metadata.name"},
		{write("other.yaml", "apiVersion: v1\nkind: ConfigMap\n"), "holds no apiextensions.k8s.io/v1 CustomResourceDefinition"},
		{write("empty/.keep", ""), "holds no"},
		{filepath.Join(dir, "missing.yaml"), "no such file"},
	} {
		if tc.path == filepath.Join(dir, "empty/.keep") {
			tc.path = filepath.Dir(tc.path)
		}
		if _, err := ReadCRDs(tc.path); err == nil || !strings.Contains(err.Error(), tc.says) {
			t.Errorf("ReadCRDs(%s) = %v, want an error saying %q", tc.path, err, tc.says)
		}
	}
}

// The watchdog removes the dir when the pipe closes, which the kernel does
// when the test binary dies; here the test closes it.
func TestWatchdogRemovesTheDirWhenThePipeCloses(t *testing.T) {
	dir, err := os.MkdirTemp(t.TempDir(), "watched-")
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(dir, "data"), []byte("x"), 0o600); err != nil {
		t.Fatal(err)
	}
	wd, err := startWatchdog(dir)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(dir); err != nil {
		t.Fatalf("the dir before the pipe closed: %v", err)
	}
	wd.stop() // returns once sh exited
	if _, err := os.Stat(dir); !os.IsNotExist(err) {
		t.Fatalf("the dir after the watchdog ended: %v, want not exist", err)
	}
}

func TestTailFileReturnsLastLines(t *testing.T) {
	path := filepath.Join(t.TempDir(), "log")
	if err := os.WriteFile(path, []byte("a\nb\nc\nd\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	if got := tailFile(path, 2); got != "c\nd" {
		t.Errorf("tailFile(2) = %q, want %q", got, "c\nd")
	}
	if got := tailFile(path, 10); got != "a\nb\nc\nd" {
		t.Errorf("tailFile(10) = %q", got)
	}
	if got := tailFile(filepath.Join(t.TempDir(), "missing"), 2); !strings.Contains(got, "no log") {
		t.Errorf("tailFile(missing) = %q", got)
	}
}
