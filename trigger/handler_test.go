package trigger_test

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"slices"
	"strings"
	"sync/atomic"
	"testing"
	"testing/synctest"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/client-go/dynamic"
	dynfake "k8s.io/client-go/dynamic/fake"
	"k8s.io/client-go/rest"
	clienttesting "k8s.io/client-go/testing"

	"github.com/opkit/opkit"
	"github.com/opkit/opkit/queue"
	"github.com/opkit/opkit/trigger"
)

// allowAll is an Authenticator that lets everyone in, so tests of the
// other status codes need no token plumbing.
type allowAll struct{}

func (allowAll) Authorize(context.Context, trigger.AuthRequest) (string, error) { return "tester", nil }

type handlerEnv struct {
	h     http.Handler
	route *oneLeader
	tr    *trigger.Trigger[*corev1.ConfigMap]
	q     *cmQueue
	dyn   *dynfake.FakeDynamicClient
	m     *countingMetrics
}

func newHandlerEnv(t *testing.T, mutate func(*trigger.HandlerConfig)) *handlerEnv {
	t.Helper()
	return newHandlerEnvWith(t, nil, mutate)
}

// newHandlerEnvWith is newHandlerEnv with the trigger's configuration
// changed by trig first: by default the trigger reads through a fake
// dynamic client (e.dyn) that holds ns/a, and shares the handler's metrics.
func newHandlerEnvWith(t *testing.T, trig func(*trigger.Config[*corev1.ConfigMap]), mutate func(*trigger.HandlerConfig)) *handlerEnv {
	t.Helper()
	scheme := runtime.NewScheme()
	if err := corev1.AddToScheme(scheme); err != nil {
		t.Fatal(err)
	}
	e := &handlerEnv{dyn: dynfake.NewSimpleDynamicClient(scheme, cm("ns", "a")), m: newCounting()}
	e.route = &oneLeader{holder: "replica-b"}
	tcfg := trigger.Config[*corev1.ConfigMap]{Dynamic: e.dyn, Metrics: e.m, Router: e.route}
	if trig != nil {
		trig(&tcfg)
	}
	e.tr, e.q = newCMTriggerWith(t, tcfg)
	tr := e.tr
	cfg := trigger.HandlerConfig{
		Authenticator: allowAll{},
		Metrics:       e.m,
		Logger:        discard,
	}
	if mutate != nil {
		mutate(&cfg)
	}
	h, err := trigger.NewHandler(tr, cfg)
	if err != nil {
		t.Fatal(err)
	}
	e.h = h
	return e
}

func (e *handlerEnv) do(method, target string, body io.Reader, header http.Header) *httptest.ResponseRecorder {
	r := httptest.NewRequest(method, target, body)
	for k, v := range header {
		r.Header[k] = v
	}
	w := httptest.NewRecorder()
	e.h.ServeHTTP(w, r)
	return w
}

func post(e *handlerEnv, target string) *httptest.ResponseRecorder {
	return e.do(http.MethodPost, target, nil, nil)
}

// wantStatus checks the code and that the body is a Kubernetes-style Status
// with the given reason, and returns it.
func wantStatus(t *testing.T, w *httptest.ResponseRecorder, code int, reason string) trigger.Status {
	t.Helper()
	if w.Code != code {
		t.Fatalf("code = %d, want %d; body %s", w.Code, code, w.Body)
	}
	if ct := w.Header().Get("Content-Type"); ct != "application/json" {
		t.Errorf("Content-Type = %q, want application/json", ct)
	}
	var st trigger.Status
	dec := json.NewDecoder(w.Body)
	dec.DisallowUnknownFields()
	if err := dec.Decode(&st); err != nil {
		t.Fatalf("body is not a Status: %v", err)
	}
	if st.Kind != "Status" || st.APIVersion != "v1" || st.Status != "Failure" || st.Code != code || string(st.Reason) != reason || st.Message == "" {
		t.Errorf("status = %+v, want Failure %d %s with a message", st, code, reason)
	}
	return st
}

