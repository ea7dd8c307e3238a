package trigger

import (
	"bytes"
	"cmp"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"maps"
	"math"
	"mime"
	"net"
	"net/http"
	"net/url"
	"os"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"
	"unicode/utf8"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/util/flowcontrol"

	"github.com/opkit/opkit"
	"github.com/opkit/opkit/queue"
)

// LeaderHeader is the response header that names the current leader when a
// trigger was dropped (503), so a caller can retry against it.
const LeaderHeader = "X-Opkit-Leader"

// ForwardedHeader marks a request a follower forwarded to the leader (its
// value names the follower), which is never forwarded again, and the
// answer a follower passed on.
const ForwardedHeader = "X-Opkit-Forwarded"

// EndpointAnnotation is the Lease annotation under which a leader
// publishes the base URL of its trigger endpoint (leader.Config's
// Annotations), for followers to forward to.
const EndpointAnnotation = "trigger.opkit.dev/endpoint"

// Status reasons of the answers Kubernetes has no reason for: 502 (the
// API server failed), 408 (the body came too late) and 431 (the headers
// are too large).
const (
	ReasonBadGateway      metav1.StatusReason = "BadGateway"
	ReasonRequestTimeout  metav1.StatusReason = "RequestTimeout"
	ReasonHeadersTooLarge metav1.StatusReason = "RequestHeaderFieldsTooLarge"
)

// HandlerConfig configures the HTTP trigger endpoint. The zero value of
// every optional field means its documented default.
type HandlerConfig[T opkit.Object] struct {
	// Trigger is where scheduled reconciles go (required); its resource
	// decides the routes: /reconcile/{namespace}/{name} for namespaced
	// resources, /reconcile/{name} for cluster-scoped ones.
	Trigger *Trigger[T]
	// Authenticator decides who may trigger what. If nil and Reviews is
	// set, the Kubernetes-native authenticator (NewKubeAuthenticator with
	// KubeAuthConfig{Client: Reviews} defaults) is used. If both are nil,
	// NewHandler fails unless InsecureSkipAuth is set.
	Authenticator Authenticator
	// Reviews is the client for the default Authenticator.
	Reviews ReviewClient
	// InsecureSkipAuth serves every caller without authentication. Only
	// for development or behind another authenticating layer. Callers
	// are then told apart by address only, for their share of the trigger
	// budget: a leader sees those a follower forwards as one caller, the
	// follower.
	InsecureSkipAuth bool
	// Leader returns the current leader's identity for 503 answers (for
	// example leader.Elector's Leader method); nil or "" means unknown.
	Leader func() string
	// LeaderEndpoint returns the base URL of the leader's trigger
	// endpoint ("https://10.0.0.7:8443", as its Lease's
	// EndpointAnnotation says) while this replica does not lead, and ""
	// while it leads or no leader is known (reconcile.Controller's
	// LeaderEndpoint). When set, a follower authenticates and authorizes
	// a request as the leader would, then forwards it there with the
	// caller's credentials (the leader authenticates and authorizes it
	// again: a follower never impersonates) and answers with the leader's
	// answer: 503 when the leader does not answer (it is likely gone).
	// A forwarded request
	// is never forwarded again (a replica that does not lead answers it
	// 503), and over TLS one is forwarded only to an https endpoint.
	LeaderEndpoint func() string
	// HolderEndpoint is LeaderEndpoint for a sharded controller
	// (reconcile.Sharded's HolderEndpoint): it returns the base URL of
	// the trigger endpoint of the replica that holds the shard of the
	// object with uid, while this replica does not, and "" while it does
	// or no holder is known. The object is read here to learn its UID,
	// and a trigger dropped because this replica does not hold its shard
	// is forwarded as with LeaderEndpoint (the holder reads it again);
	// so is a GET of a trigger this replica does not know, after a read.
	// The Trigger's queue must not drop a trigger before the read, as a
	// suspended queue drops an add that only joins an entry:
	// reconcile.Sharded's trigger joins none. At most one of
	// LeaderEndpoint and HolderEndpoint may be set.
	HolderEndpoint func(uid types.UID) string
	// ForwardClient sends forwarded requests; nil means a client of
	// net/http's default transport that keeps 64 idle connections to the
	// leader. Over TLS, give it the configuration that
	// trusts the replicas' serving certificates (and as many idle
	// connections). Identity names this
	// replica in the forwarded requests' ForwardedHeader.
	ForwardClient *http.Client
	Identity      string
	// Type is the event type of triggered reconciles; zero means
	// opkit.Modified.
	Type opkit.Type
	// MaxDelay bounds the `delay` query parameter; zero means 1h.
	MaxDelay time.Duration
	// MaxWait bounds the `wait` query parameter; zero means
	// DefaultMaxWait. MaxWaiting bounds the callers waiting for outcomes
	// at once (they hold no in-flight slot while they wait); zero means
	// DefaultMaxWaiting; beyond, 429.
	MaxWait    time.Duration
	MaxWaiting int
	// MaxBodyBytes bounds the optional JSON body ({"reason": "..."});
	// zero means DefaultMaxBodyBytes. Larger bodies get 413.
	MaxBodyBytes int64
	// BodyTimeout is how long the body may take to arrive, from when the
	// handler starts; zero means 2s. A late body gets 408 and the
	// connection is closed. The body is read before the request takes an
	// in-flight slot, so a slow client holds nothing others need.
	BodyTimeout time.Duration
	// APITimeout bounds the API calls of one request together: the
	// TokenReview, the SubjectAccessReview and the read of the object;
	// zero means 5s. A timeout answers 504.
	APITimeout time.Duration
	// RetryAfter is the Retry-After of 503 and 429 answers, rounded up to
	// whole seconds; zero means 5s.
	RetryAfter time.Duration
	// RateLimit is the sustained requests per second across all callers;
	// zero means unlimited. Requests over the limit get 429.
	RateLimit float64
	// RateBurst is the rate limiter's bucket size: how many requests may
	// come at once before RateLimit applies; zero means
	// max(1, ceil(RateLimit)).
	RateBurst int
	// MaxInFlight bounds the requests being authorized, read and
	// enqueued at once (their bodies read); zero means 64, negative means
	// unlimited. Requests over the limit get 429 at once.
	MaxInFlight int
	// MaxAuthFailures: a client address (the host of RemoteAddr: behind
	// a proxy, the proxy's) whose requests failed authentication this
	// many times, each within AuthFailureBackoff of the one before, is
	// answered 429 without a review until AuthFailureBackoff has passed
	// since the last. Zero means 10, negative means no such limit; zero
	// AuthFailureBackoff means 10s.
	MaxAuthFailures    int
	AuthFailureBackoff time.Duration
	// Metrics receives one count per request; nil means none.
	Metrics HandlerMetrics
	// Logger receives the records of refused and failed requests (never a
	// token), at most one per status code every 10s with the number left
	// out; nil means slog.Default().
	Logger *slog.Logger
}

