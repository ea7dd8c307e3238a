package trigger

// The HTTP request's parts: its route and parameters, its in-flight slot,
// and its forwarding to the replica that works on the object.

import (
	"bytes"
	"cmp"
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"mime"
	"net"
	"net/http"
	"net/url"
	"os"
	"slices"
	"strings"
	"sync"
	"time"
	"unicode/utf8"

	"github.com/opkit/opkit"
)

// forwarded is the answer of the replica a request was forwarded to, passed on as
// it came.
type forwarded struct {
	code   int
	header http.Header
	body   []byte
}

// forward sends the request r (its pointer p and wait) to the holder's
// endpoint with the caller's credentials, and returns the leader's answer
// (or 503 when there is none: the leader is likely gone; 502 when it
// would take credentials from TLS to plain HTTP). It takes a place among
// MaxWaiting unless the caller waits for an outcome (wait > 0), which
// holds one already.
func (h *handler[T]) forward(r *http.Request, holder string, p Pointer, wait time.Duration) any {
	u, err := url.Parse(holder)
	switch {
	case err != nil || u.Host == "" || u.Scheme != "http" && u.Scheme != "https":
		return h.fail(http.StatusBadGateway, "the replica that works on the object publishes no usable endpoint", &p.Key)
	case r.TLS != nil && u.Scheme != "https":
		return h.fail(http.StatusBadGateway, "the endpoint of the replica that works on the object is not HTTPS: the caller's credentials stay here", &p.Key)
	}
	if wait == 0 {
		if h.waiting.Add(1) > int64(h.cfg.MaxWaiting) {
			h.waiting.Add(-1)
			return h.fail(http.StatusTooManyRequests, fmt.Sprintf("%d forwarded or waiting requests already", h.cfg.MaxWaiting), &p.Key)
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
		return h.fail(http.StatusBadGateway, "the endpoint of the replica that works on the object cannot be addressed", &p.Key)
	}
	if auth := r.Header.Get("Authorization"); auth != "" {
		req.Header.Set("Authorization", auth)
	}
	req.Header.Set(forwardedHeader, "true")
	resp, err := h.cfg.ForwardClient.Do(req)
	if err != nil {
		if errors.Is(context.Cause(r.Context()), errServerStopping) {
			return h.fail(http.StatusServiceUnavailable, "this replica is shutting down before the forwarded answer came", &p.Key)
		}
		// Most likely that replica died and its Lease has not expired yet:
		// for the caller, no replica works on the object right now.
		h.log.Log(r.Context(), slog.LevelWarn, "forward", "trigger: forwarding to the replica that works on the object failed", slog.String("endpoint", holder), slog.Any("error", err))
		return h.fail(http.StatusServiceUnavailable, "the endpoint of the replica that works on the object does not answer: its Lease is likely changing hands", &p.Key)
	}
	defer resp.Body.Close()
	body, err := io.ReadAll(io.LimitReader(resp.Body, 1<<20))
	if err != nil {
		return h.fail(http.StatusBadGateway, "the forwarded answer was cut off", &p.Key)
	}
	header := http.Header{}
	for _, k := range []string{"Content-Type", "Retry-After", leaderHeader, "WWW-Authenticate"} {
		if v := resp.Header.Get(k); v != "" {
			header.Set(k, v)
		}
	}
	return forwarded{code: resp.StatusCode, header: header, body: body}
}

// slot takes an in-flight slot for the caller whose key is who, waiting
// for its fair turn up to the API timeout; release gives it back (once,
// however often it is called).
func (h *handler[T]) slot(r *http.Request, who string) (release func(), st *Status) {
	if h.inflight == nil {
		return func() {}, nil
	}
	ctx, cancel := context.WithTimeout(r.Context(), h.cfg.APITimeout)
	defer cancel()
	if !h.inflight.acquire(ctx, who) {
		return nil, h.fail(http.StatusTooManyRequests, "too many requests in flight, this caller's among them", nil)
	}
	return sync.OnceFunc(func() { h.inflight.release(who) }), nil
}

// caller is who sent a request, as far as the handler can tell before
// authorizing it: the user its bearer token was last authorized as, when
// that was in the last knownFor, else its client address. It authorizes
// the caller for Intake.
type caller[T opkit.Object] struct {
	h     *handler[T]
	r     *http.Request
	key   string // the fair slots' key
	host  string // the client address's host
	token string // the token's SHA-256, "" without one
	user  string // as authorized
}

// knownFor is how long the handler remembers whom a token was authorized
// as, for the fair slots, and the Kubernetes-native authenticator that it
// authenticated, for its address gate (neither as an authorization).
const knownFor = 10 * time.Minute

// identify returns the caller of r.
func (h *handler[T]) identify(r *http.Request) *caller[T] {
	host := clientHost(r)
	c := &caller[T]{h: h, r: r, key: "address " + host, host: host}
	if _, sum, ok := bearerToken(r); ok {
		c.token = sum
		if user, ok := h.known.get(sum); ok {
			c.key = "user " + user
		}
	}
	return c
}

// clientHost is the host of r's remote address: who a caller not known
// yet is, and the unit the Kubernetes-native authenticator counts failed
// authentications by.
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
	res := h.trig.cfg.Resource
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
