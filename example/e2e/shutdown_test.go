//go:build integration

package e2e

import (
	"bufio"
	"context"
	"io"
	"net/http"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/opkit/opkit/example/internal/harness"
)

// scheduledTriggers reads the triggers r scheduled (queued or merged)
// from its metrics.
func scheduledTriggers(r *harness.Replica) (float64, error) {
	resp, err := http.Get(r.MetricsURL)
	if err != nil {
		return 0, err
	}
	defer resp.Body.Close()
	n := 0.0
	sc := bufio.NewScanner(resp.Body)
	for sc.Scan() {
		line := sc.Text()
		if !strings.HasPrefix(line, "opkit_trigger_enqueued_total{") || !strings.Contains(line, `"Queued"`) && !strings.Contains(line, `"Merged"`) {
			continue
		}
		v, err := strconv.ParseFloat(line[strings.LastIndexByte(line, ' ')+1:], 64)
		if err != nil {
			return 0, err
		}
		n += v
	}
	return n, sc.Err()
}

// When the leader gets SIGTERM, a caller waiting on it for an outcome,
// directly or through the follower, is answered 503 at once: before the
// leader's process exits, so its shutdown and its Lease's release never
// wait for the callers. The Lease is released (not left to expire), and
// the follower takes over.
func TestALeadersSIGTERMAnswersItsWaitingCallersFirst(t *testing.T) {
	ctx := context.Background()
	e, start := setup(t, false)
	start("a")
	start("b")
	names := e.create(ctx, 1, 1)
	lead := e.replicas[e.leader(ctx, "")]
	var follower *harness.Replica
	for id, r := range e.replicas {
		if id != lead.Identity {
			follower = r
		}
	}
	before, err := scheduledTriggers(lead)
	if err != nil {
		t.Fatal(err)
	}

	type answer struct {
		via  string
		code int
		body string
		at   time.Time
	}
	answers := make(chan answer, 2)
	for _, r := range []*harness.Replica{lead, follower} {
		go func() {
			req, _ := http.NewRequest(http.MethodPost, r.TriggerURL+"/reconcile/"+e.ns+"/"+names[0]+"?delay=30s&wait=60s", nil)
			req.Header.Set("Authorization", "Bearer "+e.token)
			resp, err := http.DefaultClient.Do(req)
			if err != nil {
				answers <- answer{via: r.Identity, body: err.Error(), at: time.Now()}
				return
			}
			body, _ := io.ReadAll(resp.Body)
			resp.Body.Close()
			answers <- answer{r.Identity, resp.StatusCode, string(body), time.Now()}
		}()
	}
	// Both wait on the leader: the follower forwarded its caller's.
	if err := harness.Poll(ctx, time.Minute, func() (bool, error) {
		n, err := scheduledTriggers(lead)
		return err == nil && n >= before+2, nil
	}); err != nil {
		t.Fatalf("the two triggers never reached the leader: %v\n%s", err, lead.Tail(20))
	}

	sigterm := time.Now()
	if err := lead.Stop(time.Minute); err != nil {
		t.Fatalf("the leader's shutdown: %v\n%s", err, lead.Tail(30))
	}
	exited := time.Now()
	holder, err := harness.LeaseHolder(ctx, e.kube)
	if err != nil {
		t.Fatal(err)
	}
	if holder == lead.Identity {
		t.Errorf("after the leader exited, the Lease still names it: not released")
	}
	for range 2 {
		a := <-answers
		if a.code != http.StatusServiceUnavailable || !a.at.Before(exited) {
			t.Errorf("the caller through %s: %d %s, %v after SIGTERM; want 503 before the leader exited (%v after SIGTERM)",
				a.via, a.code, a.body, a.at.Sub(sigterm), exited.Sub(sigterm))
		}
		t.Logf("the caller through %s was answered %d %v after SIGTERM", a.via, a.code, a.at.Sub(sigterm).Round(time.Millisecond))
	}
	t.Logf("the leader exited, its Lease released, %v after SIGTERM", exited.Sub(sigterm).Round(time.Millisecond))
	if next := e.leader(ctx, lead.Identity); next != follower.Identity {
		t.Errorf("the next leader is %q, want the follower %q", next, follower.Identity)
	}
}
