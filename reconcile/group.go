package reconcile

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"sync"

	"golang.org/x/sync/errgroup"
)

// Runnable is one named component of a [Group]: a controller, the trigger
// HTTP server, a message consumer, a metrics or health server.
type Runnable struct {
	// Name identifies the component in logs, errors and readiness reports.
	// Required, unique within a group.
	Name string
	// Run blocks until ctx is cancelled (then it returns nil) or the
	// component fails (then it returns the error). Returning nil before
	// ctx ends means "finished", not a failure. Required.
	Run func(ctx context.Context) error
	// Ready reports whether the component is ready to serve; nil means
	// ready whenever it is running. Called from HTTP handler goroutines: it
	// must be safe for concurrent use and quick.
	Ready func() error
	// LeaderOnly components run only while this replica leads: a Group
	// hands them to its Leader (see [GroupConfig]). Others (trigger
	// endpoint, health, metrics) run on every replica.
	LeaderOnly bool
}

// TermHost runs leader-only components inside its leadership terms.
// *Controller implements it.
type TermHost interface {
	AddTermWork(r Runnable) error
}

// GroupConfig configures a [Group].
type GroupConfig struct {
	// Leader runs the LeaderOnly components (typically the controller that
	// holds the leader elector). Required only if a LeaderOnly component is
	// added.
	Leader TermHost
	// Logger receives start, stop and failure lines; nil means slog.Default().
	Logger *slog.Logger
}

// Group runs components as one unit, on errgroup: the first component to
// fail stops the others, one at a time in reverse order of registration
// (each one's context is cancelled and it is waited for before the next),
// so that, say, the trigger endpoint stops before the controller it feeds.
// Cancelling Run's context stops them the same way. Readiness reports each
// component by name.
//
// Goroutines: Run owns one goroutine per component plus the one that
// orders the shutdown; all have returned when Run returns.
type Group struct {
	cfg GroupConfig
	log *slog.Logger

	mu      sync.Mutex
	items   []*member
	started bool
}

type member struct {
	r       Runnable
	state   memberState
	err     error
	stopped chan struct{} // closed when Run returned
}

type memberState uint8

const (
	stateNew memberState = iota
	stateRunning
	stateFinished // returned nil before shutdown
	stateStopped
	stateFailed
)

// NewGroup returns an empty group.
func NewGroup(cfg GroupConfig) *Group {
	log := cfg.Logger
	if log == nil {
		log = slog.Default()
	}
	return &Group{cfg: cfg, log: log}
}

// Add registers components. It must be called before Run. A LeaderOnly
// component is registered with the Leader (it runs in its terms), and its
// readiness is still reported by the group, under its name.
func (g *Group) Add(rs ...Runnable) error {
	g.mu.Lock()
	defer g.mu.Unlock()
	if g.started {
		return errors.New("reconcile: group already running")
	}
	for _, r := range rs {
		if r.Name == "" || r.Run == nil {
			return errors.New("reconcile: a group component needs a Name and a Run func")
		}
		for _, m := range g.items {
			if m.r.Name == r.Name {
				return fmt.Errorf("reconcile: group component %q added twice", r.Name)
			}
		}
		if r.LeaderOnly {
			if g.cfg.Leader == nil {
				return fmt.Errorf("reconcile: leader-only component %q needs GroupConfig.Leader", r.Name)
			}
			if err := g.cfg.Leader.AddTermWork(r); err != nil {
				return fmt.Errorf("reconcile: leader-only component %q: %w", r.Name, err)
			}
		}
		g.items = append(g.items, &member{r: r, stopped: make(chan struct{})})
	}
	return nil
}

