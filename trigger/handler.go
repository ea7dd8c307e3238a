package trigger

import (
	"cmp"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"maps"
	"math"
	"net/http"
	"strconv"
	"strings"
	"sync/atomic"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/util/flowcontrol"

	"github.com/opkit/opkit"
	"github.com/opkit/opkit/internal/typed"
	"github.com/opkit/opkit/queue"
)

// The headers of the replicas' protocol: leaderHeader names the replica
// that works on the object in a 503 for a dropped trigger, and
// forwardedHeader marks a request forwarded to that replica (never
// forwarded again) and the answer passed on.
const (
	leaderHeader    = "X-Opkit-Leader"
	forwardedHeader = "X-Opkit-Forwarded"
)

// HandlerConfig configures the HTTP trigger endpoint; a zero field means
// its default. It needs an Authenticator, or Reviews for the
// Kubernetes-native one, or InsecureSkipAuth (for development, or behind
// another authenticating layer). ForwardClient forwards to the other
// replicas (over TLS, to https only: give it their CA; nil: 64 idle
// connections per replica). Type is the triggers' (zero: Modified).
//
// Its limits: the delay and wait parameters (zero: 1h and 5m), the
// callers waiting for outcomes or forwarded answers (1024), the body (8
// KiB) and its arrival (2s), a request's API calls together (5s), the
// requests of all callers a second (zero: none; burst max(1,
// ceil(RateLimit))), and those being authorized, read and queued (64,
// shared fairly; negative: none). 429 and 503 carry Retry-After (5s).
type HandlerConfig struct {
	Authenticator     Authenticator
	Reviews           ReviewClient
	InsecureSkipAuth  bool
	ForwardClient     *http.Client
	Type              opkit.Type
	MaxDelay, MaxWait time.Duration
	MaxWaiting        int
	MaxBodyBytes      int64
	BodyTimeout       time.Duration
	APITimeout        time.Duration
	RateLimit         float64
	RateBurst         int
	MaxInFlight       int
	RetryAfter        time.Duration
	Metrics           Metrics
	Logger            *slog.Logger
}

// Accepted is the JSON body of a 202 answer: the object as read (no UID
// and ResourceVersion when the trigger joined a waiting entry), the
// delay, the queue's outcome, and, when the caller's wait ended first, the
// trigger's ID and the path whose GET answers its Outcome.
type Accepted struct {
	Key             string `json:"key"`
	Namespace       string `json:"namespace,omitempty"`
	Name            string `json:"name"`
	UID             string `json:"uid"`
	ResourceVersion string `json:"resourceVersion"`
	Delay           string `json:"delay"`
	Outcome         string `json:"outcome"`
	ID              string `json:"id,omitempty"`
	StatusPath      string `json:"statusPath,omitempty"`
}

// Status is the JSON body of every error answer: a metav1.Status (Reason
// Kubernetes' for the code, or its name, as "BadGateway"; Details name the
// object once the path did), with the Leader and the queue's Outcome of a
// dropped trigger.
type Status struct {
	Kind       string                `json:"kind"`
	APIVersion string                `json:"apiVersion"`
	Status     string                `json:"status"`
	Message    string                `json:"message"`
	Reason     metav1.StatusReason   `json:"reason"`
	Code       int                   `json:"code"`
	Leader     string                `json:"leader,omitempty"`
	Outcome    string                `json:"outcome,omitempty"`
	Details    *metav1.StatusDetails `json:"details,omitempty"`
}

type handler[T opkit.Object] struct {
	trig     *Trigger[T]
	cfg      HandlerConfig                  // validated, defaults applied (no Authenticator: InsecureSkipAuth)
	inflight *fairSlots                     // nil when unlimited
	rate     flowcontrol.PassiveRateLimiter // nil when unlimited
	known    *ttlCache[string]              // the user a token (its hash) was authorized as
	waiting  atomic.Int64                   // callers waiting for outcomes
	log      *sampler
}