// Accepted is the JSON body of a 202 answer.
type Accepted struct {
	// Key is "namespace/name" (or "name").
	Key string `json:"key"`
	// Namespace (empty for a cluster-scoped resource) and Name are the
	// object's, as in the URL.
	Namespace string `json:"namespace,omitempty"`
	Name      string `json:"name"`
	// UID and ResourceVersion are those of the object as re-fetched.
	UID             string `json:"uid"`
	ResourceVersion string `json:"resourceVersion"`
	// Delay is the scheduling delay as a Go duration ("0s").
	Delay string `json:"delay"`
	// Outcome is "Queued" or "Merged" (into an entry already pending).
	Outcome string `json:"outcome"`
	// ID and StatusPath, when the caller waited (?wait=) and the wait
	// ended first: the trigger's id and the path whose GET answers its
	// Outcome while this replica remembers it.
	ID         string `json:"id,omitempty"`
	StatusPath string `json:"statusPath,omitempty"`
}

// Defaults of HandlerConfig.MaxWait and MaxWaiting.
const (
	DefaultMaxWait    = 5 * time.Minute
	DefaultMaxWaiting = 1024
)

// Status is the JSON body of every error answer, shaped like a Kubernetes
// metav1.Status, plus the leader's identity and the queue's outcome when an
// enqueue was dropped.
type Status struct {
	// Kind is "Status" and APIVersion "v1", as in a Kubernetes Status.
	Kind       string `json:"kind"`
	APIVersion string `json:"apiVersion"`
	// Status is "Failure".
	Status string `json:"status"`
	// Message says what went wrong, for a human.
	Message string `json:"message"`
	// Reason is the machine-readable cause (e.g. "NotFound",
	// "ServiceUnavailable"); Code is the HTTP status code.
	Reason metav1.StatusReason `json:"reason"`
	Code   int                 `json:"code"`
	// Leader is the identity of the replica leading when this one
	// dropped the enqueue (also in the X-Opkit-Leader header), if known.
	Leader string `json:"leader,omitempty"`
	// Outcome is the queue's outcome of a dropped enqueue
	// ("DroppedSuspended" or "DroppedShutDown").
	Outcome string `json:"outcome,omitempty"`
	// Details names the object, once the path named a valid one.
	Details *metav1.StatusDetails `json:"details,omitempty"`
}

type handler[T opkit.Object] struct {
	cfg      HandlerConfig[T]               // validated, defaults applied (no Authenticator: InsecureSkipAuth)
	inflight chan struct{}                  // nil when unlimited
	rate     flowcontrol.PassiveRateLimiter // nil when unlimited
	failures *ttlCache[int]                 // failed authentications by client address
	waiting  atomic.Int64                   // callers waiting for outcomes
	log      *sampler
}

