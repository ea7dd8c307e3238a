// Command envtest-build builds the control plane that package envtest runs
// -- kube-apiserver, kube-controller-manager and etcd -- from the Go module
// proxy, into the cache directory where envtest looks for them:
//
//	go run github.com/opkit/opkit/reconcile/envtest/cmd/envtest-build@latest
//
// It needs Go and nothing else: no checkout of opkit, no prebuilt binary,
// no cgo. Kubernetes is built from k8s.io/kubernetes with every staging
// module (k8s.io/api, k8s.io/apiserver, ...) replaced by its published
// v0.x release, in a throwaway module under the cache; etcd from
// go.etcd.io/etcd/server/v3. The first run takes about 9 minutes on 2 cores
// (kube-apiserver 5, kube-controller-manager 4 more, etcd under one); a
// binary already in the directory is kept, so a second run does nothing.
// It prints the directory.
//
//	-binaries kube-controller-manager   only that one (setup-envtest does not provide it)
//	-kubernetes v1.36.3 -etcd v3.6.10   other versions (default: envtest's)
//	-o DIR                              another directory; point Options.BinDir or
//	                                    $OPKIT_CONTROLPLANE_BIN (or, with the three,
//	                                    $KUBEBUILDER_ASSETS) at it
//
// opkit's hack/controlplane.sh runs it, with the same cache.
package main

import (
	"bufio"
	"bytes"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"syscall"
	"time"
)

// Defaults: envtest.KubernetesVersion and envtest.EtcdVersion (a test
// checks that they agree; this command imports nothing but the standard
// library, so that go run compiles it in a moment).
const (
	defaultKubernetes = "v1.37.2"
	defaultEtcd       = "v3.6.16"
	// cacheNATSVersion is part of the cache directory's name, which
	// opkit's hack/controlplane.sh shares (adding nats-server).
	cacheNATSVersion = "v2.15.2"
)

var allBinaries = []string{"etcd", "kube-apiserver", "kube-controller-manager"}

func main() {
	var (
		kubernetes = flag.String("kubernetes", defaultKubernetes, "version of k8s.io/kubernetes (`v1.x.y`)")
		etcd       = flag.String("etcd", defaultEtcd, "version of go.etcd.io/etcd/server/v3 (`v3.x.y`)")
		out        = flag.String("o", "", "directory to build into (default: the cache directory envtest reads for these versions)")
		work       = flag.String("work", "", "directory of the build modules (default: <user cache dir>/opkit/build)")
		binaries   = flag.String("binaries", strings.Join(allBinaries, ","), "comma-separated `names` of the binaries to build")
	)
	flag.Usage = func() {
		fmt.Fprintf(flag.CommandLine.Output(), "usage: envtest-build [flags]\n\n"+
			"Builds kube-apiserver, kube-controller-manager and etcd from the Go module proxy\n"+
			"into the directory where package envtest looks for them, and prints it.\n\n")
		flag.PrintDefaults()
	}
	flag.Parse()
	if flag.NArg() > 0 {
		flag.Usage()
		os.Exit(2)
	}
	b, err := newBuilder(*kubernetes, *etcd, *out, *work, *binaries)
	if err == nil {
		err = b.run()
	}
	if err != nil {
		fmt.Fprintln(os.Stderr, "envtest-build:", err)
		os.Exit(1)
	}
	fmt.Println(b.out)
}

// builder builds the binaries of one invocation.
type builder struct {
	kubernetes, etcd string
	out, work        string
	binaries         []string
}

var (
	kubernetesVersion = regexp.MustCompile(`^v1\.(\d+)\.\d+(-[0-9A-Za-z.-]+)?$`)
	etcdVersion       = regexp.MustCompile(`^v3\.\d+\.\d+(-[0-9A-Za-z.-]+)?$`)
)

