package trigger

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"math"
	"mime"
	"net/http"
	"net/url"
	"path"
	"strconv"
	"strings"
	"sync"
	"time"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/opkit/opkit"
	"github.com/opkit/opkit/queue"
)

// LeaderHeader is the response header that names the current leader when a
// trigger was dropped (503), so a caller can retry against it.
const LeaderHeader = "X-Opkit-Leader"

// ReasonBadGateway is the Status reason of a 502: the API server failed.
const ReasonBadGateway metav1.StatusReason = "BadGateway"

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
	// for development or behind another authenticating layer.
	InsecureSkipAuth bool
	// Leader returns the current leader's identity for 503 answers (for
	// example leader.Elector's Leader method); nil or "" means unknown.
	Leader func() string
	// Type is the event type of triggered reconciles; zero means
	// opkit.Modified.
	Type opkit.Type
	// MaxDelay bounds the `delay` query parameter; zero means 1h.
	MaxDelay time.Duration
	// MaxBodyBytes bounds the optional JSON body ({"reason": "..."});
	// zero means DefaultMaxBodyBytes. Larger bodies get 413.
	MaxBodyBytes int64
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
	// MaxInFlight bounds concurrent requests; zero means 64, negative
	// means unlimited. Requests over the limit get 429.
	MaxInFlight int
	// Metrics receives one count per request; nil means none.
	Metrics HandlerMetrics
	// Logger receives one record per refused or failed request (never a
	// token); nil means slog.Default().
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
}

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
	cfg      HandlerConfig[T]
	trig     *Trigger[T]
	res      opkit.Resource
	auth     Authenticator
	metrics  HandlerMetrics
	log      *slog.Logger
	inflight chan struct{} // nil when unlimited
	bucket   *bucket       // nil when unlimited
	mux      *http.ServeMux
}

// NewHandler validates cfg and returns the HTTP trigger endpoint. It serves
// POST /reconcile/{namespace}/{name} (namespaced resources) or POST
// /reconcile/{name} (cluster-scoped); mount it at the server root or
// behind http.StripPrefix. Query parameters: delay (a Go duration, 0 to
// MaxDelay) and reason (carried into opkit.Event.Reason); the reason may
// instead come in an application/json body {"reason": "..."}. The package
// documentation lists the status codes.
func NewHandler[T opkit.Object](cfg HandlerConfig[T]) (http.Handler, error) {
	if cfg.Trigger == nil {
		return nil, errors.New("trigger: HandlerConfig.Trigger is required")
	}
	if cfg.Trigger.get == nil {
		return nil, errNoGetter
	}
	h := &handler[T]{cfg: cfg, trig: cfg.Trigger, res: cfg.Trigger.Resource(), metrics: cfg.Metrics, log: cfg.Logger}
	switch {
	case cfg.InsecureSkipAuth:
		if cfg.Authenticator != nil || cfg.Reviews != nil {
			return nil, errors.New("trigger: HandlerConfig.InsecureSkipAuth contradicts Authenticator/Reviews")
		}
	case cfg.Authenticator != nil:
		h.auth = cfg.Authenticator
	case cfg.Reviews != nil:
		a, err := NewKubeAuthenticator(KubeAuthConfig{Client: cfg.Reviews, Logger: cfg.Logger})
		if err != nil {
			return nil, err
		}
		h.auth = a
	default:
		return nil, errors.New("trigger: HandlerConfig needs an Authenticator (or Reviews for the Kubernetes-native one); set InsecureSkipAuth to run without authentication")
	}
	if cfg.Type == 0 {
		h.cfg.Type = opkit.Modified
	}
	if !h.cfg.Type.Valid() {
		return nil, fmt.Errorf("trigger: HandlerConfig.Type %v is invalid", cfg.Type)
	}
	if cfg.MaxDelay < 0 || cfg.MaxBodyBytes < 0 || cfg.APITimeout < 0 || cfg.RetryAfter < 0 || cfg.RateLimit < 0 || cfg.RateBurst < 0 || math.IsNaN(cfg.RateLimit) || math.IsInf(cfg.RateLimit, 0) {
		return nil, errors.New("trigger: HandlerConfig durations, sizes and limits must be finite and not negative")
	}
	if cfg.RateBurst > 0 && cfg.RateLimit == 0 {
		return nil, errors.New("trigger: HandlerConfig.RateBurst without RateLimit would have no effect; set RateLimit too")
	}
	if h.cfg.MaxDelay == 0 {
		h.cfg.MaxDelay = time.Hour
	}
	if h.cfg.MaxBodyBytes == 0 {
		h.cfg.MaxBodyBytes = DefaultMaxBodyBytes
	}
	if h.cfg.APITimeout == 0 {
		h.cfg.APITimeout = 5 * time.Second
	}
	if h.cfg.RetryAfter == 0 {
		h.cfg.RetryAfter = 5 * time.Second
	}
	if cfg.MaxInFlight == 0 {
		h.cfg.MaxInFlight = 64
	}
	if h.cfg.MaxInFlight > 0 {
		h.inflight = make(chan struct{}, h.cfg.MaxInFlight)
	}
	if cfg.RateLimit > 0 {
		burst := float64(cfg.RateBurst)
		if burst == 0 {
			burst = max(1, math.Ceil(cfg.RateLimit))
		}
		h.bucket = &bucket{rate: cfg.RateLimit, burst: burst, tokens: burst}
	}
	if h.metrics == nil {
		h.metrics = nopHandlerMetrics{}
	}
	if h.log == nil {
		h.log = slog.Default()
	}
	h.mux = http.NewServeMux()
	// Patterns without a method, so that other methods get this package's
	// JSON 405 rather than the mux's plain-text one.
	if h.res.Namespaced {
		h.mux.HandleFunc("/reconcile/{namespace}/{name}", h.serve)
		h.mux.HandleFunc("/reconcile/{name}", h.wrongScope)
	} else {
		h.mux.HandleFunc("/reconcile/{name}", h.serve)
		h.mux.HandleFunc("/reconcile/{namespace}/{name}", h.wrongScope)
	}
	h.mux.HandleFunc("/", h.noRoute)
	return h, nil
}