// NewHandler validates cfg and returns the HTTP trigger endpoint. It serves
// POST /reconcile/{namespace}/{name} (namespaced resources) or POST
// /reconcile/{name} (cluster-scoped); mount it at the server root or
// behind http.StripPrefix. Query parameters: delay (a Go duration, 0 to
// MaxDelay), reason (one of the reasons the reconcile request carries;
// or in an application/json body {"reason": "..."}) and wait (a Go
// duration up to MaxWait: answer with the reconcile's Outcome, 200, if it
// finishes within it, else 202 with the trigger's id); GET
// .../triggers/{id} answers what is known of a waited-for trigger. The
// package documentation lists the status codes.
func NewHandler[T opkit.Object](cfg HandlerConfig[T]) (http.Handler, error) {
	cfg.Type = cmp.Or(cfg.Type, opkit.Modified)
	switch {
	case cfg.Trigger == nil:
		return nil, errors.New("trigger: HandlerConfig.Trigger is required")
	case cfg.Trigger.cfg.Get == nil:
		return nil, errNoGetter
	case cfg.InsecureSkipAuth && (cfg.Authenticator != nil || cfg.Reviews != nil):
		return nil, errors.New("trigger: HandlerConfig.InsecureSkipAuth contradicts Authenticator/Reviews")
	case !cfg.InsecureSkipAuth && cfg.Authenticator == nil && cfg.Reviews == nil:
		return nil, errors.New("trigger: HandlerConfig needs an Authenticator (or Reviews for the Kubernetes-native one); set InsecureSkipAuth to run without authentication")
	case !cfg.Type.Valid():
		return nil, fmt.Errorf("trigger: HandlerConfig.Type %v is invalid", cfg.Type)
	case cfg.MaxWait < 0 || cfg.MaxWaiting < 0 || cfg.MaxDelay < 0 || cfg.MaxBodyBytes < 0 || cfg.BodyTimeout < 0 || cfg.APITimeout < 0 || cfg.RetryAfter < 0 || cfg.RateLimit < 0 || cfg.RateBurst < 0 ||
		cfg.AuthFailureBackoff < 0 || math.IsNaN(cfg.RateLimit) || math.IsInf(cfg.RateLimit, 0):
		return nil, errors.New("trigger: HandlerConfig durations, sizes and limits must be finite and not negative")
	case cfg.LeaderEndpoint != nil && cfg.HolderEndpoint != nil:
		return nil, errors.New("trigger: HandlerConfig.LeaderEndpoint and HolderEndpoint are for a controller with one leader and a sharded one: set one of them")
	case cfg.RateBurst > 0 && cfg.RateLimit == 0:
		return nil, errors.New("trigger: HandlerConfig.RateBurst without RateLimit would have no effect; set RateLimit too")
	}
	cfg.MaxDelay = cmp.Or(cfg.MaxDelay, time.Hour)
	cfg.MaxWait, cfg.MaxWaiting = cmp.Or(cfg.MaxWait, DefaultMaxWait), cmp.Or(cfg.MaxWaiting, DefaultMaxWaiting)
	if cfg.ForwardClient == nil {
		// Waiting callers hold their forwarded request's connection: keep
		// as many idle ones to the leader as may wait, not net/http's 2.
		tr := http.DefaultTransport.(*http.Transport).Clone()
		tr.MaxIdleConnsPerHost = 64
		cfg.ForwardClient = &http.Client{Transport: tr}
	}
	cfg.MaxBodyBytes = cmp.Or(cfg.MaxBodyBytes, DefaultMaxBodyBytes)
	cfg.BodyTimeout = cmp.Or(cfg.BodyTimeout, 2*time.Second)
	cfg.MaxAuthFailures = cmp.Or(cfg.MaxAuthFailures, 10)
	cfg.AuthFailureBackoff = cmp.Or(cfg.AuthFailureBackoff, 10*time.Second)
	cfg.APITimeout = cmp.Or(cfg.APITimeout, 5*time.Second)
	cfg.RetryAfter = cmp.Or(cfg.RetryAfter, 5*time.Second)
	cfg.MaxInFlight = cmp.Or(cfg.MaxInFlight, 64)
	cfg.Metrics = cmp.Or[HandlerMetrics](cfg.Metrics, nopMetrics{})
	cfg.Logger = cmp.Or(cfg.Logger, slog.Default())
	if cfg.Authenticator == nil && cfg.Reviews != nil {
		a, err := NewKubeAuthenticator(KubeAuthConfig{Client: cfg.Reviews})
		if err != nil {
			return nil, err
		}
		cfg.Authenticator = a
	}
	h := &handler[T]{cfg: cfg, failures: newTTLCache[int](4096), log: newSampler(cfg.Logger)}
	if cfg.MaxInFlight > 0 {
		h.inflight = make(chan struct{}, cfg.MaxInFlight)
	}
	if cfg.RateLimit > 0 {
		burst := cmp.Or(cfg.RateBurst, max(1, int(math.Ceil(cfg.RateLimit))))
		h.rate = flowcontrol.NewTokenBucketPassiveRateLimiter(float32(cfg.RateLimit), burst)
	}
	return h, nil
}

