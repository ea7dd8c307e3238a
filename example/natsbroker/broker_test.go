package natsbroker_test

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/nats-io/nats-server/v2/server"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/opkit/opkit/example/natsbroker"
	"github.com/opkit/opkit/trigger"
)

// startServer runs an embedded JetStream server for one test.
func startServer(t *testing.T) *natsbroker.Embedded {
	t.Helper()
	srv, err := natsbroker.StartEmbedded(natsbroker.EmbeddedConfig{StoreDir: t.TempDir()})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(srv.Shutdown)
	return srv
}

func open(t *testing.T, url string, mod func(*natsbroker.Config)) *natsbroker.Broker {
	t.Helper()
	cfg := natsbroker.Config{URL: url, AckWait: 30 * time.Second}
	if mod != nil {
		mod(&cfg)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	b, err := natsbroker.Open(ctx, cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { b.Close() })
	return b
}

func publish(t *testing.T, b *natsbroker.Broker, name string) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	if _, err := natsbroker.Publish(ctx, b.Conn(), "", natsbroker.Pointer{Namespace: "ns", Name: name}); err != nil {
		t.Fatal(err)
	}
}

func receive(t *testing.T, b *natsbroker.Broker) trigger.Message {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	m, err := b.Receive(ctx)
	if err != nil {
		t.Fatalf("receive: %v", err)
	}
	return m
}

func ctx5(t *testing.T) context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	t.Cleanup(cancel)
	return ctx
}

// waitLag polls Lag until it reports want: the server updates a consumer's
// pending count asynchronously after a publish or an ack.
func waitLag(t *testing.T, b *natsbroker.Broker, want int64) {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for {
		lag, err := b.Lag(ctx5(t))
		if err == nil && lag == want {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("lag = %d, %v; want %d", lag, err, want)
		}
		time.Sleep(10 * time.Millisecond)
	}
}

func TestAckedMessageIsGoneAndLagFollows(t *testing.T) {
	srv := startServer(t)
	b := open(t, srv.URL(), nil)
	for i := range 3 {
		publish(t, b, "obj-"+strconv.Itoa(i))
	}
	waitLag(t, b, 3)
	for i := range 3 {
		m := receive(t, b)
		want := fmt.Sprintf(`{"namespace":"ns","name":"obj-%d"}`, i)
		if got := string(m.Data()); got != want {
			t.Errorf("message %d = %s, want %s (in publish order)", i, got, want)
		}
		if m.Deliveries() != 1 {
			t.Errorf("first delivery count = %d, want 1", m.Deliveries())
		}
		if err := m.Ack(ctx5(t)); err != nil {
			t.Fatal(err)
		}
	}
	waitLag(t, b, 0)
}

func TestNackRedeliversWithCount(t *testing.T) {
	srv := startServer(t)
	b := open(t, srv.URL(), nil)
	publish(t, b, "a")
	m := receive(t, b)
	if err := m.Nack(ctx5(t), 50*time.Millisecond); err != nil {
		t.Fatal(err)
	}
	m2 := receive(t, b)
	if string(m2.Data()) != string(m.Data()) || m2.Deliveries() != 2 {
		t.Fatalf("redelivery = %s (count %d), want the same message with count 2", m2.Data(), m2.Deliveries())
	}
	if err := m2.Ack(ctx5(t)); err != nil {
		t.Fatal(err)
	}
}

func deadLetters(t *testing.T, b *natsbroker.Broker) []jetstream.RawStreamMsg {
	t.Helper()
	js, err := jetstream.New(b.Conn())
	if err != nil {
		t.Fatal(err)
	}
	s, err := js.Stream(ctx5(t), natsbroker.DefaultDeadLetterStream)
	if err != nil {
		t.Fatal(err)
	}
	info, err := s.Info(ctx5(t))
	if err != nil {
		t.Fatal(err)
	}
	var out []jetstream.RawStreamMsg
	for seq := info.State.FirstSeq; seq <= info.State.LastSeq && info.State.Msgs > 0; seq++ {
		m, err := s.GetMsg(ctx5(t), seq)
		if err != nil {
			t.Fatal(err)
		}
		out = append(out, *m)
	}
	return out
}

