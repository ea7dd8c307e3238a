//go:build integration

package reconcile_test

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/dynamic"
	"k8s.io/client-go/kubernetes"

	"github.com/opkit/opkit"
	"github.com/opkit/opkit/internal/testcluster"
	"github.com/opkit/opkit/internal/typed"
	"github.com/opkit/opkit/leader"
	"github.com/opkit/opkit/reconcile"
	"github.com/opkit/opkit/trigger"
	"github.com/opkit/opkit/watcher"
)

// killable is a transport that fails every request once killed: a
// replica cut off from the API server, as a crashed or partitioned
// process is (it never releases its Lease).
type killable struct {
	rt     http.RoundTripper
	killed atomic.Bool
}

func (k *killable) RoundTrip(r *http.Request) (*http.Response, error) {
	if k.killed.Load() {
		return nil, errors.New("killed")
	}
	return k.rt.RoundTrip(r)
}

// triggerReplica is one in-process replica: a controller with leader
// election and its trigger endpoint on loopback.
type triggerReplica struct {
	id     string
	url    string
	ctrl   *reconcile.Controller[*Widget]
	cut    *killable
	cancel context.CancelFunc
	done   chan error
	srv    *http.Server
}

// triggerCluster runs replicas of a controller over the widgets of ns
// whose reconciler fails for "fail-*", fails terminally for "terminal-*",
// blocks a trigger's reconcile of "slow-*" until released, and writes the
// status (so a durable
// trigger is recorded handled) for the others.
type triggerCluster struct {
	t        *testing.T
	c        *testcluster.Cluster
	ns       string
	token    string        // the pipeline's
	release  chan struct{} // closed: slow-* reconciles go on
	mu       sync.Mutex
	reasons  map[string][][]string // the reasons of each reconcile, by name
	replicas []*triggerReplica
}

func (tc *triggerCluster) start(id string) *triggerReplica {
	t := tc.t
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	r := &triggerReplica{id: id, url: "http://" + ln.Addr().String(), done: make(chan error, 1), cut: &killable{}}
	cfg := tc.c.Config()
	cfg.QPS, cfg.Burst = -1, 0
	cfg.Wrap(func(rt http.RoundTripper) http.RoundTripper { r.cut.rt = rt; return r.cut })
	dyn := dynamic.NewForConfigOrDie(cfg)
	kube := kubernetes.NewForConfigOrDie(cfg)
	status, _ := reconcile.NewStatus[*Widget](reconcile.StatusConfig{Dynamic: dyn, Resource: widgets})
	rec := reconcile.Func[*Widget](func(ctx context.Context, req reconcile.Request[*Widget]) (reconcile.Result, error) {
		if req.Type == opkit.Deleted {
			return reconcile.Done(), nil
		}
		tc.mu.Lock()
		tc.reasons[req.Key.Name] = append(tc.reasons[req.Key.Name], req.Reasons)
		tc.mu.Unlock()
		switch name := req.Key.Name; {
		case strings.HasPrefix(name, "fail-"):
			return reconcile.Done(), errors.New("the backend is down")
		case strings.HasPrefix(name, "terminal-"):
			return reconcile.Done(), reconcile.TerminalError(errors.New("the name is taken"))
		case strings.HasPrefix(name, "slow-") && req.Sources.Has(opkit.Operator):
			select {
			case <-tc.release:
			case <-ctx.Done():
				return reconcile.Done(), ctx.Err()
			}
		}
		_, err := status.Update(ctx, req.Object, func(w *Widget) error { w.Status.Phase = "Ready"; return nil })
		return reconcile.Done(), err
	})
	ctrl, err := reconcile.NewController(reconcile.Config[*Widget]{
		Name: "test.opkit.dev/triggers", Resource: widgets, Dynamic: dyn, Reconciler: rec, NoEvents: true, Logger: quiet,
		Watch:   watcher.Config[*Widget]{Namespace: tc.ns, SkipStatusOnly: true},
		Backoff: fastBackoff,
		Leader: &leader.Config{Client: kube, Namespace: tc.ns, Name: "triggers", Identity: id,
			LeaseDuration: 6 * time.Second, RenewDeadline: 4 * time.Second, RetryPeriod: 500 * time.Millisecond,
			Annotations: map[string]string{reconcile.EndpointAnnotation: r.url}},
	})
	if err != nil {
		t.Fatal(err)
	}
	h, err := trigger.NewHandler(ctrl.Trigger(), trigger.HandlerConfig{Reviews: kube, RetryAfter: time.Second, Logger: quiet})
	if err != nil {
		t.Fatal(err)
	}
	r.ctrl, r.srv = ctrl, &http.Server{Handler: h, ReadHeaderTimeout: 5 * time.Second}
	go r.srv.Serve(ln)
	ctx, cancel := context.WithCancel(context.Background())
	r.cancel = cancel
	go func() { r.done <- ctrl.Run(ctx) }()
	tc.replicas = append(tc.replicas, r)
	t.Cleanup(func() { r.kill(); r.srv.Close() })
	return r
}