// ServeHTTP answers every request with a JSON body: an [Accepted] or a
// [Status]; 429 and 503 answers carry Retry-After.
func (h *handler[T]) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	start := time.Now()
	bodyRead := false
	body := h.serve(w, r, &bodyRead)
	if f, ok := body.(forwarded); ok {
		maps.Copy(w.Header(), f.header)
		w.Header().Set(ForwardedHeader, "by this replica to the one that serves it")
		w.WriteHeader(f.code)
		_, _ = w.Write(f.body)
		h.cfg.Metrics.Request(f.code, "Forwarded", time.Since(start))
		return
	}
	code, reason := http.StatusAccepted, "Accepted"
	if _, ok := body.(Outcome); ok {
		code, reason = http.StatusOK, "OK"
	}
	if st, ok := body.(*Status); ok {
		code, reason = st.Code, string(st.Reason)
		if (code >= 500 || code == http.StatusUnauthorized || code == http.StatusForbidden || code == http.StatusTooManyRequests) && r.Context().Err() == nil {
			h.log.Log(r.Context(), slog.LevelWarn, strconv.Itoa(code), "trigger: request refused", slog.Int("code", code),
				slog.String("reason", reason), slog.String("message", st.Message), slog.String("path", r.URL.Path))
		}
		if code == http.StatusTooManyRequests || code == http.StatusServiceUnavailable {
			w.Header().Set("Retry-After", strconv.FormatInt(max(1, int64(math.Ceil(h.cfg.RetryAfter.Seconds()))), 10))
		}
	}
	if !bodyRead && r.ContentLength != 0 {
		// net/http would otherwise read what is left of the body, before
		// it answers (a slow client would delay even a 429) and after.
		w.Header().Set("Connection", "close")
		_ = http.NewResponseController(w).SetReadDeadline(time.Now())
	}
	writeJSON(w, code, body)
	h.cfg.Metrics.Request(code, reason, time.Since(start))
}

// writeJSON writes body as the JSON answer with code.
func writeJSON(w http.ResponseWriter, code int, body any) {
	w.Header().Set("Content-Type", "application/json")
	w.Header().Set("X-Content-Type-Options", "nosniff")
	w.Header().Set("Cache-Control", "no-store")
	w.WriteHeader(code)
	_ = json.NewEncoder(w).Encode(body)
}

