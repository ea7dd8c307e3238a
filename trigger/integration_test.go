//go:build integration

package trigger_test

import (
	"context"
	"encoding/json"
	"net/http"
	"net/http/httptest"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"

	"github.com/opkit/opkit/internal/testcluster"
	"github.com/opkit/opkit/trigger"
)

func TestMain(m *testing.M) { testcluster.Main(m) }

// grantTrigger lets the ServiceAccounts sas of ns trigger the namespace's
// ConfigMaps: update on configmaps, the handler's default
// SubjectAccessReview.
func grantTrigger(ctx context.Context, t *testing.T, kube kubernetes.Interface, ns string, sas ...string) {
	t.Helper()
	var subjects []rbacv1.Subject
	for _, sa := range sas {
		subjects = append(subjects, rbacv1.Subject{Kind: "ServiceAccount", Name: sa, Namespace: ns})
	}
	if _, err := kube.RbacV1().Roles(ns).Create(ctx, &rbacv1.Role{
		ObjectMeta: metav1.ObjectMeta{Name: "trigger-configmaps"},
		Rules:      []rbacv1.PolicyRule{{APIGroups: []string{""}, Resources: []string{"configmaps"}, Verbs: []string{"update"}}},
	}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	if _, err := kube.RbacV1().RoleBindings(ns).Create(ctx, &rbacv1.RoleBinding{
		ObjectMeta: metav1.ObjectMeta{Name: "trigger-configmaps"},
		RoleRef:    rbacv1.RoleRef{APIGroup: "rbac.authorization.k8s.io", Kind: "Role", Name: "trigger-configmaps"},
		Subjects:   subjects,
	}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
}

// TestHandlerAuthAgainstTheAPIServer runs the default authenticator against
// a real kube-apiserver: TokenReview with the trigger audience and a
// SubjectAccessReview decided by real RBAC.
func TestHandlerAuthAgainstTheAPIServer(t *testing.T) {
	c := testcluster.Shared(t)
	ns := c.Namespace(t)
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()

	kube, err := kubernetes.NewForConfig(c.Config())
	if err != nil {
		t.Fatal(err)
	}
	dyn := c.Dynamic(t)
	if _, err := kube.CoreV1().ConfigMaps(ns).Create(ctx, &corev1.ConfigMap{ObjectMeta: metav1.ObjectMeta{Name: "target"}}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	grantTrigger(ctx, t, kube, ns, "deployer")
	allowedTok, err := c.ServiceAccountToken(ctx, ns, "deployer", trigger.DefaultAudience)
	if err != nil {
		t.Fatal(err)
	}
	deniedTok, err := c.ServiceAccountToken(ctx, ns, "bystander", trigger.DefaultAudience)
	if err != nil {
		t.Fatal(err)
	}
	apiServerTok, err := c.ServiceAccountToken(ctx, ns, "deployer", "") // the API server's own audience
	if err != nil {
		t.Fatal(err)
	}

	// RBAC grants reach the authorizer asynchronously; a tiny negative TTL
	// lets the test poll for the grant instead of waiting out the cache.
	auth, err := trigger.NewKubeAuthenticator(trigger.KubeAuthConfig{Client: kube, NegativeTTL: time.Nanosecond})
	if err != nil {
		t.Fatal(err)
	}
	tr, q := newCMTriggerWith(t, trigger.Config[*corev1.ConfigMap]{Dynamic: dyn})
	h, err := trigger.NewHandler(tr, trigger.HandlerConfig{Authenticator: auth})
	if err != nil {
		t.Fatal(err)
	}
	call := func(tok, target string) *httptest.ResponseRecorder {
		r := httptest.NewRequest(http.MethodPost, target, nil)
		if tok != "" {
			r.Header.Set("Authorization", "Bearer "+tok)
		}
		w := httptest.NewRecorder()
		h.ServeHTTP(w, r)
		return w
	}
	target := "/reconcile/" + ns + "/target"

	deadline := time.Now().Add(60 * time.Second)
	var w *httptest.ResponseRecorder
	for {
		w = call(allowedTok, target)
		if w.Code == http.StatusAccepted || time.Now().After(deadline) {
			break
		}
		if w.Code != http.StatusForbidden {
			t.Fatalf("allowed ServiceAccount: %d %s", w.Code, w.Body)
		}
		time.Sleep(200 * time.Millisecond) // waiting for the RBAC grant to propagate
	}
	if w.Code != http.StatusAccepted {
		t.Fatalf("allowed ServiceAccount never got 202: %d %s", w.Code, w.Body)
	}
	var acc trigger.Accepted
	if err := json.Unmarshal(w.Body.Bytes(), &acc); err != nil || acc.UID == "" || acc.ResourceVersion == "" {
		t.Fatalf("202 body %s: %v", w.Body, err)
	}
	it, err := q.Get(ctx)
	if err != nil || it.Value.Object.Name != "target" || string(it.Value.Object.UID) != acc.UID {
		t.Fatalf("queued %+v (%v), want the re-fetched target", it.Value.Object, err)
	}
	q.Done(it.Key)

	wantStatus(t, call(deniedTok, target), http.StatusForbidden, "Forbidden")
	wantStatus(t, call("not-a-token", target), http.StatusUnauthorized, "Unauthorized")
	wantStatus(t, call(apiServerTok, target), http.StatusUnauthorized, "Unauthorized")
	wantStatus(t, call("", target), http.StatusUnauthorized, "Unauthorized")
	// The deployer may trigger, but the object must exist.
	wantStatus(t, call(allowedTok, "/reconcile/"+ns+"/missing"), http.StatusNotFound, "NotFound")
	if q.Len() != 0 {
		t.Errorf("queue holds %d entries after refused requests", q.Len())
	}
}
