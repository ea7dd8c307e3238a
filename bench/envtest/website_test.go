package envtestbench

import (
	"context"
	"html"
	"os"
	"path/filepath"
	"testing"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime/schema"
	corev1ac "k8s.io/client-go/applyconfigurations/core/v1"
	"k8s.io/client-go/dynamic"
	"k8s.io/client-go/rest"

	"github.com/opkit/opkit"
	"github.com/opkit/opkit/reconcile"
	"github.com/opkit/opkit/reconcile/envtest"
	"github.com/opkit/opkit/reconcile/reconciletest"
)

// Website is the custom resource of testdata/crds: a page, kept in a
// ConfigMap "<name>-page" that the Website controls.
type Website struct {
	metav1.TypeMeta   `json:",inline"`
	metav1.ObjectMeta `json:"metadata,omitempty"`
	Spec              struct {
		Title string `json:"title,omitempty"`
	} `json:"spec"`
	Status struct {
		ObservedGeneration int64  `json:"observedGeneration,omitempty"`
		Page               string `json:"page,omitempty"`
	} `json:"status,omitempty"`
}

var (
	websites   = opkit.Resource{GroupVersionResource: schema.GroupVersionResource{Group: "example.com", Version: "v1", Resource: "websites"}, Kind: "Website", Namespaced: true}
	configMaps = opkit.Resource{GroupVersionResource: corev1.SchemeGroupVersion.WithResource("configmaps"), Kind: "ConfigMap", Namespaced: true}
)

// crds is the directory of the Website CRD.
const crds = "testdata/crds"

// websiteReconciler applies each Website's page and records it in the
// status.
type websiteReconciler struct {
	apply  *reconcile.Applier
	status *reconcile.Status[*Website]
}

func (r *websiteReconciler) Reconcile(ctx context.Context, req reconcile.Request[*Website]) (reconcile.Result, error) {
	if req.Type == opkit.Deleted || req.Object.DeletionTimestamp != nil {
		return reconcile.Done(), nil // the garbage collector deletes the page
	}
	w := req.Object
	page := corev1ac.ConfigMap(w.Name+"-page", "").
		WithData(map[string]string{"index.html": "<h1>" + html.EscapeString(w.Spec.Title) + "</h1>"})
	if _, err := r.apply.Apply(ctx, w, configMaps, page); err != nil {
		return reconcile.Done(), err
	}
	_, err := r.status.Update(ctx, w, func(w *Website) error {
		w.Status.Page = w.Name + "-page"
		return nil
	})
	return reconcile.Done(), err
}

// newWebsiteController is the operator's wiring, against cfg.
func newWebsiteController(cfg *rest.Config) (*reconcile.Controller[*Website], error) {
	dyn, err := dynamic.NewForConfig(reconcile.WithClientDefaults(cfg))
	if err != nil {
		return nil, err
	}
	apply, err := reconcile.NewApplier(reconcile.ApplyConfig{Dynamic: dyn, FieldManager: "example.com/websites", Owner: websites})
	if err != nil {
		return nil, err
	}
	status, err := reconcile.NewStatus[*Website](reconcile.StatusConfig{Dynamic: dyn, Resource: websites})
	if err != nil {
		return nil, err
	}
	return reconcile.NewController(reconcile.Config[*Website]{
		Name: "example.com/websites", Resource: websites, Dynamic: dyn, NoEvents: true,
		Reconciler: &websiteReconciler{apply: apply, status: status},
		Owns:       []opkit.Resource{configMaps},
	})
}

// website returns a Website to create; without a title, the CRD's default
// applies.
func website(name, title string) *unstructured.Unstructured {
	spec := map[string]any{}
	if title != "" {
		spec["title"] = title
	}
	return &unstructured.Unstructured{Object: map[string]any{
		"apiVersion": "example.com/v1", "kind": "Website",
		"metadata": map[string]any{"name": name},
		"spec":     spec,
	}}
}

// kubebuilderAssets sets $KUBEBUILDER_ASSETS, for t, to a directory laid
// out as `setup-envtest use -p path` lays it out: kube-apiserver and etcd
// side by side (here links to the binaries envtest-build cached; kubectl,
// which setup-envtest adds, is not needed) and no kube-controller-manager.
// It skips t (a benchmark) or fails it when the cache lacks them.
func kubebuilderAssets(tb testing.TB) string {
	tb.Helper()
	tb.Setenv(envtest.AssetsEnv, "")
	bins, err := envtest.FindBinaries("", true) // the cache

	if err != nil {
		if _, isB := tb.(*testing.B); isB {
			tb.Skip(err)
		}
		tb.Fatal(err)
	}
	dir := tb.TempDir()
	for _, bin := range []string{bins.APIServer, bins.Etcd} {
		if err := os.Symlink(bin, filepath.Join(dir, filepath.Base(bin))); err != nil {
			tb.Fatal(err)
		}
	}
	tb.Setenv(envtest.AssetsEnv, dir)
	return dir
}

// The CRD's schema has exactly the fields of Website: a field added to
// the struct and forgotten in the schema would be pruned by the API
// server without an error.
func TestTheWebsiteCRDMatchesTheGoType(t *testing.T) {
	crd, err := os.ReadFile(filepath.Join(crds, "websites.yaml"))
	if err != nil {
		t.Fatal(err)
	}
	if err := reconciletest.CheckCRD[*Website](crd, "v1"); err != nil {
		t.Fatal(err)
	}
}
