package main

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"flag"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/schema"
	dynfake "k8s.io/client-go/dynamic/fake"

	"github.com/opkit/opkit"
	"github.com/opkit/opkit/example/natsbroker"
	"github.com/opkit/opkit/queue"
	"github.com/opkit/opkit/trigger"
)

func TestOperatorFlagsDefaults(t *testing.T) {
	var stderr bytes.Buffer
	o, err := parseOperatorFlags(nil, &stderr)
	if err != nil {
		t.Fatalf("defaults: %v (%s)", err, stderr.String())
	}
	if !o.LeaderElect || o.LeaderElectionID != "opkit-demo-leader" || o.TriggerBindAddress != ":8082" ||
		o.MetricsBindAddress != ":8080" || o.HealthProbeBindAddress != ":8081" || o.InsecureSkipTriggerAuth || o.Concurrency != 4 || o.Shards != 1 {
		t.Fatalf("defaults = %+v", o)
	}
}

func TestOperatorFlagsInvalidExit2(t *testing.T) {
	for _, tc := range []struct {
		args []string
		want string
	}{
		{[]string{"--concurrency=0"}, "--concurrency must be at least 1"},
		{[]string{"--metrics-bind-address=nonsense"}, "--metrics-bind-address"},
		{[]string{"--nats-url=localhost"}, "--nats-url"},
		{[]string{"--no-such-flag"}, "flag provided but not defined"},
		{[]string{"--leader-elect=maybe"}, "invalid boolean value"},
		{[]string{"extra"}, "unexpected argument"},
		{[]string{"--trigger-cert-file=tls.crt"}, "must be given together"},
		{[]string{"--namespace=Team_A"}, "--namespace \"Team_A\" is not a namespace name"},
		{[]string{"--leader-election-namespace=-x"}, "--leader-election-namespace"},
		{[]string{"--leader-election-id=Opkit_Leader"}, "--leader-election-id \"Opkit_Leader\" is not a Lease name"},
		{[]string{"--leader-election-id="}, "--leader-election-id must not be empty"},
		{[]string{"--nats-url=nats://"}, "--nats-url \"nats://\""},
		{[]string{"--nats-url=nats://nats:4222", "--nats-store-dir=/data"}, "apply to the embedded server only"},
		{[]string{"--nats-url=nats://nats:4222", "--nats-listen=:4223"}, "apply to the embedded server only"},
		{[]string{"--nats-listen=4222"}, "--nats-listen \"4222\": want host:port"},
		{[]string{"--nats-listen=:http"}, "bad port"},
		{[]string{"--shards=-1"}, "--shards -1: want 1 to 1024"},
		{[]string{"--shards=2000"}, "--shards 2000: want 1 to 1024"},
		{[]string{"--shards=8", "--leader-elect=false"}, "--shards needs --leader-elect"},
		{[]string{"--shards=8", "--leader-election-id=opkit.demo"}, "with --shards, a DNS label of at most 40 characters"},
	} {
		var stdout, stderr bytes.Buffer
		if code := run(tc.args, &stdout, &stderr); code != 2 {
			t.Errorf("%v: exit %d, want 2", tc.args, code)
		}
		if !strings.Contains(stderr.String(), tc.want) {
			t.Errorf("%v: stderr %q does not say %q", tc.args, stderr.String(), tc.want)
		}
	}
}

func TestHelpDocumentsEveryFlag(t *testing.T) {
	var stdout, stderr bytes.Buffer
	if code := run([]string{"--help"}, &stdout, &stderr); code != 0 {
		t.Fatalf("--help exit %d", code)
	}
	for _, f := range []string{"kubeconfig", "namespace", "leader-elect", "leader-election-id", "leader-election-namespace",
		"identity", "concurrency", "shards", "trigger-bind-address", "metrics-bind-address", "health-probe-bind-address",
		"nats-url", "nats-store-dir", "nats-listen", "insecure-skip-trigger-auth", "trigger-cert-file", "trigger-key-file"} {
		if !strings.Contains(stderr.String(), "-"+f+" ") && !strings.Contains(stderr.String(), "-"+f+"\n") {
			t.Errorf("--help does not document --%s", f)
		}
	}
	stderr.Reset()
	if code := run([]string{"trigger", "--help"}, &stdout, &stderr); code != 0 {
		t.Fatalf("trigger --help exit %d", code)
	}
	for _, f := range []string{"namespace", "reason", "via", "url", "token", "token-file", "nats-url"} {
		if !strings.Contains(stderr.String(), "-"+f) {
			t.Errorf("trigger --help does not document --%s", f)
		}
	}
}

