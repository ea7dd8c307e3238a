package trigger_test

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"testing/synctest"
	"time"

	authnv1 "k8s.io/api/authentication/v1"
	authzv1 "k8s.io/api/authorization/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/kubernetes/fake"
	authnclient "k8s.io/client-go/kubernetes/typed/authentication/v1"
	authzclient "k8s.io/client-go/kubernetes/typed/authorization/v1"
	clienttesting "k8s.io/client-go/testing"

	"github.com/opkit/opkit"
	"github.com/opkit/opkit/trigger"
)

// A kubernetes.Interface (the clientset users already have) is a ReviewClient.
var _ trigger.ReviewClient = kubernetes.Interface(nil)

// fakeReviews is a trigger.ReviewClient over client-go's fake clientset
// with reactors: the fake API server knows a few tokens and RBAC grants.
type fakeReviews struct {
	cs *fake.Clientset

	mu      sync.Mutex
	tokens  map[string]authnv1.TokenReviewStatus // by token
	allowed map[string]bool                      // "user verb group/resource/sub ns/name"
	trs     []authnv1.TokenReviewSpec
	sars    []authzv1.SubjectAccessReviewSpec
	failTR  error
	// hold, if set, is where every TokenReview waits before it is made
	// (outside the fake clientset, which holds a lock while it answers);
	// held counts them.
	hold chan struct{}
	held int
	// holdSAR and heldSAR do the same for SubjectAccessReviews.
	holdSAR chan struct{}
	heldSAR int
}

func (f *fakeReviews) AuthenticationV1() authnclient.AuthenticationV1Interface {
	return heldAuthn{f.cs.AuthenticationV1(), f}
}

type heldAuthn struct {
	authnclient.AuthenticationV1Interface
	f *fakeReviews
}

func (h heldAuthn) TokenReviews() authnclient.TokenReviewInterface {
	return heldReviews{h.AuthenticationV1Interface.TokenReviews(), h.f}
}

type heldReviews struct {
	authnclient.TokenReviewInterface
	f *fakeReviews
}

func (h heldReviews) Create(ctx context.Context, tr *authnv1.TokenReview, opts metav1.CreateOptions) (*authnv1.TokenReview, error) {
	h.f.park(&h.f.hold, &h.f.held)
	return h.TokenReviewInterface.Create(ctx, tr, opts)
}

// park counts a review in *held and, while *hold is set, waits for it
// to close.
func (f *fakeReviews) park(hold *chan struct{}, held *int) {
	f.mu.Lock()
	ch := *hold
	*held++
	f.mu.Unlock()
	if ch != nil {
		<-ch
	}
}
func (f *fakeReviews) AuthorizationV1() authzclient.AuthorizationV1Interface {
	return heldAuthz{f.cs.AuthorizationV1(), f}
}

type heldAuthz struct {
	authzclient.AuthorizationV1Interface
	f *fakeReviews
}

func (h heldAuthz) SubjectAccessReviews() authzclient.SubjectAccessReviewInterface {
	return heldSARs{h.AuthorizationV1Interface.SubjectAccessReviews(), h.f}
}

type heldSARs struct {
	authzclient.SubjectAccessReviewInterface
	f *fakeReviews
}

func (h heldSARs) Create(ctx context.Context, sar *authzv1.SubjectAccessReview, opts metav1.CreateOptions) (*authzv1.SubjectAccessReview, error) {
	h.f.park(&h.f.holdSAR, &h.f.heldSAR)
	return h.SubjectAccessReviewInterface.Create(ctx, sar, opts)
}

func sarKey(user string, a *authzv1.ResourceAttributes) string {
	return fmt.Sprintf("%s %s %s/%s/%s %s/%s", user, a.Verb, a.Group, a.Resource, a.Subresource, a.Namespace, a.Name)
}

