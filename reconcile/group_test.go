package reconcile_test

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"
	"testing/synctest"
	"time"

	"github.com/opkit/opkit/reconcile"
)

// component is a Runnable that blocks until stopped or told to fail,
// and logs when it stops.
type component struct {
	name string
	fail chan error
	log  *stopLog
}

type stopLog struct {
	mu    sync.Mutex
	order []string
}

func (l *stopLog) add(s string) { l.mu.Lock(); l.order = append(l.order, s); l.mu.Unlock() }
func (l *stopLog) get() []string {
	l.mu.Lock()
	defer l.mu.Unlock()
	return append([]string(nil), l.order...)
}

func (c *component) runnable() reconcile.Runnable {
	return reconcile.Runnable{Name: c.name, Run: func(ctx context.Context) error {
		select {
		case <-ctx.Done():
			c.log.add(c.name)
			return nil
		case err := <-c.fail:
			c.log.add(c.name + " failed")
			return err
		}
	}}
}

func newComponents(log *stopLog, names ...string) []*component {
	var cs []*component
	for _, n := range names {
		cs = append(cs, &component{name: n, fail: make(chan error, 1), log: log})
	}
	return cs
}

func TestGroupStopsTheOthersInReverseOrderWhenOneFails(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		log := &stopLog{}
		cs := newComponents(log, "controller", "consumer", "trigger-http", "health")
		g := reconcile.NewGroup(reconcile.GroupConfig{Logger: quiet})
		for _, c := range cs {
			if err := g.Add(c.runnable()); err != nil {
				t.Fatal(err)
			}
		}
		done := make(chan error, 1)
		go func() { done <- g.Run(context.Background()) }()
		synctest.Wait()
		if err := g.Ready(); err != nil {
			t.Fatalf("Ready while all run: %v", err)
		}
		boom := errors.New("broker permission denied")
		cs[1].fail <- boom
		err := <-done
		if !errors.Is(err, boom) || !strings.Contains(err.Error(), "consumer") {
			t.Fatalf("Run = %v, want the consumer's failure", err)
		}
		if got := fmt.Sprint(log.get()); got != "[consumer failed health trigger-http controller]" {
			t.Fatalf("stop order %s, want the failure, then the others last-registered first", got)
		}
		st := g.Check()
		if st[1].Name != "consumer" || st[1].Err == nil || !errors.Is(st[1].Err, boom) || st[0].Err == nil {
			t.Fatalf("Check after failure = %+v", st)
		}
	})
}

func TestGroupCancellationStopsEveryComponentInReverseOrder(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		log := &stopLog{}
		g := reconcile.NewGroup(reconcile.GroupConfig{Logger: quiet})
		for _, c := range newComponents(log, "a", "b", "c") {
			g.Add(c.runnable())
		}
		ctx, cancel := context.WithCancel(context.Background())
		done := make(chan error, 1)
		go func() { done <- g.Run(ctx) }()
		synctest.Wait()
		cancel()
		if err := <-done; err != nil {
			t.Fatalf("Run = %v, want nil after cancellation", err)
		}
		if got := fmt.Sprint(log.get()); got != "[c b a]" {
			t.Fatalf("stop order %s, want [c b a]", got)
		}
	})
}

func TestGroupReadinessNamesEachComponent(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		g := reconcile.NewGroup(reconcile.GroupConfig{Logger: quiet})
		log := &stopLog{}
		cs := newComponents(log, "controller", "trigger-http")
		notSynced := errors.New("not synced")
		r := cs[0].runnable()
		r.Ready = func() error { return notSynced }
		g.Add(r, cs[1].runnable())

		rr := httptest.NewRecorder()
		g.ReadyzHandler().ServeHTTP(rr, httptest.NewRequest("GET", "/readyz", nil))
		if rr.Code != 503 || !strings.Contains(rr.Body.String(), "fail trigger-http: not started") {
			t.Fatalf("before Run: %d %q", rr.Code, rr.Body.String())
		}

		ctx, cancel := context.WithCancel(context.Background())
		done := make(chan error, 1)
		go func() { done <- g.Run(ctx) }()
		synctest.Wait()
		rr = httptest.NewRecorder()
		g.ReadyzHandler().ServeHTTP(rr, httptest.NewRequest("GET", "/readyz", nil))
		if want := "fail controller: not synced\nok trigger-http\n"; rr.Code != 503 || rr.Body.String() != want {
			t.Fatalf("running: %d %q, want 503 %q", rr.Code, rr.Body.String(), want)
		}
		rr = httptest.NewRecorder()
		g.HealthzHandler().ServeHTTP(rr, httptest.NewRequest("GET", "/healthz", nil))
		if rr.Code != 200 {
			t.Fatalf("healthz %d while nothing failed", rr.Code)
		}
		cancel()
		<-done
	})
}

