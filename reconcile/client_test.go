package reconcile_test

import (
	"io"
	"net/http"
	"strings"
	"sync"
	"testing"
	"testing/synctest"
	"time"

	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"

	"github.com/opkit/opkit/reconcile"
)

// fakeServer answers every request with the next of answers (the last
// one again once they run out), as a RoundTripper: no network, so the
// tests run in a synctest bubble.
type fakeServer struct {
	mu      sync.Mutex
	answers []func() *http.Response
	calls   int
}

func (f *fakeServer) RoundTrip(*http.Request) (*http.Response, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	a := f.answers[min(f.calls, len(f.answers)-1)]
	f.calls++
	return a(), nil
}

func answer(code int, header ...string) func() *http.Response {
	return func() *http.Response {
		h := http.Header{"Content-Type": {"application/json"}}
		for i := 0; i+1 < len(header); i += 2 {
			h.Set(header[i], header[i+1])
		}
		return &http.Response{StatusCode: code, Header: h, Body: io.NopCloser(strings.NewReader(`{"major":"1","minor":"37"}`))}
	}
}

func clientOf(t *testing.T, srv *fakeServer, cfg *rest.Config) *kubernetes.Clientset {
	t.Helper()
	cfg = reconcile.WithClientDefaults(cfg)
	cfg.Transport = srv
	cs, err := kubernetes.NewForConfig(cfg)
	if err != nil {
		t.Fatal(err)
	}
	return cs
}

// With an API server that has Priority and Fairness (its answers carry
// the flow schema header) the client sets no limit of its own once it has
// seen one answer; without, it keeps the DefaultQPS guard; a rate limit
// of the caller's own is kept as it is.
func TestTheClientDropsItsLimitOnceTheServerShowsPriorityAndFairness(t *testing.T) {
	for _, tc := range []struct {
		name   string
		header []string
		own    *rest.Config
		want   float32
	}{
		{"with APF", []string{"X-Kubernetes-PF-FlowSchema-UID", "f1", "X-Kubernetes-PF-PriorityLevel-UID", "p1"}, nil, -1},
		{"without", nil, nil, reconcile.DefaultQPS},
		{"a limit of the caller's own", []string{"X-Kubernetes-PF-FlowSchema-UID", "f1"}, &rest.Config{Host: "https://api.example", QPS: 7, Burst: 9}, 7},
	} {
		t.Run(tc.name, func(t *testing.T) {
			cfg := tc.own
			if cfg == nil {
				cfg = &rest.Config{Host: "https://api.example"}
			}
			cfg = reconcile.WithClientDefaults(cfg)
			limit := func() float32 {
				if cfg.RateLimiter == nil {
					return cfg.QPS
				}
				return cfg.RateLimiter.QPS()
			}
			if tc.own == nil && limit() != reconcile.DefaultQPS {
				t.Fatalf("before any answer: %v a second, want the guard, %d", limit(), reconcile.DefaultQPS)
			}
			cfg.Transport = &fakeServer{answers: []func() *http.Response{answer(200, tc.header...)}}
			cs, err := kubernetes.NewForConfig(cfg)
			if err != nil {
				t.Fatal(err)
			}
			if _, err := cs.Discovery().ServerVersion(); err != nil {
				t.Fatal(err)
			}
			if got := limit(); got != tc.want {
				t.Errorf("after an answer: %v a second, want %v", got, tc.want)
			}
		})
	}
}

// A 429 is retried after its Retry-After, and the call succeeds.
func TestA429IsRetriedAfterItsRetryAfter(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		srv := &fakeServer{answers: []func() *http.Response{answer(http.StatusTooManyRequests, "Retry-After", "3"), answer(200)}}
		cs := clientOf(t, srv, &rest.Config{Host: "https://api.example"})
		start := time.Now()
		if _, err := cs.Discovery().ServerVersion(); err != nil {
			t.Fatalf("ServerVersion after a 429: %v", err)
		}
		if srv.calls != 2 || time.Since(start) < 3*time.Second {
			t.Fatalf("%d requests after %v, want the 429 and its retry after Retry-After (3s)", srv.calls, time.Since(start))
		}
	})
}
