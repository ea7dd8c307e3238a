package trigger_test

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"math/rand/v2"
	"net"
	"net/http"
	"net/http/httptest"
	"slices"
	"strings"
	"sync"
	"testing"
	"testing/synctest"
	"time"

	authnv1 "k8s.io/api/authentication/v1"
	corev1 "k8s.io/api/core/v1"

	"github.com/opkit/opkit"
	"github.com/opkit/opkit/queue"
	"github.com/opkit/opkit/trigger"
)

// The specification of the trigger path under floods (issue 22): a flood
// of valid triggers costs reads and reconciles only within the trigger
// budget, slow clients hold nothing others need, failed authentication is
// cheap, and every answer has the same shape.

// A trigger for a key that waits already (pending, or parked behind the
// entry in flight) joins it: no read, and no new reconcile.
func TestATriggerForAWaitingKeyJoinsItWithoutARead(t *testing.T) {
	api := newFakeAPI()
	tr, q := newCMTriggerWith(t, trigger.Config[*corev1.ConfigMap]{Get: api.get})
	a := opkit.Key{Namespace: "ns", Name: "a"}
	intake := func(reason string, want queue.Outcome) {
		t.Helper()
		if _, o, err := intake(tr, context.Background(), trigger.Pointer{Key: a, Reason: reason}, trigger.IntakeOptions{}); err != nil || o != want {
			t.Fatalf("Intake(%s) = (%v, %v), want %v", reason, o, err, want)
		}
	}
	intake("first", queue.Queued)
	intake("second", queue.Merged)
	if len(api.read) != 1 {
		t.Fatalf("%d reads for a trigger that joined a pending entry, want 1 in all", len(api.read))
	}
	it, _ := q.Get(context.Background())
	if got := it.Value.Reasons; len(got) != 2 || !it.Value.Sources.Has(opkit.Operator) || it.Value.Object == nil {
		t.Fatalf("handed out %+v, want both reasons, source Operator and the object read", it.Value)
	}
	// In flight: the next trigger makes another reconcile, so it reads;
	// the one after joins it.
	intake("third", queue.Merged)
	intake("fourth", queue.Merged)
	if len(api.read) != 2 {
		t.Fatalf("%d reads, want 2: one for the entry parked behind the one in flight", len(api.read))
	}
	q.Done(a)
	if it, _ := q.Get(context.Background()); len(it.Value.Reasons) != 2 || it.Value.Object == nil {
		t.Fatalf("parked entry handed out as %+v, want the third and fourth reasons and the object", it.Value)
	}
}

// The budget bounds the reconciles triggers start, not the triggers that
// join waiting entries; it refills at Rate.
func TestTheTriggerBudgetBoundsNewReconcilesNotJoins(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		reads := 0
		get := func(_ context.Context, k opkit.Key) (*corev1.ConfigMap, error) {
			reads++
			return cm(k.Namespace, k.Name), nil
		}
		tr, q := newCMTriggerWith(t, trigger.Config[*corev1.ConfigMap]{Get: get, Rate: 1, Burst: 4})
		intake := func(name string) error {
			_, _, err := intake(tr, context.Background(), trigger.Pointer{Key: opkit.Key{Namespace: "ns", Name: name}}, trigger.IntakeOptions{})
			return err
		}
		taken := 0
		for ; ; taken++ {
			err := intake(fmt.Sprint("new-", taken))
			if errors.Is(err, trigger.ErrBusy) {
				break
			}
			if err != nil || taken == 4 {
				t.Fatalf("trigger %d: %v, want the burst spent within 4", taken, err)
			}
		}
		if taken == 0 || reads != taken || q.Len() != taken {
			t.Fatalf("%d taken, %d reads and %d entries, want at least one taken, and as many reads and entries: a refused trigger reads nothing", taken, reads, q.Len())
		}
		if err := intake("new-0"); err != nil {
			t.Fatalf("a trigger that joins a waiting entry with the budget spent: %v, want it taken", err)
		}
		time.Sleep(5 * time.Second)
		if err := intake("later"); err != nil {
			t.Fatalf("a new trigger once the budget refilled: %v, want a token", err)
		}
	})
}

// asker is a caller of the trigger budget that asks PerSecond times a
// second, evenly, each time for a name not waiting yet (so each needs a
// token); Got counts what it was given.
type asker struct {
	Name       string
	PerSecond  float64
	Asked, Got int
}

