package trigger

import (
	"container/list"
	"context"
	"crypto/sha256"
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
	authnclient "k8s.io/client-go/kubernetes/typed/authentication/v1"
	authzclient "k8s.io/client-go/kubernetes/typed/authorization/v1"
	"k8s.io/client-go/rest"

	"github.com/opkit/opkit"
)

// DefaultAudience is the token audience the default authenticator asks the
// TokenReview for. Mint tokens for the endpoint with it, e.g.
// `kubectl create token SA --audience opkit-trigger`; tokens for the API
// server's own audience are refused.
const DefaultAudience = "opkit-trigger"

var (
	// ErrUnauthenticated is wrapped by Authenticator errors that mean 401:
	// no bearer token, or a token that is invalid, expired or for another
	// audience.
	ErrUnauthenticated = errors.New("unauthenticated")
	// ErrForbidden is wrapped by Authenticator errors that mean 403: the
	// caller is known but not allowed to trigger this object.
	ErrForbidden = errors.New("forbidden")
)

// AuthRequest is what an Authenticator decides on.
type AuthRequest struct {
	// HTTP is the incoming request (read its headers; do not read the body).
	HTTP *http.Request
	// Resource is the resource of the object the caller wants reconciled.
	Resource opkit.Resource
	// Key is that object's namespace and name (already validated).
	Key opkit.Key
}

// Authenticator decides whether a request may trigger a reconcile. It
// returns the caller's name (for logs) and nil to allow; an error wrapping
// ErrUnauthenticated (401) or ErrForbidden (403) to refuse, with a message
// safe to show the caller; any other error means the decision could not be
// made (504 if it wraps context.DeadlineExceeded, else 502). It is called
// concurrently and must never log or return the caller's credentials.
type Authenticator interface {
	Authorize(ctx context.Context, req AuthRequest) (user string, err error)
}

// ReviewClient is what the Kubernetes-native authenticator needs of the API
// server: TokenReviews and SubjectAccessReviews. A kubernetes.Interface
// (*kubernetes.Clientset) satisfies it, and so does a small struct holding
// the two typed clients (authenticationv1.NewForConfig and
// authorizationv1.NewForConfig) or their fakes.
type ReviewClient interface {
	AuthenticationV1() authnclient.AuthenticationV1Interface
	AuthorizationV1() authzclient.AuthorizationV1Interface
}

// KubeAuthConfig configures the Kubernetes-native authenticator. The zero
// value of every optional field means its documented default.
type KubeAuthConfig struct {
	// Client makes the TokenReviews and SubjectAccessReviews (required).
	// It needs RBAC permission to create both (the system:auth-delegator
	// ClusterRole grants exactly that).
	Client ReviewClient
	// Audiences the token must be valid for; nil means {DefaultAudience}.
	Audiences []string
	// Verb checked by the SubjectAccessReview; "" means "update".
	Verb string
	// Group and Resource checked by the SubjectAccessReview; an empty
	// Resource means the trigger's own resource (its Group is then used
	// too).
	Group, Resource string
	// Subresource checked by the SubjectAccessReview, e.g. a custom
	// "reconcile" granted in a Role; "" means none.
	Subresource string
	// PositiveTTL is how long an allow is cached; zero means 10s.
	PositiveTTL time.Duration
	// NegativeTTL is how long a refusal (bad token, denied) is cached;
	// zero means 5s.
	NegativeTTL time.Duration
	// MaxEntries bounds each of the two caches (tokens, decisions); the
	// least recently used entry is evicted. Zero means 4096.
	MaxEntries int
	// Logger receives one record per refusal or review failure (user
	// names, never tokens); nil means slog.Default().
	Logger *slog.Logger
}

// KubeAuthenticator checks the bearer token with a TokenReview for its own
// audience and the caller's permission with a SubjectAccessReview, caching
// both briefly. Tokens are held only as SHA-256 hashes. It is safe for
// concurrent use.
type KubeAuthenticator struct {
	cfg    KubeAuthConfig
	tokens *ttlCache[tokenResult]
	perms  *ttlCache[error]
	now    func() time.Time
}