func TestHandler202SchedulesTheRefetchedObject(t *testing.T) {
	e := newHandlerEnv(t, nil)
	w := e.do(http.MethodPost, "/reconcile/ns/a?delay=0s&reason=ci+deployed", nil, nil)
	if w.Code != http.StatusAccepted {
		t.Fatalf("code = %d, body %s", w.Code, w.Body)
	}
	var got trigger.Accepted
	if err := json.Unmarshal(w.Body.Bytes(), &got); err != nil {
		t.Fatal(err)
	}
	want := trigger.Accepted{Key: "ns/a", Namespace: "ns", Name: "a", UID: "uid-a", ResourceVersion: "7", Delay: "0s", Outcome: "Queued"}
	if got != want {
		t.Errorf("body = %+v, want %+v", got, want)
	}
	it, err := e.q.Get(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	// The object read travels with the key, with source Operator and the
	// request's reason.
	if got, want := describe(it.Value), describe(operatorCause(cm("ns", "a"), "ci deployed")); got != want || it.Priority != trigger.DefaultPriority {
		t.Errorf("queued %s (priority %d)\nwant   %s (priority %d)", got, it.Priority, want, trigger.DefaultPriority)
	}
	if e.m.requests[202] != 1 {
		t.Errorf("metrics = %v", e.m.requests)
	}
}

func TestHandler202ReasonFromJSONBodyAndDelay(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		e := newHandlerEnv(t, nil)
		sent := time.Now()
		w := e.do(http.MethodPost, "/reconcile/ns/a?delay=90s", strings.NewReader(`{"reason":"pipeline 42"}`), http.Header{"Content-Type": {"application/json; charset=utf-8"}})
		if w.Code != http.StatusAccepted {
			t.Fatalf("code = %d, body %s", w.Code, w.Body)
		}
		var got trigger.Accepted
		_ = json.Unmarshal(w.Body.Bytes(), &got)
		if got.Delay != "1m30s" {
			t.Errorf("delay = %q, want 1m30s", got.Delay)
		}
		if e.q.Len() != 1 {
			t.Fatalf("queue len = %d, want 1", e.q.Len())
		}
		it, err := e.q.Get(t.Context())
		if err != nil || !slices.Equal(it.Value.Reasons, []string{"pipeline 42"}) || time.Since(sent) != 90*time.Second {
			t.Errorf("handed out after %v with reasons %q (%v); want after 90s with the body's reason", time.Since(sent), it.Value.Reasons, err)
		}
	})
}

// denyAnonymous refuses every request as unauthenticated and counts them.
type denyAnonymous struct{ calls *int }

func (d denyAnonymous) Authorize(context.Context, trigger.AuthRequest) (string, error) {
	*d.calls++
	return "", fmt.Errorf("%w: no bearer token", trigger.ErrUnauthenticated)
}