// ask runs the askers for the given seconds in steps of 10ms; in each
// step the last asker asks last (put a calm caller there: it asks after
// the crowd took what there was), the others in an order drawn anew (a
// fixed seed: the same each run), as requests arrive.
func ask(tr *trigger.Trigger[*corev1.ConfigMap], seconds int, askers ...*asker) {
	crowd := slices.Clone(askers[:len(askers)-1])
	order := rand.New(rand.NewPCG(1, 2))
	for step := range seconds * 100 {
		time.Sleep(10 * time.Millisecond)
		order.Shuffle(len(crowd), func(i, j int) { crowd[i], crowd[j] = crowd[j], crowd[i] })
		for _, a := range append(crowd, askers[len(askers)-1]) {
			due := int(float64(step+1)*a.PerSecond/100) - int(float64(step)*a.PerSecond/100)
			for range due {
				a.Asked++
				if intakeAs(tr, a.Name, fmt.Sprintf("%s-%d", a.Name, a.Asked)) == nil {
					a.Got++
				}
			}
		}
	}
}

// askers returns n askers named prefix-i, each asking perSecond.
func askers(prefix string, n int, perSecond float64) []*asker {
	var c []*asker
	for i := range n {
		c = append(c, &asker{Name: fmt.Sprint(prefix, "-", i), PerSecond: perSecond})
	}
	return c
}

// rush makes each of the crowd's first three asks, all at once.
func rush(tr *trigger.Trigger[*corev1.ConfigMap], crowd []*asker) {
	for i := range 3 {
		for _, a := range crowd {
			_ = intakeAs(tr, a.Name, fmt.Sprint(a.Name, "-rush-", i))
		}
	}
}

// calmThroughARush checks that calm's trigger just after the crowd's
// rush is taken, and so is every one it asks for in the 8 s after.
func calmThroughARush(t *testing.T, tr *trigger.Trigger[*corev1.ConfigMap], crowd []*asker, calm *asker) {
	t.Helper()
	rush(tr, crowd)
	if err := intakeAs(tr, "calm", "calm-after-the-rush"); err != nil {
		t.Fatalf("the calm caller's trigger just after the crowd's rush: %v, want it taken", err)
	}
	ask(tr, 8, slices.Concat(crowd, []*asker{calm})...)
	if calm.Got != calm.Asked {
		t.Errorf("the calm caller got %d of %d", calm.Got, calm.Asked)
	}
}

// got adds up what the askers were given.
func got(askers []*asker) (n int) {
	for _, a := range askers {
		n += a.Got
	}
	return n
}

// budgetTrigger returns a trigger whose reads always find the object,
// with the default trigger budget (5 a second, burst 20).
func budgetTrigger(t *testing.T) *trigger.Trigger[*corev1.ConfigMap] {
	anything := func(_ context.Context, k opkit.Key) (*corev1.ConfigMap, error) { return cm(k.Namespace, k.Name), nil }
	tr, _ := newCMTriggerWith(t, trigger.Config[*corev1.ConfigMap]{Get: anything})
	return tr
}

// atMost is what the budget gives in seconds, however many ask: its rate,
// its burst twice (the budget's, and the callers' parts'), and one token
// for each of n callers when new.
func atMost(seconds, n int) int { return 5*seconds + 2*20 + n }

// A caller alone has about half the burst at once, then the whole rate.
func TestACallerAloneHasHalfTheBurstThenTheRate(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		tr := budgetTrigger(t)
		alone := &asker{Name: "pipeline", PerSecond: 1000}
		ask(tr, 1, alone)
		if alone.Got < 10 || alone.Got > 20 {
			t.Fatalf("in its first second: %d, want about half the burst, 20, and what the rate gave in that second", alone.Got)
		}
		first := alone.Got
		ask(tr, 20, alone)
		if n := alone.Got - first; n < 90 || n > 102 {
			t.Fatalf("in the next 20 seconds: %d, want about the rate, 5 a second", n)
		}
	})
}

// A caller that asks for less than a crowd goes first, however the crowd
// asks: 64 callers at full speed, or four paced just under half the
// budget each. The crowd gets the rest, shared alike, and no more than
// the budget.
func TestACallerThatAsksForLessGoesFirst(t *testing.T) {
	for _, tc := range []struct {
		name  string
		crowd []*asker
	}{
		{"64 callers at full speed", askers("flooder", 64, 100)},
		{"4 callers at 2.5 a second", askers("paced", 4, 2.5)},
	} {
		t.Run(tc.name, func(t *testing.T) {
			synctest.Test(t, func(t *testing.T) {
				tr := budgetTrigger(t)
				calm := &asker{Name: "calm", PerSecond: 1}
				ask(tr, 60, append(tc.crowd, calm)...)
				if calm.Got != calm.Asked {
					t.Errorf("the calm caller got %d of %d", calm.Got, calm.Asked)
				}
				if n := got(tc.crowd); n > atMost(60, len(tc.crowd)) {
					t.Errorf("the crowd got %d in 60s, want at most %d", n, atMost(60, len(tc.crowd)))
				}
				lo, hi := tc.crowd[0].Got, tc.crowd[0].Got
				for _, a := range tc.crowd {
					lo, hi = min(lo, a.Got), max(hi, a.Got)
				}
				if hi > 2*lo+10 {
					t.Errorf("the crowd's callers got from %d to %d, want alike", lo, hi)
				}
			})
		})
	}
}

