// Package testcluster is how opkit's own integration tests, benchmarks and
// demo take a control plane from the public [envtest] package: always the
// binaries hack/controlplane.sh builds into the cache (never
// $KUBEBUILDER_ASSETS, whose version might lack what the tests need),
// with the alpha feature gate ShardedListAndWatch on unless a test turns
// it off, and a CRD generator for the free-form test resources. Everything
// else is envtest's: a [Cluster] is an [envtest.Environment].
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
// with [Start]; programs (make controlplane, the demo) use [New] and Stop.
package testcluster

import (
	"context"
	"fmt"
	"log/slog"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/client-go/dynamic"

	"github.com/opkit/opkit/reconcile/envtest"
)

// Versions of the binaries hack/controlplane.sh builds; they name the cache
// directory.
const (
	KubernetesVersion = envtest.KubernetesVersion
	EtcdVersion       = envtest.EtcdVersion
	NATSVersion       = "v2.15.2"
)

// BinDirEnv, when set, overrides the directory holding the binaries.
const BinDirEnv = envtest.BinDirEnv

// Users and errors of envtest, under the names the tests know.
const (
	AdminUser             = envtest.AdminUser
	UnprivilegedUser      = envtest.UnprivilegedUser
	ControllerManagerUser = envtest.ControllerManagerUser
)

var (
	ErrBinariesMissing = envtest.ErrBinariesMissing
	ErrStopped         = envtest.ErrStopped
	ErrNoAPIServer     = envtest.ErrNoAPIServer
)

// DefaultBinDir returns where hack/controlplane.sh caches the binaries
// (envtest's cache directory): $OPKIT_CONTROLPLANE_BIN if set, else
// <user cache dir>/opkit/k8s-<v>_etcd-<v>_nats-<v>/bin; "" without a user
// cache dir.
func DefaultBinDir() string { return envtest.DefaultBinDir() }

// CheckBinaries returns an error wrapping ErrBinariesMissing unless dir
// holds executable kube-apiserver, kube-controller-manager, etcd and
// nats-server binaries (the last for the example's end-to-end test and
// demo), all that hack/controlplane.sh builds. Its message tells how to
// build them.
func CheckBinaries(dir string) error {
	if dir == "" {
		return fmt.Errorf("%w: no user cache dir (set HOME, or an absolute XDG_CACHE_HOME, or %s)", ErrBinariesMissing, BinDirEnv)
	}
	if _, err := envtest.FindBinaries(dir, true); err != nil {
		return fmt.Errorf("%w (run `make test` or hack/controlplane.sh build)", err)
	}
	if st, err := os.Stat(filepath.Join(dir, "nats-server")); err != nil || st.IsDir() || st.Mode()&0o111 == 0 {
		return fmt.Errorf("%w: no nats-server in %s: run `make test` or hack/controlplane.sh build", ErrBinariesMissing, dir)
	}
	return nil
}

// Options configure a cluster: envtest's, with the binaries taken from
// DefaultBinDir and the feature gate ShardedListAndWatch on by default.
type Options struct {
	// BinDir holds the binaries. Default: DefaultBinDir().
	BinDir string
	// APIServers, ReadyTimeout, DisableWatchCache, ControllerManager and
	// APIServerFlags are envtest.Options'.
	APIServers        int
	ReadyTimeout      time.Duration
	DisableWatchCache bool
	ControllerManager bool
	APIServerFlags    []string
	// DisableShardedListAndWatch starts the API servers without the alpha
	// feature gate ShardedListAndWatch, which they otherwise run with:
	// they then ignore ListOptions.ShardSelector altogether. Tests of a
	// client-side fallback set this.
	DisableShardedListAndWatch bool
	// Logger receives progress messages (default: none).
	Logger *slog.Logger
}

func (o Options) env() envtest.Options {
	if o.BinDir == "" {
		o.BinDir = DefaultBinDir()
	}
	return envtest.Options{
		BinDir:              o.BinDir,
		APIServers:          o.APIServers,
		ReadyTimeout:        o.ReadyTimeout,
		DisableWatchCache:   o.DisableWatchCache,
		ShardedListAndWatch: !o.DisableShardedListAndWatch,
		ControllerManager:   o.ControllerManager,
		APIServerFlags:      o.APIServerFlags,
		Logger:              o.Logger,
	}
}

