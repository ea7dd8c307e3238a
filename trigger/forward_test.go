package trigger_test

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"net/url"
	"os"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/runtime/schema"

	"github.com/opkit/opkit"
	"github.com/opkit/opkit/queue"
	"github.com/opkit/opkit/trigger"
)

// A follower forwards a trigger to the leader's endpoint and answers with
// the leader's answer; a forwarded request is never forwarded again; a
// leader that does not answer is a 503 (it is likely gone); credentials
// do not leave TLS for plain HTTP.
func TestAFollowerForwardsToTheLeader(t *testing.T) {
	leader := newHandlerEnv(t, nil)
	leaderSrv := httptest.NewServer(leader.h)
	defer leaderSrv.Close()
	follower := newHandlerEnv(t, nil)
	follower.route.follow(leaderSrv.URL)
	follower.q.Suspend() // it does not lead
	followerSrv := httptest.NewServer(follower.h)
	defer followerSrv.Close()

	resp, err := http.Post(followerSrv.URL+"/reconcile/ns/a?reason=deployed", "", nil)
	if err != nil {
		t.Fatal(err)
	}
	body, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	var a trigger.Accepted
	if resp.StatusCode != http.StatusAccepted || json.Unmarshal(body, &a) != nil || a.Key != "ns/a" || resp.Header.Get("X-Opkit-Forwarded") == "" {
		t.Fatalf("through the follower: %d %s (forwarded %q), want the leader's 202", resp.StatusCode, body, resp.Header.Get("X-Opkit-Forwarded"))
	}
	if leader.q.Len() != 1 || follower.q.Len() != 0 {
		t.Fatalf("queued: leader %d, follower %d; want the leader's", leader.q.Len(), follower.q.Len())
	}
	if it, _ := leader.q.Get(t.Context()); len(it.Value.Reasons) != 1 || it.Value.Reasons[0] != "deployed" {
		t.Fatalf("the leader queued %+v, want the caller's reason", it.Value)
	}

	// Two followers that each think the other leads: one hop, then 503.
	other := newHandlerEnv(t, nil)
	other.q.Suspend()
	otherSrv := httptest.NewServer(other.h)
	defer otherSrv.Close()
	confused := newHandlerEnv(t, nil)
	confused.route.follow(otherSrv.URL)
	confused.q.Suspend()
	confusedSrv := httptest.NewServer(confused.h)
	defer confusedSrv.Close()
	other.route.follow(confusedSrv.URL)
	resp, err = http.Post(confusedSrv.URL+"/reconcile/ns/a", "", nil)
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusServiceUnavailable {
		t.Fatalf("between two followers: %d, want 503 after one hop", resp.StatusCode)
	}

	// A leader endpoint that does not answer.
	gone := newHandlerEnv(t, nil)
	gone.route.follow("http://127.0.0.1:1")
	gone.q.Suspend()
	wantStatus(t, post(gone, "/reconcile/ns/a"), http.StatusServiceUnavailable, "ServiceUnavailable")
	if gone.q.Len() != 0 {
		t.Fatal("a trigger the leader never got was queued here")
	}

	// Over TLS, never to plain HTTP.
	tlsFollower := newHandlerEnv(t, nil)
	tlsFollower.route.follow(leaderSrv.URL)
	tlsFollower.q.Suspend()
	tlsSrv := httptest.NewTLSServer(tlsFollower.h)
	defer tlsSrv.Close()
	resp, err = tlsSrv.Client().Post(tlsSrv.URL+"/reconcile/ns/a", "", nil)
	if err != nil {
		t.Fatal(err)
	}
	body, _ = io.ReadAll(resp.Body)
	resp.Body.Close()
	if resp.StatusCode != http.StatusBadGateway || !strings.Contains(string(body), "not HTTPS") {
		t.Fatalf("TLS to plain HTTP: %d %s, want 502 saying so", resp.StatusCode, body)
	}
}

// tokenAuth allows the bearer token "good" and refuses any other as
// unauthenticated, recording every Authorization header it was shown.
type tokenAuth struct {
	mu   sync.Mutex
	seen []string
}

func (a *tokenAuth) Authorize(_ context.Context, r trigger.AuthRequest) (string, error) {
	h := r.HTTP.Header.Get("Authorization")
	a.mu.Lock()
	a.seen = append(a.seen, h)
	a.mu.Unlock()
	if h != "Bearer good" {
		return "", fmt.Errorf("%w: bad token", trigger.ErrUnauthenticated)
	}
	return "pipeline", nil
}