func newBuilder(kubernetes, etcd, out, work, binaries string) (*builder, error) {
	b := &builder{kubernetes: kubernetes, etcd: etcd, out: out, work: work}
	if !kubernetesVersion.MatchString(kubernetes) {
		return nil, fmt.Errorf("-kubernetes %q: want a release such as %s", kubernetes, defaultKubernetes)
	}
	if !etcdVersion.MatchString(etcd) {
		return nil, fmt.Errorf("-etcd %q: want a v3 release such as %s", etcd, defaultEtcd)
	}
	for _, name := range strings.Split(binaries, ",") {
		name = strings.TrimSpace(name)
		if !slices.Contains(allBinaries, name) {
			return nil, fmt.Errorf("-binaries: unknown binary %q (want some of %s)", name, strings.Join(allBinaries, ", "))
		}
		if !slices.Contains(b.binaries, name) {
			b.binaries = append(b.binaries, name)
		}
	}
	if b.out == "" || b.work == "" {
		cache, err := os.UserCacheDir()
		if err != nil {
			return nil, fmt.Errorf("no user cache dir (%v): set HOME or an absolute XDG_CACHE_HOME, or give -o and -work", err)
		}
		if b.out == "" {
			b.out = cacheBinDir(cache, kubernetes, etcd)
		}
		if b.work == "" {
			b.work = filepath.Join(cache, "opkit", "build")
		}
	}
	var err error
	if b.out, err = filepath.Abs(b.out); err != nil {
		return nil, err
	}
	if b.work, err = filepath.Abs(b.work); err != nil {
		return nil, err
	}
	return b, nil
}

// cacheBinDir is envtest's cache directory for the versions (envtest's
// DefaultBinDir for its own versions).
func cacheBinDir(cache, kubernetes, etcd string) string {
	if d := os.Getenv("OPKIT_CONTROLPLANE_BIN"); d != "" && kubernetes == defaultKubernetes && etcd == defaultEtcd {
		return d
	}
	return filepath.Join(cache, "opkit", fmt.Sprintf("k8s-%s_etcd-%s_nats-%s", kubernetes, etcd, cacheNATSVersion), "bin")
}

func logf(format string, args ...any) {
	fmt.Fprintf(os.Stderr, "[envtest-build] "+format+"\n", args...)
}

func (b *builder) run() error {
	if _, err := exec.LookPath("go"); err != nil {
		return errors.New("go is not on PATH")
	}
	if err := os.MkdirAll(b.out, 0o755); err != nil {
		return err
	}
	if err := os.MkdirAll(b.work, 0o755); err != nil {
		return err
	}
	// One build at a time per cache: two test runs, or this and
	// hack/controlplane.sh, share the build modules. Each binary is looked
	// for again once the lock is held, so a waiting run reuses what the
	// other one built.
	lock, err := os.OpenFile(filepath.Join(b.work, "build.lock"), os.O_CREATE|os.O_RDWR, 0o644)
	if err != nil {
		return err
	}
	defer lock.Close()
	if err := syscall.Flock(int(lock.Fd()), syscall.LOCK_EX|syscall.LOCK_NB); err != nil {
		logf("another build holds %s: waiting for it", lock.Name())
		if err := syscall.Flock(int(lock.Fd()), syscall.LOCK_EX); err != nil {
			return fmt.Errorf("lock %s: %w", lock.Name(), err)
		}
	}
	if slices.Contains(b.binaries, "etcd") && !b.cached("etcd", b.etcd) {
		if err := b.buildEtcd(); err != nil {
			return err
		}
	}
	k8sModReady := false
	for _, name := range []string{"kube-apiserver", "kube-controller-manager"} {
		if !slices.Contains(b.binaries, name) || b.cached(name, b.kubernetes) {
			continue
		}
		if !k8sModReady {
			if err := b.prepareKubernetes(); err != nil {
				return err
			}
			k8sModReady = true
		}
		if err := b.compile(b.k8sMod(), name, kubernetesLDFlags(b.kubernetes), "k8s.io/kubernetes/cmd/"+name); err != nil {
			return err
		}
	}
	return nil
}