// serve handles r in the order the package documentation's status table
// relies on: route, method, rate, the client's failed authentications,
// query and body (bodyRead is set once the body is in), the in-flight
// limit, then Intake (the key, the caller's authorization, the scope,
// the trigger budget, the read, the enqueue). It returns an Accepted or a
// *Status.
func (h *handler[T]) serve(w http.ResponseWriter, r *http.Request, bodyRead *bool) any {
	key, id, st := h.route(r)
	if st != nil {
		return st
	}
	if want := map[bool]string{false: http.MethodPost, true: http.MethodGet}[id != ""]; r.Method != want {
		w.Header().Set("Allow", want)
		return h.fail(http.StatusMethodNotAllowed, "only POST triggers a reconcile, and only GET reads a trigger's outcome", nil)
	}
	if h.rate != nil && !h.rate.TryAccept() {
		return h.fail(http.StatusTooManyRequests, "request rate limit exceeded", nil)
	}
	client := clientHost(r)
	if n, _ := h.failures.get(client); h.cfg.MaxAuthFailures > 0 && n >= h.cfg.MaxAuthFailures {
		return h.fail(http.StatusTooManyRequests, "too many failed authentications from this address; try again later", nil)
	}
	p := Pointer{Key: key, Type: h.cfg.Type}
	var wait time.Duration
	if code, err := h.parse(w, r, &p, &wait, id != ""); err != nil {
		return h.fail(code, err.Error(), nil)
	}
	*bodyRead = true
	if wait > 0 {
		// The answer may come as late as the wait's end (the server's
		// WriteTimeout would cut it off).
		_ = http.NewResponseController(w).SetWriteDeadline(time.Now().Add(wait + 2*h.cfg.APITimeout))
	}
	release, st := h.slot()
	if st != nil {
		return st
	}
	defer release()
	var user string
	var authErr error
	authorize := func(ctx context.Context, key opkit.Key) (string, error) {
		if h.cfg.Authenticator == nil {
			return "address " + client, nil
		}
		user, authErr = h.cfg.Authenticator.Authorize(ctx, AuthRequest{HTTP: r, Resource: h.cfg.Trigger.Resource(), Key: key})
		switch {
		case errors.Is(authErr, ErrUnauthenticated):
			h.failures.update(client, time.Now().Add(h.cfg.AuthFailureBackoff), func(n int) int { return n + 1 })
		case authErr == nil:
			h.failures.forget(client)
		}
		return "user " + user, authErr
	}
	ctx, cancel := context.WithTimeout(r.Context(), h.cfg.APITimeout)
	var obj T
	var o queue.Outcome
	var tk *Ticket
	var err error
	leaderURL := ""
	waiting := false // this request holds a place among MaxWaiting
	if h.cfg.LeaderEndpoint != nil && r.Header.Get(ForwardedHeader) == "" {
		leaderURL = h.cfg.LeaderEndpoint()
	}
	switch {
	case leaderURL != "": // a follower: the leader answers, once the caller passed here too
		if err = h.cfg.Trigger.check(key, cmp.Or(p.Type, opkit.Modified), p.Delay, p.Reason); err == nil {
			if _, err = authorize(ctx, key); err != nil {
				err = fmt.Errorf("trigger: %w", err)
			}
		}
	case id != "": // GET: what is known of a trigger
		var caller string
		if caller, err = authorize(ctx, key); err != nil {
			err = fmt.Errorf("trigger: %w", err)
			break
		}
		// Unknown here: the replica that holds the object's shard may know
		// it. Read the object (paid as a trigger's read) to learn which
		// that is; none outside the scope or when it is gone. A read that
		// failed is answered as for a trigger (429, 502, 504).
		out := h.cfg.Trigger.Lookup(key, id)
		if out.State == Unknown && h.cfg.HolderEndpoint != nil && r.Header.Get(ForwardedHeader) == "" && h.cfg.Trigger.checkNamespace(key) == nil {
			if obj, err = h.cfg.Trigger.read(ctx, key, caller, IntakeOptions{}); err == nil {
				leaderURL = h.cfg.HolderEndpoint(obj.GetUID())
			} else if errors.Is(err, ErrNotFound) {
				err = nil
			}
		}
		if err == nil && leaderURL == "" {
			cancel()
			return out
		}
	case wait > 0:
		if h.waiting.Add(1) > int64(h.cfg.MaxWaiting) {
			h.waiting.Add(-1)
			cancel()
			return h.fail(http.StatusTooManyRequests, fmt.Sprintf("%d callers wait for outcomes already", h.cfg.MaxWaiting), &key)
		}
		waiting = true
		defer h.waiting.Add(-1)
		obj, o, tk, err = h.cfg.Trigger.IntakeTracked(ctx, p, IntakeOptions{Authorize: authorize}, Tracked)
	default:
		obj, o, err = h.cfg.Trigger.Intake(ctx, p, IntakeOptions{Authorize: authorize})
	}
	cancel()
	if st := h.refusal(w, r, key, err, authErr); st != nil {
		return st
	}
	if id == "" && leaderURL == "" && !o.Accepted() && !isNil(obj) && h.cfg.HolderEndpoint != nil && r.Header.Get(ForwardedHeader) == "" {
		// Dropped here: the holder of the object's shard answers, if
		// another replica holds it.
		leaderURL = h.cfg.HolderEndpoint(obj.GetUID())
	}
	if leaderURL != "" {
		release() // the leader (the shard's holder) does the work
		return h.forward(r, leaderURL, p, wait, key, waiting)
	}
	if !o.Accepted() {
		return h.dropped(w, o, key)
	}
	h.cfg.Logger.LogAttrs(r.Context(), slog.LevelDebug, "trigger: scheduled", slog.String("key", key.String()), slog.String("user", user), slog.String("outcome", o.String()))
	a := Accepted{Key: key.String(), Namespace: key.Namespace, Name: key.Name, Delay: p.Delay.String(), Outcome: o.String()}
	if !isNil(obj) { // not joined into an entry that waited: read
		a.UID, a.ResourceVersion = string(obj.GetUID()), obj.GetResourceVersion()
	}
	if tk == nil {
		return a
	}
	// The caller waits; its slot is for work, not for waiting.
	release()
	// The path as the caller sent it (a prefix StripPrefix removed included).
	path, _, _ := strings.Cut(r.RequestURI, "?")
	if path == "" {
		path = r.URL.Path
	}
	a.ID, a.StatusPath = tk.ID, strings.TrimSuffix(path, "/")+"/triggers/"+tk.ID
	wctx, stop := context.WithTimeout(r.Context(), wait)
	defer stop()
	out, err := tk.Wait(wctx)
	switch {
	case err != nil && r.Context().Err() != nil:
		return h.fail(http.StatusServiceUnavailable, "the caller left before the outcome", &key)
	case err != nil:
		return a // the wait ended first: 202, with the trigger's id
	case out.State == Unknown:
		return h.fail(http.StatusServiceUnavailable, "no outcome: "+out.Error, &key)
	}
	return out
}