// The query and the body are checked before the caller is authenticated
// (400, 413 and 415 come first, and the body is read no further than its
// limit), the key before both; a well-formed request is then authorized
// before anything is read from the API server: an unauthenticated caller
// gets its 401 without an API call and with nothing queued.
func TestHandlerParsesThenAuthenticatesBeforeReading(t *testing.T) {
	calls := 0
	e := newHandlerEnv(t, func(c *trigger.HandlerConfig) { c.Authenticator = denyAnonymous{&calls} })
	json := http.Header{"Content-Type": {"application/json"}}
	big := &countingReader{r: strings.NewReader(strings.Repeat("x", 1<<20))}
	for _, tc := range []struct {
		target string
		body   io.Reader
		header http.Header
		code   int
		reason string
	}{
		{"/reconcile/ns/a", big, json, http.StatusRequestEntityTooLarge, "RequestEntityTooLarge"},
		{"/reconcile/ns/a?nonsense=1", nil, nil, http.StatusBadRequest, "BadRequest"},
		{"/reconcile/ns/a?delay=2h", nil, nil, http.StatusBadRequest, "BadRequest"},
		{"/reconcile/ns/a", strings.NewReader(`{"unknown":1}`), json, http.StatusBadRequest, "BadRequest"},
		{"/reconcile/ns/a", strings.NewReader(`{"unknown":1}`), http.Header{"Content-Type": {"text/plain"}}, http.StatusUnsupportedMediaType, "UnsupportedMediaType"},
		// An invalid key is refused before authentication too.
		{"/reconcile/ns/a%25b", nil, nil, http.StatusBadRequest, "BadRequest"},
		{"/reconcile/Bad_NS/a", nil, nil, http.StatusBadRequest, "BadRequest"},
	} {
		wantStatus(t, e.do(http.MethodPost, tc.target, tc.body, tc.header), tc.code, tc.reason)
	}
	if calls != 0 {
		t.Fatalf("authorizer called %d times for malformed requests, want 0", calls)
	}
	if big.n > trigger.DefaultMaxBytes+1 {
		t.Errorf("read %d bytes of an oversized body, want at most the limit (%d) and one", big.n, trigger.DefaultMaxBytes)
	}
	// Well formed: authenticated before the read, refused with 401.
	for _, tc := range []struct {
		body   io.Reader
		header http.Header
	}{
		{nil, nil},
		{strings.NewReader(`{"reason":"x"}`), json},
	} {
		wantStatus(t, e.do(http.MethodPost, "/reconcile/ns/a?delay=1s", tc.body, tc.header), http.StatusUnauthorized, "Unauthorized")
	}
	if calls != 2 {
		t.Errorf("authorizer called %d times for 2 well-formed requests, want 2", calls)
	}
	if n := len(e.dyn.Actions()); n != 0 || e.q.Len() != 0 {
		t.Errorf("%d API calls, queue len %d after refused callers; want none", n, e.q.Len())
	}
}

// HandlerConfig.APITimeout bounds the authorization and the read together:
// a slow authorizer leaves the read only what remains.
func TestHandlerAPITimeoutBoundsAuthorizationAndReadTogether(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		var readFor time.Duration
		e := newHandlerEnvWith(t, func(c *trigger.Config[*corev1.ConfigMap]) {
			c.Get = func(ctx context.Context, key opkit.Key) (*corev1.ConfigMap, error) {
				start := time.Now()
				<-ctx.Done()
				readFor = time.Since(start)
				return nil, ctx.Err()
			}
		}, func(c *trigger.HandlerConfig) {
			c.APITimeout = 2 * time.Second
			c.Authenticator = slowAuth{1500 * time.Millisecond}
		})
		start := time.Now()
		wantStatus(t, post(e, "/reconcile/ns/a"), 504, "Timeout")
		if d := time.Since(start); d != 2*time.Second || readFor != 500*time.Millisecond {
			t.Errorf("answered after %v, the read given %v; want 2s in all, 500ms of it for the read", d, readFor)
		}
		if e.q.Len() != 0 {
			t.Errorf("queue len = %d, want 0", e.q.Len())
		}
	})
}

// slowAuth lets everyone in after a delay.
type slowAuth struct{ d time.Duration }

func (s slowAuth) Authorize(ctx context.Context, _ trigger.AuthRequest) (string, error) {
	select {
	case <-time.After(s.d):
		return "tester", nil
	case <-ctx.Done():
		return "", ctx.Err()
	}
}

type countingReader struct {
	r io.Reader
	n int
}

func (c *countingReader) Read(p []byte) (int, error) {
	n, err := c.r.Read(p)
	c.n += n
	return n, err
}

func TestHandler404(t *testing.T) {
	e := newHandlerEnv(t, nil)
	st := wantStatus(t, post(e, "/reconcile/ns/missing"), 404, "NotFound")
	if st.Details == nil || st.Details.Name != "missing" {
		t.Errorf("details = %+v", st.Details)
	}
	wantStatus(t, post(e, "/elsewhere"), 404, "NotFound")
	wantStatus(t, post(e, "/reconcile/ns/a/extra"), 404, "NotFound")
	// A namespaced resource has no cluster-scoped route.
	wantStatus(t, post(e, "/reconcile/a"), 404, "NotFound")
	if e.q.Len() != 0 {
		t.Errorf("queue len = %d", e.q.Len())
	}
}

