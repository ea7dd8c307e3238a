package trigger

import (
	"cmp"
	"container/list"
	"context"
	"crypto/sha256"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"net/http"
	"slices"
	"strings"
	"sync"
	"time"

	authnv1 "k8s.io/api/authentication/v1"
	authzv1 "k8s.io/api/authorization/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime/schema"
	authnclient "k8s.io/client-go/kubernetes/typed/authentication/v1"
	authzclient "k8s.io/client-go/kubernetes/typed/authorization/v1"
	"k8s.io/client-go/util/flowcontrol"

	"golang.org/x/sync/singleflight"

	"github.com/opkit/opkit"
)

// DefaultAudience is the audience of the tokens the Kubernetes-native
// authenticator takes (not the API server's).
const DefaultAudience = "opkit-trigger"

// AuthRequest is what an Authenticator decides on: the request (its
// headers; not its body) and the object it would trigger.
type AuthRequest struct {
	HTTP     *http.Request
	Resource opkit.Resource
	Key      opkit.Key
}

// Authenticator decides whether a request may trigger a reconcile: it
// returns the caller's name (for logs), or an error wrapping
// ErrUnauthenticated (401) or ErrForbidden (403), with a message for the
// caller, or any other when it could not decide (504 if it wraps
// context.DeadlineExceeded, else 502). It is called concurrently, and
// never logs or returns credentials. It owns what its checks cost: the
// handler counts no failed authentications.
type Authenticator interface {
	Authorize(ctx context.Context, req AuthRequest) (user string, err error)
}

// ReviewClient makes the TokenReviews and SubjectAccessReviews: a
// kubernetes.Interface, or a struct of the two typed clients (or fakes).
type ReviewClient interface {
	AuthenticationV1() authnclient.AuthenticationV1Interface
	AuthorizationV1() authzclient.AuthorizationV1Interface
}

// KubeAuthConfig configures the Kubernetes-native authenticator; a zero
// field means its default. Client makes the reviews (required); the token
// must be for one of Audiences (nil: DefaultAudience); the
// SubjectAccessReview checks Verb ("": "update") on Group and Resource
// (empty: the trigger's) and Subresource, for the namespace, then, if
// denied, for the object. Allows are cached PositiveTTL (zero: 10s),
// refusals NegativeTTL (5s), up to MaxEntries (4096). A service-account
// token is checked against its issuer's keys first (a forged one gets no
// review); the others share TokenReviewRate reviews a second (20, burst
// TokenReviewBurst 40); a user gets AccessReviewRate reviews a second
// (5, burst AccessReviewBurst 10), its SubjectAccessReviews and its
// signed tokens' TokenReviews; ErrBusy beyond. MaxReviews (16) run at
// once, shared fairly, each within ReviewTimeout (5s); the requests that
// need the same review share it. A client address whose authentications
// fail MaxAuthFailures times in a row (10; negative: no limit), each
// within AuthFailureBackoff (10s) of the last, gets none of the shared
// reviews until that has passed (ErrBusy), but for a token authenticated
// in the last 10 minutes; its signed tokens, reviewed on their users'
// budgets, still pass.
type KubeAuthConfig struct {
	Client                              ReviewClient
	Audiences                           []string
	Verb                                string
	Group, Resource                     string
	Subresource                         string
	PositiveTTL, NegativeTTL            time.Duration
	MaxEntries                          int
	TokenReviewRate, AccessReviewRate   float64
	TokenReviewBurst, AccessReviewBurst int
	MaxReviews                          int
	ReviewTimeout                       time.Duration
	MaxAuthFailures                     int
	AuthFailureBackoff                  time.Duration
}

// kubeAuthenticator is the Kubernetes-native Authenticator.
type kubeAuthenticator struct {
	cfg      KubeAuthConfig // validated, defaults applied
	tokens   *ttlCache[tokenResult]
	perms    *ttlCache[error] // nil: allowed; else wraps ErrForbidden
	flights  singleflight.Group
	slots    *fairSlots                     // the reviews in flight
	unknown  flowcontrol.PassiveRateLimiter // TokenReviews of tokens not checked here
	byCaller *ttlCache[flowcontrol.PassiveRateLimiter]
	issuer   *issuerKeys         // checks service-account tokens without a review
	failures *ttlCache[int]      // failed authentications by client address
	known    *ttlCache[struct{}] // tokens (hashes) authenticated in the last knownFor
}

