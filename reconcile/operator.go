package reconcile

// The assembly of a whole operator: controllers, their HTTP trigger
// endpoint with forwarding, other components and health, in the order
// that stops them right.

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"os"
	"strings"
	"sync/atomic"

	"github.com/opkit/opkit"
	"github.com/opkit/opkit/trigger"
)

// Part is a controller as an [Operator] runs it: a *Controller[T] of any
// T.
type Part interface {
	part() part
}

// part is what an Operator needs of a controller.
type part struct {
	resource opkit.Resource
	runnable Runnable
	handler  func(trigger.HandlerConfig) (http.Handler, error)
	publish  func(url string)
}

func (c *Controller[T]) part() part {
	return part{resource: c.cfg.Resource, runnable: c.Runnable(), publish: c.publishEndpoint,
		handler: func(cfg trigger.HandlerConfig) (http.Handler, error) { return trigger.NewHandler(c.trig, cfg) }}
}

// OperatorConfig configures an [Operator]: Controllers (one at least),
// their Triggers (one server, under "/{resource}.{group}" with several),
// Components (a consumer, a metrics server), HealthAddr (/healthz,
// /readyz).
type OperatorConfig struct {
	Controllers []Part
	Triggers    *TriggerEndpoint
	Components  []Runnable
	HealthAddr  string
	Logger      *slog.Logger
}

// EndpointAnnotation is the Lease annotation of the trigger endpoint's URL.
const EndpointAnnotation = "trigger.opkit.dev/endpoint"

// TriggerEndpoint is an Operator's trigger endpoint: Server (the Handler
// set), each controller's Handler, and the URL each replica publishes for
// the others (empty: http(s)://host:port, the host $POD_IP, else the
// listen address's, else the hostname). NoServer: TriggerHandler is yours.
type TriggerEndpoint struct {
	Server       trigger.ServerConfig
	Handler      trigger.HandlerConfig
	AdvertiseURL string
	NoServer     bool
}

// Operator runs controllers, their trigger endpoint, other components and
// health endpoints as one [Group], stopped in the order that loses
// nothing: servers, components, then controllers (they drain).
type Operator struct {
	cfg      OperatorConfig
	group    *Group
	handler  http.Handler    // nil without Triggers
	server   *trigger.Server // nil without Triggers, or with NoServer
	parts    []part
	listener net.Listener
	url      atomic.Pointer[string] // advertised, once bound
}

// NewOperator validates cfg and builds the operator; it binds no port.
func NewOperator(cfg OperatorConfig) (*Operator, error) {
	if len(cfg.Controllers) == 0 {
		return nil, errors.New("reconcile: an Operator needs at least one controller")
	}
	o := &Operator{cfg: cfg, group: NewGroup(GroupConfig{Logger: cfg.Logger})}
	for _, c := range cfg.Controllers {
		p := c.part()
		o.parts = append(o.parts, p)
		if err := o.group.Add(p.runnable); err != nil {
			return nil, err
		}
	}
	if err := o.group.Add(cfg.Components...); err != nil {
		return nil, err
	}
	if cfg.Triggers != nil {
		if err := o.buildTriggers(); err != nil {
			return nil, err
		}
	}
	if cfg.HealthAddr != "" {
		if err := o.group.Add(o.group.HealthServer(cfg.HealthAddr)); err != nil {
			return nil, err
		}
	}
	return o, nil
}

// buildTriggers builds the trigger server over every controller's
// endpoint.
func (o *Operator) buildTriggers() error {
	mux := http.NewServeMux()
	for _, p := range o.parts {
		h, err := p.handler(o.cfg.Triggers.Handler)
		if err != nil {
			return err
		}
		if len(o.parts) == 1 {
			mux.Handle("/", h)
			break
		}
		prefix := "/" + p.resource.GroupResource().String()
		mux.Handle(prefix+"/", http.StripPrefix(prefix, h))
	}
	o.handler = mux
	if o.cfg.Triggers.NoServer {
		return nil
	}
	scfg := o.cfg.Triggers.Server
	scfg.Handler, scfg.Logger = mux, cmp.Or(scfg.Logger, o.cfg.Logger)
	srv, err := trigger.NewServer(scfg)
	if err != nil {
		return err
	}
	o.server = srv
	return o.group.Add(Runnable{Name: "trigger server", Run: func(ctx context.Context) error { return srv.Serve(ctx, o.listener) }})
}

// Group returns the operator's components, for their readiness.
func (o *Operator) Group() *Group { return o.group }

// TriggerHandler returns the controllers' trigger endpoint.
func (o *Operator) TriggerHandler() http.Handler { return o.handler }

// TriggerURL returns the URL Run published ("" before).
func (o *Operator) TriggerURL() string {
	if u := o.url.Load(); u != nil {
		return *u
	}
	return ""
}

// Run runs every component until ctx ends (nil) or one fails; once.
func (o *Operator) Run(ctx context.Context) error {
	if o.server != nil {
		scfg := o.cfg.Triggers.Server
		tls := scfg.CertFile != ""
		addr := cmp.Or(scfg.Addr, map[bool]string{true: ":8443", false: ":8080"}[tls])
		ln, err := new(net.ListenConfig).Listen(ctx, "tcp", addr)
		if err != nil {
			return fmt.Errorf("reconcile: trigger endpoint: %w", err)
		}
		o.listener = ln
		url := advertise(o.cfg.Triggers, ln.Addr(), tls)
		o.url.Store(&url)
		for _, p := range o.parts {
			p.publish(url)
		}
		cmp.Or(o.cfg.Logger, slog.Default()).Info("trigger endpoint", "listen", ln.Addr().String(), "advertise", url)
	}
	return o.group.Run(ctx)
}

// advertise is the base URL of this replica's trigger endpoint, which
// listens on addr (see TriggerEndpoint.AdvertiseURL).
func advertise(t *TriggerEndpoint, addr net.Addr, tls bool) string {
	if t.AdvertiseURL != "" {
		return t.AdvertiseURL
	}
	scheme := "http"
	if tls {
		scheme = "https"
	}
	host, port, _ := net.SplitHostPort(addr.String())
	if ip := net.ParseIP(host); ip == nil || ip.IsUnspecified() {
		host, _ = os.Hostname()
	}
	if ip := os.Getenv("POD_IP"); ip != "" {
		host = ip
	}
	return scheme + "://" + net.JoinHostPort(strings.Trim(host, "[]"), port)
}