func TestTriggerFlags(t *testing.T) {
	var stderr bytes.Buffer
	o, err := parseTriggerFlags([]string{"--namespace", "team-a", "hello", "--reason", "deployed 42", "--via", "nats"}, &stderr)
	if err != nil {
		t.Fatalf("%v: %s", err, stderr.String())
	}
	if o.Namespace != "team-a" || o.Name != "hello" || o.Reason != "deployed 42" || o.Via != "nats" {
		t.Fatalf("parsed %+v", o)
	}
	for _, tc := range []struct {
		args []string
		want string
	}{
		{[]string{"hello"}, "--namespace is required"},
		{[]string{"--namespace", "a"}, "exactly one entity NAME"},
		{[]string{"--namespace", "a", "x", "y"}, "exactly one entity NAME"},
		{[]string{"--namespace", "a", "Bad_Name"}, "NAME"},
		{[]string{"--namespace", "a", "x", "--via", "smtp"}, "want http or nats"},
		{[]string{"--namespace", "a", "x", "--token", "t", "--token-file", "f"}, "not both"},
		{[]string{"--namespace", "a", "x", "--via", "nats", "--token", "t"}, "--via http only"},
		{[]string{"--namespace", "a", "x", "--url", "ftp://h"}, "--url"},
		{[]string{"--namespace", "a", "x", "--reason", strings.Repeat("r", 1025)}, "--reason"},
		{[]string{"--namespace", "a", "x", "--reason", "bad \xff utf-8"}, "valid UTF-8"},
	} {
		stderr.Reset()
		_, err := parseTriggerFlags(tc.args, &stderr)
		if !errors.Is(err, errUsage) && !strings.Contains(stderr.String(), "flag") {
			t.Errorf("%v: err %v, want a usage error", tc.args, err)
		}
		if !strings.Contains(stderr.String(), tc.want) {
			t.Errorf("%v: stderr %q does not say %q", tc.args, stderr.String(), tc.want)
		}
		var so, se bytes.Buffer
		if code := run(append([]string{"trigger"}, tc.args...), &so, &se); code != 2 {
			t.Errorf("%v: exit %d, want 2", tc.args, code)
		}
	}
	if _, err := parseTriggerFlags([]string{"-h"}, &stderr); !errors.Is(err, flag.ErrHelp) {
		t.Errorf("-h: %v", err)
	}
}

// The trigger command delivers any reason it accepts to the endpoint as
// given: within the handler's default body limit, not HTML-escaped.
func TestTriggerViaHTTPDeliversTheReasonAsGiven(t *testing.T) {
	q := queue.New[opkit.Key](queue.Config[opkit.Cause[*corev1.ConfigMap]]{Merge: (*opkit.Cause[*corev1.ConfigMap]).Merge})
	h := configMapHandler(t, q, 0)
	srv := httptest.NewServer(h)
	defer srv.Close()
	for _, reason := range []string{strings.Repeat("<", trigger.MaxReasonLen), "deploy <" + strings.Repeat("a&b", 150) + ">"} {
		var stdout, stderr bytes.Buffer
		if code := run([]string{"trigger", "--namespace", "ns", "a", "--url", srv.URL, "--reason", reason}, &stdout, &stderr); code != 0 {
			t.Fatalf("--reason of %d bytes: exit %d: %s", len(reason), code, stderr.String())
		}
		it, err := q.Get(t.Context())
		if err != nil || len(it.Value.Reasons) != 1 || it.Value.Reasons[0] != reason {
			t.Fatalf("queued reasons %q (%v), want the %d bytes given", it.Value.Reasons, err, len(reason))
		}
		q.Done(it.Key)
	}
}