type tokenResult struct {
	user authnv1.UserInfo
	err  error // wraps ErrUnauthenticated when the token was refused
}

// NewKubeAuthenticator validates cfg and returns the Kubernetes-native
// Authenticator (see the package documentation). It keeps tokens only as
// SHA-256 hashes, and logs nothing.
func NewKubeAuthenticator(cfg KubeAuthConfig) (Authenticator, error) {
	return newKubeAuthenticator(cfg, nil)
}

// newKubeAuthenticator is NewKubeAuthenticator with a log for the one
// thing an operator must hear of (nil: none): the service-account
// issuer's keys cannot be read, so every token costs a TokenReview.
func newKubeAuthenticator(cfg KubeAuthConfig, log *slog.Logger) (Authenticator, error) {
	if cfg.Audiences == nil {
		cfg.Audiences = []string{DefaultAudience}
	}
	switch {
	case cfg.Client == nil:
		return nil, errors.New("trigger: KubeAuthConfig.Client is required")
	case len(cfg.Audiences) == 0 || slices.Contains(cfg.Audiences, ""):
		return nil, errors.New("trigger: KubeAuthConfig.Audiences must not be empty")
	case cfg.Group != "" && cfg.Resource == "":
		return nil, fmt.Errorf("trigger: KubeAuthConfig.Group %q without Resource would be ignored (the trigger's own resource and group are checked); set Resource too", cfg.Group)
	case cfg.PositiveTTL < 0 || cfg.NegativeTTL < 0 || cfg.MaxEntries < 0 || cfg.MaxReviews < 0 || cfg.ReviewTimeout < 0 || cfg.AuthFailureBackoff < 0 ||
		!(cfg.TokenReviewRate >= 0) || !(cfg.AccessReviewRate >= 0) || cfg.TokenReviewBurst < 0 || cfg.AccessReviewBurst < 0:
		return nil, errors.New("trigger: KubeAuthConfig TTLs, timeouts, rates and limits must not be negative")
	}
	cfg.Verb = cmp.Or(cfg.Verb, "update")
	cfg.PositiveTTL = cmp.Or(cfg.PositiveTTL, 10*time.Second)
	cfg.NegativeTTL = cmp.Or(cfg.NegativeTTL, 5*time.Second)
	cfg.MaxEntries = cmp.Or(cfg.MaxEntries, 4096)
	cfg.TokenReviewRate, cfg.TokenReviewBurst = cmp.Or(cfg.TokenReviewRate, 20), cmp.Or(cfg.TokenReviewBurst, 40)
	cfg.AccessReviewRate, cfg.AccessReviewBurst = cmp.Or(cfg.AccessReviewRate, 5), cmp.Or(cfg.AccessReviewBurst, 10)
	cfg.MaxReviews = cmp.Or(cfg.MaxReviews, 16)
	cfg.ReviewTimeout = cmp.Or(cfg.ReviewTimeout, 5*time.Second)
	cfg.MaxAuthFailures = cmp.Or(cfg.MaxAuthFailures, 10)
	cfg.AuthFailureBackoff = cmp.Or(cfg.AuthFailureBackoff, 10*time.Second)
	return &kubeAuthenticator{cfg: cfg, tokens: newTTLCache[tokenResult](cfg.MaxEntries), perms: newTTLCache[error](cfg.MaxEntries),
		slots:    newFairSlots(cfg.MaxReviews),
		unknown:  flowcontrol.NewTokenBucketPassiveRateLimiter(float32(cfg.TokenReviewRate), cfg.TokenReviewBurst),
		byCaller: newTTLCache[flowcontrol.PassiveRateLimiter](cfg.MaxEntries),
		issuer:   newIssuerKeys(cfg.Client.AuthenticationV1().RESTClient(), cfg.Audiences, log),
		failures: newTTLCache[int](cfg.MaxEntries), known: newTTLCache[struct{}](cfg.MaxEntries)}, nil
}

// shared runs review once for the concurrent callers of the same key,
// under ReviewTimeout rather than the first caller's context (a caller
// that leaves stops waiting; the review goes on for the others), in one
// of the MaxReviews slots, waiting for who's fair turn (ErrBusy when the
// timeout ends first).
func shared[V any](ctx context.Context, a *kubeAuthenticator, key, who string, review func(context.Context) (V, error)) (V, error) {
	ch := a.flights.DoChan(key, func() (any, error) {
		wctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), a.cfg.ReviewTimeout)
		defer cancel()
		if !a.slots.acquire(wctx, who) {
			return *new(V), fmt.Errorf("%w: %d reviews in flight, this caller's fair share among them", ErrBusy, a.cfg.MaxReviews)
		}
		defer a.slots.release(who)
		rctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), a.cfg.ReviewTimeout)
		defer cancel()
		return review(rctx)
	})
	select {
	case r := <-ch:
		v, _ := r.Val.(V) // a nil error (allowed) is a nil any
		return v, r.Err
	case <-ctx.Done():
		return *new(V), ctx.Err()
	}
}