// Mounted behind http.StripPrefix, with or without the prefix's trailing
// slash, the handler serves its routes: the stripped path may lack its
// leading slash.
func TestHandlerBehindStripPrefix(t *testing.T) {
	for _, prefix := range []string{"/trigger", "/trigger/"} {
		t.Run(prefix, func(t *testing.T) {
			e := newHandlerEnv(t, nil)
			outer := http.NewServeMux()
			outer.Handle("/trigger/", http.StripPrefix(prefix, e.h))
			for target, code := range map[string]int{
				"/trigger/reconcile/ns/a": http.StatusAccepted,
				"/trigger/elsewhere":      http.StatusNotFound,
			} {
				w := httptest.NewRecorder()
				outer.ServeHTTP(w, httptest.NewRequest(http.MethodPost, target, nil))
				if w.Code != code || w.Header().Get("Location") != "" {
					t.Errorf("POST %s: %d (Location %q) %s, want %d", target, w.Code, w.Header().Get("Location"), w.Body, code)
				}
			}
		})
	}
}

func TestHandler400(t *testing.T) {
	e := newHandlerEnv(t, nil)
	for _, target := range []string{
		"/reconcile/Bad_NS/a",
		"/reconcile/ns/a%25b",
		"/reconcile/ns/a%2Fb",
		"/reconcile/ns/a%01",
		"/reconcile/ns/" + strings.Repeat("a", 254),
		"/reconcile/" + strings.Repeat("n", 64) + "/a",
		"/reconcile/ns%2Fx/a",
		"/reconcile/ns/a?delay=soon",
		"/reconcile/ns/a?delay=-1s",
		"/reconcile/ns/a?delay=2h",
		"/reconcile/ns/a?delay=1s&delay=2s",
		"/reconcile/ns/a?force=true",
		"/reconcile/ns/a?reason=%ff",
		"/reconcile/ns/a?reason=" + strings.Repeat("r", trigger.MaxReasonLen+1),
		"/reconcile/ns/a?a=%zz",
		// not in canonical form: the mux would redirect to another name
		"/reconcile/ns/./a",
		"/reconcile/ns//a",
		"/reconcile/x/../ns/a",
		"/reconcile/ns/a/.",
	} {
		t.Run(target[:min(len(target), 40)], func(t *testing.T) {
			wantStatus(t, post(e, target), 400, "BadRequest")
		})
	}
	json := http.Header{"Content-Type": {"application/json"}}
	for _, tc := range []struct{ body, says string }{
		{`{"reason":1}`, `member "reason": want a JSON string, got number`},
		{`{"name":"b"}`, `unknown member "name" (known: reason)`},
		{`{"Reason":"b"}`, `unknown member "Reason"`}, // names match exactly
		{`{"reason":"a","reason":""}`, `member "reason" given twice`},
		{`{"reason":"x"} {}`, "data after the JSON object"},
		{`[]`, "not a JSON object"},
		{" \n", "empty: want a JSON object"},
		{`not json`, "invalid character"},
		{`{"reason":"x"`, "does not end"},
		{`{`, "does not end"},
	} {
		st := wantStatus(t, e.do(http.MethodPost, "/reconcile/ns/a", strings.NewReader(tc.body), json), 400, "BadRequest")
		if !strings.Contains(st.Message, tc.says) {
			t.Errorf("body %q: message %q does not say %q", tc.body, st.Message, tc.says)
		}
	}
	// A reason in both places, even an empty one in the query.
	for _, target := range []string{"/reconcile/ns/a?reason=q", "/reconcile/ns/a?reason="} {
		wantStatus(t, e.do(http.MethodPost, target, strings.NewReader(`{"reason":"b"}`), json), 400, "BadRequest")
	}
	if e.q.Len() != 0 {
		t.Errorf("queue len = %d after bad requests", e.q.Len())
	}
}

func TestHandler405(t *testing.T) {
	e := newHandlerEnv(t, nil)
	for _, m := range []string{http.MethodGet, http.MethodPut, http.MethodDelete, http.MethodPatch} {
		w := e.do(m, "/reconcile/ns/a", nil, nil)
		wantStatus(t, w, 405, "MethodNotAllowed")
		if w.Header().Get("Allow") != "POST" {
			t.Errorf("%s: Allow = %q", m, w.Header().Get("Allow"))
		}
	}
}

