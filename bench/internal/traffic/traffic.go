// Package traffic counts the requests a benchmark's clients send to an API
// server, by verb and resource, reads the API server's own count of them
// (apiserver_request_total), and kills a client (every request fails from
// then on, as for a process that died). It owns no goroutine.
package traffic

import (
	"context"
	"errors"
	"fmt"
	"io"
	"maps"
	"net/http"
	"net/url"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"

	"k8s.io/client-go/rest"
)

// Kind is what a request did: its verb as the API server's metrics name it
// (GET, LIST, WATCH, POST, PUT, PATCH, DELETE) and its resource, with the
// subresource after a slash ("widgets/status"); Resource is empty for a
// request that names none (discovery, /metrics).
type Kind struct {
	Verb, Group, Resource string
}

func (k Kind) String() string {
	r := k.Resource
	if k.Group != "" {
		r += "." + k.Group
	}
	return k.Verb + " " + r
}

// Counts is a number of requests by kind.
type Counts map[Kind]int64

// Sub returns c minus o, without the kinds that are zero.
func (c Counts) Sub(o Counts) Counts {
	d := Counts{}
	for k, n := range c {
		d[k] = n
	}
	for k, n := range o {
		d[k] -= n
	}
	maps.DeleteFunc(d, func(_ Kind, n int64) bool { return n == 0 })
	return d
}

// Sum returns the number of requests of the kinds keep accepts.
func (c Counts) Sum(keep func(Kind) bool) int64 {
	var s int64
	for k, n := range c {
		if keep(k) {
			s += n
		}
	}
	return s
}

// Filter returns the counts of the kinds keep accepts.
func (c Counts) Filter(keep func(Kind) bool) Counts {
	f := Counts{}
	for k, n := range c {
		if keep(k) {
			f[k] = n
		}
	}
	return f
}

// String lists the counts in a stable order, "VERB resource.group=n".
func (c Counts) String() string {
	keys := slices.SortedFunc(maps.Keys(c), func(a, b Kind) int {
		return strings.Compare(a.Group+"/"+a.Resource+" "+a.Verb, b.Group+"/"+b.Resource+" "+b.Verb)
	})
	parts := make([]string, len(keys))
	for i, k := range keys {
		parts[i] = k.String() + "=" + strconv.FormatInt(c[k], 10)
	}
	return "{" + strings.Join(parts, " ") + "}"
}

// Classify returns the kind of a request to the API server, from its
// method and URL, the way the API server's metrics classify it.
func Classify(method string, u *url.URL) Kind {
	seg := strings.Split(strings.Trim(u.Path, "/"), "/")
	var k Kind
	switch {
	case len(seg) >= 3 && seg[0] == "api":
		seg = seg[2:]
	case len(seg) >= 4 && seg[0] == "apis":
		k.Group, seg = seg[1], seg[3:]
	default:
		seg = nil
	}
	if len(seg) >= 3 && seg[0] == "namespaces" {
		seg = seg[2:] // a namespaced resource; "namespaces/x" alone is the namespace itself
	}
	name := ""
	if len(seg) > 0 {
		k.Resource = seg[0]
	}
	if len(seg) > 1 {
		name = seg[1]
	}
	if len(seg) > 2 {
		k.Resource += "/" + seg[2]
	}
	k.Verb = method
	if method == http.MethodGet {
		switch {
		case u.Query().Get("watch") == "true" || u.Query().Get("watch") == "1":
			k.Verb = "WATCH"
		case name == "" && k.Resource != "":
			k.Verb = "LIST"
		}
	}
	return k
}

// Counter counts the requests that pass through the transports it wraps.
// It is safe for concurrent use; the zero value is ready.
type Counter struct {
	mu sync.Mutex
	n  Counts
}

// Wrap returns rt counting every request it is given, for
// rest.Config.WrapTransport.
func (c *Counter) Wrap(rt http.RoundTripper) http.RoundTripper {
	return roundTripper(func(r *http.Request) (*http.Response, error) {
		k := Classify(r.Method, r.URL)
		c.mu.Lock()
		if c.n == nil {
			c.n = Counts{}
		}
		c.n[k]++
		c.mu.Unlock()
		return rt.RoundTrip(r)
	})
}

