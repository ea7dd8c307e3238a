//go:build integration

package envtestbench

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"path/filepath"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/dynamic"
	"k8s.io/client-go/kubernetes"

	"github.com/opkit/opkit/reconcile"
	"github.com/opkit/opkit/reconcile/envtest"
	"github.com/opkit/opkit/trigger"
)

// The Website operator on binaries laid out as setup-envtest lays them
// out, with a kube-controller-manager from the cache: the CRD's default
// applies, the status is written, a page deleted or edited by hand is put
// back, and a deleted Website's page goes with it (garbage collection).
func TestWebsiteFromKubebuilderAssets(t *testing.T) {
	assets := kubebuilderAssets(t)
	env := envtest.Start(t, envtest.Options{CRDs: []string{crds}, ControllerManager: true})
	if b := env.Binaries(); filepath.Dir(b.APIServer) != assets || filepath.Dir(b.Etcd) != assets ||
		b.ControllerManager == "" || filepath.Dir(b.ControllerManager) == assets {
		t.Fatalf("binaries %+v, want kube-apiserver and etcd from %s and kube-controller-manager from the cache", b, assets)
	}
	ctrl, err := newWebsiteController(env.Config())
	if err != nil {
		t.Fatal(err)
	}
	envtest.Run(t, ctrl)
	ns, ctx := env.Namespace(t), context.Background()
	sites := dynamic.NewForConfigOrDie(env.Config()).Resource(websites.GroupVersionResource).Namespace(ns)
	pages := kubernetes.NewForConfigOrDie(env.Config()).CoreV1().ConfigMaps(ns)

	// No title: the CRD's default, "Welcome", is what the reconciler sees.
	if _, err := sites.Create(ctx, website("home", ""), metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	var first *corev1.ConfigMap
	envtest.Eventually(t, "the page with the defaulted title", func(ctx context.Context) (err error) {
		if first, err = pages.Get(ctx, "home-page", metav1.GetOptions{}); err == nil && first.Data["index.html"] != "<h1>Welcome</h1>" {
			err = fmt.Errorf("page %q", first.Data["index.html"])
		}
		return err
	})
	envtest.Eventually(t, "the status", func(ctx context.Context) error {
		u, err := sites.Get(ctx, "home", metav1.GetOptions{})
		if err != nil {
			return err
		}
		if st, _ := u.Object["status"].(map[string]any); st["page"] != "home-page" || st["observedGeneration"] != u.GetGeneration() {
			return fmt.Errorf("status %v at generation %d", u.Object["status"], u.GetGeneration())
		}
		return nil
	})

	t.Run("a page deleted by hand is recreated", func(t *testing.T) {
		if err := pages.Delete(ctx, "home-page", metav1.DeleteOptions{}); err != nil {
			t.Fatal(err)
		}
		envtest.Eventually(t, "a new page", func(ctx context.Context) error {
			cm, err := pages.Get(ctx, "home-page", metav1.GetOptions{})
			if err == nil && cm.UID == first.UID {
				return errors.New("the deleted page is still there")
			}
			return err
		})
	})
	t.Run("a page edited by hand is put back", func(t *testing.T) {
		cm, err := pages.Get(ctx, "home-page", metav1.GetOptions{})
		if err != nil {
			t.Fatal(err)
		}
		cm.Data["index.html"] = "defaced"
		if _, err := pages.Update(ctx, cm, metav1.UpdateOptions{}); err != nil {
			t.Fatal(err)
		}
		envtest.Eventually(t, "the page restored", func(ctx context.Context) error {
			cm, err := pages.Get(ctx, "home-page", metav1.GetOptions{})
			if err == nil && cm.Data["index.html"] != "<h1>Welcome</h1>" {
				err = fmt.Errorf("page %q", cm.Data["index.html"])
			}
			return err
		})
	})
	t.Run("a deleted Website's page is garbage-collected", func(t *testing.T) {
		cm, err := pages.Get(ctx, "home-page", metav1.GetOptions{})
		if err != nil {
			t.Fatal(err)
		}
		if ref := metav1.GetControllerOf(cm); ref == nil || ref.Kind != "Website" || ref.Name != "home" {
			t.Fatalf("page controlled by %+v, want Website home", ref)
		}
		if err := sites.Delete(ctx, "home", metav1.DeleteOptions{}); err != nil { // background propagation
			t.Fatal(err)
		}
		envtest.Eventually(t, "the page gone", func(ctx context.Context) error {
			if _, err := pages.Get(ctx, "home-page", metav1.GetOptions{}); !apierrors.IsNotFound(err) {
				return fmt.Errorf("page: %v", err)
			}
			return nil
		})
	})
}

// The whole operator assembly (reconcile.Operator with its HTTP trigger
// endpoint) runs as a ServiceAccount with only the RBAC an operator's
// manifest would grant, and the endpoint authenticates a caller's
// ServiceAccount token for its audience with a TokenReview and authorizes
// it with a SubjectAccessReview: refused until RBAC lets the caller
// update Websites, then answered with the reconcile's outcome.
func TestOperatorRunsAsAServiceAccount(t *testing.T) {
	env := envtest.Start(t, envtest.Options{CRDs: []string{crds}})
	ctx := context.Background()
	ns := env.Namespace(t)
	kube := kubernetes.NewForConfigOrDie(env.Config())
	grant(t, kube, ns, "operator", []rbacv1.PolicyRule{
		{APIGroups: []string{"example.com"}, Resources: []string{"websites"}, Verbs: []string{"get", "list", "watch"}},
		{APIGroups: []string{"example.com"}, Resources: []string{"websites/status"}, Verbs: []string{"update"}},
		{APIGroups: []string{""}, Resources: []string{"configmaps"}, Verbs: []string{"get", "list", "watch", "create", "patch"}},
		{APIGroups: []string{"authentication.k8s.io"}, Resources: []string{"tokenreviews"}, Verbs: []string{"create"}},
		{APIGroups: []string{"authorization.k8s.io"}, Resources: []string{"subjectaccessreviews"}, Verbs: []string{"create"}},
	})
	asOperator, err := env.ServiceAccountConfig(ctx, ns, "operator")
	if err != nil {
		t.Fatal(err)
	}
	ctrl, err := newWebsiteController(asOperator)
	if err != nil {
		t.Fatal(err)
	}
	op, err := reconcile.NewOperator(reconcile.OperatorConfig{
		Controllers: []reconcile.Part{ctrl},
		Triggers: &reconcile.TriggerEndpoint{
			Server:  trigger.ServerConfig{Addr: "127.0.0.1:0"},
			Handler: trigger.HandlerConfig{Reviews: kubernetes.NewForConfigOrDie(asOperator)},
		},
	})
	if err != nil {
		t.Fatal(err)
	}
	envtest.Run(t, op) // returns once every component is ready, the endpoint bound
	sites := dynamic.NewForConfigOrDie(env.Config()).Resource(websites.GroupVersionResource).Namespace(ns)
	if _, err := sites.Create(ctx, website("home", "Hello"), metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	envtest.Eventually(t, "the page, written as the operator", func(ctx context.Context) error {
		_, err := kube.CoreV1().ConfigMaps(ns).Get(ctx, "home-page", metav1.GetOptions{})
		return err
	})

	token, err := env.ServiceAccountToken(ctx, ns, "ci", trigger.DefaultAudience)
	if err != nil {
		t.Fatal(err)
	}
	fire := func() (int, string) {
		t.Helper()
		req, err := http.NewRequestWithContext(ctx, http.MethodPost, op.TriggerURL()+"/reconcile/"+ns+"/home?wait=30s", nil)
		if err != nil {
			t.Fatal(err)
		}
		req.Header.Set("Authorization", "Bearer "+token)
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		body, _ := io.ReadAll(resp.Body)
		return resp.StatusCode, string(body)
	}
	if code, body := fire(); code != http.StatusForbidden {
		t.Fatalf("a trigger before RBAC allows it: %d %s, want 403", code, body)
	}
	grant(t, kube, ns, "ci", []rbacv1.PolicyRule{
		{APIGroups: []string{"example.com"}, Resources: []string{"websites"}, Verbs: []string{"update"}},
	})
	var (
		code   int
		body   string
		answer struct{ State string }
	)
	envtest.Eventually(t, "the grant seen by the endpoint", func(context.Context) error {
		// RBAC's authorizer sees the grant within a moment; meanwhile
		// the caller may also spend its share of the trigger budget (429).
		if code, body = fire(); code == http.StatusForbidden || code == http.StatusTooManyRequests {
			return fmt.Errorf("%d %s", code, body)
		}
		return nil
	})
	// The caller waited (?wait=30s) for the reconcile and got its outcome.
	if code != http.StatusOK || json.Unmarshal([]byte(body), &answer) != nil || answer.State != "succeeded" {
		t.Fatalf("a granted trigger: %d %s, want 200 with state succeeded", code, body)
	}
}

// grant binds a ClusterRole with rules to ServiceAccount ns/name.
func grant(t *testing.T, kube kubernetes.Interface, ns, name string, rules []rbacv1.PolicyRule) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	role := ns + "-" + name
	if _, err := kube.RbacV1().ClusterRoles().Create(ctx, &rbacv1.ClusterRole{ObjectMeta: metav1.ObjectMeta{Name: role}, Rules: rules}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	if _, err := kube.RbacV1().ClusterRoleBindings().Create(ctx, &rbacv1.ClusterRoleBinding{
		ObjectMeta: metav1.ObjectMeta{Name: role},
		RoleRef:    rbacv1.RoleRef{APIGroup: rbacv1.GroupName, Kind: "ClusterRole", Name: role},
		Subjects:   []rbacv1.Subject{{Kind: rbacv1.ServiceAccountKind, Namespace: ns, Name: name}},
	}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
}
