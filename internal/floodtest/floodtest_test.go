package floodtest

import (
	"context"
	"net"
	"net/http"
	"strings"
	"sync"
	"testing"
	"time"
)

// seen is a trigger endpoint stand-in that answers 202 and counts what
// came: by source address, token and name.
type seen struct {
	mu                   sync.Mutex
	addrs, tokens, names map[string]int
	requests             int
}

func (s *seen) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	host, _, _ := net.SplitHostPort(r.RemoteAddr)
	s.mu.Lock()
	s.addrs[host]++
	s.tokens[strings.TrimPrefix(r.Header.Get("Authorization"), "Bearer ")]++
	s.names[r.URL.Path]++
	s.requests++
	s.mu.Unlock()
	w.WriteHeader(http.StatusAccepted)
}

func serve(t *testing.T) (*seen, Config) {
	t.Helper()
	s := &seen{addrs: map[string]int{}, tokens: map[string]int{}, names: map[string]int{}}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	srv := &http.Server{Handler: s}
	go func() { _ = srv.Serve(ln) }()
	t.Cleanup(func() { srv.Close() })
	return s, Config{URL: "http://" + ln.Addr().String(), Namespace: "ns", Names: []string{"a", "b"}, Token: "tok", Workers: 4}
}

// short runs f for a while and returns its result.
func short(cfg Config, f func(context.Context, Config) Result) Result {
	ctx, cancel := context.WithTimeout(context.Background(), 300*time.Millisecond)
	defer cancel()
	return f(ctx, cfg)
}

func TestLoopback(t *testing.T) {
	ips := Loopback("127.0.1.0", 1000)
	if len(ips) != 1000 || ips[0] != "127.0.1.0" || ips[256] != "127.0.2.0" || ips[999] != "127.0.4.231" {
		t.Fatalf("Loopback: %d addresses, %v ... %v", len(ips), ips[:2], ips[len(ips)-1])
	}
}

func TestManyIdentities(t *testing.T) {
	s, cfg := serve(t)
	cfg.Tokens = []string{"t1", "t2", "t3"}
	res := short(cfg, ManyIdentities)
	if res.Codes[http.StatusAccepted] == 0 || res.Errors != 0 {
		t.Fatalf("answers %v, %d errors", res.Codes, res.Errors)
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	if len(s.tokens) != 3 || s.tokens["t1"] == 0 || s.tokens["t3"] == 0 {
		t.Errorf("tokens seen: %v, want t1, t2 and t3", s.tokens)
	}
}

func TestGarbageFromAddresses(t *testing.T) {
	s, cfg := serve(t)
	cfg.LocalIPs = Loopback("127.0.1.0", 8)
	res := short(cfg, GarbageFromAddresses)
	s.mu.Lock()
	defer s.mu.Unlock()
	if len(s.addrs) != 8 || res.Errors != 0 {
		t.Errorf("addresses seen: %v (answers %v, %d errors), want the 8 of 127.0.1.0-7", s.addrs, res.Codes, res.Errors)
	}
	if len(s.tokens) != s.requests {
		t.Errorf("%d tokens in %d requests, want a new one each", len(s.tokens), s.requests)
	}
}

func TestRandomNames(t *testing.T) {
	s, cfg := serve(t)
	cfg.LocalIP = "127.0.0.3"
	res := short(cfg, RandomNames)
	s.mu.Lock()
	defer s.mu.Unlock()
	if len(s.names) != s.requests || s.requests == 0 || s.names["/reconcile/ns/a"] != 0 {
		t.Errorf("%d names in %d requests (answers %v), want a new one each, none of Names", len(s.names), s.requests, res.Codes)
	}
	if len(s.addrs) != 1 || s.addrs["127.0.0.3"] == 0 {
		t.Errorf("addresses seen: %v, want 127.0.0.3", s.addrs)
	}
}

// TestRate counts what a capped flood sends: at most its rate times the
// time it ran, plus its burst.
func TestRate(t *testing.T) {
	_, cfg := serve(t)
	cfg.Rate = 200
	start := time.Now()
	res := short(cfg, GarbageTokens)
	if limit := int(200*time.Since(start).Seconds()) + 2; res.Answered() > limit || res.Answered() == 0 {
		t.Errorf("a flood capped at 200/s sent %d in %v, want 1 to %d", res.Answered(), time.Since(start), limit)
	}
}

// TestPace counts what each caller of a paced crowd sends: at most its
// pace times the time it ran, plus one, whatever the others send.
func TestPace(t *testing.T) {
	s, cfg := serve(t)
	cfg.Tokens, cfg.Pace = []string{"t1", "t2", "t3"}, 20
	start := time.Now()
	res := short(cfg, ManyIdentities)
	limit := int(20*time.Since(start).Seconds()) + 1
	s.mu.Lock()
	defer s.mu.Unlock()
	for _, tok := range cfg.Tokens {
		if n := s.tokens[tok]; n == 0 || n > limit {
			t.Errorf("%s sent %d in %v paced at 20/s, want 1 to %d (answers %v)", tok, n, time.Since(start), limit, res.Codes)
		}
	}
}