// Callers that ask alike share alike; asking for more than an equal share
// gets a caller no more than it.
func TestCallersThatAskAlikeShareAlike(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		tr := budgetTrigger(t)
		ten := askers("caller", 10, 1)                      // 10 a second on a budget of 5
		ask(tr, 60, append(ten, &asker{Name: "nobody"})...) // none of the ten asks last every time
		for _, a := range ten {
			if a.Got < 20 || a.Got > 40 {
				t.Errorf("%s got %d of %d, want about half", a.Name, a.Got, a.Asked)
			}
		}
		if n := got(ten); n > atMost(60, 10) {
			t.Errorf("they got %d in 60s, want at most %d", n, atMost(60, 10))
		}
	})
}

// A crowd of new callers arriving at once cannot empty the budget before
// a known caller that asks little: a caller counts as demanding the rate
// until it shows less.
func TestACrowdOfNewcomersGoesAfterAKnownCallerAskingLittle(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		tr := budgetTrigger(t)
		calm := &asker{Name: "calm", PerSecond: 1}
		ask(tr, 10, &asker{Name: "nobody"}, calm)
		time.Sleep(5 * time.Second) // it pauses; the crowd arrives as it comes back
		crowd := askers("newcomer", 64, 100)
		calmThroughARush(t, tr, crowd, calm)
	})
}

// Callers that stopped asking take nothing from those still asking: a
// calm caller beside a flooder is served in full however soon after a
// crowd of 64 went quiet.
func TestCallersThatStoppedAskingTakeNothing(t *testing.T) {
	for _, quiet := range []int{1, 5, 10, 15, 20, 30} {
		t.Run(fmt.Sprint(quiet, "s after the crowd"), func(t *testing.T) {
			synctest.Test(t, func(t *testing.T) {
				tr := budgetTrigger(t)
				ask(tr, 8, askers("crowd", 64, 50)...)
				time.Sleep(time.Duration(quiet) * time.Second)
				calm := &asker{Name: "calm", PerSecond: 1}
				ask(tr, 8, &asker{Name: "flooder", PerSecond: 1000}, calm)
				if calm.Got != calm.Asked {
					t.Errorf("the calm caller got %d of %d", calm.Got, calm.Asked)
				}
			})
		})
	}
}

// A crowd that flooded, went quiet and comes back within two minutes
// cannot empty the budget before a caller that kept asking little: a
// caller that flooded counts as demanding at least the rate, as a
// newcomer does, for two minutes however quiet it was.
func TestACrowdThatComesBackGoesAfterACallerAskingLittle(t *testing.T) {
	for _, quiet := range []int{10, 20, 30, 60, 110} {
		t.Run(fmt.Sprint("back after ", quiet, "s"), func(t *testing.T) {
			synctest.Test(t, func(t *testing.T) {
				tr := budgetTrigger(t)
				calm := &asker{Name: "calm", PerSecond: 1}
				crowd := askers("crowd", 64, 50)
				ask(tr, 8, append(crowd, calm)...)
				ask(tr, quiet, calm)
				calmThroughARush(t, tr, crowd, calm)
			})
		})
	}
}

// The budget's limit: callers that asked little (four at 2.5 a second)
// and come back flooding, beside 60 new ones, ask for less than a calm
// caller for their first few asks, so they go first, until their demand
// catches up. The calm caller's trigger just after their rush may be
// refused; every one after it is taken.
func TestCallersThatAskedLittleAndComeBackFloodingGoFirstBriefly(t *testing.T) {
	for _, quiet := range []int{5, 20, 60} {
		t.Run(fmt.Sprint("back after ", quiet, "s"), func(t *testing.T) {
			synctest.Test(t, func(t *testing.T) {
				tr := budgetTrigger(t)
				calm := &asker{Name: "calm", PerSecond: 1}
				paced := askers("paced", 4, 2.5)
				ask(tr, 12, slices.Concat(paced, []*asker{calm})...)
				ask(tr, quiet, calm)
				crowd := slices.Concat(paced, askers("new", 60, 30))
				for _, a := range paced {
					a.PerSecond = 30
				}
				rush(tr, crowd)
				_ = intakeAs(tr, "calm", "calm-after-the-rush") // may be refused: the limit
				got, asked := calm.Got, calm.Asked
				ask(tr, 8, slices.Concat(crowd, []*asker{calm})...)
				if calm.Got-got != calm.Asked-asked {
					t.Errorf("after the rush, the calm caller got %d of %d", calm.Got-got, calm.Asked-asked)
				}
			})
		})
	}
}