func (a *tokenAuth) shown() []string {
	a.mu.Lock()
	defer a.mu.Unlock()
	return append([]string(nil), a.seen...)
}

// The follower checks the caller too and forwards only a caller it
// accepted, with the caller's own token (never one of its own): the
// leader authenticates that token again. A refused caller gets the
// follower's 401, and the leader never hears of it.
func TestAForwardedTriggerCarriesTheCallersTokenAndARefusedOneIsNotForwarded(t *testing.T) {
	leaderAuth, followerAuth := &tokenAuth{}, &tokenAuth{}
	leader := newHandlerEnv(t, func(c *trigger.HandlerConfig) { c.Authenticator = leaderAuth })
	leaderSrv := httptest.NewServer(leader.h)
	defer leaderSrv.Close()
	follower := newHandlerEnv(t, func(c *trigger.HandlerConfig) { c.Authenticator = followerAuth })
	follower.route.follow(leaderSrv.URL)
	follower.q.Suspend()
	followerSrv := httptest.NewServer(follower.h)
	defer followerSrv.Close()

	if code := postBearer(t, followerSrv.URL, "forged"); code != http.StatusUnauthorized {
		t.Fatalf("a bad token through the follower: %d, want 401", code)
	}
	if seen := leaderAuth.shown(); len(seen) != 0 {
		t.Fatalf("the leader was shown %q for a caller the follower refused", seen)
	}
	if code := postBearer(t, followerSrv.URL, "good"); code != http.StatusAccepted {
		t.Fatalf("a good token through the follower: %d, want the leader's 202", code)
	}
	if seen := leaderAuth.shown(); len(seen) != 1 || seen[0] != "Bearer good" {
		t.Fatalf("the leader was shown %q, want the caller's own token once", seen)
	}
	if leader.q.Len() != 1 || follower.q.Len() != 0 {
		t.Fatalf("queued: leader %d, follower %d; want the leader's one", leader.q.Len(), follower.q.Len())
	}
}

// unreachableAuth fails every review as an API server that does not
// answer does.
type unreachableAuth struct{}

func (unreachableAuth) Authorize(context.Context, trigger.AuthRequest) (string, error) {
	return "", &url.Error{Op: "Post", URL: "https://127.0.0.1:6443/apis/authentication.k8s.io/v1/tokenreviews",
		Err: &net.OpError{Op: "dial", Net: "tcp", Err: &os.SyscallError{Syscall: "connect", Err: syscall.ECONNREFUSED}}}
}

// A follower whose own API server does not answer cannot check the
// caller, and forwards the trigger to the leader, which does (and
// refuses a bad token itself); a leader in that state answers 503 (retry:
// its API server may be back), and a follower whose API server said no
// refuses.
func TestAFollowerThatCannotCheckTheCallerForwardsToTheLeader(t *testing.T) {
	leaderAuth := &tokenAuth{}
	leader := newHandlerEnv(t, func(c *trigger.HandlerConfig) { c.Authenticator = leaderAuth })
	leaderSrv := httptest.NewServer(leader.h)
	defer leaderSrv.Close()
	follower := newHandlerEnv(t, func(c *trigger.HandlerConfig) { c.Authenticator = unreachableAuth{} })
	follower.route.follow(leaderSrv.URL)
	follower.q.Suspend()
	followerSrv := httptest.NewServer(follower.h)
	defer followerSrv.Close()

	if code := postBearer(t, followerSrv.URL, "good"); code != http.StatusAccepted || leader.q.Len() != 1 {
		t.Fatalf("a good token through the follower that cannot check it: %d, queued on the leader %d; want the leader's 202", code, leader.q.Len())
	}
	if code := postBearer(t, followerSrv.URL, "forged"); code != http.StatusUnauthorized {
		t.Fatalf("a bad token through the follower that cannot check it: %d, want the leader's 401", code)
	}
	// The leader itself cannot check: no one can now, 503 with Retry-After.
	unchecked := newHandlerEnv(t, func(c *trigger.HandlerConfig) { c.Authenticator = unreachableAuth{} })
	w := post(unchecked, "/reconcile/ns/a")
	wantStatus(t, w, http.StatusServiceUnavailable, "ServiceUnavailable")
	if w.Header().Get("Retry-After") == "" {
		t.Error("503 without Retry-After")
	}
	// A follower whose API server refused the caller does not forward.
	refusing := newHandlerEnv(t, func(c *trigger.HandlerConfig) { c.Authenticator = &tokenAuth{} })
	refusing.route.follow(leaderSrv.URL)
	refusing.q.Suspend()
	wantStatus(t, post(refusing, "/reconcile/ns/a"), http.StatusUnauthorized, "Unauthorized")
}