// cached reports whether the binary name (of version) is already in the
// output directory, and if so says so.
func (b *builder) cached(name, version string) bool {
	bin := filepath.Join(b.out, name)
	st, err := os.Stat(bin)
	if err != nil || st.IsDir() || st.Mode()&0o111 == 0 {
		return false
	}
	logf("%s %s: cached at %s", name, version, bin)
	return true
}

// goCmd runs go with args in dir; extra adds to the environment. Its
// output goes to stderr, or, with quiet, into the error only.
func goCmd(dir string, quiet bool, extra []string, args ...string) ([]byte, error) {
	cmd := exec.Command("go", args...)
	cmd.Dir = dir
	// The build modules are their own: no workspace of the caller's.
	cmd.Env = append(os.Environ(), append([]string{"GOWORK=off"}, extra...)...)
	var stdout, stderr bytes.Buffer
	cmd.Stdout = &stdout
	cmd.Stderr = os.Stderr
	if quiet {
		cmd.Stderr = &stderr
	}
	if err := cmd.Run(); err != nil {
		return nil, fmt.Errorf("go %s (in %s): %w\n%s", strings.Join(args, " "), dir, err, stderr.Bytes())
	}
	return stdout.Bytes(), nil
}

// writeModule creates the build module dir, without the go.sum of an
// earlier run, and writes files (name: content) into it.
func writeModule(dir string, files map[string]string) error {
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return err
	}
	_ = os.Remove(filepath.Join(dir, "go.sum"))
	for name, data := range files {
		if err := os.WriteFile(filepath.Join(dir, name), []byte(data), 0o644); err != nil {
			return err
		}
	}
	return nil
}

// buildTimes say how long each build takes, for the log.
var buildTimes = map[string]string{
	"etcd":                    "under a minute",
	"kube-apiserver":          "about 5 minutes cold on 2 cores",
	"kube-controller-manager": "about 4 minutes on 2 cores after kube-apiserver",
}

// compile builds pkg of the build module in dir into the output directory
// as name, linked with ldflags. It writes name.tmp and renames it: an
// interrupted build leaves no file that looks like a built binary.
func (b *builder) compile(dir, name, ldflags, pkg string) error {
	logf("%s: compiling (%s)", name, buildTimes[name])
	start := time.Now()
	bin := filepath.Join(b.out, name)
	if _, err := goCmd(dir, false, []string{"CGO_ENABLED=0"}, "build", "-trimpath", "-ldflags", ldflags,
		"-o", bin+".tmp", pkg); err != nil {
		return fmt.Errorf("%s: %w", name, err)
	}
	if err := os.Rename(bin+".tmp", bin); err != nil {
		return err
	}
	logf("%s: built %s in %v", name, bin, time.Since(start).Round(time.Second))
	return nil
}

func (b *builder) buildEtcd() error {
	mod := filepath.Join(b.work, "etcd-"+b.etcd)
	logf("etcd %s: preparing build module in %s", b.etcd, mod)
	if err := writeModule(mod, map[string]string{"go.mod": etcdGoMod(b.etcd), "main.go": etcdMain}); err != nil {
		return err
	}
	if _, err := goCmd(mod, true, []string{"GOFLAGS=-mod=mod"}, "mod", "tidy"); err != nil {
		return fmt.Errorf("etcd: %w", err)
	}
	return b.compile(mod, "etcd", "-s -w", ".")
}

func etcdGoMod(version string) string {
	return "module opkit.local/controlplane/etcd\n\ngo 1.26\n\nrequire go.etcd.io/etcd/server/v3 " + version + "\n"
}

const etcdMain = `package main

import (
	"os"

	"go.etcd.io/etcd/server/v3/etcdmain"
)

func main() { etcdmain.Main(os.Args) }
`

func (b *builder) k8sMod() string { return filepath.Join(b.work, "kubernetes-"+b.kubernetes) }