// A batch well over the burst counts against its caller for two minutes
// only: a pipeline that triggered 30 objects at once, then one a minute,
// beside callers that keep the budget spent, is a newcomer at best until
// the batch is two minutes old, then served whenever it asks.
func TestABatchCountsAgainstItsCallerForTwoMinutesOnly(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		tr := budgetTrigger(t)
		var background []*asker // 7.8 a second on a budget of 5, each at its own pace
		for i := range 20 {
			background = append(background, &asker{Name: fmt.Sprint("background-", i), PerSecond: 0.2 + 0.02*float64(i)})
		}
		ask(tr, 10, background...)
		for i := range 30 {
			_ = intakeAs(tr, "pipeline", fmt.Sprint("batch-", i))
		}
		pipeline := &asker{Name: "pipeline", PerSecond: 1.0 / 60}
		ask(tr, 120, append(background, pipeline)...)
		within := pipeline.Got
		ask(tr, 240, append(background, pipeline)...)
		if got := pipeline.Got - within; got != 4 {
			t.Errorf("the pipeline's 4 triggers after the batch was two minutes old: %d taken, want 4 (%d of 2 before)", got, within)
		}
	})
}

// Beyond the callers the budget remembers, a caller takes only from a
// full bucket: one token, then none until the bucket is full again.
func TestACallerBeyondThoseRememberedTakesOnlyFromAFullBucket(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		tr := budgetTrigger(t)
		for i := range trigger.MaxCallers {
			_ = intakeAs(tr, fmt.Sprint("caller-", i), fmt.Sprint("c-", i))
		}
		time.Sleep(10 * time.Second) // the bucket is full; the callers' demands have faded, not gone
		if err := intakeAs(tr, "one-too-many", "x-1"); err != nil {
			t.Fatalf("from a full bucket: %v, want a token", err)
		}
		if err := intakeAs(tr, "one-too-many", "x-2"); !errors.Is(err, trigger.ErrBusy) {
			t.Fatalf("from a bucket one token short of full: %v, want ErrBusy", err)
		}
		if err := intakeAs(tr, "caller-0", "c-again"); err != nil {
			t.Fatalf("a remembered caller that asked once, 10s ago: %v, want a token", err)
		}
	})
}

// A caller that asks now and then (a pipeline that deploys) gets its
// trigger whenever it comes, a crowd spending the budget or not.
func TestARareCallerIsServedUnderAFlood(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		tr := budgetTrigger(t)
		flood := askers("flooder", 20, 10)
		ask(tr, 5, flood...)
		for round := range 4 {
			if err := intakeAs(tr, "rare", fmt.Sprint("rare-", round)); err != nil {
				t.Fatalf("the rare caller's trigger %d: %v, want it taken", round, err)
			}
			ask(tr, 25, flood...)
		}
	})
}

// intakeAs takes a trigger of ns/name through tr's Intake for caller.
func intakeAs(tr *trigger.Trigger[*corev1.ConfigMap], caller, name string) error {
	_, _, err := intake(tr, context.Background(), trigger.Pointer{Key: opkit.Key{Namespace: "ns", Name: name}},
		trigger.IntakeOptions{Authorize: func(context.Context, opkit.Key) (string, error) { return caller, nil }})
	return err
}

// A spent budget is "try again later": 429 with Retry-After from the
// handler, a hand-back from the consumer.
func TestASpentBudgetIs429AndAHandBack(t *testing.T) {
	e := newHandlerEnvWith(t, func(c *trigger.Config[*corev1.ConfigMap]) { c.Rate, c.Burst = 0.001, 1 }, nil)
	if w := post(e, "/reconcile/ns/a"); w.Code != http.StatusAccepted {
		t.Fatalf("first: %d %s", w.Code, w.Body)
	}
	it, _ := e.q.Get(context.Background())
	e.q.Done(it.Key)
	w := post(e, "/reconcile/ns/a")
	wantStatus(t, w, http.StatusTooManyRequests, "TooManyRequests")
	if w.Header().Get("Retry-After") == "" {
		t.Error("429 without Retry-After")
	}
}

// authorize asks a for the caller of token tok and the object ns/name.
func authorize(a trigger.Authenticator, ctx context.Context, tok, name string) error {
	r := httptest.NewRequest(http.MethodPost, "/", nil)
	r.Header.Set("Authorization", "Bearer "+tok)
	_, err := a.Authorize(ctx, trigger.AuthRequest{HTTP: r, Resource: configMaps, Key: opkit.Key{Namespace: "ns", Name: name}})
	return err
}

