package trigger

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net/http/httptest"
	"sync/atomic"
	"testing"
	"testing/synctest"
	"time"

	authnv1 "k8s.io/api/authentication/v1"
	authzv1 "k8s.io/api/authorization/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/client-go/kubernetes/fake"
	clienttesting "k8s.io/client-go/testing"

	"github.com/opkit/opkit"
)

// The authenticator refuses a forged service-account token without a
// TokenReview, and reviews a signed one outside the budget of tokens it
// cannot check: a flood of opaque garbage that spends that budget does not
// lock out a caller with a service-account token.
func TestASignedTokenIsReviewedWhateverTheGarbageAndAForgedOneIsNot(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		key := es256()
		issuer, _ := newTestIssuer(t, key)
		good := key.sign(t, "", claims(nil))
		cs := fake.NewClientset()
		reviews := 0
		cs.PrependReactor("create", "tokenreviews", func(a clienttesting.Action) (bool, runtime.Object, error) {
			reviews++
			tr := a.(clienttesting.CreateAction).GetObject().(*authnv1.TokenReview).DeepCopy()
			if tr.Spec.Token == good {
				tr.Status = authnv1.TokenReviewStatus{Authenticated: true, Audiences: []string{testAudience},
					User: authnv1.UserInfo{Username: "system:serviceaccount:ns:sa"}}
			}
			return true, tr, nil
		})
		cs.PrependReactor("create", "subjectaccessreviews", func(a clienttesting.Action) (bool, runtime.Object, error) {
			sar := a.(clienttesting.CreateAction).GetObject().(*authzv1.SubjectAccessReview).DeepCopy()
			sar.Status.Allowed = true
			return true, sar, nil
		})
		auth, err := NewKubeAuthenticator(KubeAuthConfig{Client: cs, Audiences: []string{testAudience}, TokenReviewRate: 0.001, TokenReviewBurst: 1})
		if err != nil {
			t.Fatal(err)
		}
		auth.(*kubeAuthenticator).issuer = issuer
		ask := func(tok string) error {
			r := httptest.NewRequest("POST", "/", nil)
			r.Header.Set("Authorization", "Bearer "+tok)
			_, err := auth.Authorize(context.Background(), AuthRequest{HTTP: r, Resource: opkit.Resource{}, Key: opkit.Key{Namespace: "ns", Name: "a"}})
			return err
		}
		if err := ask("opaque-1"); !errors.Is(err, ErrUnauthenticated) || reviews != 1 {
			t.Fatalf("an opaque token: %v after %d reviews, want ErrUnauthenticated after 1", err, reviews)
		}
		if err := ask("opaque-2"); !errors.Is(err, ErrBusy) || reviews != 1 {
			t.Fatalf("an opaque token past the budget: %v after %d reviews, want ErrBusy and no review", err, reviews)
		}
		if err := ask(flipLastSignatureByte(good)); !errors.Is(err, ErrUnauthenticated) || reviews != 1 {
			t.Fatalf("a forged token: %v after %d reviews, want ErrUnauthenticated and no review", err, reviews)
		}
		if err := ask(good); err != nil || reviews != 2 {
			t.Fatalf("a signed token with the budget spent: %v after %d reviews, want it reviewed and allowed", err, reviews)
		}
	})
}

// A service account minting token after token gets its tokens reviewed
// within its budget of reviews, not without bound; another's tokens are
// still reviewed.
func TestOneServiceAccountMintingTokensGetsItsReviewBudget(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		var tokenReviews atomic.Int32
		cs := fake.NewClientset()
		cs.PrependReactor("create", "tokenreviews", func(a clienttesting.Action) (bool, runtime.Object, error) {
			tokenReviews.Add(1)
			tr := a.(clienttesting.CreateAction).GetObject().(*authnv1.TokenReview).DeepCopy()
			var c jwtClaims
			_, payload, _, _ := splitJWT(tr.Spec.Token)
			_ = json.Unmarshal(payload, &c)
			tr.Status = authnv1.TokenReviewStatus{Authenticated: true, User: authnv1.UserInfo{Username: c.Sub}, Audiences: []string{testAudience}}
			return true, tr, nil
		})
		cs.PrependReactor("create", "subjectaccessreviews", func(a clienttesting.Action) (bool, runtime.Object, error) {
			sar := a.(clienttesting.CreateAction).GetObject().(*authzv1.SubjectAccessReview).DeepCopy()
			sar.Status.Allowed = true
			return true, sar, nil
		})
		auth, err := NewKubeAuthenticator(KubeAuthConfig{Client: cs, Audiences: []string{testAudience}})
		if err != nil {
			t.Fatal(err)
		}
		a := auth.(*kubeAuthenticator)
		a.issuer, _ = newTestIssuer(t, es256())
		authorize := func(sub string, n int) error {
			tok := es256().sign(t, "", claims(map[string]any{"sub": sub, "jti": fmt.Sprint(n)}))
			r := httptest.NewRequest("POST", "/", nil)
			r.Header.Set("Authorization", "Bearer "+tok)
			_, err := a.Authorize(t.Context(), AuthRequest{HTTP: r, Key: opkit.Key{Namespace: "ns", Name: "a"}, Resource: opkit.Resource{}})
			return err
		}
		minter := "system:serviceaccount:ns:minter"
		accepted := 0
		for n := range 100 {
			if err := authorize(minter, n); err == nil {
				accepted++
			} else if !errors.Is(err, ErrBusy) {
				t.Fatalf("minted token %d: %v, want nil or ErrBusy", n, err)
			}
		}
		// The burst of 10: 9 TokenReviews and one SubjectAccessReview (for the namespace, then cached).
		if n := tokenReviews.Load(); accepted != 9 || n != 9 {
			t.Errorf("100 minted tokens at once: %d accepted, %d TokenReviews, want 9 and 9 (the burst of the account's reviews)", accepted, n)
		}
		if err := authorize("system:serviceaccount:ns:pipeline", 0); err != nil {
			t.Errorf("another service account's token: %v, want it reviewed and allowed", err)
		}
		time.Sleep(time.Second)
		if err := authorize(minter, 1000); err != nil {
			t.Errorf("a second later: %v, want the account's rate to give a review", err)
		}
	})
}