func TestTermDeadLettersAndNeverRedelivers(t *testing.T) {
	srv := startServer(t)
	b := open(t, srv.URL(), nil)
	publish(t, b, "bad")
	publish(t, b, "good")
	m := receive(t, b)
	if err := m.Term(ctx5(t), "Malformed"); err != nil {
		t.Fatal(err)
	}
	// The next message is the second one: the first is never redelivered.
	m2 := receive(t, b)
	if got := string(m2.Data()); got != `{"namespace":"ns","name":"good"}` {
		t.Fatalf("after Term got %s, want the second message", got)
	}
	m2.Ack(ctx5(t))
	dl := deadLetters(t, b)
	if len(dl) != 1 {
		t.Fatalf("dead letters = %d, want 1", len(dl))
	}
	if string(dl[0].Data) != string(m.Data()) || dl[0].Header.Get(natsbroker.HeaderTermReason) != "Malformed" ||
		dl[0].Header.Get(natsbroker.HeaderDeliveries) != "1" || dl[0].Header.Get(natsbroker.HeaderSubject) != natsbroker.DefaultSubject {
		t.Fatalf("dead letter = %s %v", dl[0].Data, dl[0].Header)
	}
	waitLag(t, b, 0)
}

// lastDelivery publishes a trigger and returns its second delivery, the
// last with MaxDeliver 2, after nacking the first.
func lastDelivery(t *testing.T, b *natsbroker.Broker) trigger.Message {
	t.Helper()
	publish(t, b, "x")
	m := receive(t, b)
	if err := m.Nack(ctx5(t), time.Millisecond); err != nil {
		t.Fatal(err)
	}
	m = receive(t, b)
	if m.Deliveries() != 2 {
		t.Fatalf("deliveries = %d, want 2", m.Deliveries())
	}
	return m
}

// The last delivery's Nack dead-letters and says so (trigger.DeadLetterer),
// so that the consumer counts it as terminated; an earlier Nack does not.
func TestNackOnLastDeliveryDeadLetters(t *testing.T) {
	srv := startServer(t)
	b := open(t, srv.URL(), func(c *natsbroker.Config) { c.MaxDeliver = 2 })
	publish(t, b, "x")
	first := receive(t, b)
	if err := first.Nack(ctx5(t), time.Millisecond); err != nil {
		t.Fatal(err)
	}
	if dl, ok := first.(trigger.DeadLetterer); !ok || dl.DeadLettered() {
		t.Fatalf("first delivery: DeadLetterer %v, dead-lettered %v; want an implementation saying no", ok, ok && dl.DeadLettered())
	}
	m := receive(t, b)
	if err := m.Nack(ctx5(t), time.Millisecond); err != nil {
		t.Fatal(err)
	}
	if !m.(trigger.DeadLetterer).DeadLettered() {
		t.Error("the last delivery's Nack dead-lettered it but DeadLettered says no")
	}
	dl := deadLetters(t, b)
	if len(dl) != 1 || dl[0].Header.Get(natsbroker.HeaderTermReason) != natsbroker.ReasonMaxDeliveries {
		t.Fatalf("dead letters = %v, want one with reason %s", dl, natsbroker.ReasonMaxDeliveries)
	}
}

// A last delivery whose dead-letter copy fails is not stranded: the server
// does not count deliveries itself, so the message comes back after
// AckWait and the next Nack dead-letters it.
func TestAFailedDeadLetterOnTheLastDeliveryComesBack(t *testing.T) {
	srv := startServer(t)
	b := open(t, srv.URL(), func(c *natsbroker.Config) { c.MaxDeliver = 2; c.AckWait = time.Second })
	m := lastDelivery(t, b)
	js, err := jetstream.New(b.Conn())
	if err != nil {
		t.Fatal(err)
	}
	// The dead-letter stream is briefly unavailable.
	if err := js.DeleteStream(ctx5(t), natsbroker.DefaultDeadLetterStream); err != nil {
		t.Fatal(err)
	}
	if err := m.Nack(ctx5(t), time.Millisecond); err == nil {
		t.Fatal("Nack on the last delivery with no dead-letter stream succeeded")
	}
	if _, err := js.CreateOrUpdateStream(ctx5(t), jetstream.StreamConfig{
		Name: natsbroker.DefaultDeadLetterStream, Subjects: []string{natsbroker.DefaultDeadLetterSubject},
	}); err != nil {
		t.Fatal(err)
	}
	m = receive(t, b) // after AckWait
	if m.Deliveries() != 3 {
		t.Fatalf("deliveries = %d, want 3", m.Deliveries())
	}
	if err := m.Nack(ctx5(t), time.Millisecond); err != nil {
		t.Fatal(err)
	}
	if dl := deadLetters(t, b); len(dl) != 1 || dl[0].Header.Get(natsbroker.HeaderTermReason) != natsbroker.ReasonMaxDeliveries {
		t.Fatalf("dead letters = %v, want one with reason %s", dl, natsbroker.ReasonMaxDeliveries)
	}
}