// Any reason Pointer.Check accepts fits in a body of the default size, however
// the client escapes it (encoding/json writes < and control characters as
// six bytes each).
func TestHandlerAcceptsTheLongestReasonEscaped(t *testing.T) {
	for _, reason := range []string{strings.Repeat("<", trigger.MaxReasonLen), strings.Repeat("\x01", trigger.MaxReasonLen)} {
		e := newHandlerEnv(t, nil)
		body, err := json.Marshal(map[string]string{"reason": reason})
		if err != nil {
			t.Fatal(err)
		}
		w := e.do(http.MethodPost, "/reconcile/ns/a", bytes.NewReader(body), http.Header{"Content-Type": {"application/json"}})
		if w.Code != http.StatusAccepted {
			t.Fatalf("a %d-byte body with a valid reason: %d %s", len(body), w.Code, w.Body)
		}
		if it, err := e.q.Get(t.Context()); err != nil || !slices.Equal(it.Value.Reasons, []string{reason}) {
			t.Errorf("queued reasons %.40q (%v), want the %d bytes sent", it.Value.Reasons, err, len(reason))
		}
	}
}

func TestHandler413(t *testing.T) {
	e := newHandlerEnv(t, nil)
	big := `{"reason":"` + strings.Repeat("x", trigger.DefaultMaxBytes) + `"}`
	wantStatus(t, e.do(http.MethodPost, "/reconcile/ns/a", strings.NewReader(big), http.Header{"Content-Type": {"application/json"}}), 413, "RequestEntityTooLarge")
	// Without a Content-Length (chunked) the limit still holds.
	r := httptest.NewRequest(http.MethodPost, "/reconcile/ns/a", io.MultiReader(strings.NewReader(big)))
	r.ContentLength = -1
	r.Header.Set("Content-Type", "application/json")
	w := httptest.NewRecorder()
	e.h.ServeHTTP(w, r)
	wantStatus(t, w, 413, "RequestEntityTooLarge")
}

func TestHandler415(t *testing.T) {
	e := newHandlerEnv(t, nil)
	for _, ct := range []string{"text/plain", "application/x-www-form-urlencoded", "", "application/yaml"} {
		h := http.Header{}
		if ct != "" {
			h.Set("Content-Type", ct)
		}
		wantStatus(t, e.do(http.MethodPost, "/reconcile/ns/a", strings.NewReader(`{"reason":"x"}`), h), 415, "UnsupportedMediaType")
	}
}

func TestHandler503WhenDropped(t *testing.T) {
	e := newHandlerEnv(t, nil)
	e.q.Suspend()
	w := post(e, "/reconcile/ns/a")
	st := wantStatus(t, w, 503, "ServiceUnavailable")
	if w.Header().Get("Retry-After") != "5" || w.Header().Get("X-Opkit-Leader") != "replica-b" {
		t.Errorf("headers = %v", w.Header())
	}
	if st.Leader != "replica-b" || st.Outcome != "DroppedSuspended" {
		t.Errorf("status leader=%q outcome=%q", st.Leader, st.Outcome)
	}
	e.q.Resume()
	e.q.ShutDown()
	wantStatus(t, post(e, "/reconcile/ns/a"), 503, "ServiceUnavailable")
}

func TestHandler503WithoutKnownLeader(t *testing.T) {
	e := newHandlerEnv(t, func(c *trigger.HandlerConfig) { c.RetryAfter = 1500 * time.Millisecond })
	e.route.holder = ""
	e.q.Suspend()
	w := post(e, "/reconcile/ns/a")
	st := wantStatus(t, w, 503, "ServiceUnavailable")
	if _, ok := w.Header()["X-Opkit-Leader"]; ok || st.Leader != "" {
		t.Errorf("leader given though unknown: %v %q", w.Header(), st.Leader)
	}
	if w.Header().Get("Retry-After") != "2" {
		t.Errorf("Retry-After = %q, want 2 (rounded up)", w.Header().Get("Retry-After"))
	}
}