var _ Authenticator = (*KubeAuthenticator)(nil)

type tokenResult struct {
	user authnv1.UserInfo
	err  error // wraps ErrUnauthenticated when the token was refused
}

// NewKubeAuthenticator validates cfg and returns the authenticator.
func NewKubeAuthenticator(cfg KubeAuthConfig) (*KubeAuthenticator, error) {
	if cfg.Client == nil {
		return nil, errors.New("trigger: KubeAuthConfig.Client is required")
	}
	if cfg.Audiences == nil {
		cfg.Audiences = []string{DefaultAudience}
	}
	if len(cfg.Audiences) == 0 || slices.Contains(cfg.Audiences, "") {
		return nil, errors.New("trigger: KubeAuthConfig.Audiences must not be empty")
	}
	if cfg.Group != "" && cfg.Resource == "" {
		return nil, fmt.Errorf("trigger: KubeAuthConfig.Group %q without Resource would be ignored (the trigger's own resource and group are checked); set Resource too", cfg.Group)
	}
	if cfg.Verb == "" {
		cfg.Verb = "update"
	}
	if cfg.PositiveTTL < 0 || cfg.NegativeTTL < 0 || cfg.MaxEntries < 0 {
		return nil, errors.New("trigger: KubeAuthConfig TTLs and MaxEntries must not be negative")
	}
	if cfg.PositiveTTL == 0 {
		cfg.PositiveTTL = 10 * time.Second
	}
	if cfg.NegativeTTL == 0 {
		cfg.NegativeTTL = 5 * time.Second
	}
	if cfg.MaxEntries == 0 {
		cfg.MaxEntries = 4096
	}
	if cfg.Logger == nil {
		cfg.Logger = slog.Default()
	}
	return &KubeAuthenticator{
		cfg:    cfg,
		tokens: newTTLCache[tokenResult](cfg.MaxEntries),
		perms:  newTTLCache[error](cfg.MaxEntries),
		now:    time.Now,
	}, nil
}

// bearerToken returns the token of an "Authorization: Bearer ..." header.
func bearerToken(r *http.Request) (string, bool) {
	h := r.Header.Values("Authorization")
	if len(h) != 1 {
		return "", false
	}
	scheme, tok, ok := strings.Cut(h[0], " ")
	if !ok || !strings.EqualFold(scheme, "Bearer") {
		return "", false
	}
	tok = strings.TrimSpace(tok)
	return tok, tok != ""
}

// Authorize implements Authenticator.
func (a *KubeAuthenticator) Authorize(ctx context.Context, req AuthRequest) (string, error) {
	tok, ok := bearerToken(req.HTTP)
	if !ok {
		return "", fmt.Errorf("%w: a bearer token (Authorization: Bearer ...) for audience %q is required", ErrUnauthenticated, a.cfg.Audiences[0])
	}
	sum := sha256.Sum256([]byte(tok))
	tokKey := string(sum[:])

	tr, err := a.review(ctx, tokKey, tok)
	if err != nil {
		return "", err
	}
	if tr.err != nil {
		return "", tr.err
	}
	attrs := a.attributes(req)
	permKey := tokKey + "\x00" + attrs.Verb + "\x00" + attrs.Group + "\x00" + attrs.Resource + "\x00" + attrs.Subresource + "\x00" + attrs.Namespace + "\x00" + attrs.Name
	if denied, ok := a.perms.get(permKey, a.now()); ok {
		return tr.user.Username, denied
	}
	denied, err := a.access(ctx, tr.user, attrs)
	if err != nil {
		return tr.user.Username, err
	}
	ttl := a.cfg.PositiveTTL
	if denied != nil {
		ttl = a.cfg.NegativeTTL
		a.cfg.Logger.LogAttrs(ctx, slog.LevelWarn, "trigger: caller denied", slog.String("user", tr.user.Username), slog.Any("reason", denied))
	}
	a.perms.put(permKey, denied, a.now().Add(ttl))
	return tr.user.Username, denied
}

