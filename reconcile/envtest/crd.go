package envtest

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strings"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/util/wait"
	"k8s.io/apimachinery/pkg/util/yaml"
	"k8s.io/client-go/dynamic"
)

var crdResource = schema.GroupVersionResource{Group: "apiextensions.k8s.io", Version: "v1", Resource: "customresourcedefinitions"}

// ReadCRDs reads the CustomResourceDefinitions in paths: files, or
// directories whose *.yaml, *.yml and *.json files (not subdirectories)
// are read in name order. A file may hold several YAML documents, or
// JSON. Documents of other kinds (a kustomization.yaml, say) are
// skipped, but a path that yields no CustomResourceDefinition at all, a
// document that does not parse, an apiextensions.k8s.io/v1beta1
// definition (gone since Kubernetes 1.22) and one without a name are
// errors that name the file and the document.
func ReadCRDs(paths ...string) ([]*unstructured.Unstructured, error) {
	var crds []*unstructured.Unstructured
	for _, p := range paths {
		files, err := crdFiles(p)
		if err != nil {
			return nil, err
		}
		found := 0
		for _, f := range files {
			got, err := readCRDFile(f)
			if err != nil {
				return nil, err
			}
			found += len(got)
			crds = append(crds, got...)
		}
		if found == 0 {
			return nil, fmt.Errorf("envtest: read CRDs: %s holds no apiextensions.k8s.io/v1 CustomResourceDefinition", p)
		}
	}
	return crds, nil
}

// crdFiles returns p if it is a file, else the manifest files in it.
func crdFiles(p string) ([]string, error) {
	st, err := os.Stat(p)
	if err != nil {
		return nil, fmt.Errorf("envtest: read CRDs: %w", err)
	}
	if !st.IsDir() {
		return []string{p}, nil
	}
	entries, err := os.ReadDir(p)
	if err != nil {
		return nil, fmt.Errorf("envtest: read CRDs: %w", err)
	}
	var files []string
	for _, e := range entries { // sorted by name
		switch strings.ToLower(filepath.Ext(e.Name())) {
		case ".yaml", ".yml", ".json":
			if !e.IsDir() {
				files = append(files, filepath.Join(p, e.Name()))
			}
		}
	}
	return files, nil
}

func readCRDFile(path string) ([]*unstructured.Unstructured, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, fmt.Errorf("envtest: read CRDs: %w", err)
	}
	defer f.Close()
	dec := yaml.NewYAMLOrJSONDecoder(f, 4096)
	var crds []*unstructured.Unstructured
	for doc := 1; ; doc++ {
		var obj map[string]any
		if err := dec.Decode(&obj); errors.Is(err, io.EOF) {
			return crds, nil
		} else if err != nil {
			return nil, fmt.Errorf("envtest: read CRDs: %s, document %d: %w", path, doc, err)
		}
		if obj == nil {
			continue // an empty document, between two "---"
		}
		u := &unstructured.Unstructured{Object: obj}
		if u.GetKind() != "CustomResourceDefinition" {
			continue
		}
		if gv := u.GetAPIVersion(); gv != "apiextensions.k8s.io/v1" {
			return nil, fmt.Errorf("envtest: read CRDs: %s, document %d: a CustomResourceDefinition of %q, want apiextensions.k8s.io/v1", path, doc, gv)
		}
		if u.GetName() == "" {
			return nil, fmt.Errorf("envtest: read CRDs: %s, document %d: a CustomResourceDefinition without metadata.name", path, doc)
		}
		crds = append(crds, u)
	}
}