// With StartDisconnected, a broker opened while the server is down works
// once the server is up: the first Receive that reaches it creates the
// streams and the consumer.
func TestStartDisconnectedReceivesOnceTheServerIsUp(t *testing.T) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	port := l.Addr().(*net.TCPAddr).Port
	l.Close() // a port nothing listens on, for now
	url := fmt.Sprintf("nats://127.0.0.1:%d", port)

	if _, err := natsbroker.Open(ctx5(t), natsbroker.Config{URL: url}); err == nil {
		t.Fatal("Open without StartDisconnected succeeded with no server")
	}
	b := open(t, url, func(c *natsbroker.Config) { c.StartDisconnected = true })
	ctx, cancel := context.WithTimeout(context.Background(), time.Second)
	_, err = b.Receive(ctx)
	cancel()
	var be *trigger.BrokerError
	if !errors.As(err, &be) || be.Kind != "Disconnected" {
		t.Fatalf("Receive with no server = %v, want a Disconnected broker error", err)
	}

	srv, err := natsbroker.StartEmbedded(natsbroker.EmbeddedConfig{Port: port, StoreDir: t.TempDir()})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(srv.Shutdown)
	// Until a Receive gets through (then it creates the streams and the
	// consumer, and waits for a message: its deadline ends it).
	for deadline := time.Now().Add(20 * time.Second); ; time.Sleep(50 * time.Millisecond) {
		ctx, cancel := context.WithTimeout(context.Background(), time.Second)
		_, err = b.Receive(ctx)
		cancel()
		if errors.Is(err, context.DeadlineExceeded) {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("Receive 20s after the server started: %v", err)
		}
	}
	publish(t, b, "x")
	m := receive(t, b)
	if err := m.Ack(ctx5(t)); err != nil {
		t.Fatal(err)
	}
}

// StartDisconnected waits only for a server that cannot be reached: one
// that refuses the credentials fails Open with a Permission error, as
// without it.
func TestStartDisconnectedStillRefusesBadCredentials(t *testing.T) {
	opts := &server.Options{Host: "127.0.0.1", Port: -1, JetStream: true, StoreDir: t.TempDir(),
		Username: "u", Password: "right", NoLog: true, NoSigs: true}
	s, err := server.NewServer(opts)
	if err != nil {
		t.Fatal(err)
	}
	go s.Start()
	if !s.ReadyForConnections(10 * time.Second) {
		t.Fatal("server not ready")
	}
	t.Cleanup(s.Shutdown)
	url := fmt.Sprintf("nats://u:wrong@127.0.0.1:%d", opts.Port)
	for _, startDisconnected := range []bool{false, true} {
		b, err := natsbroker.Open(ctx5(t), natsbroker.Config{URL: url, StartDisconnected: startDisconnected})
		if err == nil {
			b.Close()
			t.Fatalf("StartDisconnected=%v: Open with refused credentials succeeded", startDisconnected)
		}
		if k := kindOf(err); k != "Permission" {
			t.Errorf("StartDisconnected=%v: Open = %v (kind %v), want a Permission error", startDisconnected, err, k)
		}
	}
}