func (h *handler[T]) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	if !strings.HasPrefix(r.URL.Path, "/") {
		// Behind http.StripPrefix("/x/") the path has lost its leading
		// slash; the mux would redirect it out of the prefix.
		u := *r.URL
		u.Path = "/" + u.Path
		if u.RawPath != "" {
			u.RawPath = "/" + u.RawPath
		}
		r = r.Clone(r.Context())
		r.URL = &u
	}
	// The mux would answer a path with "." or ".." segments or empty ones
	// with a bare redirect to its cleaned form (a client following it
	// triggers another name than it wrote); such a path is refused.
	if p := r.URL.Path; p != cleanPath(p) {
		h.fail(w, r, time.Now(), http.StatusBadRequest, metav1.StatusReasonBadRequest,
			fmt.Sprintf("the path %q has empty, dot or dot-dot segments; use POST %s", p, h.route()), nil)
		return
	}
	h.mux.ServeHTTP(w, r)
}

// cleanPath is p as net/http's ServeMux cleans it before routing: rooted,
// without empty, "." or ".." segments, keeping a trailing slash.
func cleanPath(p string) string {
	if p == "" {
		return "/"
	}
	if p[0] != '/' {
		p = "/" + p
	}
	np := path.Clean(p)
	if p[len(p)-1] == '/' && np != "/" {
		np += "/"
	}
	return np
}

func (h *handler[T]) noRoute(w http.ResponseWriter, r *http.Request) {
	h.fail(w, r, time.Now(), http.StatusNotFound, metav1.StatusReasonNotFound, "no such route; use POST "+h.route(), nil)
}

func (h *handler[T]) wrongScope(w http.ResponseWriter, r *http.Request) {
	h.fail(w, r, time.Now(), http.StatusNotFound, metav1.StatusReasonNotFound,
		fmt.Sprintf("%s is %s; use POST %s", h.res.Resource, scope(h.res), h.route()), nil)
}

func (h *handler[T]) route() string {
	if h.res.Namespaced {
		return "/reconcile/{namespace}/{name}"
	}
	return "/reconcile/{name}"
}

func scope(res opkit.Resource) string {
	if res.Namespaced {
		return "namespaced"
	}
	return "cluster-scoped"
}