func TestHandler502503And504FromTheAPIServer(t *testing.T) {
	for _, tc := range []struct {
		err    error
		code   int
		reason string
	}{
		{apierrors.NewInternalError(errors.New("etcd down")), 503, "ServiceUnavailable"}, // retry: it may be back soon
		{apierrors.NewForbidden(schema.GroupResource{Resource: "configmaps"}, "a", errors.New("operator lacks get")), 502, "BadGateway"},
		{apierrors.NewTimeoutError("slow", 1), 504, "Timeout"},
		{apierrors.NewServerTimeout(schema.GroupResource{Resource: "configmaps"}, "get", 1), 504, "Timeout"},
		// A NotFound naming no object: the API server does not serve the
		// resource (as client-go reports an unknown group/version, and a
		// known one without the resource). The object may exist: not a 404.
		{apierrors.NewGenericServerResponse(404, "get", schema.GroupResource{}, "", "404 page not found", 0, true), 502, "BadGateway"},
		{&apierrors.StatusError{ErrStatus: metav1.Status{Status: metav1.StatusFailure, Code: 404, Reason: metav1.StatusReasonNotFound,
			Message: "the server could not find the requested resource", Details: &metav1.StatusDetails{}}}, 502, "BadGateway"},
	} {
		var logs bytes.Buffer
		e := newHandlerEnv(t, func(c *trigger.HandlerConfig) {
			c.Logger = slog.New(slog.NewTextHandler(&logs, nil))
		})
		e.dyn.PrependReactor("get", "configmaps", func(clienttesting.Action) (bool, runtime.Object, error) { return true, nil, tc.err })
		st := wantStatus(t, post(e, "/reconcile/ns/a"), tc.code, tc.reason)
		// The API server's words are for the operator's log, not the caller.
		if strings.Contains(st.Message, tc.err.Error()) || !strings.Contains(logs.String(), "API server call failed") {
			t.Errorf("%v: message %q carries the error, or the log has no record:\n%s", tc.err, st.Message, logs.String())
		}
		if apierrors.IsNotFound(tc.err) && !strings.Contains(logs.String(), "does not serve configmaps") {
			t.Errorf("%v: the log does not say the resource is not served:\n%s", tc.err, logs.String())
		}
		if e.q.Len() != 0 {
			t.Errorf("%v: queued", tc.err)
		}
	}
}

func TestHandler504WhenTheRefetchHangs(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		e := newHandlerEnvWith(t, func(c *trigger.Config[*corev1.ConfigMap]) {
			c.Get = func(ctx context.Context, key opkit.Key) (*corev1.ConfigMap, error) {
				<-ctx.Done()
				return nil, ctx.Err()
			}
		}, func(c *trigger.HandlerConfig) { c.APITimeout = 2 * time.Second })
		start := time.Now()
		wantStatus(t, post(e, "/reconcile/ns/a"), 504, "Timeout")
		if d := time.Since(start); d != 2*time.Second {
			t.Errorf("answered after %v, want the APITimeout 2s", d)
		}
	})
}

// client-go's client-side rate limiter refuses at once a wait that would
// pass the call's deadline; the API server was not even asked: a timeout
// (504), not a failing API server (502).
func TestHandler504WhenTheClientRateLimiterWouldPassTheDeadline(t *testing.T) {
	var calls atomic.Int32
	api := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		calls.Add(1)
		w.Header().Set("Content-Type", "application/json")
		_, _ = w.Write([]byte(`{"apiVersion":"v1","kind":"ConfigMap","metadata":{"namespace":"ns","name":"a","uid":"u","resourceVersion":"1"}}`))
	}))
	defer api.Close()
	dyn, err := dynamic.NewForConfig(&rest.Config{Host: api.URL, QPS: 0.01, Burst: 1}) // the second call waits 100s
	if err != nil {
		t.Fatal(err)
	}
	e := newHandlerEnvWith(t, func(c *trigger.Config[*corev1.ConfigMap]) { c.Dynamic = dyn },
		func(c *trigger.HandlerConfig) { c.APITimeout = time.Minute })
	if w := post(e, "/reconcile/ns/a"); w.Code != http.StatusAccepted {
		t.Fatalf("first: %d %s", w.Code, w.Body)
	}
	it, _ := e.q.Get(context.Background()) // the second trigger must read again, not join a waiting entry
	e.q.Done(it.Key)
	wantStatus(t, post(e, "/reconcile/ns/a"), 504, "Timeout")
	if calls.Load() != 1 {
		t.Errorf("API server calls %d; want 1", calls.Load())
	}
}

