package testcluster

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"encoding/pem"
	"errors"
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
	t.Setenv(BinDirEnv, "")
	o, err := Options{}.withDefaults()
	if err != nil {
		t.Fatalf("zero Options: %v", err)
	}
	if o.APIServers != 1 || o.ReadyTimeout.Seconds() != 60 || o.Logger == nil || o.BinDir != DefaultBinDir() {
		t.Errorf("defaults = %+v", o)
	}
	if !strings.HasSuffix(o.BinDir, filepath.Join("opkit", "k8s-"+KubernetesVersion+"_etcd-"+EtcdVersion+"_nats-"+NATSVersion, "bin")) {
		t.Errorf("default bin dir %s does not match hack/controlplane.sh's layout", o.BinDir)
	}
	for _, bad := range []Options{{APIServers: -1}, {ReadyTimeout: -1}, {APIServerFlags: []string{"v=4"}}} {
		if _, err := bad.withDefaults(); err == nil {
			t.Errorf("%+v: no error", bad)
		}
	}
	t.Setenv(BinDirEnv, "/somewhere")
	if got := DefaultBinDir(); got != "/somewhere" {
		t.Errorf("DefaultBinDir with %s set = %s", BinDirEnv, got)
	}
}

func TestAPIServersRunWithShardedListAndWatchUnlessDisabled(t *testing.T) {
	const gate = "--feature-gates=ShardedListAndWatch=true"
	for _, tc := range []struct {
		opts Options
		want bool
	}{
		{Options{}, true},
		{Options{DisableShardedListAndWatch: true}, false},
	} {
		c := &Cluster{opts: tc.opts, pki: &pki{}}
		if got := slices.Contains(c.apiServerArgs(6443), gate); got != tc.want {
			t.Errorf("%+v: API server flags contain %s: %v, want %v", tc.opts, gate, got, tc.want)
		}
		if got := c.ShardedListAndWatch(); got != tc.want {
			t.Errorf("%+v: ShardedListAndWatch() = %v, want %v", tc.opts, got, tc.want)
		}
	}
}

func TestNewWithoutBinariesSaysHowToBuildThem(t *testing.T) {
	dir := t.TempDir()
	_, err := New(context.Background(), Options{BinDir: dir})
	if !errors.Is(err, ErrBinariesMissing) {
		t.Fatalf("New with empty bin dir: %v, want ErrBinariesMissing", err)
	}
	for _, want := range []string{dir, "kube-apiserver", "kube-controller-manager", "etcd", "hack/controlplane.sh build"} {
		if !strings.Contains(err.Error(), want) {
			t.Errorf("error %q does not mention %q", err, want)
		}
	}
}

// A bin dir the tests would read from somewhere else than where the
// script built, or no cache dir at all, is refused with a reason, not
// reported as binaries to build.
func TestCheckBinariesRefusesRelativeOrMissingDir(t *testing.T) {
	for _, tc := range []struct{ dir, want string }{
		{"bin", "relative"},
		{"./bin", "relative"},
		{"", "no user cache dir"},
	} {
		err := CheckBinaries(tc.dir)
		if !errors.Is(err, ErrBinariesMissing) || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("CheckBinaries(%q) = %v, want ErrBinariesMissing saying %q", tc.dir, err, tc.want)
		}
	}
	t.Setenv(BinDirEnv, "")
	t.Setenv("XDG_CACHE_HOME", "")
	t.Setenv("HOME", "")
	if got := DefaultBinDir(); got != "" {
		t.Errorf("DefaultBinDir without HOME or XDG_CACHE_HOME = %q, want \"\" (the script builds nowhere then)", got)
	}
}

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