func (a *KubeAuthenticator) review(ctx context.Context, tokKey, tok string) (tokenResult, error) {
	if tr, ok := a.tokens.get(tokKey, a.now()); ok {
		return tr, nil
	}
	rev, err := a.cfg.Client.AuthenticationV1().TokenReviews().Create(ctx, &authnv1.TokenReview{
		Spec: authnv1.TokenReviewSpec{Token: tok, Audiences: a.cfg.Audiences},
	}, metav1.CreateOptions{})
	if err != nil {
		a.cfg.Logger.LogAttrs(ctx, slog.LevelError, "trigger: TokenReview failed", slog.Any("error", err))
		return tokenResult{}, fmt.Errorf("TokenReview: %w", err)
	}
	var tr tokenResult
	st := rev.Status
	switch {
	case !st.Authenticated:
		// Status.Error is the API server's explanation (expired, wrong
		// audience, unknown); it never contains the token.
		msg := "the bearer token was not accepted"
		if st.Error != "" {
			msg += ": " + st.Error
		}
		tr.err = fmt.Errorf("%w: %s (audience %q)", ErrUnauthenticated, msg, a.cfg.Audiences)
	case !slices.ContainsFunc(st.Audiences, func(s string) bool { return slices.Contains(a.cfg.Audiences, s) }):
		// An authenticator that ignores audiences would accept an API
		// server token here; refuse unless the review confirms ours.
		tr.err = fmt.Errorf("%w: the bearer token is not valid for audience %q", ErrUnauthenticated, a.cfg.Audiences)
	default:
		tr.user = st.User
	}
	ttl := a.cfg.PositiveTTL
	if tr.err != nil {
		ttl = a.cfg.NegativeTTL
		a.cfg.Logger.LogAttrs(ctx, slog.LevelWarn, "trigger: token refused", slog.Any("reason", tr.err))
	}
	a.tokens.put(tokKey, tr, a.now().Add(ttl))
	return tr, nil
}

func (a *KubeAuthenticator) attributes(req AuthRequest) authzv1.ResourceAttributes {
	group, resource := req.Resource.Group, req.Resource.Resource
	if a.cfg.Resource != "" {
		group, resource = a.cfg.Group, a.cfg.Resource
	}
	return authzv1.ResourceAttributes{
		Namespace:   req.Key.Namespace,
		Verb:        a.cfg.Verb,
		Group:       group,
		Resource:    resource,
		Subresource: a.cfg.Subresource,
		Name:        req.Key.Name,
	}
}

// access returns (nil, nil) when allowed, (refusal wrapping ErrForbidden,
// nil) when denied, and (nil, err) when the review failed.
func (a *KubeAuthenticator) access(ctx context.Context, user authnv1.UserInfo, attrs authzv1.ResourceAttributes) (error, error) {
	extra := make(map[string]authzv1.ExtraValue, len(user.Extra))
	for k, v := range user.Extra {
		extra[k] = authzv1.ExtraValue(v)
	}
	sar, err := a.cfg.Client.AuthorizationV1().SubjectAccessReviews().Create(ctx, &authzv1.SubjectAccessReview{
		Spec: authzv1.SubjectAccessReviewSpec{
			ResourceAttributes: &attrs,
			User:               user.Username,
			UID:                user.UID,
			Groups:             user.Groups,
			Extra:              extra,
		},
	}, metav1.CreateOptions{})
	if err != nil {
		a.cfg.Logger.LogAttrs(ctx, slog.LevelError, "trigger: SubjectAccessReview failed", slog.Any("error", err))
		return nil, fmt.Errorf("SubjectAccessReview: %w", err)
	}
	if sar.Status.Allowed && !sar.Status.Denied {
		return nil, nil
	}
	if sar.Status.EvaluationError != "" {
		// Not allowed, and an authorizer failed (say, an unreachable
		// webhook, whether it then had no opinion or, with failurePolicy
		// Deny, denied): the check failed. Like the API server's own
		// filter, which answers an authorizer error before a denial,
		// answer with an error (a 502 here) and cache nothing.
		a.cfg.Logger.LogAttrs(ctx, slog.LevelError, "trigger: SubjectAccessReview could not be evaluated",
			slog.String("user", user.Username), slog.String("evaluationError", sar.Status.EvaluationError))
		return nil, fmt.Errorf("SubjectAccessReview: not evaluated: %s", sar.Status.EvaluationError)
	}
	what := attrs.Resource
	if attrs.Group != "" {
		what += "." + attrs.Group
	}
	if attrs.Subresource != "" {
		what += "/" + attrs.Subresource
	}
	msg := fmt.Sprintf("%s: user %q may not %s %s %q", ErrForbidden, user.Username, attrs.Verb, what, attrs.Name)
	if attrs.Namespace != "" {
		msg += fmt.Sprintf(" in namespace %q", attrs.Namespace)
	}
	if sar.Status.Reason != "" {
		msg += ": " + sar.Status.Reason
	}
	return &refusal{base: ErrForbidden, msg: msg}, nil
}

