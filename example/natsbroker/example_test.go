package natsbroker_test

import (
	"context"
	"fmt"
	"log"
	"os"
	"time"

	"github.com/opkit/opkit/example/natsbroker"
)

// The broker in a few lines: an embedded JetStream server, a durable
// consumer, one trigger published and received. In the operator the
// trigger package's Consumer calls Receive and settles each message.
func Example() {
	dir, _ := os.MkdirTemp("", "natsbroker-example-")
	defer os.RemoveAll(dir)
	srv, err := natsbroker.StartEmbedded(natsbroker.EmbeddedConfig{StoreDir: dir})
	if err != nil {
		log.Fatal(err)
	}
	defer srv.Shutdown()

	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	b, err := natsbroker.Open(ctx, natsbroker.Config{URL: srv.URL()})
	if err != nil {
		log.Fatal(err)
	}
	defer b.Close()

	// What `demo-operator trigger --via nats` does:
	if _, err := natsbroker.Publish(ctx, b.Conn(), "", natsbroker.Pointer{Namespace: "team-a", Name: "hello", Reason: "deployed"}); err != nil {
		log.Fatal(err)
	}
	m, err := b.Receive(ctx)
	if err != nil {
		log.Fatal(err)
	}
	fmt.Println(string(m.Data()), "delivery", m.Deliveries())
	fmt.Println(m.Ack(ctx))
	// Output:
	// {"namespace":"team-a","name":"hello","reason":"deployed"} delivery 1
	// <nil>
}