// InstallCRDs applies the CustomResourceDefinitions ([ReadCRDs] reads them
// from files) server-side, with field manager "opkit-envtest" so that
// installing one again updates it, through the first running API server,
// and waits until each is Established and every
// version it serves answers a list on every running API server (each
// kube-apiserver starts serving a new CRD on its own, a moment after
// Established). It polls until ctx ends or, without a deadline on ctx, for
// at most a minute; the error then says what it last saw. A
// controller-manager's garbage collector learns of a CRD installed here
// at its next discovery, up to 30 seconds later; those of Options.CRDs it
// knows from its start.
func (e *Environment) InstallCRDs(ctx context.Context, crds ...*unstructured.Unstructured) error {
	if _, ok := ctx.Deadline(); !ok {
		var cancel context.CancelFunc
		ctx, cancel = context.WithTimeout(ctx, time.Minute)
		defer cancel()
	}
	servers := e.running()
	if len(servers) == 0 {
		return errors.New("envtest: install CRDs: no API server is running")
	}
	clients := make([]*dynamic.DynamicClient, len(servers))
	for j, i := range servers {
		var err error
		if clients[j], err = e.unthrottled(i); err != nil {
			return err
		}
	}
	for _, crd := range crds {
		if _, err := clients[0].Resource(crdResource).Apply(ctx, crd.GetName(), crd,
			metav1.ApplyOptions{FieldManager: "opkit-envtest", Force: true}); err != nil {
			return fmt.Errorf("envtest: install CRD %s: %w", crd.GetName(), err)
		}
	}
	for _, crd := range crds {
		var saw string
		err := wait.PollUntilContextCancel(ctx, 100*time.Millisecond, true, func(ctx context.Context) (bool, error) {
			saw = crdUnready(ctx, crd, servers, clients)
			return saw == "", nil
		})
		if err != nil {
			return fmt.Errorf("envtest: CRD %s not ready: %w (last saw %s)", crd.GetName(), err, saw)
		}
	}
	return nil
}

// crdUnready returns what shows that crd is not ready yet, or "" once it
// is Established and each of its served versions answers a list on every
// API server of servers, through clients (one for each of them).
func crdUnready(ctx context.Context, crd *unstructured.Unstructured, servers []int, clients []*dynamic.DynamicClient) string {
	got, err := clients[0].Resource(crdResource).Get(ctx, crd.GetName(), metav1.GetOptions{})
	if err != nil {
		return err.Error()
	}
	conds, _, _ := unstructured.NestedSlice(got.Object, "status", "conditions")
	established := false
	var seen []string
	for _, c := range conds {
		m, _ := c.(map[string]any)
		established = established || m["type"] == "Established" && m["status"] == "True"
		seen = append(seen, fmt.Sprintf("%v=%v (%v)", m["type"], m["status"], m["message"]))
	}
	if !established {
		return "conditions [" + strings.Join(seen, ", ") + "]"
	}
	for _, gvr := range served(crd) {
		for j, c := range clients {
			if _, err := c.Resource(gvr).List(ctx, metav1.ListOptions{Limit: 1}); err != nil {
				return fmt.Sprintf("%s not served by API server %d: %v", gvr, servers[j], err)
			}
		}
	}
	return ""
}

// served returns the resources of a CRD's served versions.
func served(crd *unstructured.Unstructured) []schema.GroupVersionResource {
	group, _, _ := unstructured.NestedString(crd.Object, "spec", "group")
	plural, _, _ := unstructured.NestedString(crd.Object, "spec", "names", "plural")
	versions, _, _ := unstructured.NestedSlice(crd.Object, "spec", "versions")
	var gvrs []schema.GroupVersionResource
	for _, v := range versions {
		m, _ := v.(map[string]any)
		if name, _ := m["name"].(string); name != "" && m["served"] == true {
			gvrs = append(gvrs, schema.GroupVersionResource{Group: group, Version: name, Resource: plural})
		}
	}
	return gvrs
}

// unthrottled returns an admin dynamic client for API server i without
// client-side rate limiting.
func (e *Environment) unthrottled(i int) (*dynamic.DynamicClient, error) {
	cfg := e.ConfigFor(i)
	cfg.QPS, cfg.Burst = -1, 0
	return dynamic.NewForConfig(cfg)
}