func newFakeReviews(t *testing.T) *fakeReviews {
	f := &fakeReviews{
		cs:      fake.NewClientset(),
		allowed: map[string]bool{},
		tokens: map[string]authnv1.TokenReviewStatus{
			"good-token": {Authenticated: true, Audiences: []string{trigger.DefaultAudience},
				User: authnv1.UserInfo{Username: "system:serviceaccount:ci:deployer", UID: "sa-uid", Groups: []string{"system:serviceaccounts"}, Extra: map[string]authnv1.ExtraValue{"k": {"v"}}}},
			"other-token": {Authenticated: true, Audiences: []string{trigger.DefaultAudience},
				User: authnv1.UserInfo{Username: "system:serviceaccount:ci:intruder"}},
			// An authenticator that ignores audiences answers without any.
			"no-audience-token": {Authenticated: true, User: authnv1.UserInfo{Username: "legacy"}},
		},
	}
	f.cs.PrependReactor("*", "*", func(a clienttesting.Action) (bool, runtime.Object, error) {
		t.Errorf("unexpected API call %s %s", a.GetVerb(), a.GetResource().Resource)
		return true, nil, errors.New("unexpected")
	})
	f.cs.PrependReactor("create", "tokenreviews", func(a clienttesting.Action) (bool, runtime.Object, error) {
		tr := a.(clienttesting.CreateAction).GetObject().(*authnv1.TokenReview)
		f.mu.Lock()
		defer f.mu.Unlock()
		f.trs = append(f.trs, tr.Spec)
		if f.failTR != nil {
			return true, nil, f.failTR
		}
		out := tr.DeepCopy()
		st, ok := f.tokens[tr.Spec.Token]
		if !ok {
			st = authnv1.TokenReviewStatus{Error: "invalid bearer token"}
		}
		out.Status = st
		return true, out, nil
	})
	f.cs.PrependReactor("create", "subjectaccessreviews", func(a clienttesting.Action) (bool, runtime.Object, error) {
		sar := a.(clienttesting.CreateAction).GetObject().(*authzv1.SubjectAccessReview)
		f.mu.Lock()
		defer f.mu.Unlock()
		f.sars = append(f.sars, sar.Spec)
		out := sar.DeepCopy()
		out.Status.Allowed = f.allowed[sarKey(sar.Spec.User, sar.Spec.ResourceAttributes)]
		if !out.Status.Allowed {
			out.Status.Reason = "no RBAC policy matched"
		}
		return true, out, nil
	})
	return f
}

func (f *fakeReviews) calls() (int, int) {
	f.mu.Lock()
	defer f.mu.Unlock()
	return len(f.trs), len(f.sars)
}

func bearer(tok string) http.Header { return http.Header{"Authorization": {"Bearer " + tok}} }