// A broker opened disconnected reports Lag once the server is up even if
// it never called Receive (a follower's consumer is paused): Lag creates
// what the first Receive would have.
func TestStartDisconnectedLagWorksWithoutAReceive(t *testing.T) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	port := l.Addr().(*net.TCPAddr).Port
	l.Close()
	b := open(t, fmt.Sprintf("nats://127.0.0.1:%d", port), func(c *natsbroker.Config) { c.StartDisconnected = true })
	if _, err := b.Lag(ctx5(t)); kindOf(err) != "Disconnected" {
		t.Fatalf("Lag with no server = %v, want a Disconnected error", err)
	}
	srv, err := natsbroker.StartEmbedded(natsbroker.EmbeddedConfig{Port: port, StoreDir: t.TempDir()})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(srv.Shutdown)
	publish(t, open(t, srv.URL(), nil), "x") // another replica, one trigger
	waitLag(t, b, 1)
}

func TestReceiveEndsWithContext(t *testing.T) {
	srv := startServer(t)
	b := open(t, srv.URL(), nil)
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() {
		_, err := b.Receive(ctx)
		done <- err
	}()
	cancel()
	if err := <-done; !errors.Is(err, context.Canceled) {
		t.Fatalf("Receive after cancel = %v, want context.Canceled", err)
	}
}

func TestServerGoneIsDisconnected(t *testing.T) {
	srv := startServer(t)
	b := open(t, srv.URL(), nil)
	srv.Shutdown()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	// The first call may still be served by the old iterator; within a few
	// calls the failure must be reported as Disconnected.
	for {
		_, err := b.Receive(ctx)
		if ctx.Err() != nil {
			t.Fatal("no Disconnected error before the deadline")
		}
		if err == nil {
			continue
		}
		if k := kindOf(err); k == "Disconnected" {
			return
		} else {
			t.Logf("receive error of kind %v: %v", k, err)
		}
	}
}

func TestCloseNacksBufferedMessages(t *testing.T) {
	srv := startServer(t)
	// A long AckWait: without the nack on Close the buffered messages would
	// not come back within the test's deadline.
	b1 := open(t, srv.URL(), func(c *natsbroker.Config) { c.AckWait = time.Hour })
	for i := range 5 {
		publish(t, b1, "m"+strconv.Itoa(i))
	}
	m := receive(t, b1) // the iterator now holds the rest in its buffer
	if err := m.Ack(ctx5(t)); err != nil {
		t.Fatal(err)
	}
	b1.Close()
	b2 := open(t, srv.URL(), func(c *natsbroker.Config) { c.AckWait = time.Hour })
	for range 4 {
		m := receive(t, b2)
		if err := m.Ack(ctx5(t)); err != nil {
			t.Fatal(err)
		}
	}
}

// Release (what a paused consumer calls) hands the messages the iterator
// buffered back to the server at once, and the broker receives again
// afterwards.
func TestReleaseHandsBufferedMessagesBack(t *testing.T) {
	srv := startServer(t)
	// A long AckWait: without the release the buffered messages would not
	// come back within the test's deadline.
	b1 := open(t, srv.URL(), func(c *natsbroker.Config) { c.AckWait = time.Hour })
	if err := b1.Release(ctx5(t)); err != nil {
		t.Fatalf("Release before any Receive = %v", err)
	}
	for i := range 5 {
		publish(t, b1, "m"+strconv.Itoa(i))
	}
	if err := receive(t, b1).Ack(ctx5(t)); err != nil { // the iterator now buffers the rest
		t.Fatal(err)
	}
	if err := b1.Release(ctx5(t)); err != nil {
		t.Fatalf("Release = %v", err)
	}
	b2 := open(t, srv.URL(), func(c *natsbroker.Config) { c.AckWait = time.Hour })
	for range 4 {
		if err := receive(t, b2).Ack(ctx5(t)); err != nil {
			t.Fatal(err)
		}
	}
	if err := b2.Release(ctx5(t)); err != nil {
		t.Fatalf("Release = %v", err)
	}
	publish(t, b1, "again")
	m := receive(t, b1)
	if !strings.Contains(string(m.Data()), `"again"`) {
		t.Fatalf("after Release, b1 received %s", m.Data())
	}
	if err := m.Ack(ctx5(t)); err != nil {
		t.Fatal(err)
	}
}