// Concurrent requests with the same unknown token make one TokenReview;
// the reviews in flight are bounded; a caller that leaves does not fail
// the others.
func TestReviewsAreSharedBoundedAndOutliveTheCallerThatLeft(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		rev := newFakeReviews(t)
		rev.allowed["system:serviceaccount:ci:deployer update /configmaps/ ns/"] = true
		rev.hold = make(chan struct{})
		a, err := trigger.NewKubeAuthenticator(trigger.KubeAuthConfig{Client: rev, MaxReviews: 2})
		if err != nil {
			t.Fatal(err)
		}
		leaving, leave := context.WithCancel(context.Background())
		errs := make([]error, 10)
		var wg sync.WaitGroup
		for i := range errs {
			ctx := context.Background()
			if i == 0 {
				ctx = leaving
			}
			wg.Go(func() { errs[i] = authorize(a, ctx, "good-token", "a") })
		}
		wg.Go(func() { _ = authorize(a, context.Background(), "garbage-1", "a") })
		synctest.Wait()
		rev.mu.Lock()
		held := rev.held
		rev.mu.Unlock()
		if held != 2 {
			t.Fatalf("%d TokenReviews in flight for 10 callers of one token and 1 of another, want 2", held)
		}
		// Both review slots are taken: a third token waits for one, and is
		// refused when the review timeout ends first.
		if err := authorize(a, context.Background(), "garbage-2", "a"); !errors.Is(err, trigger.ErrBusy) {
			t.Fatalf("a third review with MaxReviews 2 held: %v, want ErrBusy", err)
		}
		leave()
		synctest.Wait()
		close(rev.hold)
		wg.Wait()
		if !errors.Is(errs[0], context.Canceled) {
			t.Errorf("the caller that left: %v, want its context's error", errs[0])
		}
		for i, err := range errs[1:] {
			if err != nil {
				t.Errorf("caller %d sharing the review: %v", i+1, err)
			}
		}
		if tr, sar := rev.calls(); tr != 2 || sar != 1 {
			t.Errorf("%d TokenReviews and %d SARs in all, want 2 and 1", tr, sar)
		}
	})
}

// The review slots go fairly: a caller whose reviews hold every slot
// does not make another caller's review fail; the slot given back goes
// to the caller that holds none, ahead of the first caller's next review.
func TestAReviewWaitsForItsFairTurn(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		rev := newFakeReviews(t)
		for _, name := range []string{"a", "b", "c"} {
			rev.allowed["system:serviceaccount:ci:deployer update /configmaps/ ns/"+name] = true
		}
		rev.allowed["system:serviceaccount:ci:intruder update /configmaps/ ns/"] = true
		a, err := trigger.NewKubeAuthenticator(trigger.KubeAuthConfig{Client: rev, MaxReviews: 2})
		if err != nil {
			t.Fatal(err)
		}
		// The users' tokens reviewed (and cached) first, and the
		// deployer's namespace denial.
		for _, tok := range []string{"good-token", "other-token"} {
			if err := authorize(a, context.Background(), tok, "a"); err != nil {
				t.Fatal(err)
			}
		}
		rev.holdSAR = make(chan struct{})
		release := sync.OnceFunc(func() { close(rev.holdSAR) })
		var wg sync.WaitGroup
		defer wg.Wait()
		defer release() // also when the test fails early
		errs := make([]error, 3)
		wg.Go(func() { errs[0] = authorize(a, context.Background(), "good-token", "b") })
		wg.Go(func() { errs[1] = authorize(a, context.Background(), "good-token", "c") })
		synctest.Wait()
		wg.Go(func() { errs[2] = authorize(a, context.Background(), "other-token", "x") })
		synctest.Wait()
		rev.mu.Lock()
		held := rev.heldSAR
		rev.mu.Unlock()
		if held != 3+2 { // the warm-ups', the deployer's two; the intruder's waits
			t.Fatalf("%d SubjectAccessReviews made, want 5: the intruder's waits for a slot", held)
		}
		release()
		wg.Wait()
		for i, err := range errs {
			if err != nil {
				t.Errorf("review %d: %v, want it to wait for its turn and pass", i, err)
			}
		}
	})
}

// A decision is cached by user, verb and object: another token of the same
// user needs a TokenReview, not another SubjectAccessReview.
func TestDecisionsAreCachedByUserNotByToken(t *testing.T) {
	rev := newFakeReviews(t)
	rev.tokens["second-token"] = rev.tokens["good-token"]
	rev.allowed["system:serviceaccount:ci:deployer update /configmaps/ ns/"] = true
	a, err := trigger.NewKubeAuthenticator(trigger.KubeAuthConfig{Client: rev})
	if err != nil {
		t.Fatal(err)
	}
	for _, tok := range []string{"good-token", "second-token"} {
		if err := authorize(a, context.Background(), tok, "a"); err != nil {
			t.Fatal(err)
		}
	}
	if tr, sar := rev.calls(); tr != 2 || sar != 1 {
		t.Errorf("%d TokenReviews and %d SARs for two tokens of one user, want 2 and 1", tr, sar)
	}
	// Another user with a grant of its own is asked about on its own.
	rev.tokens["third-token"] = authnv1.TokenReviewStatus{Authenticated: true, Audiences: []string{trigger.DefaultAudience},
		User: authnv1.UserInfo{Username: "system:serviceaccount:ci:deployer", Groups: []string{"other"}}}
	if err := authorize(a, context.Background(), "third-token", "a"); err != nil {
		t.Fatal(err)
	}
	if _, sar := rev.calls(); sar != 2 {
		t.Errorf("%d SARs after a user with the same name and other groups, want 2: a decision of its own", sar)
	}
}