// request is a parsed trigger request.
type request struct {
	key    opkit.Key
	delay  time.Duration
	reason string
}

func (h *handler[T]) serve(w http.ResponseWriter, r *http.Request) {
	start := time.Now()
	if r.Method != http.MethodPost {
		w.Header().Set("Allow", http.MethodPost)
		h.fail(w, r, start, http.StatusMethodNotAllowed, metav1.StatusReasonMethodNotAllowed, "only POST triggers a reconcile", nil)
		return
	}
	if h.inflight != nil {
		select {
		case h.inflight <- struct{}{}:
			defer func() { <-h.inflight }()
		default:
			h.retryAfter(w)
			h.fail(w, r, start, http.StatusTooManyRequests, metav1.StatusReasonTooManyRequests, "too many requests in flight", nil)
			return
		}
	}
	if h.bucket != nil && !h.bucket.allow(time.Now()) {
		h.retryAfter(w)
		h.fail(w, r, start, http.StatusTooManyRequests, metav1.StatusReasonTooManyRequests, "request rate limit exceeded", nil)
		return
	}
	req := request{key: opkit.Key{Namespace: r.PathValue("namespace"), Name: r.PathValue("name")}}
	if code, reason, err := h.parse(w, r, &req); err != nil {
		h.fail(w, r, start, code, reason, err.Error(), nil)
		return
	}
	ctx := r.Context()
	// The key is valid when authorize runs: who asks is checked before
	// anything is read, and the trigger path is the Trigger's Intake.
	user := ""
	var authErr error
	authorize := func(ctx context.Context, key opkit.Key) error {
		if h.auth == nil {
			return nil
		}
		user, authErr = h.auth.Authorize(ctx, AuthRequest{HTTP: r, Resource: h.res, Key: key})
		return authErr
	}
	ictx, cancel := context.WithTimeout(ctx, h.cfg.APITimeout)
	obj, o, err := h.trig.Intake(ictx, Pointer{Key: req.key, Type: h.cfg.Type, Reason: req.reason, Delay: req.delay}, authorize)
	cancel()
	switch {
	case err == nil:
	case errors.Is(err, ErrInvalid):
		h.fail(w, r, start, http.StatusBadRequest, metav1.StatusReasonBadRequest, err.Error(), nil)
		return
	case authErr != nil:
		h.authFailure(w, r, start, authErr, &req)
		return
	case errors.Is(err, ErrOutOfScope), errors.Is(err, ErrNotFound):
		h.fail(w, r, start, http.StatusNotFound, metav1.StatusReasonNotFound, err.Error(), &req)
		return
	default:
		h.apiFailure(w, r, start, "read", err, &req, true)
		return
	}
	if !o.Accepted() {
		h.dropped(w, r, start, o, &req)
		return
	}
	h.log.LogAttrs(ctx, slog.LevelDebug, "trigger: scheduled", slog.String("key", req.key.String()), slog.String("user", user), slog.String("outcome", o.String()))
	writeJSON(w, http.StatusAccepted, Accepted{
		Key:             req.key.String(),
		Namespace:       req.key.Namespace,
		Name:            req.key.Name,
		UID:             string(obj.GetUID()),
		ResourceVersion: obj.GetResourceVersion(),
		Delay:           req.delay.String(),
		Outcome:         o.String(),
	})
	h.metrics.Request(http.StatusAccepted, "Accepted", time.Since(start))
}

// authFailure answers a refused or failed authorization.
func (h *handler[T]) authFailure(w http.ResponseWriter, r *http.Request, start time.Time, err error, req *request) {
	switch {
	case errors.Is(err, ErrUnauthenticated):
		// RFC 6750: an error code only when a token was presented.
		challenge := `Bearer realm="opkit-trigger"`
		if _, ok := bearerToken(r); ok {
			challenge += `, error="invalid_token"`
		}
		w.Header().Set("WWW-Authenticate", challenge)
		h.fail(w, r, start, http.StatusUnauthorized, metav1.StatusReasonUnauthorized, err.Error(), req)
	case errors.Is(err, ErrForbidden):
		h.fail(w, r, start, http.StatusForbidden, metav1.StatusReasonForbidden, err.Error(), req)
	default:
		// The caller is not authenticated or not authorized yet: the
		// API server's answer (which may describe the operator's own
		// RBAC) goes to the log only.
		h.apiFailure(w, r, start, "authorization", err, req, false)
	}
}