func TestClassify(t *testing.T) {
	for _, tc := range []struct {
		err  error
		want string
	}{
		{nats.ErrAuthorization, "Permission"},
		{errors.New(`nats: permissions violation for subscription to "demo.reconcile"`), "Permission"},
		{&jetstream.APIError{Code: 400, ErrorCode: 10047, Description: "insufficient storage resources available"}, "Quota"},
		{jetstream.ErrMaximumConsumersLimit, "Quota"},
		{fmt.Errorf("wrapped: %w", nats.ErrMaxPayload), "Quota"},
		{jetstream.ErrConsumerNotFound, "NotFound"},
		{jetstream.ErrStreamNotFound, "NotFound"},
		{nats.ErrConnectionClosed, "Disconnected"},
		{nats.ErrNoServers, "Disconnected"},
		{jetstream.ErrNoHeartbeat, "Disconnected"},
		{errors.New("something else"), ""},
	} {
		if got := natsbroker.Classify(tc.err); got != tc.want {
			t.Errorf("Classify(%v) = %v, want %v", tc.err, got, tc.want)
		}
	}
}

// Each bad Config is refused before any connection is tried (the URL
// points nowhere, so only validation can produce ErrInvalidConfig).
func TestConfigValidation(t *testing.T) {
	for _, tc := range []struct {
		cfg  natsbroker.Config
		want string
	}{
		{natsbroker.Config{}, "URL or Config.Conn is required"},
		{natsbroker.Config{URL: "nats://x", MaxDeliver: 1}, "MaxDeliver must be at least 2"},
		{natsbroker.Config{URL: "nats://x", MaxDeliver: -1}, "negative MaxDeliver"},
		{natsbroker.Config{URL: "nats://x", AckWait: -time.Second}, "negative AckWait"},
		{natsbroker.Config{URL: "nats://x", Prefetch: -1}, "negative Prefetch"},
		{natsbroker.Config{URL: "nats://x", Subject: "a", DeadLetterSubject: "a"}, "must not overlap"},
		{natsbroker.Config{URL: "nats://x", Subject: "demo.>", DeadLetterSubject: "demo.dlq"}, "must not overlap"},
		{natsbroker.Config{URL: "nats://x", Subject: "demo.*", DeadLetterSubject: "demo.dlq"}, "must not overlap"},
		{natsbroker.Config{URL: "nats://x", Stream: "S", DeadLetterStream: "S"}, "must differ"},
	} {
		_, err := natsbroker.Open(context.Background(), tc.cfg)
		if !errors.Is(err, natsbroker.ErrInvalidConfig) || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("Open(%+v) = %v, want ErrInvalidConfig saying %q", tc.cfg, err, tc.want)
		}
	}
	// Patterns that share a prefix but no subject are fine.
	_, err := natsbroker.Open(context.Background(), natsbroker.Config{URL: "nats://127.0.0.1:1", Subject: "demo.*", DeadLetterSubject: "demo.dlq.x"})
	if errors.Is(err, natsbroker.ErrInvalidConfig) {
		t.Errorf("demo.* with demo.dlq.x refused: %v", err)
	}
}

// Publish refuses what the consumer would dead-letter, before sending.
func TestPublishRefusesWhatTheConsumerWouldRefuse(t *testing.T) {
	for _, p := range []natsbroker.Pointer{
		{Namespace: "ns"},
		{Namespace: "ns", Name: "a/b"},
		{Namespace: "ns", Name: "a%b"},
		{Namespace: "Bad_NS", Name: "a"},
		{Namespace: "ns", Name: "a", Reason: strings.Repeat("r", trigger.MaxReasonLen+1)},
		{Namespace: "ns", Name: "a", Reason: "\xff"},
	} {
		// No connection: a refused pointer never reaches it.
		if _, err := natsbroker.Publish(context.Background(), nil, "", p); !errors.Is(err, natsbroker.ErrInvalidPointer) {
			t.Errorf("Publish(%.60q) = %v, want ErrInvalidPointer", p, err)
		}
	}
}

