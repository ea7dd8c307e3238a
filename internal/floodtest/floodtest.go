package floodtest

import (
	"bufio"
	"cmp"
	"context"
	crand "crypto/rand"
	"encoding/binary"
	"fmt"
	"io"
	"math/rand/v2"
	"net"
	"net/http"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	corev1client "k8s.io/client-go/kubernetes/typed/core/v1"
	"k8s.io/client-go/util/flowcontrol"
)

// Config says where a flood sends its requests, and from where.
type Config struct {
	// URL is the endpoint's base URL, e.g. "http://127.0.0.1:8080".
	URL string
	// Namespace and Names (not empty) are the objects triggered, as they
	// go into the path: each request picks one of Names at random.
	Namespace string
	Names     []string
	// Token is the bearer token of Valid, SlowBodies and RandomNames.
	Token string
	// Workers is the number of goroutines of Valid, GarbageTokens,
	// GarbageFromAddresses and RandomNames, each with one request at a
	// time; zero means 64.
	Workers int
	// LocalIP is the address the connections come from; "" means any.
	LocalIP string
	// Tokens are ManyIdentities' bearer tokens, one caller each.
	Tokens []string
	// LocalIPs are the addresses GarbageFromAddresses' requests come
	// from, in turn (see Loopback).
	LocalIPs []string
	// Rate caps a flood (not SlowBodies) at that many requests a second,
	// all its goroutines together; zero means no cap.
	Rate float64
	// Pace caps each of a flood's goroutines (not SlowBodies') at that
	// many requests a second, on its own: with ManyIdentities, each
	// caller; zero means no cap. A goroutine still sends one request at
	// a time, so an answer slower than 1/Pace slows it.
	Pace float64
}

// Result counts what a flood saw: the answers by HTTP status code, and
// the requests (for SlowBodies, connections) that ended without one
// before the context did.
type Result struct {
	Codes  map[int]int
	Errors int
}

// Answered is the number of requests answered, whatever the code.
func (r Result) Answered() int {
	n := 0
	for _, c := range r.Codes {
		n += c
	}
	return n
}

// Valid POSTs /reconcile/{namespace}/{name} with cfg.Token for random
// names of cfg.Names from cfg.Workers goroutines until ctx ends.
func Valid(ctx context.Context, cfg Config) Result {
	client := NewClient(cfg.LocalIP, workers(cfg))
	defer client.CloseIdleConnections()
	return flood(ctx, cfg, workers(cfg), func(int) shot { return shot{client, pick(cfg.Names), cfg.Token} })
}

// GarbageTokens is Valid with a new random bearer token on every request.
// From a well-behaved caller's address (cfg.LocalIP), it is the neighbour
// flood: callers behind one NAT, or on one node, share an address.
func GarbageTokens(ctx context.Context, cfg Config) Result {
	client := NewClient(cfg.LocalIP, workers(cfg))
	defer client.CloseIdleConnections()
	return flood(ctx, cfg, workers(cfg), func(int) shot { return shot{client, pick(cfg.Names), crand.Text()} })
}

// ManyIdentities is Valid from many callers: a goroutine and a connection
// for each of cfg.Tokens, which sends that token (cfg.Workers and
// cfg.Token are unused).
func ManyIdentities(ctx context.Context, cfg Config) Result {
	clients := make([]*http.Client, len(cfg.Tokens))
	for i := range clients {
		clients[i] = NewClient(cfg.LocalIP, 1)
		defer clients[i].CloseIdleConnections()
	}
	return flood(ctx, cfg, len(clients), func(w int) shot { return shot{clients[w], pick(cfg.Names), cfg.Tokens[w]} })
}

// GarbageFromAddresses is GarbageTokens from many addresses: the flood's
// i-th request (of all cfg.Workers goroutines together) comes from
// cfg.LocalIPs[i mod len], over a connection of that address's own
// (cfg.LocalIP is unused).
func GarbageFromAddresses(ctx context.Context, cfg Config) Result {
	clients := make([]*http.Client, len(cfg.LocalIPs))
	for i, ip := range cfg.LocalIPs {
		clients[i] = NewClient(ip, 1)
		defer clients[i].CloseIdleConnections()
	}
	var next atomic.Uint64
	return flood(ctx, cfg, workers(cfg), func(int) shot {
		return shot{clients[(next.Add(1)-1)%uint64(len(clients))], pick(cfg.Names), crand.Text()}
	})
}

