//go:build integration

package trigger_test

import (
	"context"
	"encoding/base64"
	"slices"
	"strings"
	"testing"
	"time"

	rbacv1 "k8s.io/api/rbac/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"

	"github.com/opkit/opkit/internal/testcluster"
	"github.com/opkit/opkit/trigger"
)

// TestIssuerAgainstTheAPIServer checks tokens the API server minted
// against the keys it publishes, fetched as another ServiceAccount with
// nothing but the default RBAC: Kubernetes binds the ClusterRole
// system:service-account-issuer-discovery to every ServiceAccount.
func TestIssuerAgainstTheAPIServer(t *testing.T) {
	c := testcluster.Shared(t)
	ns := c.Namespace(t)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	admin := kubeAs(t, c.Config())
	crb, err := admin.RbacV1().ClusterRoleBindings().Get(ctx, "system:service-account-issuer-discovery", metav1.GetOptions{})
	if err != nil || !slices.Contains(crb.Subjects, rbacv1.Subject{Kind: "Group", APIGroup: "rbac.authorization.k8s.io", Name: "system:serviceaccounts"}) {
		t.Fatalf("default binding of the issuer discovery: %+v, %v", crb, err)
	}

	keys := issuerKeysAs(t, c.TokenConfig(saToken(ctx, t, c, ns, "operator", ""))) // the operator's own token, for the API server
	tok := saToken(ctx, t, c, ns, "deployer", trigger.DefaultAudience)
	for _, tc := range []struct {
		name string
		tok  string
		want trigger.Verdict
	}{
		{"a token for the trigger", tok, trigger.TokenSigned},
		{"the same with a signature byte changed", changeSignatureByte(t, tok), trigger.TokenForged},
		{"a token for the API server", saToken(ctx, t, c, ns, "deployer", ""), trigger.TokenForged},
		{"a token for another audience", saToken(ctx, t, c, ns, "deployer", "vault"), trigger.TokenForged},
		{"garbage", "not-a-token", trigger.TokenUnknown},
	} {
		if got := trigger.IssuerCheck(keys, ctx, tc.tok); got != tc.want {
			t.Errorf("%s: %d, want %d", tc.name, got, tc.want)
		}
	}
	if err := trigger.IssuerErr(keys); err != nil {
		t.Errorf("fetching the keys as a ServiceAccount: %v", err)
	}

	// A user that is no ServiceAccount may not read them by default: its
	// checks leave every token to the TokenReview.
	userKeys := issuerKeysAs(t, c.UserConfig())
	if got := trigger.IssuerCheck(userKeys, ctx, tok); got != trigger.TokenUnknown {
		t.Errorf("keys fetched as an unprivileged user: %d, want TokenUnknown", got)
	}
	if err := trigger.IssuerErr(userKeys); !apierrors.IsForbidden(err) {
		t.Errorf("fetching the keys as an unprivileged user: %v, want Forbidden", err)
	}
}

// TestIssuerKeysWithAJWKSURIElsewhere checks that the keys are still
// fetched from the API server when its discovery document sends clients
// elsewhere for them (--service-account-jwks-uri, as managed clusters set
// it).
func TestIssuerKeysWithAJWKSURIElsewhere(t *testing.T) {
	c := testcluster.Start(t, testcluster.Options{APIServerFlags: []string{"--service-account-jwks-uri=https://oidc.example.com/keys"}})
	ns := c.Namespace(t)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	operator := c.TokenConfig(saToken(ctx, t, c, ns, "operator", ""))
	disc, err := kubeAs(t, operator).CoreV1().RESTClient().Get().AbsPath("/.well-known/openid-configuration").DoRaw(ctx)
	if err != nil || !strings.Contains(string(disc), `"jwks_uri":"https://oidc.example.com/keys"`) {
		t.Fatalf("discovery: %s (%v), want the jwks_uri set", disc, err)
	}
	keys := issuerKeysAs(t, operator)
	if got := trigger.IssuerCheck(keys, ctx, saToken(ctx, t, c, ns, "deployer", trigger.DefaultAudience)); got != trigger.TokenSigned {
		t.Errorf("a token for the trigger: %d (%v), want TokenSigned", got, trigger.IssuerErr(keys))
	}
}

// saToken returns a token of ServiceAccount ns/sa for audience ("": the
// API server's), creating the ServiceAccount if need be.
func saToken(ctx context.Context, t *testing.T, c *testcluster.Cluster, ns, sa, audience string) string {
	t.Helper()
	tok, err := c.ServiceAccountToken(ctx, ns, sa, audience)
	if err != nil {
		t.Fatal(err)
	}
	return tok
}

func kubeAs(t *testing.T, cfg *rest.Config) *kubernetes.Clientset {
	t.Helper()
	kube, err := kubernetes.NewForConfig(cfg)
	if err != nil {
		t.Fatal(err)
	}
	return kube
}

// issuerKeysAs returns the issuer's keys for the trigger's audience,
// fetched with cfg's credentials.
func issuerKeysAs(t *testing.T, cfg *rest.Config) *trigger.IssuerKeysT {
	t.Helper()
	return trigger.NewIssuerKeys(kubeAs(t, cfg).CoreV1().RESTClient(), []string{trigger.DefaultAudience}, nil)
}

// changeSignatureByte changes the middle byte of tok's signature.
func changeSignatureByte(t *testing.T, tok string) string {
	t.Helper()
	i := strings.LastIndexByte(tok, '.')
	sig, err := base64.RawURLEncoding.DecodeString(tok[i+1:])
	if err != nil {
		t.Fatal(err)
	}
	sig[len(sig)/2] ^= 0x10
	return tok[:i+1] + base64.RawURLEncoding.EncodeToString(sig)
}
