package trigger_test

import (
	"context"
	"encoding/json"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"testing"
	"testing/synctest"
	"time"

	"github.com/opkit/opkit"
	"github.com/opkit/opkit/queue"
	"github.com/opkit/opkit/trigger"
)

// The specification of triggers a caller waits for (?wait=): the answer
// is the outcome of the reconcile that serves the trigger, or, when the
// wait ends first, the trigger's id, whose outcome a GET tells later.

// serveTurn takes the next entry as a controller's worker does and
// reports outcome for the tickets it carries.
func serveTurn(t *testing.T, e *handlerEnv, o trigger.Outcome) {
	t.Helper()
	it, err := e.q.Get(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	e.tr.Report(it.Key, it.Value.Ticket, opkit.Shards{}, o)
	e.q.Done(it.Key)
}

// postAsync POSTs target in a goroutine and returns the answer's channel.
func postAsync(e *handlerEnv, target string) <-chan *httptest.ResponseRecorder {
	out := make(chan *httptest.ResponseRecorder, 1)
	go func() { out <- post(e, target) }()
	return out
}

func outcomeOf(t *testing.T, w *httptest.ResponseRecorder) trigger.Outcome {
	t.Helper()
	var o trigger.Outcome
	if err := json.Unmarshal(w.Body.Bytes(), &o); err != nil {
		t.Fatalf("body %s is not an Outcome: %v", w.Body, err)
	}
	return o
}

func TestAWaitingCallerGetsTheReconcilesOutcome(t *testing.T) {
	for _, tc := range []struct {
		name string
		o    trigger.Outcome
	}{
		{"succeeded", trigger.Outcome{State: trigger.Succeeded, Attempts: 1, Replica: "replica-a", Term: 3}},
		{"failed", trigger.Outcome{State: trigger.Failed, Error: "the database is down", Attempts: 2}},
		{"terminal", trigger.Outcome{State: trigger.Terminal, Error: "terminal: the name is taken", Attempts: 1}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			synctest.Test(t, func(t *testing.T) {
				e := newHandlerEnv(t, nil)
				answer := postAsync(e, "/reconcile/ns/a?wait=30s")
				synctest.Wait()
				serveTurn(t, e, tc.o)
				w := <-answer
				if w.Code != http.StatusOK {
					t.Fatalf("code %d, body %s; want 200", w.Code, w.Body)
				}
				got := outcomeOf(t, w)
				want := tc.o
				want.ID = got.ID
				if got != want || got.ID == "" {
					t.Fatalf("outcome %+v, want %+v with an id", got, want)
				}
			})
		})
	}
}

// Triggers merged into one entry all get its outcome; one merged into an
// entry in flight waits for the next turn.
func TestTriggersMergedIntoAnEntryShareItsOutcome(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		e := newHandlerEnv(t, nil)
		first, second := postAsync(e, "/reconcile/ns/a?wait=30s&reason=one"), postAsync(e, "/reconcile/ns/a?wait=30s&reason=two")
		synctest.Wait()
		serveTurn(t, e, trigger.Outcome{State: trigger.Succeeded})
		for _, a := range []<-chan *httptest.ResponseRecorder{first, second} {
			if w := <-a; w.Code != http.StatusOK || outcomeOf(t, w).State != trigger.Succeeded {
				t.Fatalf("answer %d %s, want 200 succeeded", w.Code, w.Body)
			}
		}
		// A turn in flight: a trigger parks behind it, and waits for the next.
		if w := post(e, "/reconcile/ns/a"); w.Code != http.StatusAccepted {
			t.Fatalf("plain trigger: %d", w.Code)
		}
		it, _ := e.q.Get(context.Background())
		third := postAsync(e, "/reconcile/ns/a?wait=30s")
		synctest.Wait()
		e.tr.Report(it.Key, it.Value.Ticket, opkit.Shards{}, trigger.Outcome{State: trigger.Failed, Error: "the old turn"})
		e.q.Done(it.Key)
		synctest.Wait()
		select {
		case w := <-third:
			t.Fatalf("the parked trigger got the in-flight turn's answer: %d %s", w.Code, w.Body)
		default:
		}
		serveTurn(t, e, trigger.Outcome{State: trigger.Succeeded})
		if w := <-third; w.Code != http.StatusOK || outcomeOf(t, w).State != trigger.Succeeded {
			t.Fatalf("parked trigger: %d %s, want 200 succeeded", w.Code, w.Body)
		}
	})
}