// RandomNames is Valid with a new random name on every request ("flood-"
// and 16 hex digits), which no object has (cfg.Names is unused): one
// caller each of whose requests needs an authorization of its own, unless
// authorization is decided for the whole namespace.
func RandomNames(ctx context.Context, cfg Config) Result {
	client := NewClient(cfg.LocalIP, workers(cfg))
	defer client.CloseIdleConnections()
	return flood(ctx, cfg, workers(cfg), func(int) shot {
		return shot{client, fmt.Sprintf("flood-%016x", rand.Uint64()), cfg.Token}
	})
}

// Loopback returns n consecutive IPv4 addresses from first: with
// Loopback("127.0.1.0", 1000), 127.0.1.0 to 127.0.4.231. Within
// 127.0.0.0/8, which Linux routes to the loopback interface, they need
// no setup.
func Loopback(first string, n int) []string {
	ip := net.ParseIP(first).To4()
	if ip == nil {
		panic(fmt.Sprintf("floodtest: %q is not an IPv4 address", first))
	}
	base := binary.BigEndian.Uint32(ip)
	ips := make([]string, n)
	for i := range ips {
		ips[i] = net.IP(binary.BigEndian.AppendUint32(nil, base+uint32(i))).String()
	}
	return ips
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

// workers is cfg.Workers, or its default.
func workers(cfg Config) int { return cmp.Or(cfg.Workers, 64) }

func pick(names []string) string { return names[rand.IntN(len(names))] }

// shot is one request of a flood: the client it goes through, the name it
// triggers and the bearer token it sends.
type shot struct {
	client      *http.Client
	name, token string
}

// flood POSTs the trigger next(w) returns from each goroutine w of n, one
// request at a time each, at most cfg.Pace a second each and cfg.Rate a
// second together, until ctx ends.
func flood(ctx context.Context, cfg Config, n int, next func(w int) shot) Result {
	all := func(ctx context.Context) error { return ctx.Err() }
	if cfg.Rate > 0 {
		all = flowcontrol.NewTokenBucketRateLimiter(float32(cfg.Rate), max(1, int(cfg.Rate/100))).Wait // a burst of 10ms
	}
	var started atomic.Int64
	return run(n, func(count func(int)) {
		w := int(started.Add(1) - 1)
		wait := all
		if cfg.Pace > 0 {
			own := flowcontrol.NewTokenBucketRateLimiter(float32(cfg.Pace), 1).Wait
			wait = func(ctx context.Context) error {
				if err := own(ctx); err != nil {
					return err
				}
				return all(ctx)
			}
		}
		for wait(ctx) == nil {
			s := next(w)
			req, err := http.NewRequestWithContext(ctx, http.MethodPost, cfg.URL+"/reconcile/"+cfg.Namespace+"/"+s.name, nil)
			if err != nil {
				count(0) // a malformed URL
				return
			}
			req.Header.Set("Authorization", "Bearer "+s.token)
			resp, err := s.client.Do(req)
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

// Drive merge-patches the ConfigMaps names of cms round-robin, one every
// interval, until ctx ends, and counts the patches that succeeded in
// updates: the changes a watch keeps reconciling while a flood runs.
func Drive(ctx context.Context, cms corev1client.ConfigMapInterface, names []string, every time.Duration, updates *atomic.Int64) {
	tick := time.NewTicker(every)
	defer tick.Stop()
	for i := 0; ; i++ {
		select {
		case <-ctx.Done():
			return
		case <-tick.C:
		}
		patch := fmt.Appendf(nil, `{"data":{"v":"drive-%d"}}`, i)
		if _, err := cms.Patch(ctx, names[i%len(names)], types.MergePatchType, patch, metav1.PatchOptions{}); err == nil {
			updates.Add(1)
		}
	}
}
