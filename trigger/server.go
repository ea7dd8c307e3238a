package trigger

import (
	"cmp"
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"os"
	"sync"
	"time"
)

// errServerStopping is the cause of a request's context once its Server
// shuts down: the handler answers a caller still waiting 503 at once.
var errServerStopping = errors.New("trigger: the server is shutting down")

// ServerConfig configures a Server; a zero field means its default. It
// listens on Addr (":8443" with TLS, else ":8080") and serves Handler
// (required); with CertFile and KeyFile (PEM) it speaks HTTPS only and
// reloads them when they change; the timeouts are 5s, 10s, 30s and 60s,
// MaxHeaderBytes 16 KiB, ShutdownTimeout 10s, Logger slog.Default().
type ServerConfig struct {
	Addr                                                      string
	Handler                                                   http.Handler
	CertFile, KeyFile                                         string
	ReadHeaderTimeout, ReadTimeout, WriteTimeout, IdleTimeout time.Duration
	MaxHeaderBytes                                            int
	ShutdownTimeout                                           time.Duration
	Logger                                                    *slog.Logger
}

// Server serves the trigger endpoint, with a timeout on every phase of a
// request.
type Server struct {
	cfg   ServerConfig
	certs *certReloader // nil without TLS
}

// NewServer validates cfg, loads the certificate if any, and returns a
// Server.
func NewServer(cfg ServerConfig) (*Server, error) {
	switch {
	case cfg.Handler == nil:
		return nil, errors.New("trigger: ServerConfig.Handler is required")
	case (cfg.CertFile == "") != (cfg.KeyFile == ""):
		return nil, errors.New("trigger: ServerConfig needs both CertFile and KeyFile, or neither")
	case min(cfg.ReadHeaderTimeout, cfg.ReadTimeout, cfg.WriteTimeout, cfg.IdleTimeout, cfg.ShutdownTimeout) < 0:
		return nil, errors.New("trigger: ServerConfig timeouts must not be negative")
	}
	cfg.ReadHeaderTimeout = cmp.Or(cfg.ReadHeaderTimeout, 5*time.Second)
	cfg.ReadTimeout = cmp.Or(cfg.ReadTimeout, 10*time.Second)
	cfg.WriteTimeout = cmp.Or(cfg.WriteTimeout, 30*time.Second)
	cfg.IdleTimeout = cmp.Or(cfg.IdleTimeout, 60*time.Second)
	cfg.ShutdownTimeout = cmp.Or(cfg.ShutdownTimeout, 10*time.Second)
	cfg.MaxHeaderBytes = cmp.Or(cfg.MaxHeaderBytes, 16<<10)
	cfg.Logger = cmp.Or(cfg.Logger, slog.Default())
	s := &Server{cfg: cfg}
	if cfg.CertFile != "" {
		c := &certReloader{certFile: cfg.CertFile, keyFile: cfg.KeyFile, log: cfg.Logger}
		// Stamped before the load, so that a change in between is loaded
		// again; a missing file fails the load.
		c.loaded, _ = c.stamps()
		pair, err := tls.LoadX509KeyPair(cfg.CertFile, cfg.KeyFile)
		if err != nil {
			return nil, fmt.Errorf("trigger: certificate: %w", err)
		}
		c.cert = &pair
		s.certs = c
		s.cfg.Addr = cmp.Or(cfg.Addr, ":8443")
	}
	s.cfg.Addr = cmp.Or(s.cfg.Addr, ":8080")
	return s, nil
}

// Run listens on Addr and serves until ctx ends; see Serve.
func (s *Server) Run(ctx context.Context) error {
	ln, err := new(net.ListenConfig).Listen(ctx, "tcp", s.cfg.Addr)
	if err != nil {
		return fmt.Errorf("trigger: listen: %w", err)
	}
	return s.Serve(ctx, ln)
}

