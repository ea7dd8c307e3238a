package leader_test

// Tests of Elector.Publish: a replica replaces what it publishes on the
// Lease after New, e.g. its trigger endpoint's URL once its listener is
// bound.

import (
	"maps"
	"testing"
	"testing/synctest"
	"time"

	"github.com/opkit/opkit/leader"
)

const endpointAnnotation = "trigger.opkit.dev/endpoint"

// published returns the annotations to expect on a Lease whose holder
// publishes own: own and the bookkeeping of their names.
func published(own map[string]string, names string) map[string]string {
	want := maps.Clone(own)
	want[leader.PublishedAnnotation] = names
	return want
}

// A set published before Run replaces Config.Annotations: it is what the
// acquiring write carries, and the caller's map is copied.
func TestPublishBeforeRunIsWhatTheAcquisitionWrites(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		e := newEnv(t)
		a := e.prepare("a", func(c *leader.Config) {
			c.Annotations = map[string]string{"old.example/endpoint": "https://0.0.0.0:0"}
		}, nil)
		own := map[string]string{endpointAnnotation: "https://10.0.0.1:41023"}
		a.elector.Publish(own)
		own[endpointAnnotation] = "changed after Publish"
		a.run()
		synctest.Wait()

		l := e.api.lease()
		if holder(l) != "a" {
			t.Fatalf("holder = %q, want a", holder(l))
		}
		if n := countVerb(e.api.callsOf("a"), "update"); n != 0 {
			t.Fatalf("%d updates before the first renewal; want the Lease as created", n)
		}
		want := published(map[string]string{endpointAnnotation: "https://10.0.0.1:41023"}, endpointAnnotation)
		if !maps.Equal(l.Annotations, want) {
			t.Errorf("the created Lease carries %v, want %v", l.Annotations, want)
		}
		if got := a.elector.LeaderAnnotation(endpointAnnotation); got != "https://10.0.0.1:41023" {
			t.Errorf("the holder reads %q", got)
		}
		if err := a.stop(); err != nil {
			t.Errorf("Run = %v", err)
		}
	})
}

// A set published during a term is written by the next renewal, without
// a request of its own; a name no longer published is removed at that
// write, and both the holder and a follower read the new set.
func TestPublishDuringATermIsWrittenWithTheNextRenewal(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		e := newEnv(t)
		a := e.start("a", func(c *leader.Config) {
			c.Annotations = map[string]string{endpointAnnotation: "https://10.0.0.1:8443", "old.example/pid": "1"}
		}, nil)
		sleep(time.Second) // halfway to a's first renewal
		b := e.start("b", nil, nil)
		synctest.Wait()
		if !a.elector.IsLeader() || b.elector.LeaderAnnotation("old.example/pid") != "1" {
			t.Fatal("a should lead with its annotations published")
		}

		updates := countVerb(e.api.callsOf("a"), "update")
		own := map[string]string{endpointAnnotation: "https://10.0.0.1:41023"}
		a.elector.Publish(own)
		synctest.Wait()
		if n := countVerb(e.api.callsOf("a"), "update"); n != updates {
			t.Errorf("Publish sent %d requests of its own", n-updates)
		}
		if got := e.api.lease().Annotations["old.example/pid"]; got != "1" {
			t.Errorf("the Lease changed before the next renewal: old.example/pid = %q", got)
		}

		sleep(retryPeriod) // past a's first renewal
		if n := countVerb(e.api.callsOf("a"), "update"); n != updates+1 {
			t.Errorf("%d writes in one RetryPeriod, want the one renewal", n-updates)
		}
		if got, want := e.api.lease().Annotations, published(own, endpointAnnotation); !maps.Equal(got, want) {
			t.Errorf("after the renewal the Lease carries %v, want %v", got, want)
		}
		for _, r := range []*replica{a, b} {
			if got := r.elector.LeaderAnnotation(endpointAnnotation); got != "https://10.0.0.1:41023" {
				t.Errorf("%s reads the endpoint %q, want the one published", r.name, got)
			}
			if got := r.elector.LeaderAnnotation("old.example/pid"); got != "" {
				t.Errorf("%s still reads the removed name: %q", r.name, got)
			}
		}
		if err := a.stop(); err != nil {
			t.Errorf("Run = %v", err)
		}
		b.stop()
	})
}

// A follower's Publish has nothing to write until it acquires the Lease:
// its acquisition then carries the new set, not Config.Annotations.
func TestPublishWhileFollowingIsWrittenByTheNextAcquisition(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		e := newEnv(t)
		a := e.start("a", nil, nil)
		sleep(time.Second)
		b := e.start("b", func(c *leader.Config) {
			c.Annotations = map[string]string{endpointAnnotation: "https://0.0.0.0:0"}
		}, nil)
		synctest.Wait()
		own := map[string]string{endpointAnnotation: "https://10.0.0.2:41023"}
		b.elector.Publish(own)
		synctest.Wait()
		if b.elector.IsLeader() || len(e.api.lease().Annotations) != 0 {
			t.Fatalf("b leads %v, the Lease carries %v; want a leading, nothing published",
				b.elector.IsLeader(), e.api.lease().Annotations)
		}

		if err := a.stop(); err != nil { // releases the Lease; b takes it at once
			t.Fatal(err)
		}
		synctest.Wait()
		if !b.elector.IsLeader() {
			t.Fatalf("b did not take the released Lease; journal:\n%s", e.j)
		}
		if got, want := e.api.lease().Annotations, published(own, endpointAnnotation); !maps.Equal(got, want) {
			t.Errorf("b's acquisition wrote %v, want %v", got, want)
		}
		b.stop()
	})
}
