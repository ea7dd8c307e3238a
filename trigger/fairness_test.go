package trigger_test

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"testing/synctest"
	"time"

	authnv1 "k8s.io/api/authentication/v1"

	"github.com/opkit/opkit"
	"github.com/opkit/opkit/trigger"
)

// A grant for every object of the namespace answers for every name: a
// caller naming random objects costs one SubjectAccessReview, not one
// per name.
func TestAGrantForTheNamespaceAnswersForEveryName(t *testing.T) {
	rev := newFakeReviews(t)
	rev.allowed["system:serviceaccount:ci:deployer update /configmaps/ ns/"] = true
	a, err := trigger.NewKubeAuthenticator(trigger.KubeAuthConfig{Client: rev})
	if err != nil {
		t.Fatal(err)
	}
	for i := range 50 {
		if err := authorize(a, context.Background(), "good-token", fmt.Sprintf("random-%d", i)); err != nil {
			t.Fatal(err)
		}
	}
	if tr, sar := rev.calls(); tr != 1 || sar != 1 {
		t.Errorf("50 names made %d TokenReviews and %d SARs, want 1 and 1", tr, sar)
	}
}

// A caller allowed only on named objects gets AccessReviewBurst reviews
// at once (the namespace's among them) and AccessReviewRate a second
// after that: random names, or namespaces, cost the API server a bounded
// number of reviews, and another caller's budget is its own.
func TestReviewsOfSingleObjectsAreBoundedPerCaller(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		rev := newFakeReviews(t)
		rev.allowed["system:serviceaccount:ci:intruder update /configmaps/ ns/"] = true
		a, err := trigger.NewKubeAuthenticator(trigger.KubeAuthConfig{Client: rev, AccessReviewRate: 2, AccessReviewBurst: 4})
		if err != nil {
			t.Fatal(err)
		}
		refused := 0
		for i := range 20 {
			err := authorize(a, context.Background(), "good-token", fmt.Sprintf("random-%d", i))
			switch {
			case errors.Is(err, trigger.ErrBusy):
				refused++
			case !errors.Is(err, trigger.ErrForbidden):
				t.Fatalf("random-%d: %v, want ErrForbidden or ErrBusy", i, err)
			}
		}
		if _, sar := rev.calls(); refused != 17 || sar != 4 {
			t.Fatalf("20 random names: %d refused, %d SARs; want 17 and 4 (the burst: the namespace's, then 3 names)", refused, sar)
		}
		r := httptest.NewRequest(http.MethodPost, "/", nil)
		r.Header = bearer("good-token")
		if _, err := a.Authorize(context.Background(), trigger.AuthRequest{HTTP: r, Resource: configMaps, Key: opkit.Key{Namespace: "random-ns", Name: "a"}}); !errors.Is(err, trigger.ErrBusy) {
			t.Fatalf("another namespace with the budget spent: %v, want ErrBusy", err)
		}
		if _, sar := rev.calls(); sar != 4 {
			t.Fatalf("%d SARs after a namespace refused for the budget, want still 4", sar)
		}
		if err := authorize(a, context.Background(), "other-token", "random-0"); err != nil {
			t.Fatalf("another caller, allowed in the namespace: %v", err)
		}
		time.Sleep(time.Second)
		if err := authorize(a, context.Background(), "good-token", "random-100"); !errors.Is(err, trigger.ErrForbidden) {
			t.Fatalf("a second later: %v, want a review (ErrForbidden)", err)
		}
	})
}

// Tokens the authenticator cannot check itself share TokenReviewBurst
// reviews (TokenReviewRate a second after that): garbage from any number
// of addresses costs a bounded number of TokenReviews, and a token already
// reviewed still passes.
func TestReviewsOfUncheckedTokensShareOneBudget(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		rev := newFakeReviews(t)
		rev.allowed["system:serviceaccount:ci:deployer update /configmaps/ ns/"] = true
		a, err := trigger.NewKubeAuthenticator(trigger.KubeAuthConfig{Client: rev, TokenReviewRate: 5, TokenReviewBurst: 10})
		if err != nil {
			t.Fatal(err)
		}
		if err := authorize(a, context.Background(), "good-token", "a"); err != nil {
			t.Fatal(err)
		}
		busy := 0
		for i := range 100 {
			r := httptest.NewRequest(http.MethodPost, "/", nil)
			r.RemoteAddr = fmt.Sprintf("10.0.%d.%d:1000", i/250, i%250)
			r.Header = bearer(fmt.Sprintf("garbage-%d", i))
			if _, err := a.Authorize(context.Background(), trigger.AuthRequest{HTTP: r, Resource: configMaps}); errors.Is(err, trigger.ErrBusy) {
				busy++
			} else if !errors.Is(err, trigger.ErrUnauthenticated) {
				t.Fatalf("garbage-%d: %v", i, err)
			}
		}
		if tr, _ := rev.calls(); tr != 10 || busy != 91 {
			t.Fatalf("100 garbage tokens from 100 addresses: %d TokenReviews, %d refused busy; want 10 (1 + 9 left of the burst) and 91", tr, busy)
		}
		if err := authorize(a, context.Background(), "good-token", "b"); err != nil {
			t.Fatalf("a reviewed token while the budget is spent: %v", err)
		}
	})
}