// NewHandler validates cfg and returns the HTTP trigger endpoint of t:
// POST /reconcile/{namespace}/{name} (or /reconcile/{name}) with
// ?delay=, ?wait= (Go durations) and ?reason= (or a JSON body
// {"reason": ...}), and GET .../triggers/{id}, at the root or behind
// http.StripPrefix; see the package documentation.
func NewHandler[T opkit.Object](t *Trigger[T], cfg HandlerConfig) (http.Handler, error) {
	cfg.Type = cmp.Or(cfg.Type, opkit.Modified)
	switch {
	case t == nil:
		return nil, errors.New("trigger: NewHandler needs a Trigger")
	case t.cfg.Get == nil:
		return nil, errNoGetter
	case cfg.InsecureSkipAuth && (cfg.Authenticator != nil || cfg.Reviews != nil):
		return nil, errors.New("trigger: HandlerConfig.InsecureSkipAuth contradicts Authenticator/Reviews")
	case !cfg.InsecureSkipAuth && cfg.Authenticator == nil && cfg.Reviews == nil:
		return nil, errors.New("trigger: HandlerConfig needs an Authenticator (or Reviews for the Kubernetes-native one); set InsecureSkipAuth to run without authentication")
	case !cfg.Type.Valid():
		return nil, fmt.Errorf("trigger: HandlerConfig.Type %v is invalid", cfg.Type)
	case cfg.MaxWait < 0 || cfg.MaxWaiting < 0 || cfg.MaxDelay < 0 || cfg.MaxBodyBytes < 0 || cfg.BodyTimeout < 0 || cfg.APITimeout < 0 || cfg.RetryAfter < 0 || cfg.RateLimit < 0 || cfg.RateBurst < 0 ||
		math.IsNaN(cfg.RateLimit) || math.IsInf(cfg.RateLimit, 0):
		return nil, errors.New("trigger: HandlerConfig durations, sizes and limits must be finite and not negative")
	case cfg.RateBurst > 0 && cfg.RateLimit == 0:
		return nil, errors.New("trigger: HandlerConfig.RateBurst without RateLimit would have no effect; set RateLimit too")
	}
	cfg.MaxDelay = cmp.Or(cfg.MaxDelay, time.Hour)
	cfg.MaxWait, cfg.MaxWaiting = cmp.Or(cfg.MaxWait, 5*time.Minute), cmp.Or(cfg.MaxWaiting, 1024)
	if cfg.ForwardClient == nil {
		// Waiting callers hold their forwarded request's connection: keep
		// as many idle ones to the leader as may wait, not net/http's 2.
		tr := http.DefaultTransport.(*http.Transport).Clone()
		tr.MaxIdleConnsPerHost = 64
		cfg.ForwardClient = &http.Client{Transport: tr}
	}
	cfg.MaxBodyBytes = cmp.Or(cfg.MaxBodyBytes, defaultMaxBytes)
	cfg.BodyTimeout = cmp.Or(cfg.BodyTimeout, 2*time.Second)
	cfg.APITimeout = cmp.Or(cfg.APITimeout, 5*time.Second)
	cfg.RetryAfter = cmp.Or(cfg.RetryAfter, 5*time.Second)
	cfg.MaxInFlight = cmp.Or(cfg.MaxInFlight, 64)
	cfg.Metrics = cmp.Or[Metrics](cfg.Metrics, nopMetrics{})
	cfg.Logger = cmp.Or(cfg.Logger, slog.Default())
	if cfg.Authenticator == nil && cfg.Reviews != nil {
		a, err := newKubeAuthenticator(KubeAuthConfig{Client: cfg.Reviews}, cfg.Logger)
		if err != nil {
			return nil, err
		}
		cfg.Authenticator = a
	}
	h := &handler[T]{trig: t, cfg: cfg, known: newTTLCache[string](4096), log: newSampler(cfg.Logger)}
	if cfg.MaxInFlight > 0 {
		h.inflight = newFairSlots(cfg.MaxInFlight)
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
	code, reason := http.StatusAccepted, "Accepted"
	switch b := body.(type) {
	case forwarded:
		maps.Copy(w.Header(), b.header)
		w.Header().Set(forwardedHeader, "by this replica to the one that serves it")
		w.WriteHeader(b.code)
		_, _ = w.Write(b.body)
		h.cfg.Metrics.Request(b.code, "Forwarded", time.Since(start))
		return
	case Outcome:
		code, reason = http.StatusOK, "OK"
	case *Status:
		code, reason = b.Code, string(b.Reason)
		if (code >= 500 || code == http.StatusUnauthorized || code == http.StatusForbidden || code == http.StatusTooManyRequests) && r.Context().Err() == nil {
			h.log.Log(r.Context(), slog.LevelWarn, strconv.Itoa(code), "trigger: request refused", slog.Int("code", code),
				slog.String("reason", reason), slog.String("message", b.Message), slog.String("path", r.URL.Path))
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
// relies on: route, method, rate, query and body (bodyRead is set once
// the body is in), the in-flight limit, then Intake (the key, the
// caller's authorization, the scope, where the object is worked on, the
// trigger budget, the read, the enqueue), and acts on its decision:
// answer, forward or drop. It returns an Accepted, an Outcome, a
// forwarded answer or a *Status.
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
	c := h.identify(r)
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
	release, st := h.slot(r, c.key)
	if st != nil {
		return st
	}
	defer release()
	if id != "" {
		return h.lookup(w, r, c, key, id)
	}
	return h.trigger(w, r, c, p, wait, release)
}

// authorize is Intake's IntakeOptions.Authorize for the caller.
func (c *caller[T]) authorize(ctx context.Context, key opkit.Key) (string, error) {
	if c.h.cfg.Authenticator == nil {
		return "address " + c.host, nil
	}
	user, err := c.h.cfg.Authenticator.Authorize(ctx, AuthRequest{HTTP: c.r, Resource: c.h.trig.cfg.Resource, Key: key})
	if err != nil {
		return "", authFailure{fmt.Errorf("trigger: %w", err)}
	}
	c.user = user
	if c.token != "" {
		c.h.known.put(c.token, c.user, time.Now().Add(knownFor))
	}
	return "user " + c.user, nil
}

// trigger takes the POST of p through Intake and acts on its decision;
// with a wait, the caller waits for the outcome holding no in-flight slot
// (release gives it back).
func (h *handler[T]) trigger(w http.ResponseWriter, r *http.Request, c *caller[T], p Pointer, wait time.Duration, release func()) any {
	track := notTracked
	if wait > 0 {
		if h.waiting.Add(1) > int64(h.cfg.MaxWaiting) {
			h.waiting.Add(-1)
			return h.fail(http.StatusTooManyRequests, fmt.Sprintf("%d callers wait for outcomes or forwarded answers already", h.cfg.MaxWaiting), &p.Key)
		}
		defer h.waiting.Add(-1)
		track = Tracked
	}
	ctx, cancel := context.WithTimeout(r.Context(), h.cfg.APITimeout)
	d, err := h.trig.Intake(ctx, p, IntakeOptions{Authorize: c.authorize, Track: track, NoForward: r.Header.Get(forwardedHeader) != ""})
	cancel()
	switch {
	case err != nil:
		return h.refusal(w, r, p.Key, err)
	case d.Endpoint != "":
		release() // the replica that works on the object does the work
		return h.forward(r, d.Endpoint, p, wait)
	case !d.Outcome.Accepted():
		return h.dropped(w, d.Outcome, d.Holder, p.Key)
	}
	h.cfg.Logger.LogAttrs(r.Context(), slog.LevelDebug, "trigger: scheduled", slog.String("key", p.Key.String()), slog.String("user", c.user), slog.String("outcome", d.Outcome.String()))
	a := Accepted{Key: p.Key.String(), Namespace: p.Key.Namespace, Name: p.Key.Name, Delay: p.Delay.String(), Outcome: d.Outcome.String()}
	if !isNil(d.Object) { // not joined into an entry that waited: read
		a.UID, a.ResourceVersion = string(d.Object.GetUID()), d.Object.GetResourceVersion()
	}
	if d.Ticket == nil {
		return a
	}
	release() // the caller waits; its slot is for work, not for waiting
	return h.await(r, a, d.Ticket, wait, p.Key)
}

// await waits up to wait for the outcome of tk's reconcile: 200 with it,
// 202 with the trigger's id when the wait ends first, 503 when the term
// (or this replica) ended first, or the caller left.
func (h *handler[T]) await(r *http.Request, a Accepted, tk *Ticket, wait time.Duration, key opkit.Key) any {
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
	case err != nil && errors.Is(context.Cause(r.Context()), errServerStopping):
		return h.fail(http.StatusServiceUnavailable, "this replica is shutting down: the trigger was accepted, its outcome will not be reported here", &key)
	case err != nil && r.Context().Err() != nil:
		return h.fail(http.StatusServiceUnavailable, "the caller left before the outcome", &key)
	case err != nil:
		return a // the wait ended first: 202, with the trigger's id
	case out.State == Unknown:
		return h.fail(http.StatusServiceUnavailable, "no outcome: "+out.Error, &key)
	}
	return out
}

// lookup answers GET .../triggers/{id}: what this replica knows of the
// trigger, or, when it does not know it and another replica works on the
// object, that replica's answer.
func (h *handler[T]) lookup(w http.ResponseWriter, r *http.Request, c *caller[T], key opkit.Key, id string) any {
	ctx, cancel := context.WithTimeout(r.Context(), h.cfg.APITimeout)
	defer cancel()
	who, err := c.authorize(ctx, key)
	if err != nil {
		return h.refusal(w, r, key, err)
	}
	out := h.trig.tickets.lookup(key, id)
	if out.State != Unknown || r.Header.Get(forwardedHeader) != "" {
		return out
	}
	// Another replica may know it: find where the object is worked on (a
	// read, paid as a trigger's, when there are shards).
	pl, _, err := h.trig.locate(ctx, key, who, IntakeOptions{})
	switch {
	case errors.Is(err, ErrNotFound) || errors.Is(err, ErrOutOfScope):
		return out
	case err != nil:
		return h.refusal(w, r, key, err)
	case pl.Queue == nil && pl.Endpoint != "":
		cancel()
		return h.forward(r, pl.Endpoint, Pointer{Key: key}, 0)
	}
	return out
}

// authFailure marks an error as the authorization's, for refusal.
type authFailure struct{ error }

func (a authFailure) Unwrap() error { return a.error }

// refusal is the answer to a request Intake or the authorization (an
// authFailure) refused with err.
func (h *handler[T]) refusal(w http.ResponseWriter, r *http.Request, key opkit.Key, err error) *Status {
	byAuth := errors.As(err, new(authFailure))
	switch {
	case errors.Is(err, ErrInvalid):
		return h.fail(http.StatusBadRequest, err.Error(), nil)
	case errors.Is(err, ErrBusy):
		return h.fail(http.StatusTooManyRequests, err.Error(), &key)
	case byAuth && errors.Is(err, ErrUnauthenticated):
		// RFC 6750: an error code only when a token was presented.
		challenge := `Bearer realm="opkit-trigger"`
		if _, _, ok := bearerToken(r); ok {
			challenge += `, error="invalid_token"`
		}
		w.Header().Set("WWW-Authenticate", challenge)
		return h.fail(http.StatusUnauthorized, err.Error(), &key)
	case byAuth && errors.Is(err, ErrForbidden):
		return h.fail(http.StatusForbidden, err.Error(), &key)
	case byAuth:
		// The caller is not authenticated or not authorized yet: the API
		// server's answer (which may describe the operator's own RBAC)
		// goes to the log only.
		return h.apiFailure(r, "authorization", err, key)
	case errors.Is(err, ErrOutOfScope), errors.Is(err, ErrNotFound):
		return h.fail(http.StatusNotFound, err.Error(), &key)
	}
	return h.apiFailure(r, "read", err, key)
}

// apiFailure answers a failed API call: 504 when it timed out, 503 (retry)
// when the API server did not answer or cannot serve now (a restart), else
// 502; and 503 when the caller went away and cut it short (nothing was
// queued).
// The error (which may name the API server's address, or describe the
// operator's own RBAC) goes to the log, never into the answer.
func (h *handler[T]) apiFailure(r *http.Request, call string, err error, key opkit.Key) *Status {
	if r.Context().Err() != nil {
		return h.fail(http.StatusServiceUnavailable, "request cancelled during the "+call, &key)
	}
	h.log.Log(r.Context(), apiLevel(err), "api-"+call, "trigger: API server call failed", slog.String("call", call), slog.String("key", key.String()), slog.Any("error", err))
	code, msg := http.StatusBadGateway, call+" failed: the API server answered with an error (details in the operator's log)"
	switch {
	case typed.Timeout(err):
		code, msg = http.StatusGatewayTimeout, call+" failed: the API server did not answer in time"
	case typed.Class(err) == typed.Transient:
		code, msg = http.StatusServiceUnavailable, call+" failed: this replica cannot reach its API server now (it does not answer or cannot serve); retry"
		if h.trig.cfg.Router.Shards() > 1 && r.Header.Get(forwardedHeader) == "" {
			msg += ": another replica may take the trigger"
		}
	}
	return h.fail(code, msg, &key)
}

// dropped answers a trigger no replica can take now: 503, naming the
// replica that works on the object when it is known.
func (h *handler[T]) dropped(w http.ResponseWriter, o queue.Outcome, holder string, key opkit.Key) *Status {
	msg := "the trigger was dropped: no replica works on this object now (this one does not, or is shutting down; leadership may be changing)"
	if holder != "" {
		w.Header().Set(leaderHeader, holder)
		msg += "; it is worked on by: " + holder
	}
	st := h.fail(http.StatusServiceUnavailable, msg, &key)
	st.Leader, st.Outcome = holder, o.String()
	return st
}

// statusReason is the Status reason of an error code: Kubernetes' reasons
// are the codes' names without spaces ("TooManyRequests"), but 504's
// (Timeout); the others are named the same way ("BadGateway").
func statusReason(code int) metav1.StatusReason {
	if code == http.StatusGatewayTimeout {
		return metav1.StatusReasonTimeout
	}
	return metav1.StatusReason(strings.ReplaceAll(http.StatusText(code), " ", ""))
}

// failure returns the Status of an error answer.
func failure(code int, msg string) *Status {
	return &Status{Kind: "Status", APIVersion: "v1", Status: metav1.StatusFailure, Message: msg, Reason: statusReason(code), Code: code}
}

// fail returns the Status of an error answer; key, once the request named
// a valid object, goes into its Details.
func (h *handler[T]) fail(code int, msg string, key *opkit.Key) *Status {
	st := failure(code, msg)
	if key != nil {
		res := h.trig.cfg.Resource
		st.Details = &metav1.StatusDetails{Name: key.Name, Group: res.Group, Kind: res.Resource}
	}
	return st
}