// bearerToken returns the token of an "Authorization: Bearer ..." header
// and its SHA-256, the key the caches know it by (they never keep a
// token).
func bearerToken(r *http.Request) (tok, sum string, ok bool) {
	h := r.Header.Values("Authorization")
	if len(h) != 1 {
		return "", "", false
	}
	scheme, tok, ok := strings.Cut(h[0], " ")
	if tok = strings.TrimSpace(tok); !ok || !strings.EqualFold(scheme, "Bearer") || tok == "" {
		return "", "", false
	}
	hash := sha256.Sum256([]byte(tok))
	return tok, string(hash[:]), true
}

// Authorize authenticates the caller's token (a review of a token not
// checked here comes out of the shared budget, which a client address
// whose authentications keep failing may not spend), then asks whether
// the caller may act on the object.
func (a *kubeAuthenticator) Authorize(ctx context.Context, req AuthRequest) (user string, err error) {
	host := clientHost(req.HTTP)
	defer func() {
		if errors.Is(err, ErrUnauthenticated) { // however refused, and whatever it cost
			a.failures.update(host, time.Now().Add(a.cfg.AuthFailureBackoff), func(n int) int { return n + 1 })
		}
	}()
	tok, tokKey, ok := bearerToken(req.HTTP)
	if !ok {
		return "", fmt.Errorf("%w: a bearer token (Authorization: Bearer ...) for audience %q is required", ErrUnauthenticated, a.cfg.Audiences[0])
	}
	_, known := a.known.get(tokKey)
	tr, ok := a.tokens.get(tokKey)
	if !ok {
		v, subject := a.issuer.check(ctx, tok, tokKey)
		switch v {
		case tokenForged:
			return "", fmt.Errorf("%w: the bearer token claims the cluster's service-account issuer but is not signed by it, current, and for audience %q", ErrUnauthenticated, a.cfg.Audiences)
		case tokenSigned:
			if !a.takeReview(subject) { // one service account minting token after token
				return "", fmt.Errorf("%w: user %q asked for more reviews than %v a second", ErrBusy, subject, a.cfg.AccessReviewRate)
			}
		case tokenUnknown:
			if n, _ := a.failures.get(host); a.cfg.MaxAuthFailures > 0 && n >= a.cfg.MaxAuthFailures && !known {
				return "", fmt.Errorf("%w: too many failed authentications from this address; try again later", ErrBusy)
			}
			if !a.unknown.TryAccept() {
				return "", fmt.Errorf("%w: the reviews of tokens other than the cluster's service-account tokens (%v a second) are spent", ErrBusy, a.cfg.TokenReviewRate)
			}
		}
		if tr, err = shared(ctx, a, "token\x00"+tokKey, "address "+host, func(ctx context.Context) (tokenResult, error) { return a.review(ctx, tokKey, tok) }); err != nil {
			return "", err
		}
		// Only a new token paid for from the shared budget ends the
		// address's failures in a row: a known or signed one's success
		// says nothing of its neighbours.
		if tr.err == nil && v == tokenUnknown && !known {
			a.failures.forget(host)
		}
	}
	if tr.err != nil {
		return "", tr.err
	}
	a.known.put(tokKey, struct{}{}, time.Now().Add(knownFor))
	return tr.user.Username, a.access(ctx, tr.user, req)
}

