package reconcile

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"slices"
	"strings"
	"sync"
	"time"

	"golang.org/x/sync/errgroup"
)

// Runnable is a component of a [Group]: a unique Name, and Run, which
// returns when ctx ends (nil) or it fails; Ready, if set, is quick; a
// LeaderOnly one runs in the Leader's terms.
type Runnable struct {
	Name       string
	Run        func(ctx context.Context) error
	Ready      func() error
	LeaderOnly bool
}

// TermHost runs leader-only components in its terms: a *Controller.
type TermHost interface {
	AddTermWork(r Runnable) error
}

// GroupConfig configures a [Group]: the Leader of its LeaderOnly ones.
type GroupConfig struct {
	Leader TermHost
	Logger *slog.Logger
}

// Group runs components as one unit: the first to fail, or the end of
// Run's context, stops them one at a time, in reverse order.
type Group struct {
	cfg GroupConfig
	log *slog.Logger

	mu      sync.Mutex
	items   []*member
	started bool
}

// member is a component and what became of it: down is nil while it runs
// (its Ready decides), else why it is not ready.
type member struct {
	r       Runnable
	down    error
	failed  bool
	stopped chan struct{} // closed when its Run returned
}

// NewGroup returns an empty group.
func NewGroup(cfg GroupConfig) *Group {
	return &Group{cfg: cfg, log: cmp.Or(cfg.Logger, slog.Default())}
}

// Add registers components before Run (a LeaderOnly one with the
// Leader).
func (g *Group) Add(rs ...Runnable) error {
	g.mu.Lock()
	defer g.mu.Unlock()
	for _, r := range rs {
		switch {
		case g.started:
			return errors.New("reconcile: group already running")
		case r.Name == "" || r.Run == nil:
			return errors.New("reconcile: a group component needs a Name and a Run func")
		case slices.ContainsFunc(g.items, func(m *member) bool { return m.r.Name == r.Name }):
			return fmt.Errorf("reconcile: group component %q added twice", r.Name)
		case r.LeaderOnly && g.cfg.Leader == nil:
			return fmt.Errorf("reconcile: leader-only component %q needs GroupConfig.Leader", r.Name)
		}
		m := &member{r: r, down: errors.New("not started"), stopped: make(chan struct{})}
		if r.LeaderOnly {
			m.down = nil // the group never runs it: its Ready decides
			if err := g.cfg.Leader.AddTermWork(r); err != nil {
				return fmt.Errorf("reconcile: leader-only component %q: %w", r.Name, err)
			}
		}
		g.items = append(g.items, m)
	}
	return nil
}

// Run runs the components until ctx ends or one fails, stops them all
// and returns the first failure. A group runs once.
func (g *Group) Run(ctx context.Context) error {
	g.mu.Lock()
	if g.started {
		g.mu.Unlock()
		return errors.New("reconcile: group already running")
	}
	g.started = true
	// The LeaderOnly components run in the Leader's terms.
	members := slices.DeleteFunc(slices.Clone(g.items), func(m *member) bool { return m.r.LeaderOnly })
	for _, m := range members {
		m.down = nil
	}
	g.mu.Unlock()

	eg, egCtx := errgroup.WithContext(ctx)
	cancels := make([]context.CancelFunc, len(members))
	for i, m := range members {
		mctx, cancel := context.WithCancel(context.WithoutCancel(ctx))
		cancels[i] = cancel
		g.log.Info("component starting", "component", m.r.Name)
		eg.Go(func() error {
			defer close(m.stopped)
			err := m.r.Run(mctx)
			g.mu.Lock()
			defer g.mu.Unlock()
			switch {
			case mctx.Err() != nil:
				m.down = errors.New("stopped")
			case err != nil:
				m.down, m.failed = fmt.Errorf("failed: %w", err), true
				g.log.Error("component failed", "component", m.r.Name, "err", err)
				return fmt.Errorf("reconcile: component %s: %w", m.r.Name, err)
			default:
				m.down = errors.New("finished")
				g.log.Info("component finished", "component", m.r.Name)
			}
			return nil
		})
	}
	eg.Go(func() error {
		<-egCtx.Done()
		for i := len(members) - 1; i >= 0; i-- {
			cancels[i]()
			<-members[i].stopped
			g.log.Info("component stopped", "component", members[i].r.Name)
		}
		return nil
	})
	return eg.Wait()
}