// refusal is the answer to a request Intake or the authorization refused
// (err, and authErr the authorization's), or nil when neither did.
func (h *handler[T]) refusal(w http.ResponseWriter, r *http.Request, key opkit.Key, err, authErr error) *Status {
	switch {
	case err == nil:
		return nil
	case errors.Is(err, ErrInvalid):
		return h.fail(http.StatusBadRequest, err.Error(), nil)
	case errors.Is(err, ErrBusy):
		return h.fail(http.StatusTooManyRequests, err.Error(), &key)
	case errors.Is(authErr, ErrUnauthenticated):
		// RFC 6750: an error code only when a token was presented.
		challenge := `Bearer realm="opkit-trigger"`
		if _, ok := bearerToken(r); ok {
			challenge += `, error="invalid_token"`
		}
		w.Header().Set("WWW-Authenticate", challenge)
		return h.fail(http.StatusUnauthorized, err.Error(), &key)
	case errors.Is(authErr, ErrForbidden):
		return h.fail(http.StatusForbidden, err.Error(), &key)
	case authErr != nil:
		// The caller is not authenticated or not authorized yet: the API
		// server's answer (which may describe the operator's own RBAC)
		// goes to the log only.
		return h.apiFailure(r, "authorization", err, key)
	case errors.Is(err, ErrOutOfScope), errors.Is(err, ErrNotFound):
		return h.fail(http.StatusNotFound, err.Error(), &key)
	}
	return h.apiFailure(r, "read", err, key)
}

// forwarded is the leader's answer to a forwarded request, passed on as
// it came.
type forwarded struct {
	code   int
	header http.Header
	body   []byte
}

// forward sends the request r (its pointer p and wait) to the leader's
// endpoint with the caller's credentials, and returns the leader's answer
// (or 503 when there is none: the leader is likely gone; 502 when it
// would take credentials from TLS to plain HTTP). It takes a place among
// MaxWaiting unless the request holds one already (waiting).
func (h *handler[T]) forward(r *http.Request, leader string, p Pointer, wait time.Duration, key opkit.Key, waiting bool) any {
	u, err := url.Parse(leader)
	switch {
	case err != nil || u.Host == "" || u.Scheme != "http" && u.Scheme != "https":
		return h.fail(http.StatusBadGateway, "the leader publishes no usable endpoint", &key)
	case r.TLS != nil && u.Scheme != "https":
		return h.fail(http.StatusBadGateway, "the leader's endpoint is not HTTPS: the caller's credentials stay here", &key)
	}
	if !waiting {
		if h.waiting.Add(1) > int64(h.cfg.MaxWaiting) {
			h.waiting.Add(-1)
			return h.fail(http.StatusTooManyRequests, fmt.Sprintf("%d forwarded or waiting requests already", h.cfg.MaxWaiting), &key)
		}
		defer h.waiting.Add(-1)
	}
	q := r.URL.Query()
	if p.Reason != "" {
		q.Set("reason", p.Reason) // it may have come in the body
	}
	u = u.JoinPath(r.URL.Path)
	u.RawQuery = q.Encode()
	ctx, cancel := context.WithTimeout(r.Context(), wait+2*h.cfg.APITimeout)
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, r.Method, u.String(), nil)
	if err != nil {
		return h.fail(http.StatusBadGateway, "the leader's endpoint cannot be addressed", &key)
	}
	if auth := r.Header.Get("Authorization"); auth != "" {
		req.Header.Set("Authorization", auth)
	}
	req.Header.Set(ForwardedHeader, cmp.Or(h.cfg.Identity, "follower"))
	resp, err := h.cfg.ForwardClient.Do(req)
	if err != nil {
		// Most likely the leader died and its Lease has not expired yet:
		// for the caller, no replica leads right now.
		h.log.Log(r.Context(), slog.LevelWarn, "forward", "trigger: forwarding to the leader failed", slog.String("leader", leader), slog.Any("error", err))
		return h.fail(http.StatusServiceUnavailable, "the leader's endpoint does not answer: leadership is likely changing", &key)
	}
	defer resp.Body.Close()
	body, err := io.ReadAll(io.LimitReader(resp.Body, 1<<20))
	if err != nil {
		return h.fail(http.StatusBadGateway, "the leader's answer was cut off", &key)
	}
	header := http.Header{}
	for _, k := range []string{"Content-Type", "Retry-After", LeaderHeader, "WWW-Authenticate"} {
		if v := resp.Header.Get(k); v != "" {
			header.Set(k, v)
		}
	}
	return forwarded{code: resp.StatusCode, header: header, body: body}
}

// slot takes an in-flight slot; release gives it back (once, however
// often it is called).
func (h *handler[T]) slot() (release func(), st *Status) {
	if h.inflight == nil {
		return func() {}, nil
	}
	select {
	case h.inflight <- struct{}{}:
		return sync.OnceFunc(func() { <-h.inflight }), nil
	default:
		return nil, h.fail(http.StatusTooManyRequests, "too many requests in flight", nil)
	}
}

// clientHost is the host of r's remote address, the unit the failed
// authentications are counted by.
func clientHost(r *http.Request) string {
	if host, _, err := net.SplitHostPort(r.RemoteAddr); err == nil {
		return host
	}
	return r.RemoteAddr
}

