package envtest

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
)

// Versions of the binaries that [BuildCommand] (and opkit's
// hack/controlplane.sh, which runs it) builds by default; they name the
// cache directory [DefaultBinDir].
const (
	KubernetesVersion = "v1.37.2"
	EtcdVersion       = "v3.6.16"
)

// cacheNATSVersion is part of the cache directory's name only: opkit's
// hack/controlplane.sh builds nats-server v2.15.2 into the same directory
// for its example, and the directory is shared.
const cacheNATSVersion = "v2.15.2"

// Environment variables that say where the binaries are.
const (
	// AssetsEnv names the directory setup-envtest lays out (kube-apiserver,
	// etcd and kubectl side by side), as controller-runtime's envtest
	// reads it. When set, kube-apiserver and etcd are taken from there.
	AssetsEnv = "KUBEBUILDER_ASSETS"
	// BinDirEnv, when set, replaces the cache directory [DefaultBinDir]
	// (an absolute path).
	BinDirEnv = "OPKIT_CONTROLPLANE_BIN"
)

// BuildCommand builds kube-apiserver, kube-controller-manager and etcd from
// the Go module proxy (no prebuilt binary is downloaded) into
// [DefaultBinDir], where [FindBinaries] looks; it needs only Go, and not
// opkit's repository. About 9 minutes on 2 cores the first time. Add
// -binaries kube-controller-manager to build only that one (the binary
// setup-envtest does not provide), -kubernetes and -etcd for other
// versions, -o for another directory; -h says more.
const BuildCommand = "go run github.com/opkit/opkit/reconcile/envtest/cmd/envtest-build@latest"

// ErrBinariesMissing is wrapped by the errors of [FindBinaries], [New]
// and [Start] when a binary is not where it should be. The message says
// where it looked and which command provides the binary.
var ErrBinariesMissing = errors.New("control plane binaries missing")

// Binaries are the paths of the programs an [Environment] runs.
type Binaries struct {
	APIServer string // kube-apiserver
	Etcd      string // etcd
	// ControllerManager is kube-controller-manager, or "" when it was not
	// asked for and not found.
	ControllerManager string
}

// DefaultBinDir returns the directory [BuildCommand] fills by default:
// $OPKIT_CONTROLPLANE_BIN if set, else
// <user cache dir>/opkit/k8s-<version>_etcd-<version>_nats-<version>/bin
// (~/.cache/opkit/... on Linux). It returns "" when there is no user
// cache dir (neither XDG_CACHE_HOME nor HOME is set).
func DefaultBinDir() string {
	if d := os.Getenv(BinDirEnv); d != "" {
		return d
	}
	cache, err := os.UserCacheDir()
	if err != nil {
		return ""
	}
	return filepath.Join(cache, "opkit",
		fmt.Sprintf("k8s-%s_etcd-%s_nats-%s", KubernetesVersion, EtcdVersion, cacheNATSVersion), "bin")
}

// FindBinaries finds kube-apiserver and etcd, and kube-controller-manager
// when controllerManager is set (else only if it is there):
//
//   - all of them in binDir when it is not empty;
//   - else, when $KUBEBUILDER_ASSETS is set, kube-apiserver and etcd
//     there (the layout `setup-envtest use -p path` prints), and
//     kube-controller-manager there too if present, else in
//     [DefaultBinDir]: setup-envtest does not provide it;
//   - else all of them in [DefaultBinDir], which [BuildCommand] fills.
//
// A missing binary is an error wrapping [ErrBinariesMissing] that says
// where it looked and which command provides it; a directory that is set
// but incomplete is not skipped for the next one. Directories must be
// absolute: tests run in their package's directory.
func FindBinaries(binDir string, controllerManager bool) (Binaries, error) {
	if binDir != "" {
		return findIn(binDir, "Options.BinDir="+binDir, controllerManager,
			fmt.Sprintf("%s -o %s", BuildCommand, binDir))
	}
	cache := DefaultBinDir()
	assets := os.Getenv(AssetsEnv)
	if assets == "" {
		where := "the cache " + cache + " (" + AssetsEnv + " is not set)"
		if os.Getenv(BinDirEnv) != "" {
			where = "$" + BinDirEnv + "=" + cache + " (" + AssetsEnv + " is not set)"
		}
		if cache == "" {
			return Binaries{}, fmt.Errorf("envtest: %w: %s is not set and there is no user cache dir: set HOME, an absolute XDG_CACHE_HOME or %s",
				ErrBinariesMissing, AssetsEnv, BinDirEnv)
		}
		return findIn(cache, where, controllerManager, BuildCommand)
	}
	b, err := findIn(assets, "$"+AssetsEnv+"="+assets, false,
		"setup-envtest use -p path (it prints the directory to set "+AssetsEnv+" to), or unset "+AssetsEnv+" and run "+BuildCommand)
	if err != nil || b.ControllerManager != "" || !controllerManager {
		return b, err
	}
	if cache != "" && filepath.IsAbs(cache) && executable(filepath.Join(cache, "kube-controller-manager")) {
		b.ControllerManager = filepath.Join(cache, "kube-controller-manager")
		return b, nil
	}
	return Binaries{}, fmt.Errorf("envtest: %w: kube-controller-manager is in neither $%s=%s (setup-envtest does not provide it) nor the cache %s: build it with %s -binaries kube-controller-manager",
		ErrBinariesMissing, AssetsEnv, assets, cache, BuildCommand)
}

// findIn looks for the binaries in dir (described by where in errors;
// fix says how to provide them).
func findIn(dir, where string, controllerManager bool, fix string) (Binaries, error) {
	if !filepath.IsAbs(dir) {
		return Binaries{}, fmt.Errorf("envtest: %w: %s is a relative path; tests run in their package's directory: make it absolute",
			ErrBinariesMissing, where)
	}
	b := Binaries{APIServer: filepath.Join(dir, "kube-apiserver"), Etcd: filepath.Join(dir, "etcd")}
	want := []string{b.APIServer, b.Etcd}
	if kcm := filepath.Join(dir, "kube-controller-manager"); controllerManager || executable(kcm) {
		b.ControllerManager = kcm
		want = append(want, kcm)
	}
	var missing []string
	for _, p := range want {
		if !executable(p) {
			missing = append(missing, filepath.Base(p))
		}
	}
	if len(missing) > 0 {
		return Binaries{}, fmt.Errorf("envtest: %w: no %s in %s: %s",
			ErrBinariesMissing, strings.Join(missing, ", "), where, fix)
	}
	return b, nil
}

// executable reports whether path is (a link to) an executable file.
func executable(path string) bool {
	st, err := os.Stat(path)
	return err == nil && !st.IsDir() && st.Mode()&0o111 != 0
}