// A client address that keeps failing authentication is refused before
// any review, other addresses are not, and the refusal ends.
func TestAClientThatKeepsFailingAuthenticationIsRefusedBeforeAnyReview(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		rev := newFakeReviews(t)
		rev.allowed["system:serviceaccount:ci:deployer update /configmaps/ ns/a"] = true
		auth, err := trigger.NewKubeAuthenticator(trigger.KubeAuthConfig{Client: rev, MaxAuthFailures: 3, AuthFailureBackoff: 10 * time.Second})
		if err != nil {
			t.Fatal(err)
		}
		e := newHandlerEnv(t, func(c *trigger.HandlerConfig) { c.Authenticator = auth })
		from := func(addr, tok string) *httptest.ResponseRecorder { return postFrom(e, addr, tok) }
		for i := range 3 {
			wantStatus(t, from("10.0.0.1:1000", fmt.Sprintf("garbage-%d", i)), 401, "Unauthorized")
		}
		before, _ := rev.calls()
		wantStatus(t, from("10.0.0.1:2000", "garbage-3"), 429, "TooManyRequests") // another port, the same client
		wantStatus(t, from("10.0.0.1:2000", "good-token"), 429, "TooManyRequests")
		if after, _ := rev.calls(); after != before {
			t.Fatalf("a refused address made %d more TokenReviews, want none", after-before)
		}
		if w := from("10.0.0.2:1000", "good-token"); w.Code != http.StatusAccepted {
			t.Fatalf("another address: %d %s", w.Code, w.Body)
		}
		time.Sleep(10 * time.Second)
		if w := from("10.0.0.1:1000", "good-token"); w.Code != http.StatusAccepted {
			t.Fatalf("after AuthFailureBackoff: %d %s", w.Code, w.Body)
		}
		// A new token's success forgets the failures before it; a known
		// token's success says nothing of its neighbours.
		rev.tokens["new-token"] = rev.tokens["good-token"]
		failTwice := func(first int) {
			for i := range 2 {
				wantStatus(t, from("10.0.0.1:1000", fmt.Sprintf("garbage-%d", first+i)), 401, "Unauthorized")
			}
		}
		failTwice(10)
		if w := from("10.0.0.1:1000", "new-token"); w.Code != http.StatusAccepted {
			t.Fatalf("a new token: %d %s", w.Code, w.Body)
		}
		failTwice(20)
		if w := from("10.0.0.1:1000", "good-token"); w.Code != http.StatusAccepted {
			t.Fatalf("a known token: %d %s", w.Code, w.Body)
		}
		wantStatus(t, from("10.0.0.1:1000", "garbage-30"), 401, "Unauthorized") // the third in a row
		wantStatus(t, from("10.0.0.1:1000", "garbage-31"), 429, "TooManyRequests")
	})
}

// postFrom posts a trigger of ns/a with token tok from addr.
func postFrom(e *handlerEnv, addr, tok string) *httptest.ResponseRecorder {
	r := httptest.NewRequest(http.MethodPost, "/reconcile/ns/a", nil)
	r.RemoteAddr, r.Header = addr, bearer(tok)
	w := httptest.NewRecorder()
	e.h.ServeHTTP(w, r)
	return w
}

// A flood of refusals is a few log lines: the first of each status code
// every 10s, the next one with the number left out.
func TestRefusalsAreLoggedOncePerIntervalWithACount(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		var logs bytes.Buffer
		e := newHandlerEnv(t, func(c *trigger.HandlerConfig) {
			c.Authenticator = refuseAll{}
			c.Logger = slog.New(slog.NewTextHandler(&logs, nil))
		})
		for range 100 {
			wantStatus(t, post(e, "/reconcile/ns/a"), 401, "Unauthorized")
		}
		if n := strings.Count(logs.String(), "\n"); n != 1 {
			t.Fatalf("%d log lines for 100 refusals within 10s, want 1:\n%s", n, logs.String())
		}
		time.Sleep(10 * time.Second)
		wantStatus(t, post(e, "/reconcile/ns/a"), 401, "Unauthorized")
		if !strings.Contains(logs.String(), "suppressed=99") {
			t.Errorf("the next interval's line does not count the 99 left out:\n%s", logs.String())
		}
	})
}

type refuseAll struct{}

func (refuseAll) Authorize(context.Context, trigger.AuthRequest) (string, error) {
	return "", fmt.Errorf("%w: no", trigger.ErrUnauthenticated)
}