// route returns the key named by r's path: /reconcile/{namespace}/{name}
// for a namespaced resource, /reconcile/{name} for a cluster-scoped one
// (behind http.StripPrefix the leading slash may be missing). Segments are
// unescaped one by one, so "a%2Fb" is one (invalid) name. A path with
// empty, "." or ".." segments is refused: a mux would redirect it to its
// cleaned form, and a client following that would trigger another name
// than it wrote.
func (h *handler[T]) route(r *http.Request) (key opkit.Key, id string, st *Status) {
	res := h.cfg.Trigger.Resource()
	want, scope, use := 1, "cluster-scoped", "use POST /reconcile/{name}"
	if res.Namespaced {
		want, scope, use = 2, "namespaced", "use POST /reconcile/{namespace}/{name}"
	}
	segs := strings.Split(strings.TrimPrefix(r.URL.EscapedPath(), "/"), "/")
	for i, seg := range segs {
		var err error
		segs[i], err = url.PathUnescape(seg)
		if err != nil || segs[i] == "." || segs[i] == ".." || segs[i] == "" && i < len(segs)-1 {
			return key, "", h.fail(http.StatusBadRequest, fmt.Sprintf("the path %q has an empty, dot, dot-dot or badly escaped segment; %s", r.URL.Path, use), nil)
		}
	}
	if n := len(segs); n == 3+want && segs[n-2] == "triggers" { // .../triggers/{id}
		id, segs = segs[n-1], segs[:n-2]
	}
	if len(segs) != 1+want || segs[0] != "reconcile" || slices.Contains(segs, "") {
		return key, "", h.fail(http.StatusNotFound, fmt.Sprintf("no such route: %s is %s; %s (and GET its .../triggers/{id})", res.Resource, scope, use), nil)
	}
	if want == 1 {
		return opkit.Key{Name: segs[1]}, id, nil
	}
	return opkit.Key{Namespace: segs[1], Name: segs[2]}, id, nil
}

// parse reads the query's delay and reason, and the reason of the
// optional application/json body ({"reason": "..."}), into p; on failure
// it returns the status code (400, 413 or 415). Intake checks the key and
// the reason.
func (h *handler[T]) parse(w http.ResponseWriter, r *http.Request, p *Pointer, wait *time.Duration, lookup bool) (int, error) {
	q, err := url.ParseQuery(r.URL.RawQuery)
	if err != nil {
		return http.StatusBadRequest, invalid("query: %v", err)
	}
	for k, v := range q {
		if k != "delay" && k != "reason" && k != "wait" || len(v) != 1 || lookup {
			return http.StatusBadRequest, invalid("query parameter %q: want at most one delay, one reason and one wait, and nothing else (a lookup takes none)", k)
		}
	}
	if q.Has("wait") {
		*wait, err = time.ParseDuration(q.Get("wait"))
		if err != nil || *wait <= 0 || *wait > h.cfg.MaxWait {
			return http.StatusBadRequest, invalid("wait %q: want a Go duration above 0 and at most %v", q.Get("wait"), h.cfg.MaxWait)
		}
	}
	if q.Has("delay") {
		p.Delay, err = time.ParseDuration(q.Get("delay"))
		if err != nil || p.Delay < 0 || p.Delay > h.cfg.MaxDelay {
			return http.StatusBadRequest, invalid("delay %q: want a Go duration from 0 to %v", q.Get("delay"), h.cfg.MaxDelay)
		}
	}
	p.Reason = q.Get("reason")

	// The body is optional and never describes the object: at most a
	// reason. A server request always has one; a hand-made one may not.
	// It must arrive within BodyTimeout (a recorder in tests has no
	// deadline to set). It is decoded at once; the checks below apply in
	// this order.
	rc := http.NewResponseController(w)
	_ = rc.SetReadDeadline(time.Now().Add(h.cfg.BodyTimeout))
	body, err := io.ReadAll(http.MaxBytesReader(w, cmp.Or[io.ReadCloser](r.Body, http.NoBody), h.cfg.MaxBodyBytes))
	// The body is in: no read deadline from here on (net/http would take
	// its passing for the caller going away, and end a wait for the
	// outcome early).
	_ = rc.SetReadDeadline(time.Time{})
	mt, _, mtErr := mime.ParseMediaType(r.Header.Get("Content-Type"))
	var reason *string // nil: no reason member, or a body of null
	jsonErr := decodeObject(body, map[string]any{"reason": &reason}, false)
	switch {
	case errors.As(err, new(*http.MaxBytesError)):
		return http.StatusRequestEntityTooLarge, invalid("body exceeds the limit of %d bytes", h.cfg.MaxBodyBytes)
	case errors.Is(err, os.ErrDeadlineExceeded):
		return http.StatusRequestTimeout, invalid("the body did not arrive within %v", h.cfg.BodyTimeout)
	case err != nil:
		// The error names the connection's addresses: not for the caller.
		return http.StatusBadRequest, invalid("the body could not be read")
	case len(body) == 0:
		return 0, nil
	case mtErr != nil || mt != "application/json":
		return http.StatusUnsupportedMediaType, invalid(`a body must be application/json ({"reason": "..."})`)
	case !utf8.Valid(body):
		return http.StatusBadRequest, invalid("the body is not valid UTF-8")
	case jsonErr != nil && string(bytes.TrimSpace(body)) != "null":
		return http.StatusBadRequest, invalid("body: %w", jsonErr)
	case reason != nil && q.Has("reason"):
		return http.StatusBadRequest, invalid("reason given both in the query and in the body")
	case reason != nil && strings.Count(*reason, "\uFFFD") > bytes.Count(body, []byte("\uFFFD"))+strings.Count(strings.ToLower(string(body)), `\ufffd`):
		// encoding/json turns an escaped lone surrogate into U+FFFD.
		return http.StatusBadRequest, invalid("reason: an escaped lone surrogate is not valid UTF-8")
	case reason != nil:
		p.Reason = *reason
	}
	return 0, nil
}