// reviewRefusedAuth is an Authenticator whose API server refuses the
// review itself (the operator lacks create on tokenreviews, or the
// server's authorizer has not synced): the caller was not judged.
type reviewRefusedAuth struct{}

func (reviewRefusedAuth) Authorize(context.Context, trigger.AuthRequest) (string, error) {
	return "", apierrors.NewForbidden(schema.GroupResource{Group: "authentication.k8s.io", Resource: "tokenreviews"}, "", errors.New("no RBAC"))
}

// With shards, a replica whose own API server does not answer can neither
// check the caller nor read the object to learn its shard: it answers 503
// with Retry-After, saying why (another replica may take the trigger),
// reading and forwarding nothing; so does one that knew the caller but
// could not read. A review its API server refused is a 502, as with one
// shard; a request forwarded to it already gets 503 too.
func TestAShardedReplicaThatCannotCheckTheCallerAsksForARetry(t *testing.T) {
	api := newFakeAPI()
	var forwarded atomic.Int32
	other := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) { forwarded.Add(1) }))
	defer other.Close()
	r := &shardsRouter{n: 8, held: map[int]queue.Adder[opkit.Key, opkit.Cause[*corev1.ConfigMap]]{0: newCMQueue()}, endpoint: other.URL}
	tr, err := trigger.New(trigger.Config[*corev1.ConfigMap]{Router: r, Resource: configMaps, Get: api.get, Logger: discard})
	if err != nil {
		t.Fatal(err)
	}
	env := &handlerEnv{tr: tr}
	for _, tc := range []struct {
		auth      trigger.Authenticator
		name      string
		forwarded bool
		code      int
		reason    string
	}{
		{unreachableAuth{}, "a", false, http.StatusServiceUnavailable, "ServiceUnavailable"},
		{reviewRefusedAuth{}, "a", false, http.StatusBadGateway, "BadGateway"},
		{unreachableAuth{}, "a", true, http.StatusServiceUnavailable, "ServiceUnavailable"},
		// A caller it knows (a cached review), but the read fails.
		{allowAll{}, "boom", false, http.StatusServiceUnavailable, "ServiceUnavailable"},
		{allowAll{}, "boom", true, http.StatusServiceUnavailable, "ServiceUnavailable"},
	} {
		if env.h, err = trigger.NewHandler(tr, trigger.HandlerConfig{Authenticator: tc.auth, RetryAfter: 2 * time.Second, Logger: discard}); err != nil {
			t.Fatal(err)
		}
		var header http.Header
		if tc.forwarded {
			header = http.Header{"X-Opkit-Forwarded": {"true"}}
		}
		w := env.do(http.MethodPost, "/reconcile/ns/"+tc.name, nil, header)
		retryAfter := w.Header().Get("Retry-After")
		st := wantStatus(t, w, tc.code, tc.reason)
		if tc.code == http.StatusServiceUnavailable && (retryAfter != "2" || !strings.Contains(st.Message, "API server") || !strings.Contains(st.Message, "retry") || strings.Contains(st.Message, "6443")) {
			t.Errorf("503: Retry-After %q, message %q; want 2 and why, without the API server's address", retryAfter, st.Message)
		}
	}
	if reads := fmt.Sprint(api.read); reads != "[ns/boom ns/boom]" || forwarded.Load() != 0 {
		t.Errorf("reads %s, %d forwards; want the two of ns/boom, and none", reads, forwarded.Load())
	}
}

// postBearer posts a trigger of ns/a to the endpoint at base with token,
// over the network, and returns the status code.
func postBearer(t *testing.T, base, token string) int {
	t.Helper()
	req, err := http.NewRequest(http.MethodPost, base+"/reconcile/ns/a", nil)
	if err != nil {
		t.Fatal(err)
	}
	req.Header.Set("Authorization", "Bearer "+token)
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	return resp.StatusCode
}
