//go:build integration

package reconcile_test

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/url"
	"sync"
	"testing"
	"time"

	"k8s.io/client-go/kubernetes"

	"github.com/opkit/opkit"
	"github.com/opkit/opkit/internal/testcluster"
	"github.com/opkit/opkit/leader"
	"github.com/opkit/opkit/reconcile"
	"github.com/opkit/opkit/trigger"
	"github.com/opkit/opkit/watcher"
)

// Three replicas share eight shards, each serving the HTTP trigger
// endpoint and publishing it on its shard Leases. A trigger sent to any
// replica, for an object of any shard, is reconciled by the replica that
// holds the object's shard (the caller's answer names it, and so do the
// reconcilers' own records), forwarded there by the others; a GET of
// its id through another replica is answered by the holder too.
func TestIntegrationTriggersReachTheShardsHolder(t *testing.T) {
	dyn, ns := realCluster(t)
	c := testcluster.Shared(t)
	ctx := context.Background()
	const shards, n = 8, 24
	kube, err := kubernetes.NewForConfig(c.Config())
	if err != nil {
		t.Fatal(err)
	}

	var mu sync.Mutex
	ranBy := map[string]string{} // the reason a trigger carried -> the replica that reconciled it
	endpoints := map[string]string{}
	for _, name := range []string{"a", "b", "c"} {
		ln, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			t.Fatal(err)
		}
		endpoints[name] = "http://" + ln.Addr().String()
		rec := reconcile.Func[*Widget](func(_ context.Context, req reconcile.Request[*Widget]) (reconcile.Result, error) {
			mu.Lock()
			defer mu.Unlock()
			for _, r := range req.Reasons {
				ranBy[r] = name
			}
			return reconcile.Done(), nil
		})
		s, err := reconcile.NewController(reconcile.Config[*Widget]{
			Name: "test.opkit.dev/sharded-triggers", Resource: widgets, Dynamic: dyn, Reconciler: rec, Shards: opkit.Shards{Count: shards},
			Concurrency: 2, NoEvents: true, Logger: quiet, Watch: watcher.Config[*Widget]{Namespace: ns}, TriggerRate: -1,
			Leader: &leader.Config{Client: kube, Namespace: ns, Name: "sharded", Identity: name,
				LeaseDuration: 6 * time.Second, RenewDeadline: 4 * time.Second, RetryPeriod: 500 * time.Millisecond,
				Annotations: map[string]string{reconcile.EndpointAnnotation: endpoints[name]}},
		})
		if err != nil {
			t.Fatal(err)
		}
		h, err := trigger.NewHandler(s.Trigger(), trigger.HandlerConfig{InsecureSkipAuth: true, Logger: quiet})
		if err != nil {
			t.Fatal(err)
		}
		srv := &http.Server{Handler: h, ReadHeaderTimeout: 5 * time.Second}
		go func() { _ = srv.Serve(ln) }()
		rctx, cancel := context.WithCancel(ctx)
		done := make(chan error, 1)
		go func() { done <- s.Run(rctx) }()
		t.Cleanup(func() {
			_ = srv.Close()
			cancel()
			if err := <-done; err != nil {
				t.Errorf("replica %s: %v", name, err)
			}
		})
	}

	var objs []*Widget
	for i := range n {
		objs = append(objs, create(t, dyn, ns, fmt.Sprintf("t%02d", i), 1))
	}
	holders := func() []string { return waitSpread(t, kube, ns, "sharded", shards, "a", "b", "c") }
	hs := holders()

	call := func(method, url string, into any) (int, http.Header) {
		t.Helper()
		req, err := http.NewRequestWithContext(ctx, method, url, nil)
		if err != nil {
			t.Fatal(err)
		}
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		body, _ := io.ReadAll(resp.Body)
		if err := json.Unmarshal(body, into); err != nil {
			t.Fatalf("%s %s: %d %s", method, url, resp.StatusCode, body)
		}
		return resp.StatusCode, resp.Header
	}
	for _, w := range objs {
		holder := hs[opkit.ShardOf(w.UID, shards)]
		for via, base := range endpoints {
			reason := fmt.Sprintf("%s via %s", w.Name, via)
			var out trigger.Outcome
			code, header := call(http.MethodPost, fmt.Sprintf("%s/reconcile/%s/%s?wait=30s&reason=%s", base, ns, w.Name, url.QueryEscape(reason)), &out)
			if code != http.StatusOK || out.State != trigger.Succeeded || out.Replica != holder {
				t.Fatalf("%s: %d %+v, want succeeded on %s, the holder of shard %d", reason, code, out, holder, opkit.ShardOf(w.UID, shards))
			}
			if forwarded := header.Get("X-Opkit-Forwarded") != ""; forwarded != (via != holder) {
				t.Errorf("%s: forwarded %v, want %v", reason, forwarded, via != holder)
			}
		}
	}
	mu.Lock()
	for _, w := range objs {
		holder := hs[opkit.ShardOf(w.UID, shards)]
		for via := range endpoints {
			if r := fmt.Sprintf("%s via %s", w.Name, via); ranBy[r] != holder {
				t.Errorf("%s reconciled by %q, want %s", r, ranBy[r], holder)
			}
		}
	}
	mu.Unlock()

	// A trigger's id, asked through a replica that does not hold the
	// object's shard: the holder answers.
	w := objs[0]
	holder := hs[opkit.ShardOf(w.UID, shards)]
	var a trigger.Accepted
	if code, _ := call(http.MethodPost, fmt.Sprintf("%s/reconcile/%s/%s?delay=1h", endpoints[holder], ns, w.Name), &a); code != http.StatusAccepted {
		t.Fatalf("a delayed trigger: %d %+v", code, a)
	}
	var tracked trigger.Accepted
	if code, _ := call(http.MethodPost, fmt.Sprintf("%s/reconcile/%s/%s?wait=1s&delay=1h", endpoints[holder], ns, w.Name), &tracked); code != http.StatusAccepted || tracked.ID == "" {
		t.Fatalf("a delayed trigger waited for: %d %+v, want 202 with an id", code, tracked)
	}
	for via, base := range endpoints {
		var out trigger.Outcome
		if code, _ := call(http.MethodGet, base+tracked.StatusPath, &out); code != http.StatusOK || out.State != trigger.Pending || out.ID != tracked.ID {
			t.Errorf("GET of %s's trigger via %s: %d %+v, want the holder's pending", holder, via, code, out)
		}
	}
	if got := holders(); fmt.Sprint(got) != fmt.Sprint(hs) {
		t.Logf("the shards moved during the test: %v, then %v", hs, got)
	}
}