// apiFailure answers a failed API call: 504 when it timed out, else 502,
// and 503 when the caller went away and cut it short (nothing was queued).
// The error (which may name the API server's address, or describe the
// operator's own RBAC) goes to the log, never into the answer.
func (h *handler[T]) apiFailure(r *http.Request, call string, err error, key opkit.Key) *Status {
	if r.Context().Err() != nil {
		return h.fail(http.StatusServiceUnavailable, "request cancelled during the "+call, &key)
	}
	h.log.Log(r.Context(), apiLevel(err), "api-"+call, "trigger: API server call failed", slog.String("call", call), slog.String("key", key.String()), slog.Any("error", err))
	code, msg := http.StatusBadGateway, call+" failed: the API server answered with an error (details in the operator's log)"
	if isTimeout(err) {
		code, msg = http.StatusGatewayTimeout, call+" failed: the API server did not answer in time"
	}
	return h.fail(code, msg, &key)
}

// isTimeout reports whether err says an API call ran out of time: the
// context's deadline, the API server's timeout statuses, or client-go's
// client-side rate limiter refusing to wait past the deadline (its error,
// from golang.org/x/time/rate, wraps nothing: only its text says so).
func isTimeout(err error) bool {
	return errors.Is(err, context.DeadlineExceeded) || apierrors.IsTimeout(err) || apierrors.IsServerTimeout(err) ||
		strings.Contains(err.Error(), "would exceed context deadline")
}

// dropped answers an enqueue the queue dropped: 503, naming the leader
// when it is known.
func (h *handler[T]) dropped(w http.ResponseWriter, o queue.Outcome, key opkit.Key) *Status {
	msg := "the enqueue was dropped: this replica is not the leader or leadership is changing"
	if o == queue.DroppedShutDown {
		msg = "the enqueue was dropped: the controller is shutting down"
	}
	leader := ""
	if h.cfg.Leader != nil {
		leader = h.cfg.Leader()
	}
	if leader != "" {
		w.Header().Set(LeaderHeader, leader)
		msg += "; current leader: " + leader
	}
	st := h.fail(http.StatusServiceUnavailable, msg, &key)
	st.Leader, st.Outcome = leader, o.String()
	return st
}

// statusReasons are the Status reasons of the handler's error codes.
var statusReasons = map[int]metav1.StatusReason{
	http.StatusBadRequest:                  metav1.StatusReasonBadRequest,
	http.StatusRequestTimeout:              ReasonRequestTimeout,
	http.StatusRequestHeaderFieldsTooLarge: ReasonHeadersTooLarge,
	http.StatusUnauthorized:                metav1.StatusReasonUnauthorized,
	http.StatusForbidden:                   metav1.StatusReasonForbidden,
	http.StatusNotFound:                    metav1.StatusReasonNotFound,
	http.StatusMethodNotAllowed:            metav1.StatusReasonMethodNotAllowed,
	http.StatusRequestEntityTooLarge:       metav1.StatusReasonRequestEntityTooLarge,
	http.StatusUnsupportedMediaType:        metav1.StatusReasonUnsupportedMediaType,
	http.StatusTooManyRequests:             metav1.StatusReasonTooManyRequests,
	http.StatusBadGateway:                  ReasonBadGateway,
	http.StatusServiceUnavailable:          metav1.StatusReasonServiceUnavailable,
	http.StatusGatewayTimeout:              metav1.StatusReasonTimeout,
}

// failure returns the Status of an error answer.
func failure(code int, msg string) *Status {
	return &Status{Kind: "Status", APIVersion: "v1", Status: metav1.StatusFailure, Message: msg, Reason: statusReasons[code], Code: code}
}

// fail returns the Status of an error answer; key, once the request named
// a valid object, goes into its Details.
func (h *handler[T]) fail(code int, msg string, key *opkit.Key) *Status {
	st := failure(code, msg)
	if key != nil {
		res := h.cfg.Trigger.Resource()
		st.Details = &metav1.StatusDetails{Name: key.Name, Group: res.Group, Kind: res.Resource}
	}
	return st
}