// When the wait ends first: 202 with the id and the path to ask; a GET
// there says pending, then the outcome; an id this replica does not know
// is Unknown, not an error.
func TestAWaitThatEndsFirstLeavesAnIDToAsk(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		e := newHandlerEnv(t, nil)
		w := post(e, "/reconcile/ns/a?wait=2s")
		var a trigger.Accepted
		if err := json.Unmarshal(w.Body.Bytes(), &a); err != nil || w.Code != http.StatusAccepted || a.ID == "" || a.StatusPath != "/reconcile/ns/a/triggers/"+a.ID {
			t.Fatalf("answer %d %s, want 202 with the id and its path", w.Code, w.Body)
		}
		get := func(path string) trigger.Outcome {
			t.Helper()
			w := e.do(http.MethodGet, path, nil, nil)
			if w.Code != http.StatusOK {
				t.Fatalf("GET %s: %d %s", path, w.Code, w.Body)
			}
			return outcomeOf(t, w)
		}
		if o := get(a.StatusPath); o.State != trigger.Pending || o.ID != a.ID {
			t.Fatalf("before the reconcile: %+v, want pending", o)
		}
		serveTurn(t, e, trigger.Outcome{State: trigger.Requeued})
		if o := get(a.StatusPath); o.State != trigger.Requeued {
			t.Fatalf("after the reconcile: %+v, want requeued", o)
		}
		if o := get("/reconcile/ns/a/triggers/ffffffff-0-7"); o.State != trigger.Unknown {
			t.Fatalf("an unknown id: %+v, want unknown", o)
		}
	})
}

// A waiting caller whose leader's term ends gets 503 at once, not a hang;
// what it waited for is unknown from then on.
func TestAWaitingCallerGets503WhenTheTermEnds(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		e := newHandlerEnv(t, nil)
		answer := postAsync(e, "/reconcile/ns/a?wait=5m")
		synctest.Wait()
		e.tr.Abandon("the term ended", opkit.Shards{})
		synctest.Wait()
		select {
		case w := <-answer:
			wantStatus(t, w, http.StatusServiceUnavailable, "ServiceUnavailable")
			if w.Header().Get("Retry-After") == "" {
				t.Error("no Retry-After")
			}
		default:
			t.Fatal("the waiting caller still waits after the term ended")
		}
	})
}

// A waiting caller holds no in-flight slot: with one slot, another
// trigger is served while it waits.
func TestWaitingHoldsNoInFlightSlot(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		e := newHandlerEnv(t, func(c *trigger.HandlerConfig) { c.MaxInFlight = 1 })
		answer := postAsync(e, "/reconcile/ns/a?wait=1m")
		synctest.Wait()
		if w := post(e, "/reconcile/ns/a?reason=meanwhile"); w.Code != http.StatusAccepted {
			t.Fatalf("a trigger while another waits: %d %s, want 202", w.Code, w.Body)
		}
		serveTurn(t, e, trigger.Outcome{State: trigger.Succeeded})
		<-answer
	})
}

func TestBadWaitsAreRefused(t *testing.T) {
	e := newHandlerEnv(t, func(c *trigger.HandlerConfig) { c.MaxWait = time.Minute })
	for _, target := range []string{"/reconcile/ns/a?wait=0s", "/reconcile/ns/a?wait=-1s", "/reconcile/ns/a?wait=2m", "/reconcile/ns/a?wait=soon", "/reconcile/ns/a?wait=1s&wait=2s"} {
		wantStatus(t, post(e, target), http.StatusBadRequest, "BadRequest")
	}
	if e.q.Len() != 0 {
		t.Fatalf("%d entries after refused triggers", e.q.Len())
	}
	wantStatus(t, e.do(http.MethodPost, "/reconcile/ns/a/triggers/x", nil, nil), http.StatusMethodNotAllowed, "MethodNotAllowed")
	wantStatus(t, e.do(http.MethodGet, "/reconcile/ns/a/triggers/x?wait=1s", nil, nil), http.StatusBadRequest, "BadRequest")
	_ = opkit.Key{}
}