// prepareKubernetes writes the build module that requires k8s.io/kubernetes
// with every staging module replaced by its published release, and
// resolves its module graph (once for both binaries: the second build
// reuses most of the first one's compiled packages).
func (b *builder) prepareKubernetes() error {
	mod := b.k8sMod()
	logf("kubernetes %s: preparing build module in %s", b.kubernetes, mod)
	_ = os.Remove(filepath.Join(mod, "tools.go"))
	if err := writeModule(mod, map[string]string{"go.mod": "module opkit.local/controlplane/kubernetes\n\ngo 1.26\n"}); err != nil {
		return err
	}
	logf("kubernetes: fetching k8s.io/kubernetes@%s go.mod", b.kubernetes)
	out, err := goCmd(mod, true, nil, "mod", "download", "-json", "k8s.io/kubernetes@"+b.kubernetes)
	if err != nil {
		return fmt.Errorf("could not download k8s.io/kubernetes@%s from the module proxy: %w", b.kubernetes, err)
	}
	var info struct{ GoMod, Error string }
	if err := json.Unmarshal(out, &info); err != nil || info.GoMod == "" {
		return fmt.Errorf("go mod download k8s.io/kubernetes@%s: no go.mod (%v %s)", b.kubernetes, err, info.Error)
	}
	kgomod, err := os.ReadFile(info.GoMod)
	if err != nil {
		return err
	}
	staged := stagingModules(kgomod)
	if len(staged) == 0 {
		return fmt.Errorf("found no staging replace directives in %s", info.GoMod)
	}
	if err := writeModule(mod, map[string]string{"go.mod": kubernetesGoMod(b.kubernetes, staged), "tools.go": kubernetesTools}); err != nil {
		return err
	}
	logf("kubernetes: replaced %d staging modules with %s; resolving module graph", len(staged), stagingVersion(b.kubernetes))
	if _, err := goCmd(mod, true, []string{"GOFLAGS=-mod=mod"}, "mod", "tidy"); err != nil {
		return fmt.Errorf("kubernetes: %w", err)
	}
	return nil
}

var stagingReplace = regexp.MustCompile(`^\s*(?:replace\s+)?(k8s\.io/\S+)\s+=>\s+\./staging/`)

// stagingModules returns the k8s.io modules that k8s.io/kubernetes's go.mod
// replaces with a staging directory, sorted.
func stagingModules(gomod []byte) []string {
	var mods []string
	sc := bufio.NewScanner(bytes.NewReader(gomod))
	for sc.Scan() {
		if m := stagingReplace.FindStringSubmatch(sc.Text()); m != nil && !slices.Contains(mods, m[1]) {
			mods = append(mods, m[1])
		}
	}
	slices.Sort(mods)
	return mods
}

// stagingVersion is the release of the staging modules that goes with
// Kubernetes v1.x.y: v0.x.y.
func stagingVersion(kubernetes string) string { return "v0" + strings.TrimPrefix(kubernetes, "v1") }

func kubernetesGoMod(kubernetes string, staged []string) string {
	var b strings.Builder
	fmt.Fprintf(&b, "module opkit.local/controlplane/kubernetes\n\ngo 1.26\n\nrequire k8s.io/kubernetes %s\n\nreplace (\n", kubernetes)
	for _, m := range staged {
		fmt.Fprintf(&b, "\t%s => %s %s\n", m, m, stagingVersion(kubernetes))
	}
	b.WriteString(")\n")
	return b.String()
}

const kubernetesTools = `//go:build tools

package tools

import (
	_ "k8s.io/kubernetes/cmd/kube-apiserver"
	_ "k8s.io/kubernetes/cmd/kube-controller-manager"
)
`

// kubernetesLDFlags stamps the version, as Kubernetes' own build does: the
// binaries report it, and kube-apiserver derives its emulated version
// (and so the feature gates it knows) from it.
func kubernetesLDFlags(kubernetes string) string {
	const pkg = "k8s.io/component-base/version"
	minor := kubernetesVersion.FindStringSubmatch(kubernetes)[1]
	return fmt.Sprintf("-s -w -X %[1]s.gitVersion=%[2]s -X %[1]s.gitMajor=1 -X %[1]s.gitMinor=%[3]s -X %[1]s.gitTreeState=clean",
		pkg, kubernetes, minor)
}
