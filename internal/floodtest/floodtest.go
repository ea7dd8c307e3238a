package floodtest

import (
	"bufio"
	"cmp"
	"context"
	crand "crypto/rand"
	"fmt"
	"io"
	"math/rand/v2"
	"net"
	"net/http"
	"strings"
	"sync"
	"time"
)

// Config says where a flood sends its requests, and from where.
type Config struct {
	// URL is the endpoint's base URL, e.g. "http://127.0.0.1:8080".
	URL string
	// Namespace and Names (not empty) are the objects triggered, as they
	// go into the path: each request picks one of Names at random.
	Namespace string
	Names     []string
	// Token is the bearer token of Valid and SlowBodies.
	Token string
	// Workers is the number of goroutines of Valid and GarbageTokens,
	// each with one request at a time; zero means 64.
	Workers int
	// LocalIP is the address the connections come from; "" means any.
	LocalIP string
}

// Result counts what a flood saw: the answers by HTTP status code, and
// the requests (for SlowBodies, connections) that ended without one
// before the context did.
type Result struct {
	Codes  map[int]int
	Errors int
}

// Valid POSTs /reconcile/{namespace}/{name} with cfg.Token for random
// names of cfg.Names from cfg.Workers goroutines until ctx ends.
func Valid(ctx context.Context, cfg Config) Result {
	return flood(ctx, cfg, func() string { return cfg.Token })
}

// GarbageTokens is Valid with a new random bearer token on every request.
func GarbageTokens(ctx context.Context, cfg Config) Result {
	return flood(ctx, cfg, crand.Text)
}

// NewClient returns an HTTP client whose connections come from localIP
// ("" means any) and that keeps up to conns idle connections per host, so
// that a flood reuses its connections rather than use up ephemeral ports.
func NewClient(localIP string, conns int) *http.Client {
	return &http.Client{Timeout: 30 * time.Second, Transport: &http.Transport{
		DialContext: dialer(localIP).DialContext, MaxIdleConns: conns, MaxIdleConnsPerHost: conns,
	}}
}

func dialer(localIP string) *net.Dialer {
	d := &net.Dialer{Timeout: 10 * time.Second}
	if ip := net.ParseIP(localIP); ip != nil {
		d.LocalAddr = &net.TCPAddr{IP: ip}
	} else if localIP != "" {
		panic(fmt.Sprintf("floodtest: LocalIP %q is not an IP address", localIP))
	}
	return d
}

func flood(ctx context.Context, cfg Config, token func() string) Result {
	workers := cmp.Or(cfg.Workers, 64)
	client := NewClient(cfg.LocalIP, workers)
	defer client.CloseIdleConnections()
	return run(workers, func(count func(int)) {
		for ctx.Err() == nil {
			name := cfg.Names[rand.IntN(len(cfg.Names))]
			req, err := http.NewRequestWithContext(ctx, http.MethodPost, cfg.URL+"/reconcile/"+cfg.Namespace+"/"+name, nil)
			if err != nil {
				count(0) // a malformed URL
				return
			}
			req.Header.Set("Authorization", "Bearer "+token())
			resp, err := client.Do(req)
			switch {
			case err == nil:
				_, _ = io.Copy(io.Discard, resp.Body) // so that the connection is reused
				resp.Body.Close()
				count(resp.StatusCode)
			case ctx.Err() == nil:
				count(0)
				pause(ctx, 10*time.Millisecond) // a refused connection must not spin
			}
		}
	})
}

// SlowBodies keeps n connections from cfg.LocalIP to cfg.URL (plain
// http://host:port) busy until ctx ends: each sends the headers of a
// valid trigger (cfg.Token, the first of cfg.Names, Content-Type:
// application/json, Content-Length: 100), then its body one byte a
// second, and connects again once the server answers or closes.
func SlowBodies(ctx context.Context, cfg Config, n int) Result {
	addr := strings.TrimPrefix(cfg.URL, "http://")
	head := fmt.Sprintf("POST /reconcile/%s/%s HTTP/1.1\r\nHost: %s\r\nAuthorization: Bearer %s\r\n"+
		"Content-Type: application/json\r\nContent-Length: 100\r\n\r\n", cfg.Namespace, cfg.Names[0], addr, cfg.Token)
	d := dialer(cfg.LocalIP)
	return run(n, func(count func(int)) {
		for ctx.Err() == nil {
			if conn, err := d.DialContext(ctx, "tcp", addr); err == nil {
				if code := trickle(ctx, conn, head); code != 0 {
					count(code)
					continue
				}
			}
			if ctx.Err() == nil { // no connection, or closed without an answer
				count(0)
				pause(ctx, 100*time.Millisecond)
			}
		}
	})
}

// trickle sends head on conn, then a byte of the body a second, until the
// server answers or closes or ctx ends; it returns the answer's status
// code, 0 for none, once conn is closed and its reader has returned.
func trickle(ctx context.Context, conn net.Conn, head string) int {
	defer conn.Close()
	defer context.AfterFunc(ctx, func() { conn.Close() })()
	answer := make(chan int, 1)
	go func() { // the reader: returns once the answer is in or conn is closed
		code := 0
		if resp, err := http.ReadResponse(bufio.NewReader(conn), nil); err == nil {
			code = resp.StatusCode
			resp.Body.Close()
		}
		answer <- code
	}()
	tick := time.NewTicker(time.Second)
	defer tick.Stop()
	_, err := io.WriteString(conn, head)
	for sent := 0; err == nil; sent++ {
		select {
		case code := <-answer:
			return code
		case <-tick.C:
		}
		if sent < 100 {
			_, err = conn.Write([]byte{' '})
		}
	}
	conn.Close() // the server is gone: so that the reader returns
	return <-answer
}

// run runs work in n goroutines and returns what they counted (a status
// code, or 0 for an error) once all of them have returned.
func run(n int, work func(count func(code int))) Result {
	var mu sync.Mutex
	r := Result{Codes: map[int]int{}}
	count := func(code int) {
		mu.Lock()
		defer mu.Unlock()
		if code == 0 {
			r.Errors++
		} else {
			r.Codes[code]++
		}
	}
	var wg sync.WaitGroup
	for range n {
		wg.Go(func() { work(count) })
	}
	wg.Wait()
	return r
}

func pause(ctx context.Context, d time.Duration) {
	select {
	case <-ctx.Done():
	case <-time.After(d):
	}
}