// Run starts every component that is not LeaderOnly and blocks until ctx
// is cancelled or one fails; then it stops the rest in reverse order of
// registration and returns the first failure (nil after a plain
// cancellation). A group runs once.
func (g *Group) Run(ctx context.Context) error {
	g.mu.Lock()
	if g.started {
		g.mu.Unlock()
		return errors.New("reconcile: group already running")
	}
	g.started = true
	var members []*member
	for _, m := range g.items {
		if !m.r.LeaderOnly {
			members = append(members, m)
			m.state = stateRunning
		}
	}
	g.mu.Unlock()

	eg, egCtx := errgroup.WithContext(ctx)
	ctxs := make([]context.Context, len(members))
	cancels := make([]context.CancelFunc, len(members))
	for i := range members {
		ctxs[i], cancels[i] = context.WithCancel(context.WithoutCancel(ctx))
	}
	for i, m := range members {
		g.log.Info("component starting", "component", m.r.Name)
		eg.Go(func() error {
			defer close(m.stopped)
			err := m.r.Run(ctxs[i])
			g.mu.Lock()
			defer g.mu.Unlock()
			switch {
			case ctxs[i].Err() != nil:
				m.state, m.err = stateStopped, err
			case err != nil:
				m.state, m.err = stateFailed, err
				g.log.Error("component failed", "component", m.r.Name, "err", err)
				return fmt.Errorf("reconcile: component %s: %w", m.r.Name, err)
			default:
				m.state = stateFinished
				g.log.Info("component finished", "component", m.r.Name)
			}
			return nil
		})
	}
	// The shutdown order: once the first failure (or ctx) ends egCtx,
	// stop the components last-registered first, each awaited in turn.
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

// ComponentStatus is one component's line in a readiness report.
type ComponentStatus struct {
	// Name is the component's name, as given to the group.
	Name string
	// Err is nil when the component is ready.
	Err error
}

// Check reports every component by name, in registration order: not
// started, finished, stopped or failed components are not ready; running
// ones are ready unless their Ready func says otherwise. LeaderOnly
// components are reported through their Ready func only.
func (g *Group) Check() []ComponentStatus {
	g.mu.Lock()
	type snap struct {
		name  string
		state memberState
		err   error
		ready func() error
		lo    bool
	}
	snaps := make([]snap, len(g.items))
	for i, m := range g.items {
		snaps[i] = snap{m.r.Name, m.state, m.err, m.r.Ready, m.r.LeaderOnly}
	}
	g.mu.Unlock()
	out := make([]ComponentStatus, len(snaps))
	for i, s := range snaps {
		var err error
		switch {
		case s.lo:
		case s.state == stateNew:
			err = errors.New("not started")
		case s.state == stateFinished:
			err = errors.New("finished")
		case s.state == stateStopped:
			err = errors.New("stopped")
		case s.state == stateFailed:
			err = fmt.Errorf("failed: %w", s.err)
		}
		if err == nil && s.ready != nil {
			err = s.ready()
		}
		out[i] = ComponentStatus{Name: s.name, Err: err}
	}
	return out
}

// Ready returns nil if every component is ready, otherwise an error naming
// each one that is not.
func (g *Group) Ready() error {
	var errs []error
	for _, s := range g.Check() {
		if s.Err != nil {
			errs = append(errs, fmt.Errorf("%s: %w", s.Name, s.Err))
		}
	}
	return errors.Join(errs...)
}

// ReadyzHandler serves the readiness report: 200 when every component is
// ready, 503 otherwise; the body has one line per component,
// "ok <name>" or "fail <name>: <reason>".
func (g *Group) ReadyzHandler() http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) {
		st := g.Check()
		code := http.StatusOK
		for _, s := range st {
			if s.Err != nil {
				code = http.StatusServiceUnavailable
			}
		}
		w.Header().Set("Content-Type", "text/plain; charset=utf-8")
		w.Header().Set("X-Content-Type-Options", "nosniff")
		w.WriteHeader(code)
		for _, s := range st {
			if s.Err != nil {
				fmt.Fprintf(w, "fail %s: %v\n", s.Name, s.Err)
			} else {
				fmt.Fprintf(w, "ok %s\n", s.Name)
			}
		}
	})
}

// HealthzHandler serves liveness: 200 "ok" while no component has failed,
// 503 naming the failed ones otherwise. Readiness problems (not synced, a
// follower) do not make a process unhealthy.
func (g *Group) HealthzHandler() http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) {
		g.mu.Lock()
		var failed []string
		for _, m := range g.items {
			if m.state == stateFailed {
				failed = append(failed, fmt.Sprintf("fail %s: %v", m.r.Name, m.err))
			}
		}
		g.mu.Unlock()
		w.Header().Set("Content-Type", "text/plain; charset=utf-8")
		if len(failed) > 0 {
			w.WriteHeader(http.StatusServiceUnavailable)
			for _, f := range failed {
				fmt.Fprintln(w, f)
			}
			return
		}
		io.WriteString(w, "ok\n")
	})
}
