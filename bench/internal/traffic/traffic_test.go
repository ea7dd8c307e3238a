package traffic

import (
	"errors"
	"io"
	"net/http"
	"net/http/httptest"
	"net/url"
	"testing"
)

func TestClassify(t *testing.T) {
	for _, c := range []struct {
		method, url string
		want        Kind
	}{
		{"GET", "/apis/bench.opkit.dev/v1/namespaces/ns/widgets?limit=500", Kind{"LIST", "bench.opkit.dev", "widgets"}},
		{"GET", "/apis/bench.opkit.dev/v1/namespaces/ns/widgets?watch=true&resourceVersion=5", Kind{"WATCH", "bench.opkit.dev", "widgets"}},
		{"GET", "/apis/bench.opkit.dev/v1/widgets?watch=1", Kind{"WATCH", "bench.opkit.dev", "widgets"}},
		{"PATCH", "/apis/bench.opkit.dev/v1/namespaces/ns/widgets/w-1/status", Kind{"PATCH", "bench.opkit.dev", "widgets/status"}},
		{"PUT", "/apis/bench.opkit.dev/v1/namespaces/ns/widgets/w-1/status", Kind{"PUT", "bench.opkit.dev", "widgets/status"}},
		{"GET", "/api/v1/namespaces/ns/configmaps/w-1-child", Kind{"GET", "", "configmaps"}},
		{"POST", "/api/v1/namespaces/ns/configmaps", Kind{"POST", "", "configmaps"}},
		{"GET", "/api/v1/namespaces/ns", Kind{"GET", "", "namespaces"}},
		{"POST", "/api/v1/namespaces", Kind{"POST", "", "namespaces"}},
		{"PUT", "/apis/coordination.k8s.io/v1/namespaces/ns/leases/l", Kind{"PUT", "coordination.k8s.io", "leases"}},
		{"GET", "/apis/bench.opkit.dev/v1", Kind{"GET", "", ""}},
		{"GET", "/metrics", Kind{"GET", "", ""}},
	} {
		u, err := url.Parse(c.url)
		if err != nil {
			t.Fatal(err)
		}
		if got := Classify(c.method, u); got != c.want {
			t.Errorf("Classify(%s %s) = %+v, want %+v", c.method, c.url, got, c.want)
		}
	}
}

func TestParseLabels(t *testing.T) {
	got := parseLabels(`code="200",group="",resource="widgets",odd="a\"b\\c",verb="LIST"`)
	want := map[string]string{"code": "200", "group": "", "resource": "widgets", "odd": `a"b\c`, "verb": "LIST"}
	if len(got) != len(want) {
		t.Fatalf("parseLabels = %v, want %v", got, want)
	}
	for k, v := range want {
		if got[k] != v {
			t.Errorf("label %s = %q, want %q", k, got[k], v)
		}
	}
}

func TestCounterAndSwitch(t *testing.T) {
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {}))
	defer srv.Close()
	var c Counter
	var s Switch
	hc := &http.Client{Transport: s.Wrap(c.Wrap(http.DefaultTransport))}
	for range 2 {
		resp, err := hc.Get(srv.URL + "/api/v1/namespaces/ns/configmaps")
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
	}
	s.Kill()
	if _, err := hc.Get(srv.URL + "/api/v1/namespaces/ns/configmaps"); !errors.Is(err, ErrKilled) {
		t.Fatalf("after Kill: %v, want ErrKilled", err)
	}
	want := Counts{{"LIST", "", "configmaps"}: 2}
	if got := c.Counts(); got.Sub(want).String() != "{}" {
		t.Fatalf("counts %v, want %v (a killed request is not sent, so not counted)", got, want)
	}
}

func TestBytesCountsWhatTheClientRead(t *testing.T) {
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { w.Write([]byte("0123456789")) }))
	defer srv.Close()
	var b Bytes
	hc := &http.Client{Transport: b.Wrap(http.DefaultTransport)}
	for range 3 {
		resp, err := hc.Get(srv.URL)
		if err != nil {
			t.Fatal(err)
		}
		io.Copy(io.Discard, resp.Body)
		resp.Body.Close()
	}
	if got := b.Load(); got != 30 {
		t.Fatalf("counted %d bytes, want 30", got)
	}
	b.Reset()
	if got := b.Load(); got != 0 {
		t.Fatalf("after Reset: %d", got)
	}
}