// ComponentStatus is a component's readiness: nil Err when ready.
type ComponentStatus struct {
	Name string
	Err  error
}

// Check reports every component in registration order: one that does not
// run is not ready; one that runs (a LeaderOnly one always) is as its
// Ready says.
func (g *Group) Check() []ComponentStatus {
	g.mu.Lock()
	defer g.mu.Unlock()
	out := make([]ComponentStatus, len(g.items))
	for i, m := range g.items {
		err := m.down
		if err == nil && m.r.Ready != nil {
			err = m.r.Ready()
		}
		out[i] = ComponentStatus{Name: m.r.Name, Err: err}
	}
	return out
}

// Ready returns an error naming each component that is not ready.
func (g *Group) Ready() error {
	var errs []error
	for _, s := range g.Check() {
		if s.Err != nil {
			errs = append(errs, fmt.Errorf("%s: %w", s.Name, s.Err))
		}
	}
	return errors.Join(errs...)
}

// ReadyzHandler serves Check: 200 when every component is ready, else
// 503, with a line "ok <name>" or "fail <name>: <reason>" for each.
func (g *Group) ReadyzHandler() http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) {
		var b strings.Builder
		code := http.StatusOK
		for _, s := range g.Check() {
			line := "ok " + s.Name
			if s.Err != nil {
				code, line = http.StatusServiceUnavailable, fmt.Sprintf("fail %s: %v", s.Name, s.Err)
			}
			fmt.Fprintln(&b, line)
		}
		plain(w, code, b.String())
	})
}

// HealthzHandler serves liveness: 200 while no component has failed, else
// 503 naming the failed ones.
func (g *Group) HealthzHandler() http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) {
		g.mu.Lock()
		var b strings.Builder
		for _, m := range g.items {
			if m.failed {
				fmt.Fprintf(&b, "fail %s: %v\n", m.r.Name, m.down)
			}
		}
		g.mu.Unlock()
		if b.Len() > 0 {
			plain(w, http.StatusServiceUnavailable, b.String())
			return
		}
		plain(w, http.StatusOK, "ok\n")
	})
}

// HealthServer returns a component that serves /healthz and /readyz on
// addr (such as ":8081"), to add to the group it reports on.
func (g *Group) HealthServer(addr string) Runnable {
	return Runnable{Name: "health server", Run: func(ctx context.Context) error {
		mux := http.NewServeMux()
		mux.Handle("GET /healthz", g.HealthzHandler())
		mux.Handle("GET /readyz", g.ReadyzHandler())
		srv := &http.Server{Addr: addr, Handler: mux, ReadHeaderTimeout: 5 * time.Second, ErrorLog: slog.NewLogLogger(g.log.Handler(), slog.LevelWarn)}
		served := make(chan error, 1)
		go func() { served <- srv.ListenAndServe() }()
		select {
		case err := <-served:
			return fmt.Errorf("health server: %w", err)
		case <-ctx.Done():
		}
		shutdown, cancel := context.WithTimeout(context.WithoutCancel(ctx), 5*time.Second)
		defer cancel()
		if err := srv.Shutdown(shutdown); err != nil {
			srv.Close()
		}
		<-served
		return nil
	}}
}

func plain(w http.ResponseWriter, code int, body string) {
	w.Header().Set("Content-Type", "text/plain; charset=utf-8")
	w.Header().Set("X-Content-Type-Options", "nosniff")
	w.WriteHeader(code)
	io.WriteString(w, body)
}