func TestKubeAuthStatusCodes(t *testing.T) {
	rev := newFakeReviews(t)
	rev.allowed["system:serviceaccount:ci:deployer update /configmaps/ ns/a"] = true
	var logs bytes.Buffer
	e := newHandlerEnv(t, func(c *trigger.HandlerConfig) {
		c.Authenticator = nil
		c.Reviews = rev.cs // the clientset itself
		c.Logger = slog.New(slog.NewTextHandler(&logs, &slog.HandlerOptions{Level: slog.LevelDebug}))
	})

	w := e.do(http.MethodPost, "/reconcile/ns/a", nil, nil)
	st := wantStatus(t, w, 401, "Unauthorized")
	if h := w.Header().Get("WWW-Authenticate"); h != `Bearer realm="opkit-trigger"` || !strings.Contains(st.Message, "bearer token") {
		t.Errorf("missing token: header %q (want a challenge without an error code) message %q", h, st.Message)
	}
	w = e.do(http.MethodPost, "/reconcile/ns/a", nil, http.Header{"Authorization": {"Basic dXNlcjpwYXNz"}})
	wantStatus(t, w, 401, "Unauthorized")
	if h := w.Header().Get("WWW-Authenticate"); h != `Bearer realm="opkit-trigger"` {
		t.Errorf("basic credentials: header %q, want a challenge without an error code", h)
	}
	w = e.do(http.MethodPost, "/reconcile/ns/a", nil, bearer("garbage-token"))
	st = wantStatus(t, w, 401, "Unauthorized")
	if !strings.Contains(st.Message, "invalid bearer token") {
		t.Errorf("401 message %q does not say why", st.Message)
	}
	if h := w.Header().Get("WWW-Authenticate"); h != `Bearer realm="opkit-trigger", error="invalid_token"` {
		t.Errorf("refused token: header %q, want the invalid_token error code", h)
	}
	wantStatus(t, e.do(http.MethodPost, "/reconcile/ns/a", nil, bearer("no-audience-token")), 401, "Unauthorized")
	st = wantStatus(t, e.do(http.MethodPost, "/reconcile/ns/a", nil, bearer("other-token")), 403, "Forbidden")
	if !strings.Contains(st.Message, `"system:serviceaccount:ci:intruder" may not update configmaps "a" in namespace "ns"`) {
		t.Errorf("403 message = %q", st.Message)
	}
	// The deployer may update ns/a but not ns/b.
	wantStatus(t, e.do(http.MethodPost, "/reconcile/ns/b", nil, bearer("good-token")), 403, "Forbidden")
	if w := e.do(http.MethodPost, "/reconcile/ns/a", nil, bearer("good-token")); w.Code != 202 {
		t.Fatalf("allowed caller: %d %s", w.Code, w.Body)
	}
	if e.q.Len() != 1 {
		t.Errorf("queue len = %d, want only the allowed trigger", e.q.Len())
	}

	// Every TokenReview named our audience; the SAR carried the caller's
	// full identity and the object's attributes.
	rev.mu.Lock()
	for _, tr := range rev.trs {
		if len(tr.Audiences) != 1 || tr.Audiences[0] != trigger.DefaultAudience {
			t.Errorf("TokenReview audiences = %v", tr.Audiences)
		}
	}
	var last authzv1.SubjectAccessReviewSpec
	for _, s := range rev.sars {
		if s.User == "system:serviceaccount:ci:deployer" {
			last = s
		}
	}
	rev.mu.Unlock()
	ra := last.ResourceAttributes
	if ra == nil || ra.Verb != "update" || ra.Resource != "configmaps" || ra.Group != "" || ra.Namespace != "ns" || ra.Name != "a" ||
		last.UID != "sa-uid" || len(last.Groups) != 1 || last.Extra["k"][0] != "v" {
		t.Errorf("SAR spec = %+v attrs %+v", last, ra)
	}
	if strings.Contains(logs.String(), "-token") {
		t.Errorf("a token reached the log:\n%s", logs.String())
	}
}

func TestKubeAuthConfigurableVerbAudienceSubresource(t *testing.T) {
	rev := newFakeReviews(t)
	rev.tokens["ci"] = authnv1.TokenReviewStatus{Authenticated: true, Audiences: []string{"reconcile.example.com"}, User: authnv1.UserInfo{Username: "ci"}}
	rev.allowed["ci create demo.opkit.dev/widgets/reconcile ns/a"] = true
	a, err := trigger.NewKubeAuthenticator(trigger.KubeAuthConfig{
		Client: rev, Audiences: []string{"reconcile.example.com"}, Verb: "create",
		Group: "demo.opkit.dev", Resource: "widgets", Subresource: "reconcile",
	})
	if err != nil {
		t.Fatal(err)
	}
	r := httptest.NewRequest(http.MethodPost, "/reconcile/ns/a", nil)
	r.Header.Set("Authorization", "bearer ci")
	user, err := a.Authorize(context.Background(), trigger.AuthRequest{HTTP: r, Resource: configMaps, Key: opkit.Key{Namespace: "ns", Name: "a"}})
	if err != nil || user != "ci" {
		t.Fatalf("Authorize = (%q, %v)", user, err)
	}
	// The default-audience token is refused by an endpoint with another audience.
	r.Header.Set("Authorization", "Bearer good-token")
	if _, err := a.Authorize(context.Background(), trigger.AuthRequest{HTTP: r, Resource: configMaps, Key: opkit.Key{Namespace: "ns", Name: "a"}}); !errors.Is(err, trigger.ErrUnauthenticated) {
		t.Errorf("token for another audience: %v, want ErrUnauthenticated", err)
	}
}

