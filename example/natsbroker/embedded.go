package natsbroker

import (
	"errors"
	"fmt"
	"net"
	"os"
	"strconv"
	"time"

	"github.com/nats-io/nats-server/v2/server"
)

// EmbeddedConfig configures [StartEmbedded]. The zero value means defaults.
type EmbeddedConfig struct {
	// Host to listen on (default "127.0.0.1").
	Host string
	// Port to listen on; zero means a free port chosen by the system.
	Port int
	// StoreDir is JetStream's storage directory. Empty means a new
	// temporary directory, removed by Shutdown.
	StoreDir string
	// MaxStore bounds JetStream file storage in bytes (default 1 GiB);
	// MaxMemory bounds memory storage (default 64 MiB).
	MaxStore, MaxMemory int64
	// ReadyTimeout bounds the wait for the server to accept connections
	// (default 10s).
	ReadyTimeout time.Duration
}

// Embedded is a NATS server with JetStream running inside this process.
type Embedded struct {
	srv     *server.Server
	tempDir string
}

// StartEmbedded starts a JetStream-enabled NATS server in-process and waits
// until it accepts connections. The server logs nothing.
func StartEmbedded(cfg EmbeddedConfig) (*Embedded, error) {
	if cfg.Host == "" {
		cfg.Host = "127.0.0.1"
	}
	if cfg.MaxStore == 0 {
		cfg.MaxStore = 1 << 30
	}
	if cfg.MaxMemory == 0 {
		cfg.MaxMemory = 64 << 20
	}
	if cfg.ReadyTimeout == 0 {
		cfg.ReadyTimeout = 10 * time.Second
	}
	if cfg.MaxStore < 0 || cfg.MaxMemory < 0 || cfg.ReadyTimeout < 0 || cfg.Port < 0 {
		return nil, errors.New("natsbroker: negative value in EmbeddedConfig")
	}
	if cfg.Port == 0 {
		cfg.Port = server.RANDOM_PORT
	} else {
		// The server, logging nothing, would only time out: say why.
		l, err := net.Listen("tcp", net.JoinHostPort(cfg.Host, strconv.Itoa(cfg.Port)))
		if err != nil {
			return nil, fmt.Errorf("natsbroker: embedded server: %w", err)
		}
		l.Close()
	}
	e := &Embedded{}
	if cfg.StoreDir == "" {
		dir, err := os.MkdirTemp("", "opkit-nats-")
		if err != nil {
			return nil, fmt.Errorf("natsbroker: store dir: %w", err)
		}
		cfg.StoreDir, e.tempDir = dir, dir
	} else if err := os.MkdirAll(cfg.StoreDir, 0o700); err != nil {
		return nil, fmt.Errorf("natsbroker: store dir: %w", err)
	}
	srv, err := server.NewServer(&server.Options{
		ServerName:         "opkit-embedded",
		Host:               cfg.Host,
		Port:               cfg.Port,
		JetStream:          true,
		StoreDir:           cfg.StoreDir,
		JetStreamMaxStore:  cfg.MaxStore,
		JetStreamMaxMemory: cfg.MaxMemory,
		NoSigs:             true,
		NoLog:              true,
	})
	if err != nil {
		e.removeTemp()
		return nil, fmt.Errorf("natsbroker: embedded server: %w", err)
	}
	e.srv = srv
	srv.Start()
	if !srv.ReadyForConnections(cfg.ReadyTimeout) {
		srv.Shutdown()
		srv.WaitForShutdown()
		e.removeTemp()
		return nil, fmt.Errorf("natsbroker: embedded server not ready after %v", cfg.ReadyTimeout)
	}
	return e, nil
}

// URL is the client URL, e.g. "nats://127.0.0.1:40123".
func (e *Embedded) URL() string { return e.srv.ClientURL() }

// Shutdown stops the server, waits for it, and removes a temporary store
// directory. It is idempotent.
func (e *Embedded) Shutdown() {
	e.srv.Shutdown()
	e.srv.WaitForShutdown()
	e.removeTemp()
}

func (e *Embedded) removeTemp() {
	if e.tempDir != "" {
		_ = os.RemoveAll(e.tempDir)
	}
}