// A reason full of characters JSON would HTML-escape (six bytes each) is
// sent as it is, and one of control characters (which JSON escapes to six
// bytes whatever the encoder) still fits the consumer's limit.
func TestPublishDoesNotInflateTheReason(t *testing.T) {
	const limit = 8 << 10 // trigger.ConsumerConfig.MaxMessageBytes's default
	b := open(t, startServer(t).URL(), nil)
	for _, reason := range []string{strings.Repeat("<&>", trigger.MaxReasonLen/3), strings.Repeat("\x01", trigger.MaxReasonLen)} {
		if _, err := natsbroker.Publish(ctx5(t), b.Conn(), "", natsbroker.Pointer{Namespace: "ns", Name: "a", Reason: reason}); err != nil {
			t.Fatal(err)
		}
		m := receive(t, b)
		var got natsbroker.Pointer
		if err := json.Unmarshal(m.Data(), &got); err != nil || len(m.Data()) > limit || got.Reason != reason {
			t.Fatalf("message of %d bytes (%v), reason intact %v", len(m.Data()), err, got.Reason == reason)
		}
		if strings.HasPrefix(reason, "<") && len(m.Data()) > 2*len(reason) {
			t.Errorf("message of %d bytes for a %d-byte reason: escaped", len(m.Data()), len(reason))
		}
		if err := m.Ack(ctx5(t)); err != nil {
			t.Fatal(err)
		}
	}
}

// A fixed port that is taken is reported as such, at once (the server
// itself logs nothing and would only time out).
func TestStartEmbeddedOnATakenPortSaysSo(t *testing.T) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	port := l.Addr().(*net.TCPAddr).Port
	e, err := natsbroker.StartEmbedded(natsbroker.EmbeddedConfig{Port: port, ReadyTimeout: time.Minute})
	if err == nil {
		e.Shutdown()
		t.Fatalf("started on a taken port")
	}
	if !errors.Is(err, syscall.EADDRINUSE) {
		t.Fatalf("err = %v, want one wrapping EADDRINUSE", err)
	}
}

// Request publishes a trigger that asks for its outcome and returns what
// the consumer replies; a reply address outside the inbox prefix is
// refused, so a publisher cannot make the operator publish elsewhere.
func TestRequestGetsTheReplyAndOnlyInboxesAreAnswered(t *testing.T) {
	srv := startServer(t)
	b := open(t, srv.URL(), nil)

	type result struct {
		out trigger.Outcome
		err error
	}
	got := make(chan result, 1)
	go func() {
		out, err := natsbroker.Request(ctx5(t), b.Conn(), "", natsbroker.Pointer{Namespace: "ns", Name: "a"})
		got <- result{out, err}
	}()
	m := receive(t, b)
	want := trigger.Outcome{ID: "t-1", State: trigger.Succeeded, Attempts: 1}
	data, _ := json.Marshal(want)
	if err := m.(trigger.Replier).Reply(ctx5(t), data); err != nil {
		t.Fatal(err)
	}
	if err := m.Ack(ctx5(t)); err != nil {
		t.Fatal(err)
	}
	if r := <-got; r.err != nil || r.out != want {
		t.Fatalf("Request = %+v, %v; want %+v", r.out, r.err, want)
	}

	// A publisher that names the trigger subject itself as reply address.
	loop, err := b.Conn().SubscribeSync(natsbroker.DefaultSubject)
	if err != nil {
		t.Fatal(err)
	}
	js, err := jetstream.New(b.Conn())
	if err != nil {
		t.Fatal(err)
	}
	msg := &nats.Msg{Subject: natsbroker.DefaultSubject, Data: []byte(`{"namespace":"ns","name":"b"}`),
		Header: nats.Header{natsbroker.HeaderReplyTo: []string{natsbroker.DefaultSubject}}}
	if _, err := js.PublishMsg(ctx5(t), msg); err != nil {
		t.Fatal(err)
	}
	if _, err := loop.NextMsg(5 * time.Second); err != nil { // the publish itself
		t.Fatal(err)
	}
	m = receive(t, b)
	if err := m.(trigger.Replier).Reply(ctx5(t), data); err == nil || !strings.Contains(err.Error(), "inbox") {
		t.Fatalf("Reply to %s = %v, want a refusal naming the inbox rule", natsbroker.DefaultSubject, err)
	}
	if err := m.Ack(ctx5(t)); err != nil {
		t.Fatal(err)
	}
	if extra, err := loop.NextMsg(200 * time.Millisecond); err == nil {
		t.Fatalf("the refused reply was published anyway: %s", extra.Data)
	}
}

// kindOf is the kind of err's *trigger.BrokerError, "" without one.
func kindOf(err error) string {
	if be, ok := errors.AsType[*trigger.BrokerError](err); ok {
		return be.Kind
	}
	return ""
}