type refusal struct {
	base error
	msg  string
}

func (r *refusal) Error() string { return r.msg }
func (r *refusal) Unwrap() error { return r.base }

// ttlCache is a bounded map with per-entry expiry and least-recently-used
// eviction. Keys are hashes, never raw tokens.
type ttlCache[V any] struct {
	mu    sync.Mutex
	max   int
	items map[string]*list.Element
	order *list.List // front = most recently used
}

type cacheEntry[V any] struct {
	key     string
	val     V
	expires time.Time
}

func newTTLCache[V any](max int) *ttlCache[V] {
	return &ttlCache[V]{max: max, items: map[string]*list.Element{}, order: list.New()}
}

func (c *ttlCache[V]) get(key string, now time.Time) (V, bool) {
	c.mu.Lock()
	defer c.mu.Unlock()
	el, ok := c.items[key]
	if !ok {
		var zero V
		return zero, false
	}
	e := el.Value.(*cacheEntry[V])
	if !now.Before(e.expires) {
		c.order.Remove(el)
		delete(c.items, key)
		var zero V
		return zero, false
	}
	c.order.MoveToFront(el)
	return e.val, true
}

func (c *ttlCache[V]) put(key string, val V, expires time.Time) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if el, ok := c.items[key]; ok {
		e := el.Value.(*cacheEntry[V])
		e.val, e.expires = val, expires
		c.order.MoveToFront(el)
		return
	}
	c.items[key] = c.order.PushFront(&cacheEntry[V]{key: key, val: val, expires: expires})
	for c.order.Len() > c.max {
		last := c.order.Back()
		c.order.Remove(last)
		delete(c.items, last.Value.(*cacheEntry[V]).key)
	}
}

func (c *ttlCache[V]) len() int {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.order.Len()
}

type reviewClient struct {
	authn authnclient.AuthenticationV1Interface
	authz authzclient.AuthorizationV1Interface
}

func (c reviewClient) AuthenticationV1() authnclient.AuthenticationV1Interface { return c.authn }
func (c reviewClient) AuthorizationV1() authzclient.AuthorizationV1Interface   { return c.authz }

// NewReviewClient returns a ReviewClient for the API server cfg points to,
// for callers that have no kubernetes.Interface at hand.
func NewReviewClient(cfg *rest.Config) (ReviewClient, error) {
	authn, err := authnclient.NewForConfig(cfg)
	if err != nil {
		return nil, fmt.Errorf("trigger: authentication client: %w", err)
	}
	authz, err := authzclient.NewForConfig(cfg)
	if err != nil {
		return nil, fmt.Errorf("trigger: authorization client: %w", err)
	}
	return reviewClient{authn: authn, authz: authz}, nil
}