// A caller whose token was authorized before is not refused because its
// address keeps failing authentication (a neighbour behind the same NAT
// or node), even once its token's review is no longer cached: the address
// gate refuses only requests it cannot tell apart.
func TestAKnownCallerIsNotRefusedForItsNeighboursFailures(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		rev := newFakeReviews(t)
		rev.allowed["system:serviceaccount:ci:deployer update /configmaps/ ns/"] = true
		auth, err := trigger.NewKubeAuthenticator(trigger.KubeAuthConfig{Client: rev, PositiveTTL: time.Second, MaxAuthFailures: 3, AuthFailureBackoff: 10 * time.Second})
		if err != nil {
			t.Fatal(err)
		}
		e := newHandlerEnv(t, func(c *trigger.HandlerConfig) { c.Authenticator = auth })
		from := func(tok string) *httptest.ResponseRecorder { return postFrom(e, "10.0.0.1:1000", tok) }
		if w := from("good-token"); w.Code != http.StatusAccepted {
			t.Fatalf("first trigger: %d %s", w.Code, w.Body)
		}
		time.Sleep(time.Second) // its review's PositiveTTL
		for i := range 3 {
			wantStatus(t, from(fmt.Sprintf("garbage-%d", i)), 401, "Unauthorized")
		}
		wantStatus(t, from("garbage-3"), 429, "TooManyRequests")
		if w := from("good-token"); w.Code != http.StatusAccepted {
			t.Fatalf("the known caller behind the failing address: %d %s", w.Code, w.Body)
		}
		wantStatus(t, from("garbage-4"), 429, "TooManyRequests")
	})
}

// A neighbour behind a flooder's address (a NAT, a node) whose token
// rotated is not locked out: a new token signed by the cluster's
// service-account issuer costs only its own user's reviews, so it passes
// the address gate the flooder's failures closed. A new token the
// authenticator cannot check would spend the shared budget: it is still
// refused, and so is the flooder.
func TestANewSignedTokenPassesTheGateItsNeighboursFailuresClosed(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		const neighbour = "system:serviceaccount:ci:pipeline"
		rev := newFakeReviews(t)
		rev.allowed[neighbour+" update /configmaps/ ns/"] = true
		// The shared budget holds the flooder's 10 failures (the gate's
		// default), the neighbour's user 2 reviews: a TokenReview and a
		// SubjectAccessReview.
		auth, err := trigger.NewKubeAuthenticator(trigger.KubeAuthConfig{Client: rev, TokenReviewRate: 0.001, TokenReviewBurst: 10, AccessReviewBurst: 2})
		if err != nil {
			t.Fatal(err)
		}
		mint := trigger.SignedTokens(t, auth)
		newToken := func() string {
			tok := mint(neighbour)
			rev.tokens[tok] = authnv1.TokenReviewStatus{Authenticated: true, Audiences: []string{trigger.DefaultAudience}, User: authnv1.UserInfo{Username: neighbour}}
			return tok
		}
		e := newHandlerEnv(t, func(c *trigger.HandlerConfig) { c.Authenticator = auth })
		from := func(tok string) *httptest.ResponseRecorder { return postFrom(e, "10.0.0.1:1000", tok) }
		wantGated := func(who, tok string) {
			t.Helper()
			if st := wantStatus(t, from(tok), 429, "TooManyRequests"); !strings.Contains(st.Message, "failed authentications") {
				t.Errorf("%s: %q, want the address's failed authentications as the reason", who, st.Message)
			}
		}
		for i := range 10 {
			wantStatus(t, from(fmt.Sprintf("garbage-%d", i)), 401, "Unauthorized")
		}
		wantGated("the flooder", "garbage-10")

		before, _ := rev.calls()
		if w := from(newToken()); w.Code != http.StatusAccepted {
			t.Fatalf("the neighbour's new signed token: %d %s, want 202", w.Code, w.Body)
		}
		if after, _ := rev.calls(); after != before+1 {
			t.Errorf("the neighbour's new signed token made %d TokenReviews, want 1", after-before)
		}
		// Its review was its user's: the user's budget is spent, the
		// shared one (which the flooder spent) was not needed.
		if st := wantStatus(t, from(newToken()), 429, "TooManyRequests"); !strings.Contains(st.Message, neighbour) {
			t.Errorf("the neighbour's next new token: %q, want its own user's budget as the reason", st.Message)
		}

		wantGated("the flooder, after its neighbour was served", "garbage-11")
		wantGated("a neighbour with a new token the authenticator cannot check", "other-token")
	})
}