// Cluster is a running control plane: an envtest.Environment, plus the
// helpers below.
type Cluster struct {
	*envtest.Environment
	binDir string
}

func wrap(e *envtest.Environment, opts envtest.Options) *Cluster {
	return &Cluster{Environment: e, binDir: opts.BinDir}
}

// New starts a cluster; the caller must Stop it.
func New(ctx context.Context, opts Options) (*Cluster, error) {
	eo := opts.env()
	e, err := envtest.New(ctx, eo)
	if err != nil {
		return nil, err
	}
	return wrap(e, eo), nil
}

// Start starts a private cluster for t, stopped at t's cleanup.
func Start(t testing.TB, opts Options) *Cluster {
	t.Helper()
	eo := opts.env()
	return wrap(envtest.Start(t, eo), eo)
}

// Main is the body of a test binary's TestMain: envtest.Main with the
// shared cluster's options, after checking that every binary
// hack/controlplane.sh builds is there.
func Main(m *testing.M) {
	if err := CheckBinaries(DefaultBinDir()); err != nil {
		fmt.Fprintf(os.Stderr, "testcluster: %v\n", err)
		os.Exit(1)
	}
	envtest.Main(m, Options{}.env())
}

// Shared returns the test binary's shared cluster (see envtest.Shared).
func Shared(t testing.TB) *Cluster {
	t.Helper()
	return wrap(envtest.Shared(t), Options{}.env())
}

// BinDir returns the directory the binaries were taken from; nats-server is
// there too.
func (c *Cluster) BinDir() string { return c.binDir }

// Dynamic returns an admin dynamic client for API server 0, failing t if
// it cannot be built.
func (c *Cluster) Dynamic(t testing.TB) *dynamic.DynamicClient {
	t.Helper()
	d, err := dynamic.NewForConfig(c.Config())
	if err != nil {
		t.Fatal(err)
	}
	return d
}

// CRD describes a test custom resource for [Cluster.InstallCRD]. Its spec
// and status are free-form (x-kubernetes-preserve-unknown-fields) and
// status is a subresource, so metadata.generation follows spec changes only,
// as with a real operator's CRD.
type CRD struct {
	// Resource is group, version and plural, e.g. widgets.test.opkit.dev/v1.
	Resource schema.GroupVersionResource
	// Kind is the object kind, e.g. "Widget"; its list kind is Kind+"List".
	Kind string
	// Namespaced selects the scope; false means cluster-scoped.
	Namespaced bool
}

// Object returns the CustomResourceDefinition.
func (crd CRD) Object() *unstructured.Unstructured {
	scope := "Cluster"
	if crd.Namespaced {
		scope = "Namespaced"
	}
	free := map[string]any{"type": "object", "x-kubernetes-preserve-unknown-fields": true}
	return &unstructured.Unstructured{Object: map[string]any{
		"apiVersion": "apiextensions.k8s.io/v1",
		"kind":       "CustomResourceDefinition",
		"metadata":   map[string]any{"name": crd.Resource.Resource + "." + crd.Resource.Group},
		"spec": map[string]any{
			"group": crd.Resource.Group,
			"scope": scope,
			"names": map[string]any{
				"plural": crd.Resource.Resource, "singular": strings.ToLower(crd.Kind),
				"kind": crd.Kind, "listKind": crd.Kind + "List",
			},
			"versions": []any{map[string]any{
				"name": crd.Resource.Version, "served": true, "storage": true,
				"subresources": map[string]any{"status": map[string]any{}},
				"schema": map[string]any{"openAPIV3Schema": map[string]any{
					"type":       "object",
					"properties": map[string]any{"spec": free, "status": free},
				}},
			}},
		},
	}}
}

// InstallCRD installs crd and waits until every running API server serves
// it (see envtest.Environment.InstallCRDs).
func (c *Cluster) InstallCRD(ctx context.Context, crd CRD) error {
	return c.InstallCRDs(ctx, crd.Object())
}