// A caller that goes away during the re-fetch cut the API call short
// itself: that is no API server failure (no 502, no error log), and
// nothing is queued.
func TestHandlerCallerGoneDuringTheRefetch(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		ctx, hangUp := context.WithCancel(context.Background())
		e := newHandlerEnvWith(t, func(c *trigger.Config[*corev1.ConfigMap]) {
			c.Get = func(gctx context.Context, key opkit.Key) (*corev1.ConfigMap, error) {
				hangUp()
				<-gctx.Done()
				return nil, gctx.Err()
			}
		}, nil)
		r := httptest.NewRequestWithContext(ctx, http.MethodPost, "/reconcile/ns/a", nil)
		w := httptest.NewRecorder()
		e.h.ServeHTTP(w, r)
		st := wantStatus(t, w, http.StatusServiceUnavailable, "ServiceUnavailable")
		if !strings.Contains(st.Message, "cancelled") || e.q.Len() != 0 {
			t.Errorf("message %q, queue len %d; want a cancelled request and nothing queued", st.Message, e.q.Len())
		}
	})
}

func TestHandler429InFlightLimit(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		release := make(chan struct{})
		e := newHandlerEnvWith(t, func(c *trigger.Config[*corev1.ConfigMap]) {
			c.Get = func(ctx context.Context, key opkit.Key) (*corev1.ConfigMap, error) {
				<-release
				return cm(key.Namespace, key.Name), nil
			}
		}, func(c *trigger.HandlerConfig) { c.MaxInFlight = 1 })
		first := make(chan int)
		go func() { first <- post(e, "/reconcile/ns/a").Code }()
		synctest.Wait() // the first request holds the only slot
		w := post(e, "/reconcile/ns/b")
		wantStatus(t, w, 429, "TooManyRequests")
		if w.Header().Get("Retry-After") == "" {
			t.Error("429 without Retry-After")
		}
		close(release)
		if code := <-first; code != 202 {
			t.Errorf("first request = %d, want 202", code)
		}
		if code := post(e, "/reconcile/ns/b").Code; code != 202 {
			t.Errorf("after the slot is free: %d, want 202", code)
		}
	})
}

func TestHandler429RateLimit(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		e := newHandlerEnv(t, func(c *trigger.HandlerConfig) { c.RateLimit = 2; c.RateBurst = 2 })
		codes := []int{post(e, "/reconcile/ns/a").Code, post(e, "/reconcile/ns/a").Code}
		wantStatus(t, post(e, "/reconcile/ns/a"), 429, "TooManyRequests")
		time.Sleep(500 * time.Millisecond) // virtual: one token refills at 2/s
		codes = append(codes, post(e, "/reconcile/ns/a").Code)
		for i, c := range codes {
			if c != 202 {
				t.Errorf("request %d = %d, want 202", i, c)
			}
		}
		wantStatus(t, post(e, "/reconcile/ns/a"), 429, "TooManyRequests")
	})
}