// review asks a TokenReview for the user of tok and caches the answer by
// its hash, tokKey: the user, or an error wrapping ErrUnauthenticated
// when it refused the token. It returns an error when the review failed.
func (a *kubeAuthenticator) review(ctx context.Context, tokKey, tok string) (tokenResult, error) {
	if tr, ok := a.tokens.get(tokKey); ok { // reviewed by a review that ended as this caller came to share one
		return tr, nil
	}
	rev, err := a.cfg.Client.AuthenticationV1().TokenReviews().Create(ctx, &authnv1.TokenReview{
		Spec: authnv1.TokenReviewSpec{Token: tok, Audiences: a.cfg.Audiences},
	}, metav1.CreateOptions{})
	if err != nil {
		return tokenResult{}, fmt.Errorf("TokenReview: %w", err)
	}
	var tr tokenResult
	switch st := rev.Status; {
	case !st.Authenticated:
		// Status.Error is the API server's explanation (expired, wrong
		// audience, unknown); it never contains the token.
		tr.err = fmt.Errorf("%w: the bearer token was not accepted: %s (audience %q)", ErrUnauthenticated, cmp.Or(st.Error, "no reason given"), a.cfg.Audiences)
	case !slices.ContainsFunc(st.Audiences, func(s string) bool { return slices.Contains(a.cfg.Audiences, s) }):
		// An authenticator that ignores audiences would accept an API
		// server token here; refuse unless the review confirms ours.
		tr.err = fmt.Errorf("%w: the bearer token is not valid for audience %q", ErrUnauthenticated, a.cfg.Audiences)
	default:
		tr.user = st.User
	}
	a.tokens.put(tokKey, tr, a.expiry(tr.err))
	return tr, nil
}

// access asks whether user may act on req's object, at the widest scope
// first (every object of the resource in the namespace: one review
// answers for every name), then, if that is denied, for the object,
// each review within the user's budget. It returns nil when allowed,
// an error wrapping ErrForbidden when denied, any other when a review
// failed or the budget is spent (ErrBusy).
func (a *kubeAuthenticator) access(ctx context.Context, user authnv1.UserInfo, req AuthRequest) error {
	attrs := authzv1.ResourceAttributes{Namespace: req.Key.Namespace, Verb: a.cfg.Verb, Group: req.Resource.Group,
		Resource: req.Resource.Resource, Subresource: a.cfg.Subresource}
	if a.cfg.Resource != "" {
		attrs.Group, attrs.Resource = a.cfg.Group, a.cfg.Resource
	}
	if denied, err := a.decide(ctx, user, attrs); err != nil || denied == nil {
		return err
	}
	attrs.Name = req.Key.Name
	denied, err := a.decide(ctx, user, attrs)
	return cmp.Or(err, denied)
}

// decide returns the cached decision on user and attrs, or asks a
// SubjectAccessReview for a token of the user's budget: denied is nil
// when allowed, else wraps ErrForbidden.
func (a *kubeAuthenticator) decide(ctx context.Context, user authnv1.UserInfo, attrs authzv1.ResourceAttributes) (denied, err error) {
	uk := userKey(user)
	key := strings.Join([]string{uk, attrs.Verb, attrs.Group, attrs.Resource, attrs.Subresource, attrs.Namespace, attrs.Name}, "\x00")
	if denied, ok := a.perms.get(key); ok {
		return denied, nil
	}
	if !a.takeReview(user.Username) {
		return nil, fmt.Errorf("%w: user %q asked for more reviews than %v a second", ErrBusy, user.Username, a.cfg.AccessReviewRate)
	}
	return shared(ctx, a, "access\x00"+key, "user "+uk, func(ctx context.Context) (error, error) {
		if denied, ok := a.perms.get(key); ok { // decided by a review that ended as this caller came to share one
			return denied, nil
		}
		return a.sar(ctx, key, user, attrs)
	})
}

// takeReview takes a token of user's budget of reviews (its
// SubjectAccessReviews, and the TokenReviews of its service-account
// tokens), reporting whether there was one.
func (a *kubeAuthenticator) takeReview(user string) bool {
	var b flowcontrol.PassiveRateLimiter
	a.byCaller.update(user, time.Now().Add(time.Minute), func(old flowcontrol.PassiveRateLimiter) flowcontrol.PassiveRateLimiter {
		if b = old; b == nil {
			b = flowcontrol.NewTokenBucketPassiveRateLimiter(float32(a.cfg.AccessReviewRate), a.cfg.AccessReviewBurst)
		}
		return b
	})
	return b.TryAccept()
}

// userKey identifies a user as a SubjectAccessReview sees them: name,
// UID, groups and extra, hashed. Their JSON tells any two users apart
// (encoding/json sorts the extra's keys).
func userKey(u authnv1.UserInfo) string {
	data, _ := json.Marshal(u) // strings, slices and maps of them: it cannot fail
	sum := sha256.Sum256(data)
	return string(sum[:])
}