// termHost records leader-only work handed to it.
type termHost struct{ got []string }

func (h *termHost) AddTermWork(r reconcile.Runnable) error { h.got = append(h.got, r.Name); return nil }

func TestGroupHandsLeaderOnlyComponentsToTheLeader(t *testing.T) {
	g := reconcile.NewGroup(reconcile.GroupConfig{Logger: quiet})
	run := func(ctx context.Context) error { <-ctx.Done(); return nil }
	if err := g.Add(reconcile.Runnable{Name: "gc", Run: run, LeaderOnly: true}); err == nil {
		t.Fatal("leader-only component accepted without a Leader")
	}
	host := &termHost{}
	g = reconcile.NewGroup(reconcile.GroupConfig{Leader: host, Logger: quiet})
	if err := g.Add(reconcile.Runnable{Name: "gc", Run: run, LeaderOnly: true}, reconcile.Runnable{Name: "http", Run: run}); err != nil {
		t.Fatal(err)
	}
	if fmt.Sprint(host.got) != "[gc]" {
		t.Fatalf("leader got %v, want [gc]", host.got)
	}
	if err := g.Add(reconcile.Runnable{Name: "http", Run: run}); err == nil {
		t.Fatal("duplicate name accepted")
	}
}

// The health server serves the group's reports on its own port, and stops
// with the group.
func TestHealthServerServesTheGroupsReports(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := ln.Addr().String()
	ln.Close()
	g := reconcile.NewGroup(reconcile.GroupConfig{Logger: quiet})
	ready := errors.New("warming up")
	var mu sync.Mutex
	mustOK(t, g.Add(reconcile.Runnable{Name: "cache", Run: func(ctx context.Context) error { <-ctx.Done(); return nil },
		Ready: func() error { mu.Lock(); defer mu.Unlock(); return ready }}))
	mustOK(t, g.Add(g.HealthServer(addr)))
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- g.Run(ctx) }()
	get := func(path string) (int, string) {
		t.Helper()
		for range 100 { // until it listens
			resp, err := http.Get("http://" + addr + path)
			if err != nil {
				time.Sleep(10 * time.Millisecond)
				continue
			}
			defer resp.Body.Close()
			b, _ := io.ReadAll(resp.Body)
			return resp.StatusCode, string(b)
		}
		t.Fatalf("GET %s: the health server never answered", path)
		return 0, ""
	}
	if code, body := get("/readyz"); code != http.StatusServiceUnavailable || !strings.Contains(body, "fail cache: warming up") || !strings.Contains(body, "ok health server") {
		t.Fatalf("/readyz while warming up: %d %q", code, body)
	}
	if code, body := get("/healthz"); code != http.StatusOK || body != "ok\n" {
		t.Fatalf("/healthz: %d %q", code, body)
	}
	mu.Lock()
	ready = nil
	mu.Unlock()
	if code, _ := get("/readyz"); code != http.StatusOK {
		t.Fatalf("/readyz once ready: %d", code)
	}
	cancel()
	if err := <-done; err != nil {
		t.Fatalf("Run: %v", err)
	}
	if _, err := http.Get("http://" + addr + "/healthz"); err == nil {
		t.Fatal("the health server still answers after the group stopped")
	}
}

// A port the health server cannot bind fails it, and so the group.
func TestHealthServerFailsOnAPortInUse(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	g := reconcile.NewGroup(reconcile.GroupConfig{Logger: quiet})
	mustOK(t, g.Add(g.HealthServer(ln.Addr().String())))
	if err := g.Run(context.Background()); err == nil || !strings.Contains(err.Error(), "health server") {
		t.Fatalf("Run = %v, want the health server's bind failure", err)
	}
}

func mustOK(t *testing.T, err error) {
	t.Helper()
	if err != nil {
		t.Fatal(err)
	}
}