// Counts returns a copy of the counts so far.
func (c *Counter) Counts() Counts {
	c.mu.Lock()
	defer c.mu.Unlock()
	return maps.Clone(c.n)
}

// ErrKilled is what every request of a killed client fails with.
var ErrKilled = errors.New("traffic: killed")

// Switch kills clients: once Kill is called, every request through a
// transport it wrapped fails with ErrKilled before it is sent, so that the
// API server hears nothing more from them, as from a process that died.
// Streams already open (watches) are not cut. The zero value is alive.
type Switch struct{ dead atomic.Bool }

// Kill makes every later request fail.
func (s *Switch) Kill() { s.dead.Store(true) }

// Wrap returns rt behind the switch, for rest.Config.WrapTransport.
func (s *Switch) Wrap(rt http.RoundTripper) http.RoundTripper {
	return roundTripper(func(r *http.Request) (*http.Response, error) {
		if s.dead.Load() {
			return nil, ErrKilled
		}
		return rt.RoundTrip(r)
	})
}

// Bytes counts the response body bytes read through the transports it
// wraps: what a client received from the API server. It is safe for
// concurrent use; the zero value is ready.
type Bytes struct{ n atomic.Int64 }

// Wrap returns rt counting the body bytes of every response, for
// rest.Config.WrapTransport.
func (b *Bytes) Wrap(rt http.RoundTripper) http.RoundTripper {
	return roundTripper(func(r *http.Request) (*http.Response, error) {
		resp, err := rt.RoundTrip(r)
		if err == nil {
			resp.Body = countingBody{resp.Body, &b.n}
		}
		return resp, err
	})
}

// Load returns the bytes counted so far; Reset starts again from zero.
func (b *Bytes) Load() int64 { return b.n.Load() }
func (b *Bytes) Reset()      { b.n.Store(0) }

type countingBody struct {
	io.ReadCloser
	n *atomic.Int64
}

func (b countingBody) Read(p []byte) (int, error) {
	n, err := b.ReadCloser.Read(p)
	b.n.Add(int64(n))
	return n, err
}

type roundTripper func(*http.Request) (*http.Response, error)

func (f roundTripper) RoundTrip(r *http.Request) (*http.Response, error) { return f(r) }

// ServerCounts reads the API server's apiserver_request_total from its
// /metrics endpoint (rc needs the right to read it, e.g. an admin's) and
// returns it summed over response codes and scopes. The API server counts
// a request when it ends: a watch only once it closed.
func ServerCounts(ctx context.Context, rc rest.Interface) (Counts, error) {
	raw, err := rc.Get().AbsPath("/metrics").DoRaw(ctx)
	if err != nil {
		return nil, fmt.Errorf("traffic: read /metrics: %w", err)
	}
	const metric = "apiserver_request_total{"
	c := Counts{}
	for line := range strings.Lines(string(raw)) {
		rest, ok := strings.CutPrefix(line, metric)
		if !ok {
			continue
		}
		labels, value, ok := strings.Cut(rest, "} ")
		if !ok {
			return nil, fmt.Errorf("traffic: malformed line %q", line)
		}
		v, err := strconv.ParseFloat(strings.TrimSpace(value), 64)
		if err != nil {
			return nil, fmt.Errorf("traffic: malformed value in %q: %w", line, err)
		}
		l := parseLabels(labels)
		k := Kind{Verb: l["verb"], Group: l["group"], Resource: l["resource"]}
		if sub := l["subresource"]; sub != "" {
			k.Resource += "/" + sub
		}
		c[k] += int64(v)
	}
	if len(c) == 0 {
		return nil, errors.New("traffic: /metrics has no apiserver_request_total")
	}
	return c, nil
}

// parseLabels parses `a="x",b="y"` (label values in Prometheus' text
// format escape only backslash, quote and newline).
func parseLabels(s string) map[string]string {
	l := map[string]string{}
	for s != "" {
		name, rest, ok := strings.Cut(s, `="`)
		if !ok {
			break
		}
		var v strings.Builder
		i := 0
		for ; i < len(rest) && rest[i] != '"'; i++ {
			if rest[i] == '\\' && i+1 < len(rest) {
				i++
			}
			v.WriteByte(rest[i])
		}
		l[name] = v.String()
		s = strings.TrimPrefix(rest[min(i+1, len(rest)):], ",")
	}
	return l
}