// sar makes the SubjectAccessReview of access and caches its decision
// under key: nil (allowed) or an error wrapping ErrForbidden (denied). It
// returns an error when the review failed or could not be evaluated.
func (a *kubeAuthenticator) sar(ctx context.Context, key string, user authnv1.UserInfo, attrs authzv1.ResourceAttributes) (denied, err error) {
	extra := make(map[string]authzv1.ExtraValue, len(user.Extra))
	for k, v := range user.Extra {
		extra[k] = authzv1.ExtraValue(v)
	}
	sar, err := a.cfg.Client.AuthorizationV1().SubjectAccessReviews().Create(ctx, &authzv1.SubjectAccessReview{
		Spec: authzv1.SubjectAccessReviewSpec{ResourceAttributes: &attrs, User: user.Username, UID: user.UID, Groups: user.Groups, Extra: extra},
	}, metav1.CreateOptions{})
	if err != nil {
		return nil, fmt.Errorf("SubjectAccessReview: %w", err)
	}
	switch st := sar.Status; {
	case st.Allowed && !st.Denied:
	case st.EvaluationError != "":
		// Not allowed, and an authorizer failed (say, an unreachable
		// webhook, whether it then had no opinion or, with failurePolicy
		// Deny, denied): the check failed. Like the API server's own
		// filter, which answers an authorizer error before a denial,
		// answer with an error (a 502 here) and cache nothing.
		return nil, fmt.Errorf("SubjectAccessReview for user %q: not evaluated: %s", user.Username, st.EvaluationError)
	default:
		what := schema.GroupResource{Group: attrs.Group, Resource: attrs.Resource}.String()
		if attrs.Subresource != "" {
			what += "/" + attrs.Subresource
		}
		msg := fmt.Sprintf("user %q may not %s %s %q", user.Username, attrs.Verb, what, attrs.Name)
		if attrs.Namespace != "" {
			msg += fmt.Sprintf(" in namespace %q", attrs.Namespace)
		}
		if st.Reason != "" {
			msg += ": " + st.Reason
		}
		denied = fmt.Errorf("%w: %s", ErrForbidden, msg)
	}
	a.perms.put(key, denied, a.expiry(denied))
	return denied, nil
}

// expiry is when a decision made now leaves the cache: refusals (err
// not nil) after NegativeTTL, grants after PositiveTTL.
func (a *kubeAuthenticator) expiry(err error) time.Time {
	if err != nil {
		return time.Now().Add(a.cfg.NegativeTTL)
	}
	return time.Now().Add(a.cfg.PositiveTTL)
}

// ttlCache is a bounded map with per-entry expiry and least-recently-used
// eviction. Keys are hashes, never raw tokens.
type ttlCache[V any] struct {
	mu    sync.Mutex
	max   int
	items map[string]*list.Element // of *cacheEntry[V]
	order *list.List               // front: most recently used
}

type cacheEntry[V any] struct {
	key     string
	val     V
	expires time.Time
}

func newTTLCache[V any](max int) *ttlCache[V] {
	return &ttlCache[V]{max: max, items: map[string]*list.Element{}, order: list.New()}
}

func (c *ttlCache[V]) get(key string) (val V, ok bool) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if el := c.items[key]; el != nil {
		if e := el.Value.(*cacheEntry[V]); time.Now().Before(e.expires) {
			c.order.MoveToFront(el)
			return e.val, true
		}
		c.remove(el) // expired
	}
	return val, false
}

func (c *ttlCache[V]) put(key string, val V, expires time.Time) {
	c.update(key, expires, func(V) V { return val })
}

// forget removes key's entry, if any.
func (c *ttlCache[V]) forget(key string) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if el := c.items[key]; el != nil {
		c.remove(el)
	}
}

func (c *ttlCache[V]) remove(el *list.Element) {
	c.order.Remove(el)
	delete(c.items, el.Value.(*cacheEntry[V]).key)
}

// update replaces the value under key with f of the current one (the
// zero value when missing or expired), expiring at expires.
func (c *ttlCache[V]) update(key string, expires time.Time, f func(V) V) {
	c.mu.Lock()
	defer c.mu.Unlock()
	var old V
	if el := c.items[key]; el != nil {
		if e := el.Value.(*cacheEntry[V]); time.Now().Before(e.expires) {
			old = e.val
		}
		c.remove(el)
	}
	c.items[key] = c.order.PushFront(&cacheEntry[V]{key: key, val: f(old), expires: expires})
	if c.order.Len() > c.max { // evict the least recently used
		c.remove(c.order.Back())
	}
}
