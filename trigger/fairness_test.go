package trigger_test

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"net/http/httptest"
	"testing"
	"testing/synctest"
	"time"

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
// or node): the address gate refuses only requests it cannot tell apart.
func TestAKnownCallerIsNotRefusedForItsNeighboursFailures(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		rev := newFakeReviews(t)
		rev.allowed["system:serviceaccount:ci:deployer update /configmaps/ ns/"] = true
		e := newHandlerEnv(t, func(c *trigger.HandlerConfig) {
			c.Authenticator, c.Reviews, c.MaxAuthFailures, c.AuthFailureBackoff = nil, rev, 3, 10*time.Second
		})
		from := func(tok string) *httptest.ResponseRecorder { return postFrom(e, "10.0.0.1:1000", tok) }
		if w := from("good-token"); w.Code != http.StatusAccepted {
			t.Fatalf("first trigger: %d %s", w.Code, w.Body)
		}
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