// parse validates the query and the optional body into req (the key is
// Intake's to validate).
func (h *handler[T]) parse(w http.ResponseWriter, r *http.Request, req *request) (int, metav1.StatusReason, error) {
	bad := func(err error) (int, metav1.StatusReason, error) {
		return http.StatusBadRequest, metav1.StatusReasonBadRequest, err
	}
	q, err := url.ParseQuery(r.URL.RawQuery)
	if err != nil {
		return bad(invalid("query: %v", err))
	}
	for k, v := range q {
		switch k {
		case "delay", "reason":
			if len(v) != 1 {
				return bad(invalid("query parameter %q given %d times", k, len(v)))
			}
		default:
			return bad(invalid("unknown query parameter %q (known: delay, reason)", k))
		}
	}
	if v, ok := q["delay"]; ok {
		d, err := time.ParseDuration(v[0])
		if err != nil {
			return bad(invalid("delay: %v", err))
		}
		if d < 0 || d > h.cfg.MaxDelay {
			return bad(invalid("delay %v is outside [0, %v]", d, h.cfg.MaxDelay))
		}
		req.delay = d
	}
	reasonInQuery := false
	if v, ok := q["reason"]; ok {
		req.reason, reasonInQuery = v[0], true
	}

	// The body is optional and never describes the object: at most a reason.
	if r.ContentLength > h.cfg.MaxBodyBytes {
		return http.StatusRequestEntityTooLarge, metav1.StatusReasonRequestEntityTooLarge,
			invalid("body of %d bytes exceeds the limit of %d", r.ContentLength, h.cfg.MaxBodyBytes)
	}
	var rb io.ReadCloser = http.NoBody
	if r.Body != nil { // a server request always has one; a hand-made one may not
		rb = r.Body
	}
	body, err := io.ReadAll(http.MaxBytesReader(w, rb, h.cfg.MaxBodyBytes))
	if err != nil {
		var tooLarge *http.MaxBytesError
		if errors.As(err, &tooLarge) {
			return http.StatusRequestEntityTooLarge, metav1.StatusReasonRequestEntityTooLarge,
				invalid("body exceeds the limit of %d bytes", h.cfg.MaxBodyBytes)
		}
		return bad(invalid("reading the body: %v", err))
	}
	if len(body) > 0 {
		mt, _, err := mime.ParseMediaType(r.Header.Get("Content-Type"))
		if err != nil || mt != "application/json" {
			return http.StatusUnsupportedMediaType, metav1.StatusReasonUnsupportedMediaType,
				invalid("a body must be application/json ({\"reason\": \"...\"})")
		}
		var reason *string // nil: no reason member, or a body of null
		if string(bytes.TrimSpace(body)) != "null" {
			if err := decodeObject(body, []member{{"reason", &reason}}, false); err != nil {
				return bad(invalid("body: %w", err))
			}
		}
		if reason != nil {
			if reasonInQuery {
				return bad(invalid("reason given both in the query and in the body"))
			}
			req.reason = *reason
		}
	}
	if err := CheckReason(req.reason); err != nil {
		return bad(err)
	}
	return 0, "", nil
}

func (h *handler[T]) retryAfter(w http.ResponseWriter) {
	secs := int64(math.Ceil(h.cfg.RetryAfter.Seconds()))
	w.Header().Set("Retry-After", strconv.FormatInt(max(secs, 1), 10))
}

func (h *handler[T]) dropped(w http.ResponseWriter, r *http.Request, start time.Time, o queue.Outcome, req *request) {
	leader := ""
	if h.cfg.Leader != nil {
		leader = h.cfg.Leader()
	}
	h.retryAfter(w)
	msg := "the enqueue was dropped: this replica is not the leader or leadership is changing"
	if o == queue.DroppedShutDown {
		msg = "the enqueue was dropped: the controller is shutting down"
	}
	if leader != "" {
		w.Header().Set(LeaderHeader, leader)
		msg += "; current leader: " + leader
	}
	h.log.LogAttrs(r.Context(), slog.LevelWarn, "trigger: dropped", slog.String("key", req.key.String()), slog.String("outcome", o.String()), slog.String("leader", leader))
	st := status(http.StatusServiceUnavailable, metav1.StatusReasonServiceUnavailable, msg, h.res, req)
	st.Leader, st.Outcome = leader, o.String()
	writeJSON(w, http.StatusServiceUnavailable, st)
	h.metrics.Request(http.StatusServiceUnavailable, string(st.Reason), time.Since(start))
}