// A reason must be valid UTF-8 wherever it comes from: raw bytes, or an
// escaped lone surrogate that encoding/json would turn into U+FFFD.
func TestAReasonInTheBodyMustBeValidUTF8(t *testing.T) {
	e := newHandlerEnv(t, nil)
	body := func(s string) *httptest.ResponseRecorder {
		return e.do(http.MethodPost, "/reconcile/ns/a", strings.NewReader(s), http.Header{"Content-Type": {"application/json"}})
	}
	wantStatus(t, body("{\"reason\": \"bad \xff byte\"}"), 400, "BadRequest")
	wantStatus(t, body(`{"reason": "lone \ud800 surrogate"}`), 400, "BadRequest")
	if e.q.Len() != 0 {
		t.Fatalf("queued %d entries for invalid reasons", e.q.Len())
	}
	if w := body(`{"reason": "a replacement character \ufffd, escaped, and \uD83D\uDE00"}`); w.Code != http.StatusAccepted {
		t.Fatalf("valid escapes: %d %s", w.Code, w.Body)
	}
	it, _ := e.q.Get(context.Background())
	if r := it.Value.Reasons; len(r) != 1 || r[0] != "a replacement character \ufffd, escaped, and \U0001F600" {
		t.Errorf("reasons %q", r)
	}
}

// An error reading the body names the connection's addresses; the answer
// does not.
func TestAnAnswerNamesNoAddress(t *testing.T) {
	e := newHandlerEnv(t, nil)
	r := io.MultiReader(strings.NewReader(`{"rea`), errReader{errors.New("read tcp 127.0.0.1:8443->10.1.2.3:50000: connection reset by peer")})
	st := wantStatus(t, e.do(http.MethodPost, "/reconcile/ns/a", r, http.Header{"Content-Type": {"application/json"}}), 400, "BadRequest")
	if strings.Contains(st.Message, "127.0.0.1") || strings.Contains(st.Message, "10.1.2.3") {
		t.Errorf("message %q names an address", st.Message)
	}
}

type errReader struct{ err error }

func (r errReader) Read([]byte) (int, error) { return 0, r.err }

// rawRequest sends a POST with the given headers (and Content-Length) but
// only part of its body over a new connection to srv, and returns the
// connection.
func rawRequest(t *testing.T, addr, path string, contentLength int, sent string) net.Conn {
	t.Helper()
	c, err := net.Dial("tcp", addr)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	fmt.Fprintf(c, "POST %s HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nContent-Length: %d\r\n\r\n%s", path, contentLength, sent)
	return c
}

// readResponse reads one response from c, failing the test if none comes
// within a generous deadline.
func readResponse(t *testing.T, c net.Conn) (*http.Response, Status) {
	t.Helper()
	_ = c.SetReadDeadline(time.Now().Add(time.Minute))
	resp, err := http.ReadResponse(bufio.NewReader(c), nil)
	if err != nil {
		t.Fatalf("no answer: %v", err)
	}
	defer resp.Body.Close()
	var st Status
	if err := json.NewDecoder(resp.Body).Decode(&st); err != nil {
		t.Fatalf("answer %d is not JSON: %v", resp.StatusCode, err)
	}
	return resp, st
}

// Status is trigger.Status as decoded here.
type Status = trigger.Status

// A client that sends its body slowly holds no in-flight slot: others are
// served meanwhile, and it gets 408 once BodyTimeout has passed. An answer
// given before the body was read does not wait for it.
func TestASlowBodyHoldsNothingAndAnEarlyAnswerDoesNotWaitForIt(t *testing.T) {
	e := newHandlerEnv(t, func(c *trigger.HandlerConfig) {
		c.MaxInFlight, c.BodyTimeout, c.RateLimit, c.RateBurst = 1, 500*time.Millisecond, 1e-3, 2
	})
	srv := httptest.NewServer(e.h) // no ReadTimeout: only the handler bounds the body
	defer srv.Close()
	addr := strings.TrimPrefix(srv.URL, "http://")

	slow := rawRequest(t, addr, "/reconcile/ns/a", 100, `{"reason": "sl`)
	resp, err := http.Post(srv.URL+"/reconcile/ns/a", "", nil)
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusAccepted {
		t.Fatalf("a request beside a slow body got %d, want 202: the slow one held the only slot", resp.StatusCode)
	}
	if resp, st := readResponse(t, slow); resp.StatusCode != http.StatusRequestTimeout || st.Reason != "RequestTimeout" {
		t.Errorf("the slow body got %d %s, want 408 RequestTimeout", resp.StatusCode, st.Reason)
	}

	// The rate limit (burst 2) is spent now: the next request is refused
	// before its body is read, and the answer must not wait for a body
	// that never comes.
	never := rawRequest(t, addr, "/reconcile/ns/a", 100, "")
	resp, st := readResponse(t, never)
	if resp.StatusCode != http.StatusTooManyRequests || !resp.Close {
		t.Errorf("refused before its body: %d (close %v) %s, want 429 and the connection closed", resp.StatusCode, resp.Close, st.Message)
	}
}