// kill cuts the replica off the API server and stops it without a
// release, as a crash does; its endpoint keeps answering (503: it leads
// nothing) until the test ends.
func (r *triggerReplica) kill() {
	if r.cut.killed.Swap(true) {
		return
	}
	r.cancel()
	<-r.done
}

// leaderOf waits for a replica of rs to lead and returns it.
func (tc *triggerCluster) leaderOf(rs ...*triggerReplica) *triggerReplica {
	tc.t.Helper()
	var lead *triggerReplica
	eventually(tc.t, time.Minute, "a leader", func() error {
		for _, r := range rs {
			if !r.cut.killed.Load() && r.ctrl.Held() == 1 && r.ctrl.Check() == nil {
				lead = r
				return nil
			}
		}
		return errors.New("no replica leads")
	})
	return lead
}

// post triggers name through r with the pipeline's token and returns the
// answer.
func (tc *triggerCluster) post(t *testing.T, r *triggerReplica, name, query string) (int, []byte) {
	t.Helper()
	req, _ := http.NewRequest(http.MethodPost, r.url+"/reconcile/"+tc.ns+"/"+name+query, nil)
	req.Header.Set("Authorization", "Bearer "+tc.token)
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatalf("POST %s to %s: %v", name, r.id, err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return resp.StatusCode, b
}

// Triggers a pipeline can rely on, with three replicas on a real control
// plane: any replica accepts (a follower forwards to the leader), a
// caller waits for the outcome of a succeeding, a failing and a terminal
// reconcile, a waiting caller gets 503 when the leader's term ends, and a
// durable trigger set while no replica leads is handled by the next
// leader.
func TestIntegrationTriggersAPipelineCanRelyOn(t *testing.T) {
	c, dyn, kube, ns := privateWidgets(t, testcluster.Options{})
	ctx := context.Background()
	// The pipeline may update (so trigger) widgets; the replicas run as
	// admin.
	token := pipelineToken(t, c, kube, ns)
	for _, name := range []string{"ok-1", "fail-1", "terminal-1", "slow-1"} {
		create(t, dyn, ns, name, 1)
	}
	tc := &triggerCluster{t: t, c: c, ns: ns, token: token, release: make(chan struct{}), reasons: map[string][][]string{}}
	a, b, d := tc.start("a"), tc.start("b"), tc.start("d")
	lead := tc.leaderOf(a, b, d)
	followers := slices.DeleteFunc([]*triggerReplica{a, b, d}, func(r *triggerReplica) bool { return r == lead })
	eventually(t, time.Minute, "the followers see the leader's endpoint", func() error {
		for _, f := range followers {
			d, err := f.ctrl.Trigger().Intake(ctx, trigger.Pointer{Key: opkit.Key{Namespace: ns, Name: "ok-1"}}, trigger.IntakeOptions{})
			if err != nil || d.Endpoint != lead.url {
				return fmt.Errorf("%s decides %+v (%v)", f.id, d, err)
			}
		}
		return nil
	})

	t.Run("a follower forwards to the leader", func(t *testing.T) {
		for _, f := range followers {
			code, body := tc.post(t, f, "ok-1", "?reason=from-"+f.id)
			if code != http.StatusAccepted {
				t.Fatalf("through %s: %d %s, want 202 (the leader's)", f.id, code, body)
			}
		}
		eventually(t, time.Minute, "both reasons reconciled", func() error {
			tc.mu.Lock()
			defer tc.mu.Unlock()
			var all []string
			for _, r := range tc.reasons["ok-1"] {
				all = append(all, r...)
			}
			for _, f := range followers {
				if !slices.Contains(all, "from-"+f.id) {
					return fmt.Errorf("reasons %v", all)
				}
			}
			return nil
		})
	})

	t.Run("a waiting caller gets the outcome", func(t *testing.T) {
		for _, tt := range []struct {
			name  string
			state trigger.State
			err   string
		}{{"ok-1", trigger.Succeeded, ""}, {"fail-1", trigger.Failed, "the backend is down"}, {"terminal-1", trigger.Terminal, "the name is taken"}} {
			code, body := tc.post(t, followers[0], tt.name, "?wait=1m")
			var o trigger.Outcome
			if code != http.StatusOK || json.Unmarshal(body, &o) != nil || o.State != tt.state || !strings.Contains(o.Error, tt.err) || o.Replica != lead.id {
				t.Errorf("%s through %s: %d %s; want 200 %s by %s", tt.name, followers[0].id, code, body, tt.state, lead.id)
			}
		}
	})

	t.Run("waiting callers get 503 when the leader's term ends", func(t *testing.T) {
		type answer struct {
			code int
			body []byte
		}
		answers := make(chan answer, 2)
		for _, r := range []*triggerReplica{lead, followers[0]} { // directly, and through a follower
			go func() {
				code, body := tc.post(t, r, "slow-1", "?wait=2m")
				answers <- answer{code, body}
			}()
		}
		eventually(t, time.Minute, "slow-1's triggered reconcile under way", func() error {
			tc.mu.Lock()
			defer tc.mu.Unlock()
			if len(tc.reasons["slow-1"]) < 2 { // the list's, then the triggers'
				return errors.New("not yet")
			}
			return nil
		})
		// Whether the second caller's trigger joined that turn, parked
		// behind it or arrives once the term ended, it waits or is dropped:
		// 503 either way.
		lead.cut.killed.Store(true) // cut off: its renewals fail, its term ends
		for range 2 {
			// (The term ends after RenewDeadline, 4s: the callers waited
			// longer than the handler's body timeout, 2s.)
			if a := <-answers; a.code != http.StatusServiceUnavailable || !strings.Contains(string(a.body), "term ended") {
				t.Errorf("a waiting caller got %d %s, want 503 saying the term ended", a.code, a.body)
			}
		}
		close(tc.release)
		lead.kill()
	})

	t.Run("a durable trigger set while no replica leads is handled by the next leader", func(t *testing.T) {
		for _, r := range tc.replicas {
			r.kill()
		}
		w, err := typedGet(ctx, dyn, ns, "ok-1")
		if err != nil {
			t.Fatal(err)
		}
		patch := []byte(`{"metadata":{"annotations":{"reconcile.opkit.dev/requestedAt":"while-no-one-led"}}}`)
		if _, err := dyn.Resource(widgets.GroupVersionResource).Namespace(ns).Patch(ctx, w.Name, types.MergePatchType, patch, metav1.PatchOptions{}); err != nil {
			t.Fatal(err)
		}
		e := tc.start("e")
		tc.leaderOf(e)
		eventually(t, time.Minute, "the request handled", func() error {
			w, err := typedGet(ctx, dyn, ns, "ok-1")
			if err != nil {
				return err
			}
			if w.Status.LastHandledReconcileAt != "while-no-one-led" {
				return fmt.Errorf("lastHandledReconcileAt %q", w.Status.LastHandledReconcileAt)
			}
			return nil
		})
		tc.mu.Lock()
		defer tc.mu.Unlock()
		if !slices.ContainsFunc(tc.reasons["ok-1"], func(r []string) bool { return slices.Contains(r, "requestedAt while-no-one-led") }) {
			t.Fatalf("ok-1's reconciles had reasons %v, want one with the request", tc.reasons["ok-1"])
		}
	})
}

func typedGet(ctx context.Context, dyn dynamic.Interface, ns, name string) (*Widget, error) {
	return typed.New[*Widget](dyn, widgets).Get(ctx, opkit.Key{Namespace: ns, Name: name})
}
