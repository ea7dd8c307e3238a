package trigger_test

import (
	"context"
	"encoding/json"
	"net/http"
	"net/http/httptest"
	"net/url"
	"strings"
	"testing"
	"time"
	"unicode/utf8"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/util/validation"

	"github.com/opkit/opkit"
	"github.com/opkit/opkit/queue"
	"github.com/opkit/opkit/trigger"
)

// acceptAll is a queue.Adder that stores nothing and accepts everything,
// so a fuzz run does not grow a real queue.
type acceptAll[V any] struct{}

func (acceptAll[V]) Add(opkit.Key, V, queue.AddOptions) queue.Outcome { return queue.Queued }

// validTrigger is an oracle written independently of the handler: it says
// whether a request URL names a valid namespaced key and valid parameters.
func validTrigger(u *url.URL) bool {
	rest, ok := strings.CutPrefix(u.EscapedPath(), "/reconcile/")
	if !ok {
		return false
	}
	segs := strings.Split(rest, "/")
	if len(segs) != 2 {
		return false
	}
	ns, err1 := url.PathUnescape(segs[0])
	name, err2 := url.PathUnescape(segs[1])
	if err1 != nil || err2 != nil || len(validation.IsDNS1123Label(ns)) > 0 || !validName(name) {
		return false
	}
	q, err := url.ParseQuery(u.RawQuery)
	if err != nil {
		return false
	}
	for k, v := range q {
		if (k != "delay" && k != "reason") || len(v) != 1 {
			return false
		}
	}
	if v, ok := q["delay"]; ok {
		d, err := time.ParseDuration(v[0])
		if err != nil || d < 0 || d > time.Hour {
			return false
		}
	}
	if v, ok := q["reason"]; ok && (len(v[0]) > trigger.MaxReasonLen || !utf8.ValidString(v[0])) {
		return false
	}
	return true
}

// validName is the oracle's rule for names: what the API server takes as
// a name of some resource (a path segment: not "." or "..", no "/" or
// "%"), at most 253 bytes of UTF-8 text without control characters.
func validName(name string) bool {
	if name == "" || name == "." || name == ".." || len(name) > 253 || !utf8.ValidString(name) {
		return false
	}
	for _, r := range name {
		if r == '/' || r == '%' || r < 0x20 || (r >= 0x7f && r < 0xa0) {
			return false
		}
	}
	return true
}

func FuzzHandlerPath(f *testing.F) {
	for _, seed := range [][2]string{
		{"ns/a", ""},
		{"ns/a", "delay=5s&reason=ci"},
		{"ns/a", "delay=1h0m0.000000001s"},
		{"ns/a", "delay=-0s"},
		{"ns/a", "delay=9223372036854775807ns"},
		{"ns/a", "reason=%ff"},
		{"ns/a", "delay=1s;reason=x"},
		{"NS/a", ""},
		{"ns/a.b-c", ""},
		{"ns/a..b", ""},
		{"ns%2Fx/a", ""},
		{"ns/%61", ""},
		{"../ns/a", ""},
		{"ns/./a", ""},
		{"ns//a", ""},
		{"ns/a/", ""},
		{"a", ""},
		{"ns/a%00", ""},
		{"ns/a%C2%85", ""},
		{"ns/a%ff", ""},
		{"ns/system:aggregate-to-admin", ""},
		{"ns/Upper_Case", ""},
		{"ns/a%25", ""},
		{"ns/" + strings.Repeat("a", 253), ""},
		{"ns/" + strings.Repeat("a", 254), ""},
		{"ns/a", "delay=1s&delay=1s"},
		{"ns/a", "x"},
	} {
		f.Add(seed[0], seed[1])
	}
	tr, err := trigger.New(trigger.Config[*corev1.ConfigMap]{
		Queue:    acceptAll[opkit.Cause[*corev1.ConfigMap]]{},
		Resource: configMaps,
		Get:      func(_ context.Context, k opkit.Key) (*corev1.ConfigMap, error) { return cm(k.Namespace, k.Name), nil },
		Logger:   discard,
	})
	if err != nil {
		f.Fatal(err)
	}
	h, err := trigger.NewHandler(tr, trigger.HandlerConfig{
		Authenticator: allowAll{},
		MaxInFlight:   -1,
		Logger:        discard,
	})
	if err != nil {
		f.Fatal(err)
	}
	f.Fuzz(func(t *testing.T, path, query string) {
		target := "http://opkit.test/reconcile/" + path
		if query != "" {
			target += "?" + query
		}
		r, err := http.NewRequest(http.MethodPost, target, nil)
		if err != nil {
			return // not a URL a client could send
		}
		w := httptest.NewRecorder()
		h.ServeHTTP(w, r)
		switch {
		case w.Code == http.StatusAccepted:
			if !validTrigger(r.URL) {
				t.Fatalf("202 for invalid request %q (path %q, query %q)", target, r.URL.EscapedPath(), r.URL.RawQuery)
			}
			var acc trigger.Accepted
			if err := json.Unmarshal(w.Body.Bytes(), &acc); err != nil || acc.Name == "" {
				t.Fatalf("202 body %q: %v", w.Body, err)
			}
		case w.Code >= 200 && w.Code < 300:
			t.Fatalf("unexpected %d for %q", w.Code, target)
		case w.Code == http.StatusBadRequest || w.Code == http.StatusNotFound:
			var st trigger.Status
			if err := json.Unmarshal(w.Body.Bytes(), &st); err != nil || st.Kind != "Status" || st.Code != w.Code {
				t.Fatalf("%d body %q is not a Status: %v", w.Code, w.Body, err)
			}
			if validTrigger(r.URL) && w.Code == http.StatusBadRequest {
				t.Fatalf("400 for a valid request %q: %s", target, w.Body)
			}
		default:
			t.Fatalf("unexpected status %d for %q: %s", w.Code, target, w.Body)
		}
	})
}