// Serve serves on ln (and closes it) until ctx ends, then ends the
// requests' contexts, so that waiting callers are answered, and shuts down
// within ShutdownTimeout. It returns nil, or the error that stopped it.
func (s *Server) Serve(ctx context.Context, ln net.Listener) error {
	// The requests' contexts end, with errServerStopping, when the
	// shutdown starts: a caller waiting for an outcome, or for a forwarded
	// answer, is answered 503 at once instead of holding the shutdown up.
	base, stopping := context.WithCancelCause(context.WithoutCancel(ctx))
	defer stopping(nil)
	srv := &http.Server{
		Handler:           headerLimit{s.cfg.Handler, s.cfg.MaxHeaderBytes},
		ReadHeaderTimeout: s.cfg.ReadHeaderTimeout,
		ReadTimeout:       s.cfg.ReadTimeout,
		WriteTimeout:      s.cfg.WriteTimeout,
		IdleTimeout:       s.cfg.IdleTimeout,
		MaxHeaderBytes:    4 * s.cfg.MaxHeaderBytes,
		ErrorLog:          slog.NewLogLogger(s.cfg.Logger.Handler(), slog.LevelWarn),
		BaseContext:       func(net.Listener) context.Context { return base },
	}
	if s.certs != nil {
		srv.TLSConfig = &tls.Config{MinVersion: tls.VersionTLS12, GetCertificate: s.certs.get}
		ln = tls.NewListener(ln, srv.TLSConfig)
	}
	s.cfg.Logger.Info("trigger: serving", "addr", ln.Addr().String(), "tls", s.certs != nil)
	done := make(chan error, 1)
	go func() { done <- srv.Serve(ln) }()
	select {
	case err := <-done:
		return fmt.Errorf("trigger: serve: %w", err)
	case <-ctx.Done():
	}
	stopping(errServerStopping)
	sctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), s.cfg.ShutdownTimeout)
	defer cancel()
	err := srv.Shutdown(sctx)
	<-done
	if err != nil {
		_ = srv.Close()
		return fmt.Errorf("trigger: shutdown: %w", err)
	}
	return nil
}

// headerLimit answers 431 with a Status body to requests whose request
// line and headers exceed max bytes, so that the caller gets the answer
// every other refusal has (net/http's own, for larger headers, is plain
// text).
type headerLimit struct {
	next http.Handler
	max  int
}

func (h headerLimit) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	n := len(r.Method) + len(r.RequestURI) + len(r.Proto) + 4
	for k, vs := range r.Header {
		for _, v := range vs {
			n += len(k) + len(v) + 4 // "k: v\r\n"
		}
	}
	if n <= h.max {
		h.next.ServeHTTP(w, r)
		return
	}
	w.Header().Set("Connection", "close")
	writeJSON(w, http.StatusRequestHeaderFieldsTooLarge, failure(http.StatusRequestHeaderFieldsTooLarge, fmt.Sprintf("the request line and headers exceed %d bytes", h.max)))
}

// certReloader serves a certificate pair and reloads it when a file changes.
type certReloader struct {
	certFile, keyFile string
	log               *slog.Logger

	mu     sync.Mutex
	cert   *tls.Certificate
	loaded [2]fileStamp // the files' stamps at the last load
}

type fileStamp struct {
	mod  time.Time
	size int64
}

// stamps returns the modification time and size of the two files.
func (c *certReloader) stamps() ([2]fileStamp, error) {
	var st [2]fileStamp
	for i, f := range []string{c.certFile, c.keyFile} {
		fi, err := os.Stat(f)
		if err != nil {
			return st, err
		}
		st[i] = fileStamp{mod: fi.ModTime(), size: fi.Size()}
	}
	return st, nil
}

// get serves the pair, reloading it first when either file changed. The
// files' stamps are recorded before the load: a broken pair is retried
// only after the files change again, not on every handshake. A file it
// cannot stat (mid-rotation) leaves the previous pair in service.
func (c *certReloader) get(*tls.ClientHelloInfo) (*tls.Certificate, error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if st, err := c.stamps(); err == nil && st != c.loaded {
		c.loaded = st
		pair, err := tls.LoadX509KeyPair(c.certFile, c.keyFile)
		if err != nil {
			c.log.Error("trigger: certificate reload failed; serving the previous one", "error", err)
			return c.cert, nil
		}
		c.cert = &pair
		c.log.Info("trigger: certificate reloaded", "cert", c.certFile)
	}
	return c.cert, nil
}