// Headers over ServerConfig.MaxHeaderBytes get 431 as a Status, like every
// other refusal.
func TestOversizedHeadersGetAStatus(t *testing.T) {
	e := newHandlerEnv(t, nil)
	s, err := trigger.NewServer(trigger.ServerConfig{Handler: e.h, MaxHeaderBytes: 1024, Logger: discard})
	if err != nil {
		t.Fatal(err)
	}
	req, _ := http.NewRequest(http.MethodPost, "http://"+serveOn(t, s)+"/reconcile/ns/a", nil)
	req.Header.Set("X-Padding", strings.Repeat("p", 2000))
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	var st Status
	if err := json.NewDecoder(resp.Body).Decode(&st); err != nil || resp.StatusCode != http.StatusRequestHeaderFieldsTooLarge || st.Reason != "RequestHeaderFieldsTooLarge" {
		t.Fatalf("got %d %+v (%v), want 431 with a Status", resp.StatusCode, st, err)
	}
	if e.q.Len() != 0 {
		t.Error("queued")
	}
}

// The consumer waits for a token of the trigger budget before it receives
// a message, rather than handing messages back (which would only bring the
// next one at once): a backlog waits in the broker and drains at Rate,
// each message settled once.
func TestTheConsumerWaitsForTheTriggerBudget(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		e := newConsumerEnvWith(t, func(c *trigger.Config[*corev1.ConfigMap]) { c.Rate, c.Burst = 1, 1 },
			func(c *trigger.ConsumerConfig[*corev1.ConfigMap]) { c.Concurrency = 4 })
		var ids []uint64
		for i := range 6 {
			name := fmt.Sprintf("obj-%d", i)
			e.objs.exist[opkit.Key{Namespace: "ns", Name: name}] = true
			ids = append(ids, e.b.Publish(fmt.Appendf(nil, `{"namespace":"ns","name":%q}`, name)))
		}
		start := time.Now()
		stop := e.run(t)
		defer stop()
		for e.q.Len() < len(ids) {
			time.Sleep(100 * time.Millisecond)
		}
		if took := time.Since(start); took < 5*time.Second {
			t.Errorf("6 new reconciles at 1 a second (burst 1) took %v, want at least 5s", took)
		}
		synctest.Wait()
		for _, id := range ids {
			if got := ops(e.b.Events(id)); got != "Ack:Scheduled" && got != "Ack" {
				t.Errorf("message %d settled as %q, want one Ack", id, got)
			}
		}
	})
}

// A trigger for a key whose entry waits for its due time (a retry's
// backoff, a requeue) joins it for free only when it would not make it
// sooner; to make it due now it is read and added as any trigger, for a
// token of the budget, and without one it is refused (ErrBusy): a
// trigger alone never starts a reconcile sooner for free.
func TestATriggerMakesAWaitingEntryDueOnlyForAToken(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		anything := func(_ context.Context, k opkit.Key) (*corev1.ConfigMap, error) { return cm(k.Namespace, k.Name), nil }
		tr, q := newCMTriggerWith(t, trigger.Config[*corev1.ConfigMap]{Get: anything, Rate: 1, Burst: 1})
		a := opkit.Key{Namespace: "ns", Name: "a"}
		q.Add(a, opkit.Cause[*corev1.ConfigMap]{}, queue.AddOptions{Delay: time.Hour}) // a retry, an hour away
		try := func(want error) {
			t.Helper()
			if _, o, err := intake(tr, context.Background(), trigger.Pointer{Key: a}, trigger.IntakeOptions{}); !errors.Is(err, want) || want == nil && o != queue.Merged {
				t.Fatalf("Intake = %v, %v; want Merged, or %v", o, err, want)
			}
		}
		due := func() bool {
			ctx, cancel := context.WithTimeout(context.Background(), time.Second)
			defer cancel()
			it, err := q.Get(ctx)
			if err == nil {
				q.Done(it.Key)
				q.Add(a, opkit.Cause[*corev1.ConfigMap]{}, queue.AddOptions{Delay: time.Hour})
			}
			return err == nil
		}
		try(nil) // the budget's one token: due now
		if !due() {
			t.Fatal("a paid trigger left the entry an hour away")
		}
		try(trigger.ErrBusy) // no token left: refused, still an hour away
		if _, o, err := intake(tr, context.Background(), trigger.Pointer{Key: a, Delay: 2 * time.Hour}, trigger.IntakeOptions{}); err != nil || o != queue.Merged {
			t.Fatalf("a trigger due later than the entry: %v, %v; want it joined for free", o, err)
		}
		if due() {
			t.Fatal("a trigger without a token made the entry due")
		}
	})
}
