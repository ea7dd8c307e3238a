package natsbroker_test

import (
	"context"
	"net"
	"testing"
	"time"

	"github.com/opkit/opkit/example/natsbroker"
)

func freePort(t *testing.T) int {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	return ln.Addr().(*net.TCPAddr).Port
}

// A restarted server (same port, same store) is reconnected to, and the
// message stored before the restart is delivered: nothing is lost.
func TestReconnectsAfterServerRestart(t *testing.T) {
	port, store := freePort(t), t.TempDir()
	srv, err := natsbroker.StartEmbedded(natsbroker.EmbeddedConfig{Port: port, StoreDir: store})
	if err != nil {
		t.Fatal(err)
	}
	b := open(t, srv.URL(), nil)
	publish(t, b, "before-restart")
	srv.Shutdown()

	// While the server is down, Receive reports Disconnected.
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	for {
		_, err := b.Receive(ctx)
		if ctx.Err() != nil {
			t.Fatal("no Disconnected error while the server was down")
		}
		if kindOf(err) == "Disconnected" {
			break
		}
	}
	srv2, err := natsbroker.StartEmbedded(natsbroker.EmbeddedConfig{Port: port, StoreDir: store})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(srv2.Shutdown)
	for {
		m, err := b.Receive(ctx)
		if ctx.Err() != nil {
			t.Fatalf("no delivery after the restart: %v", err)
		}
		if err != nil {
			continue // the consumer retries with backoff; here we just call again
		}
		if got := string(m.Data()); got != `{"namespace":"ns","name":"before-restart"}` {
			t.Fatalf("got %s", got)
		}
		if err := m.Ack(ctx); err != nil {
			t.Fatal(err)
		}
		return
	}
}