func TestKubeAuthCachesDecisionsBriefly(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		rev := newFakeReviews(t)
		rev.allowed["system:serviceaccount:ci:deployer update /configmaps/ ns/a"] = true
		a, err := trigger.NewKubeAuthenticator(trigger.KubeAuthConfig{Client: rev, PositiveTTL: 10 * time.Second, NegativeTTL: 2 * time.Second})
		if err != nil {
			t.Fatal(err)
		}
		ask := func(tok, name string) error {
			r := httptest.NewRequest(http.MethodPost, "/", nil)
			r.Header.Set("Authorization", "Bearer "+tok)
			_, err := a.Authorize(context.Background(), trigger.AuthRequest{HTTP: r, Resource: configMaps, Key: opkit.Key{Namespace: "ns", Name: name}})
			return err
		}
		for range 3 {
			if err := ask("good-token", "a"); err != nil {
				t.Fatal(err)
			}
		}
		// One SAR for the namespace (denied: the grant names the object),
		// one for the object.
		if tr, sar := rev.calls(); tr != 1 || sar != 2 {
			t.Fatalf("3 identical requests made %d TokenReviews and %d SARs, want 1 and 2", tr, sar)
		}
		// Another object: the token review and the namespace's denial are
		// cached, the object's SAR is not.
		if err := ask("good-token", "b"); !errors.Is(err, trigger.ErrForbidden) {
			t.Fatalf("ns/b: %v, want ErrForbidden", err)
		}
		if err := ask("good-token", "b"); !errors.Is(err, trigger.ErrForbidden) {
			t.Fatalf("ns/b cached: %v", err)
		}
		if tr, sar := rev.calls(); tr != 1 || sar != 3 {
			t.Fatalf("calls = %d TR, %d SAR; want 1, 3", tr, sar)
		}
		// Negative entries expire first: the denial is re-checked and the
		// grant added in the meantime takes effect.
		rev.mu.Lock()
		rev.allowed["system:serviceaccount:ci:deployer update /configmaps/ ns/b"] = true
		rev.mu.Unlock()
		time.Sleep(2 * time.Second)
		if err := ask("good-token", "b"); err != nil {
			t.Fatalf("after the negative TTL: %v", err)
		}
		// Garbage tokens are remembered for the negative TTL too.
		for range 2 {
			if err := ask("garbage", "a"); !errors.Is(err, trigger.ErrUnauthenticated) {
				t.Fatal(err)
			}
		}
		if tr, _ := rev.calls(); tr != 2 {
			t.Fatalf("TokenReviews = %d, want 2 (one for the garbage token)", tr)
		}
		// Positive entries expire after their TTL.
		time.Sleep(10 * time.Second)
		if err := ask("good-token", "a"); err != nil {
			t.Fatal(err)
		}
		// The namespace's denial expired too (SARs 4 and 5 were b's).
		if tr, sar := rev.calls(); tr != 3 || sar != 7 {
			t.Fatalf("after the positive TTL: %d TR, %d SAR; want 3, 7", tr, sar)
		}
	})
}

func TestKubeAuthCacheIsBounded(t *testing.T) {
	rev := newFakeReviews(t)
	a, err := trigger.NewKubeAuthenticator(trigger.KubeAuthConfig{Client: rev, MaxEntries: 4, TokenReviewBurst: 1000, MaxAuthFailures: -1})
	if err != nil {
		t.Fatal(err)
	}
	ask := func(tok string) {
		r := httptest.NewRequest(http.MethodPost, "/", nil)
		r.Header.Set("Authorization", "Bearer "+tok)
		_, _ = a.Authorize(context.Background(), trigger.AuthRequest{HTTP: r, Resource: configMaps, Key: opkit.Key{Namespace: "ns", Name: "a"}})
	}
	for i := range 100 {
		ask(fmt.Sprintf("garbage-%d", i))
	}
	// The most recent 4 are cached; the first one was evicted.
	before, _ := rev.calls()
	ask("garbage-99")
	if after, _ := rev.calls(); after != before {
		t.Errorf("recent token re-reviewed: %d -> %d", before, after)
	}
	ask("garbage-0")
	if after, _ := rev.calls(); after != before+1 {
		t.Errorf("evicted token not re-reviewed: %d -> %d", before, after)
	}
	if n := trigger.AuthCacheLen(a); n > 8 {
		t.Errorf("cache holds %d entries, want at most 2*4", n)
	}
}

