//go:build integration

package envtestbench

import (
	"context"
	"testing"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/dynamic"
	"k8s.io/client-go/kubernetes"

	"github.com/opkit/opkit/reconcile/envtest"
)

// TestWebsite is the integration test docs/guide.md quotes, as it is here.
func TestWebsite(t *testing.T) {
	env := envtest.Start(t, envtest.Options{CRDs: []string{"testdata/crds"}})
	ctrl, err := newWebsiteController(env.Config())
	if err != nil {
		t.Fatal(err)
	}
	envtest.Run(t, ctrl) // until the test ends; returns once the controller is ready
	ns, ctx := env.Namespace(t), context.Background()
	sites := dynamic.NewForConfigOrDie(env.Config()).Resource(websites.GroupVersionResource).Namespace(ns)
	pages := kubernetes.NewForConfigOrDie(env.Config()).CoreV1().ConfigMaps(ns)
	if _, err := sites.Create(ctx, website("home", "Hello"), metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	page := func(ctx context.Context) error {
		_, err := pages.Get(ctx, "home-page", metav1.GetOptions{})
		return err
	}
	envtest.Eventually(t, "the page", page)
	if err := pages.Delete(ctx, "home-page", metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
	envtest.Eventually(t, "the page, repaired", page) // Owns: the page's delete reconciles its Website
}