// A trigger's id tells its outcome only for its own object: the same id
// under another object's path is unknown (ids are guessable; what a
// caller may see is decided by the object it asks about).
func TestAnIDIsAnsweredOnlyForItsObject(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		e := newHandlerEnv(t, nil)
		w := post(e, "/reconcile/ns/a?wait=1s")
		var a trigger.Accepted
		if err := json.Unmarshal(w.Body.Bytes(), &a); err != nil || a.ID == "" {
			t.Fatalf("answer %d %s, want 202 with an id", w.Code, w.Body)
		}
		serveTurn(t, e, trigger.Outcome{State: trigger.Failed, Error: "a secret of ns/a"})
		w = e.do(http.MethodGet, "/reconcile/other/b/triggers/"+a.ID, nil, nil)
		if o := outcomeOf(t, w); o.State != trigger.Unknown || o.Error != "" {
			t.Fatalf("ns/a's id under other/b: %+v, want unknown and nothing else", o)
		}
		if o := outcomeOf(t, e.do(http.MethodGet, a.StatusPath, nil, nil)); o.State != trigger.Failed {
			t.Fatalf("under its own path: %+v, want failed", o)
		}
	})
}

// A server that shuts down answers its waiting callers at once, 503,
// whatever their wait, so that its shutdown (and the Lease release that
// follows it in an operator) never waits for them: here a caller waits
// directly, and one through a follower whose leader stops.
func TestAServerThatStopsAnswersItsWaitingCallersAtOnce(t *testing.T) {
	leader := newHandlerEnv(t, nil)
	follower := newHandlerEnv(t, nil)
	follower.q.Suspend()
	serve := func(h http.Handler) (url string, stop func() error) {
		ln, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			t.Fatal(err)
		}
		// A shutdown that waited for the callers would run into this
		// timeout, and Serve would say so.
		srv, err := trigger.NewServer(trigger.ServerConfig{Handler: h, ShutdownTimeout: 10 * time.Minute, Logger: discard})
		if err != nil {
			t.Fatal(err)
		}
		ctx, cancel := context.WithCancel(context.Background())
		done := make(chan error, 1)
		go func() { done <- srv.Serve(ctx, ln) }()
		return "http://" + ln.Addr().String(), func() error { cancel(); return <-done }
	}
	leaderURL, stopLeader := serve(leader.h)
	followerURL, stopFollower := serve(follower.h)
	defer stopFollower()
	follower.route.follow(leaderURL)

	answers := make(chan *http.Response, 2)
	for _, base := range []string{leaderURL, followerURL} {
		go func() {
			resp, err := http.Post(base+"/reconcile/ns/a?wait=5m&delay=1m", "", nil)
			if err != nil {
				t.Errorf("POST through %s: %v", base, err)
				answers <- nil
				return
			}
			answers <- resp
		}()
	}
	// Both wait on the leader: two tickets there.
	for deadline := time.Now().Add(time.Minute); scheduled(leader) < 2; {
		if time.Now().After(deadline) {
			t.Fatal("the two callers never waited on the leader")
		}
		time.Sleep(10 * time.Millisecond)
	}
	if err := stopLeader(); err != nil {
		t.Fatalf("the leader's server stopped with %v, want a clean shutdown (no wait for the callers)", err)
	}
	for range 2 {
		resp := <-answers
		if resp == nil {
			continue
		}
		body, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		if resp.StatusCode != http.StatusServiceUnavailable || resp.Header.Get("Retry-After") == "" {
			t.Errorf("a waiting caller: %d %s, want 503 with Retry-After", resp.StatusCode, body)
		}
	}
}

// scheduled is how many triggers e's trigger scheduled (queued or
// merged).
func scheduled(e *handlerEnv) int {
	e.m.mu.Lock()
	defer e.m.mu.Unlock()
	return e.m.enqueued[queue.Queued] + e.m.enqueued[queue.Merged]
}