// Behind a Service the trigger may reach a follower (503, not the leader):
// the CLI retries after the Retry-After it was sent, until --timeout.
func TestTriggerViaHTTPRetriesA503(t *testing.T) {
	q := queue.New[opkit.Key](queue.Config[opkit.Cause[*corev1.ConfigMap]]{Merge: (*opkit.Cause[*corev1.ConfigMap]).Merge})
	q.Suspend() // a follower, until the first answer
	h := configMapHandler(t, q, time.Second)
	var codes []int
	var mu sync.Mutex
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		rec := httptest.NewRecorder()
		h.ServeHTTP(rec, r)
		mu.Lock()
		codes = append(codes, rec.Code)
		mu.Unlock()
		q.Resume() // leadership arrives
		for k, v := range rec.Header() {
			w.Header()[k] = v
		}
		w.WriteHeader(rec.Code)
		w.Write(rec.Body.Bytes())
	}))
	defer srv.Close()
	var stdout, stderr bytes.Buffer
	if code := run([]string{"trigger", "--namespace", "ns", "a", "--url", srv.URL, "--timeout", "30s"}, &stdout, &stderr); code != 0 {
		t.Fatalf("exit %d: %s", code, stderr.String())
	}
	mu.Lock()
	defer mu.Unlock()
	if len(codes) != 2 || codes[0] != http.StatusServiceUnavailable || codes[1] != http.StatusAccepted {
		t.Fatalf("answers %v, want 503 then 202", codes)
	}
	if !strings.Contains(stderr.String(), "retrying in 1s") || q.Len() != 1 {
		t.Errorf("stderr %q, queue len %d; want a retry note and the trigger queued", stderr.String(), q.Len())
	}
}

// configMapHandler is an unauthenticated trigger endpoint for ConfigMaps
// (ns/a exists) feeding q, with the given RetryAfter (0: the default).
func configMapHandler(t *testing.T, q *queue.Queue[opkit.Key, opkit.Cause[*corev1.ConfigMap]], retryAfter time.Duration) http.Handler {
	t.Helper()
	scheme := runtime.NewScheme()
	if err := corev1.AddToScheme(scheme); err != nil {
		t.Fatal(err)
	}
	dyn := dynfake.NewSimpleDynamicClient(scheme, &corev1.ConfigMap{ObjectMeta: metav1.ObjectMeta{Namespace: "ns", Name: "a"}})
	res := opkit.Resource{GroupVersionResource: schema.GroupVersionResource{Version: "v1", Resource: "configmaps"}, Kind: "ConfigMap", Namespaced: true}
	tr, err := trigger.New(trigger.Config[*corev1.ConfigMap]{Queue: q, Resource: res, Dynamic: dyn})
	if err != nil {
		t.Fatal(err)
	}
	h, err := trigger.NewHandler(tr, trigger.HandlerConfig{InsecureSkipAuth: true, RetryAfter: retryAfter})
	if err != nil {
		t.Fatal(err)
	}
	return h
}

// With --via nats --wait the command asks for the outcome on a reply
// inbox and exits as the reconcile ended: 1 when it failed, 0 when it
// succeeded. The test stands in for the operator's consumer.
func TestTriggerViaNATSWaitsForTheOutcome(t *testing.T) {
	srv, err := natsbroker.StartEmbedded(natsbroker.EmbeddedConfig{StoreDir: t.TempDir()})
	if err != nil {
		t.Fatal(err)
	}
	defer srv.Shutdown()
	ctx, cancel := context.WithTimeout(t.Context(), 30*time.Second)
	defer cancel()
	b, err := natsbroker.Open(ctx, natsbroker.Config{URL: srv.URL(), AckWait: 30 * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	defer b.Close()
	for _, tc := range []struct {
		out      trigger.Outcome
		wantCode int
	}{
		{trigger.Outcome{State: trigger.Failed, Error: "the database is down", Attempts: 1}, 1},
		{trigger.Outcome{State: trigger.Succeeded, Attempts: 2}, 0},
	} {
		type exit struct {
			code           int
			stdout, stderr string
		}
		done := make(chan exit, 1)
		go func() {
			var so, se bytes.Buffer
			code := run([]string{"trigger", "--via", "nats", "--nats-url", srv.URL(), "--namespace", "ns", "a", "--wait", "20s", "--timeout", "25s"}, &so, &se)
			done <- exit{code, so.String(), se.String()}
		}()
		m, err := b.Receive(ctx)
		if err != nil {
			t.Fatal(err)
		}
		data, _ := json.Marshal(tc.out)
		if err := m.(trigger.Replier).Reply(ctx, data); err != nil {
			t.Fatal(err)
		}
		if err := m.Ack(ctx); err != nil {
			t.Fatal(err)
		}
		e := <-done
		if e.code != tc.wantCode || !strings.Contains(e.stdout+e.stderr, string(tc.out.State)) {
			t.Errorf("outcome %s: exit %d, stdout %q, stderr %q; want exit %d naming the state", tc.out.State, e.code, e.stdout, e.stderr, tc.wantCode)
		}
	}
}