func TestKubeAuthReviewFailures(t *testing.T) {
	rev := newFakeReviews(t)
	rev.failTR = apierrors.NewForbidden(schema.GroupResource{Group: "authentication.k8s.io", Resource: "tokenreviews"}, "",
		errors.New(`User "system:serviceaccount:ops:operator" cannot create`))
	e := newHandlerEnv(t, func(c *trigger.HandlerConfig) { c.Authenticator = nil; c.Reviews = rev })
	// A caller not yet authenticated learns nothing of the operator's
	// RBAC from the answer.
	if st := wantStatus(t, e.do(http.MethodPost, "/reconcile/ns/a", nil, bearer("good-token")), 502, "BadGateway"); strings.Contains(st.Message, "serviceaccount") {
		t.Errorf("message %q shows the API server's answer to the operator", st.Message)
	}
	// Failures are not cached: the next request asks again.
	rev.mu.Lock()
	rev.failTR = nil
	rev.mu.Unlock()
	rev.allowed["system:serviceaccount:ci:deployer update /configmaps/ ns/a"] = true
	if w := e.do(http.MethodPost, "/reconcile/ns/a", nil, bearer("good-token")); w.Code != 202 {
		t.Fatalf("after recovery: %d %s", w.Code, w.Body)
	}
	rev.mu.Lock()
	rev.failTR = context.DeadlineExceeded
	rev.mu.Unlock()
	wantStatus(t, e.do(http.MethodPost, "/reconcile/ns/a", nil, bearer("new-token")), 504, "Timeout")
}

func TestNewKubeAuthenticatorValidates(t *testing.T) {
	if _, err := trigger.NewKubeAuthenticator(trigger.KubeAuthConfig{}); err == nil {
		t.Error("no client: want an error")
	}
	rev := newFakeReviews(t)
	if _, err := trigger.NewKubeAuthenticator(trigger.KubeAuthConfig{Client: rev, Audiences: []string{}}); err == nil {
		t.Error("empty audiences: want an error")
	}
	if _, err := trigger.NewKubeAuthenticator(trigger.KubeAuthConfig{Client: rev, PositiveTTL: -1}); err == nil {
		t.Error("negative TTL: want an error")
	}
	if _, err := trigger.NewKubeAuthenticator(trigger.KubeAuthConfig{Client: rev, Group: "apps"}); err == nil {
		t.Error("Group without Resource: want an error")
	}
}

// An authorizer outage comes back from the SubjectAccessReview as
// Allowed=false with Status.EvaluationError set (the union authorizer turns a
// failing webhook into NoOpinion+error). That is a review that failed (502,
// not cached), not a denial: a valid caller must not be answered 403 and then
// locked out for NegativeTTL after the authorizer recovers.
func TestAnAuthorizerOutageIsA502AndNotCachedAsADenial(t *testing.T) {
	// With failurePolicy NoOpinion the failed webhook leaves the review
	// neither allowed nor denied; with Deny it denies. Either way it failed.
	for _, denyOnFailure := range []bool{false, true} {
		t.Run(fmt.Sprintf("denied=%v", denyOnFailure), func(t *testing.T) {
			rev := newFakeReviews(t)
			var outage atomic.Bool
			outage.Store(true)
			rev.cs.PrependReactor("create", "subjectaccessreviews", func(a clienttesting.Action) (bool, runtime.Object, error) {
				if !outage.Load() {
					return false, nil, nil // fall through to the RBAC reactor
				}
				out := a.(clienttesting.CreateAction).GetObject().(*authzv1.SubjectAccessReview).DeepCopy()
				out.Status = authzv1.SubjectAccessReviewStatus{EvaluationError: "webhook authorizer: dial tcp 10.0.0.9:443: connect: connection refused", Denied: denyOnFailure}
				return true, out, nil
			})
			rev.allowed["system:serviceaccount:ci:deployer update /configmaps/ ns/a"] = true
			e := newHandlerEnv(t, func(c *trigger.HandlerConfig) { c.Authenticator = nil; c.Reviews = rev })

			w := e.do(http.MethodPost, "/reconcile/ns/a", nil, bearer("good-token"))
			if w.Code != http.StatusBadGateway {
				t.Errorf("during the authorizer outage: %d %s, want 502", w.Code, w.Body)
			}
			outage.Store(false) // the authorizer is back
			if w := e.do(http.MethodPost, "/reconcile/ns/a", nil, bearer("good-token")); w.Code != http.StatusAccepted {
				t.Errorf("after recovery: %d %s, want 202 (the failed review was cached as a denial)", w.Code, w.Body)
			}
		})
	}
}