// apiFailure answers 504 when err is a timeout, else 502; the body carries
// err's text only if detail (the log always does).
func (h *handler[T]) apiFailure(w http.ResponseWriter, r *http.Request, start time.Time, what string, err error, req *request, detail bool) {
	if r.Context().Err() != nil {
		// The caller went away: the API call was cut short by it, not
		// failed by the API server. Nothing was queued.
		h.fail(w, r, start, http.StatusServiceUnavailable, metav1.StatusReasonServiceUnavailable, "request cancelled during the "+what, req)
		return
	}
	code, reason := http.StatusBadGateway, ReasonBadGateway
	if isTimeout(err) {
		code, reason = http.StatusGatewayTimeout, metav1.StatusReasonTimeout
	}
	h.log.LogAttrs(r.Context(), slog.LevelError, "trigger: API server call failed", slog.String("call", what), slog.String("key", req.key.String()), slog.Any("error", err))
	msg := fmt.Sprintf("%s failed: %v", what, err)
	if !detail {
		msg = what + " failed: the API server's review failed (details in the operator's log)"
		if code == http.StatusGatewayTimeout {
			msg = what + " timed out: the API server did not answer the review in time"
		}
	}
	h.fail(w, r, start, code, reason, msg, req)
}

// isTimeout reports whether err says an API call ran out of time: the
// context's deadline, the API server's timeout statuses, or client-go's
// client-side rate limiter refusing to wait past the deadline (its error,
// from golang.org/x/time/rate, wraps nothing: only its text says so).
func isTimeout(err error) bool {
	return errors.Is(err, context.DeadlineExceeded) || apierrors.IsTimeout(err) || apierrors.IsServerTimeout(err) ||
		strings.Contains(err.Error(), "would exceed context deadline")
}

func (h *handler[T]) fail(w http.ResponseWriter, r *http.Request, start time.Time, code int, reason metav1.StatusReason, msg string, req *request) {
	if code >= 500 || code == http.StatusUnauthorized || code == http.StatusForbidden {
		attrs := []slog.Attr{slog.Int("code", code), slog.String("reason", string(reason)), slog.String("message", msg)}
		if req != nil {
			attrs = append(attrs, slog.String("key", req.key.String()))
		}
		h.log.LogAttrs(r.Context(), slog.LevelWarn, "trigger: request refused", attrs...)
	}
	writeJSON(w, code, status(code, reason, msg, h.res, req))
	h.metrics.Request(code, string(reason), time.Since(start))
}

func status(code int, reason metav1.StatusReason, msg string, res opkit.Resource, req *request) Status {
	st := Status{Kind: "Status", APIVersion: "v1", Status: metav1.StatusFailure, Message: msg, Reason: reason, Code: code}
	if req != nil {
		st.Details = &metav1.StatusDetails{Name: req.key.Name, Group: res.Group, Kind: res.Resource}
	}
	return st
}

func writeJSON(w http.ResponseWriter, code int, v any) {
	w.Header().Set("Content-Type", "application/json")
	w.Header().Set("X-Content-Type-Options", "nosniff")
	w.Header().Set("Cache-Control", "no-store")
	w.WriteHeader(code)
	_ = json.NewEncoder(w).Encode(v)
}

// bucket is a token bucket: rate tokens per second up to burst.
type bucket struct {
	mu     sync.Mutex
	rate   float64
	burst  float64
	tokens float64
	last   time.Time
}

func (b *bucket) allow(now time.Time) bool {
	b.mu.Lock()
	defer b.mu.Unlock()
	if !b.last.IsZero() {
		b.tokens = min(b.burst, b.tokens+now.Sub(b.last).Seconds()*b.rate)
	}
	b.last = now
	if b.tokens < 1 {
		return false
	}
	b.tokens--
	return true
}