func TestHandlerClusterScopedRoute(t *testing.T) {
	scheme := runtime.NewScheme()
	dyn := dynfake.NewSimpleDynamicClientWithCustomListKinds(scheme, map[schema.GroupVersionResource]string{widgets.GroupVersionResource: "WidgetList"})
	w0 := &Widget{}
	w0.APIVersion, w0.Kind, w0.Name, w0.UID = "demo.opkit.dev/v1", "Widget", "big", "uid-big"
	u, err := runtime.DefaultUnstructuredConverter.ToUnstructured(w0)
	if err != nil {
		t.Fatal(err)
	}
	if err := dyn.Tracker().Add(&unstructured.Unstructured{Object: u}); err != nil {
		t.Fatal(err)
	}
	q := queue.New[opkit.Key](queue.Config[opkit.Cause[*Widget]]{Merge: (*opkit.Cause[*Widget]).Merge})
	tr, err := trigger.New(trigger.Config[*Widget]{Queue: q, Resource: widgets, Dynamic: dyn, Logger: discard})
	if err != nil {
		t.Fatal(err)
	}
	h, err := trigger.NewHandler(tr, trigger.HandlerConfig{Authenticator: allowAll{}, Logger: discard})
	if err != nil {
		t.Fatal(err)
	}
	e := &handlerEnv{h: h}
	if w := post(e, "/reconcile/big"); w.Code != 202 {
		t.Fatalf("code = %d, body %s", w.Code, w.Body)
	}
	wantStatus(t, post(e, "/reconcile/ns/big"), 404, "NotFound")
	wantStatus(t, post(e, "/reconcile/none"), 404, "NotFound")
	it, _ := q.Get(context.Background())
	if it.Key != (opkit.Key{Name: "big"}) || it.Value.Object == nil || it.Value.Object.UID != "uid-big" || !it.Value.Sources.Has(opkit.Operator) {
		t.Errorf("queued %v %+v", it.Key, it.Value)
	}
}

// An object of another kind from the API server is its failure, not the
// caller's: a 502, and nothing queued.
func TestHandler502WhenTheServerReturnsAnotherKind(t *testing.T) {
	e := newHandlerEnvWith(t, func(c *trigger.Config[*corev1.ConfigMap]) {
		c.Get = func(ctx context.Context, key opkit.Key) (*corev1.ConfigMap, error) {
			o := cm(key.Namespace, key.Name)
			o.Kind = "Secret"
			return o, nil
		}
	}, nil)
	st := wantStatus(t, post(e, "/reconcile/ns/a"), 502, "BadGateway")
	if strings.Contains(st.Message, "Secret") || e.q.Len() != 0 {
		t.Errorf("message %q, queue len %d; want no internal detail and nothing queued", st.Message, e.q.Len())
	}
}

func TestNewHandlerRequiresAuthOrExplicitInsecure(t *testing.T) {
	dyn := dynfake.NewSimpleDynamicClient(runtime.NewScheme())
	tr, _ := newCMTriggerWith(t, trigger.Config[*corev1.ConfigMap]{Dynamic: dyn})
	if _, err := trigger.NewHandler[*corev1.ConfigMap](nil, trigger.HandlerConfig{}); err == nil {
		t.Error("NewHandler without a Trigger succeeded")
	}
	if _, err := trigger.NewHandler(tr, trigger.HandlerConfig{}); err == nil {
		t.Error("NewHandler without any authentication succeeded")
	}
	if _, err := trigger.NewHandler(tr, trigger.HandlerConfig{InsecureSkipAuth: true, Authenticator: allowAll{}}); err == nil {
		t.Error("NewHandler with InsecureSkipAuth and an Authenticator succeeded")
	}
	if _, err := trigger.NewHandler(tr, trigger.HandlerConfig{InsecureSkipAuth: true, MaxDelay: -1}); err == nil {
		t.Error("NewHandler with a negative MaxDelay succeeded")
	}
	if _, err := trigger.NewHandler(tr, trigger.HandlerConfig{InsecureSkipAuth: true, RateBurst: 5}); err == nil {
		t.Error("NewHandler with RateBurst but no RateLimit succeeded")
	}
	if _, err := trigger.NewHandler(tr, trigger.HandlerConfig{InsecureSkipAuth: true, Type: opkit.Type(9)}); err == nil {
		t.Error("NewHandler with an invalid Type succeeded")
	}
	h, err := trigger.NewHandler(tr, trigger.HandlerConfig{InsecureSkipAuth: true, Logger: discard})
	if err != nil || h == nil {
		t.Fatalf("insecure handler: %v", err)
	}
}
