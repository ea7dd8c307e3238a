package natsbroker

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/nats-io/nats-server/v2/server"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/opkit/opkit/trigger"
)

// Defaults for the zero fields of [Config].
const (
	DefaultStream            = "DEMO_TRIGGERS"
	DefaultSubject           = "demo.reconcile"
	DefaultDeadLetterStream  = "DEMO_TRIGGERS_DLQ"
	DefaultDeadLetterSubject = "demo.reconcile.dlq"
	DefaultDurable           = "opkit-demo"
	DefaultMaxDeliver        = 100
	DefaultAckWait           = 30 * time.Second
	DefaultPrefetch          = 8
	DefaultMaxAge            = 24 * time.Hour
	DefaultDeadLetterMaxAge  = 7 * 24 * time.Hour
)

// ErrInvalidConfig wraps every error Open returns for a Config that cannot
// work.
var ErrInvalidConfig = errors.New("natsbroker: invalid config")

// Header names set on dead-lettered messages.
const (
	HeaderTermReason = "Opkit-Term-Reason"
	HeaderStreamSeq  = "Opkit-Stream-Seq"
	HeaderDeliveries = "Opkit-Deliveries"
	HeaderSubject    = "Opkit-Subject"
	// HeaderReplyTo, on a published trigger, names the subject where the
	// consumer publishes the reconcile's outcome (trigger.Outcome as
	// JSON) when it acknowledges after the reconcile
	// (trigger.ConsumerConfig.AckAfterReconcile): request-reply over the
	// stream (the message's own reply subject is JetStream's ack subject).
	HeaderReplyTo = "Opkit-Reply-To"
)

// connectionCheckInterval is how often a waiting Receive checks that the
// connection is still up.
const connectionCheckInterval = time.Second

// ReasonMaxDeliveries is the dead-letter reason of a message nacked on its
// last allowed delivery: the reason the consumer counts it under (the
// trigger package's consumer table).
const ReasonMaxDeliveries = "MaxDeliveries"

// Config configures a [Broker]. The zero value of every field but URL (or
// Conn) means its documented default.
type Config struct {
	// URL is the NATS server URL, e.g. "nats://127.0.0.1:4222". Required
	// unless Conn is set.
	URL string
	// Conn is an existing connection to use instead of dialing URL. The
	// broker does not close a connection it was given.
	Conn *nats.Conn
	// Name is the client connection name shown by the server
	// (default "opkit-demo-operator").
	Name string
	// Stream holds the triggers (default DefaultStream); Subject is what
	// publishers send to (default DefaultSubject).
	Stream, Subject string
	// DeadLetterStream and DeadLetterSubject hold dead letters
	// (defaults DefaultDeadLetterStream, DefaultDeadLetterSubject). The
	// dead-letter subject must not be matched by Subject.
	DeadLetterStream, DeadLetterSubject string
	// Durable is the durable consumer's name (default DefaultDurable);
	// every replica uses the same one.
	Durable string
	// MaxDeliver is the delivery limit (default DefaultMaxDeliver): a
	// Nack of delivery MaxDeliver or later dead-letters. The broker
	// enforces it, not the server, so a last delivery that ends without a
	// settle comes back after AckWait.
	MaxDeliver int
	// AckWait is how long the server waits for an ack before redelivering
	// (default DefaultAckWait).
	AckWait time.Duration
	// Prefetch is how many messages the client buffers ahead of Receive
	// (default DefaultPrefetch). Buffered messages are nacked by Close.
	Prefetch int
	// MaxAge bounds how long an unconsumed trigger is kept
	// (default DefaultMaxAge); DeadLetterMaxAge likewise for dead letters
	// (default DefaultDeadLetterMaxAge).
	MaxAge, DeadLetterMaxAge time.Duration
	// Logger receives connection events; nil means slog.Default().
	Logger *slog.Logger
	// StartDisconnected lets Open succeed while the server cannot be
	// reached: the connection keeps trying in the background, Receive
	// returns Disconnected errors until it gets through, and the first
	// Receive that reaches the server creates the streams and the
	// consumer. Without it, Open fails when the server is unreachable, so
	// an operator started during a NATS outage would not run at all.
	StartDisconnected bool
}

func (c *Config) setDefaults() error {
	invalid := func(format string, args ...any) error {
		return fmt.Errorf("%w: "+format, append([]any{ErrInvalidConfig}, args...)...)
	}
	if c.URL == "" && c.Conn == nil {
		return invalid("Config.URL or Config.Conn is required")
	}
	def := func(s *string, d string) {
		if *s == "" {
			*s = d
		}
	}
	def(&c.Name, "opkit-demo-operator")
	def(&c.Stream, DefaultStream)
	def(&c.Subject, DefaultSubject)
	def(&c.DeadLetterStream, DefaultDeadLetterStream)
	def(&c.DeadLetterSubject, DefaultDeadLetterSubject)
	def(&c.Durable, DefaultDurable)
	if c.Stream == c.DeadLetterStream || server.SubjectsCollide(c.Subject, c.DeadLetterSubject) {
		return invalid("the dead-letter stream and subject (%s, %q) must differ from the trigger stream and subject (%s, %q), and the subjects must not overlap",
			c.DeadLetterStream, c.DeadLetterSubject, c.Stream, c.Subject)
	}
	for _, v := range []struct {
		name string
		d    *time.Duration
		def  time.Duration
	}{{"AckWait", &c.AckWait, DefaultAckWait}, {"MaxAge", &c.MaxAge, DefaultMaxAge}, {"DeadLetterMaxAge", &c.DeadLetterMaxAge, DefaultDeadLetterMaxAge}} {
		if *v.d < 0 {
			return invalid("negative %s %v", v.name, *v.d)
		}
		if *v.d == 0 {
			*v.d = v.def
		}
	}
	switch {
	case c.MaxDeliver < 0:
		return invalid("negative MaxDeliver %d", c.MaxDeliver)
	case c.MaxDeliver == 0:
		c.MaxDeliver = DefaultMaxDeliver
	case c.MaxDeliver == 1:
		return invalid("MaxDeliver must be at least 2 (a nacked trigger must be redeliverable)")
	}
	switch {
	case c.Prefetch < 0:
		return invalid("negative Prefetch %d", c.Prefetch)
	case c.Prefetch == 0:
		c.Prefetch = DefaultPrefetch
	}
	if c.Logger == nil {
		c.Logger = slog.Default()
	}
	return nil
}

// Broker is a trigger.Broker over a JetStream durable pull consumer.
type Broker struct {
	cfg     Config
	nc      *nats.Conn
	ownConn bool
	js      jetstream.JetStream
	log     *slog.Logger

	// mu guards cons and iter. Receive holds it only to read or replace
	// them, never while blocked in Next, so Close is not held up.
	mu     sync.Mutex
	cons   jetstream.Consumer
	iter   jetstream.MessagesContext
	closed bool

	// lastAsync remembers the last asynchronous error the server sent
	// (permission violations arrive that way), to classify the timeouts
	// they cause; a successful delivery clears it.
	asyncMu   sync.Mutex
	lastAsync error
}

var (
	_ trigger.Broker = (*Broker)(nil)
	_ trigger.Lag    = (*Broker)(nil)
)

// Open connects (unless cfg.Conn is given), creates or updates the trigger
// and dead-letter streams and the durable consumer (with
// cfg.StartDisconnected and no server yet: on first use), and returns the
// broker.
// The connection reconnects on its own forever; while it is down Receive
// returns Disconnected errors.
func Open(ctx context.Context, cfg Config) (*Broker, error) {
	if err := cfg.setDefaults(); err != nil {
		return nil, err
	}
	b := &Broker{cfg: cfg, log: cfg.Logger}
	if cfg.Conn != nil {
		b.nc = cfg.Conn
	} else {
		connect := func(retry bool) (*nats.Conn, error) {
			return nats.Connect(cfg.URL,
				nats.Name(cfg.Name),
				nats.MaxReconnects(-1),
				nats.ReconnectWait(500*time.Millisecond),
				nats.RetryOnFailedConnect(retry),
				nats.DisconnectErrHandler(func(_ *nats.Conn, err error) {
					if err != nil { // nil: a deliberate Close
						b.log.Warn("nats disconnected", "error", err)
					}
				}),
				nats.ReconnectHandler(func(c *nats.Conn) {
					b.log.Info("nats reconnected", "url", c.ConnectedUrlRedacted())
				}),
				nats.ErrorHandler(func(_ *nats.Conn, _ *nats.Subscription, err error) {
					b.asyncMu.Lock()
					b.lastAsync = err
					b.asyncMu.Unlock()
					b.log.Warn("nats asynchronous error", "error", err, "kind", cmp.Or(Classify(err), "Unknown"))
				}),
			)
		}
		nc, err := connect(false)
		if err != nil && cfg.StartDisconnected && Classify(err) == "Disconnected" {
			// Only an unreachable server may be waited for: refused
			// credentials or a bad URL fail Open as they would without.
			nc, err = connect(true)
		}
		if err != nil {
			return nil, &trigger.BrokerError{Kind: Classify(err), Op: "connect", Err: err}
		}
		b.nc, b.ownConn = nc, true
	}
	js, err := jetstream.New(b.nc)
	if err != nil {
		b.closeConn()
		return nil, &trigger.BrokerError{Kind: Classify(err), Op: "connect", Err: err}
	}
	b.js = js
	if cfg.StartDisconnected && !b.nc.IsConnected() {
		b.log.Warn("nats server not reachable yet; receiving once it is", "status", b.nc.Status().String())
		return b, nil // iterator runs ensure on the first Receive
	}
	if err := b.ensure(ctx); err != nil {
		b.closeConn()
		return nil, err
	}
	return b, nil
}

// ensure creates or updates both streams and the consumer.
func (b *Broker) ensure(ctx context.Context) error {
	c := b.cfg
	if _, err := b.js.CreateOrUpdateStream(ctx, jetstream.StreamConfig{
		Name:        c.Stream,
		Description: "opkit reconcile triggers: {namespace, name, reason} pointers",
		Subjects:    []string{c.Subject},
		Retention:   jetstream.WorkQueuePolicy,
		Storage:     jetstream.FileStorage,
		MaxAge:      c.MaxAge,
		MaxMsgSize:  64 << 10,
		Discard:     jetstream.DiscardNew,
	}); err != nil {
		return &trigger.BrokerError{Kind: Classify(err), Op: "create stream " + c.Stream, Err: err}
	}
	if _, err := b.js.CreateOrUpdateStream(ctx, jetstream.StreamConfig{
		Name:        c.DeadLetterStream,
		Description: "opkit reconcile triggers that were dead-lettered",
		Subjects:    []string{c.DeadLetterSubject},
		Retention:   jetstream.LimitsPolicy,
		Storage:     jetstream.FileStorage,
		MaxAge:      c.DeadLetterMaxAge,
	}); err != nil {
		return &trigger.BrokerError{Kind: Classify(err), Op: "create stream " + c.DeadLetterStream, Err: err}
	}
	cons, err := b.js.CreateOrUpdateConsumer(ctx, c.Stream, jetstream.ConsumerConfig{
		Durable:     c.Durable,
		Description: "opkit demo operator replicas",
		AckPolicy:   jetstream.AckExplicitPolicy,
		AckWait:     c.AckWait,
		// No limit on the server: it would stop redelivering the last
		// delivery without telling anyone, stranding a trigger whose
		// dead-letter copy failed (or whose receiver died). Nack enforces
		// c.MaxDeliver instead, by dead-lettering.
		MaxDeliver:    -1,
		FilterSubject: c.Subject,
		DeliverPolicy: jetstream.DeliverAllPolicy,
		MaxAckPending: 1000,
	})
	if err != nil {
		return &trigger.BrokerError{Kind: Classify(err), Op: "create consumer " + c.Durable, Err: err}
	}
	b.mu.Lock()
	b.cons = cons
	b.mu.Unlock()
	return nil
}

// iterator returns the current pull iterator, creating it (and the
// consumer, if it was deleted) when needed.
func (b *Broker) iterator(ctx context.Context) (jetstream.MessagesContext, error) {
	b.mu.Lock()
	if b.closed {
		b.mu.Unlock()
		return nil, &trigger.BrokerError{Kind: "Disconnected", Op: "receive", Err: errors.New("broker closed")}
	}
	if it := b.iter; it != nil {
		b.mu.Unlock()
		return it, nil
	}
	cons := b.cons
	b.mu.Unlock()
	if cons == nil {
		if !b.nc.IsConnected() {
			return nil, b.disconnected("receive")
		}
		if err := b.ensure(ctx); err != nil {
			return nil, err
		}
		b.mu.Lock()
		cons = b.cons
		b.mu.Unlock()
	}
	it, err := cons.Messages(jetstream.PullMaxMessages(b.cfg.Prefetch), jetstream.PullExpiry(5*time.Second))
	if err != nil {
		kind := Classify(err)
		if kind == "NotFound" {
			b.mu.Lock()
			b.cons = nil // recreate it next time
			b.mu.Unlock()
		}
		return nil, &trigger.BrokerError{Kind: kind, Op: "receive", Err: err}
	}
	b.mu.Lock()
	defer b.mu.Unlock()
	if b.closed {
		it.Stop()
		return nil, &trigger.BrokerError{Kind: "Disconnected", Op: "receive", Err: errors.New("broker closed")}
	}
	b.iter = it
	return it, nil
}

// Receive blocks until a message arrives, ctx ends (ctx's error) or the
// subscription fails (a *trigger.BrokerError; the next call starts over).
func (b *Broker) Receive(ctx context.Context) (trigger.Message, error) {
	it, err := b.iterator(ctx)
	if err != nil {
		return nil, err
	}
	for {
		if !b.nc.IsConnected() {
			return nil, b.disconnected("receive")
		}
		// Wait in slices of connectionCheckInterval: while the connection is
		// down the iterator just waits for it to come back, and the consumer
		// must hear about it (logs, metrics, readiness).
		sliceCtx, cancel := context.WithTimeout(ctx, connectionCheckInterval)
		msg, err := it.Next(jetstream.NextContext(sliceCtx))
		sliceTimedOut := sliceCtx.Err() != nil
		cancel()
		if err != nil {
			if ctxErr := ctx.Err(); ctxErr != nil {
				return nil, ctxErr
			}
			if sliceTimedOut && (errors.Is(err, context.DeadlineExceeded) || errors.Is(err, context.Canceled)) {
				continue
			}
			b.mu.Lock()
			if b.iter == it {
				b.iter = nil
			}
			kind := b.classify(err)
			if kind == "NotFound" {
				b.cons = nil
			}
			b.mu.Unlock()
			it.Stop()
			return nil, &trigger.BrokerError{Kind: kind, Op: "receive", Err: err}
		}
		md, err := msg.Metadata()
		if err != nil {
			// Not a JetStream delivery (cannot be acked): skip it.
			b.log.Warn("nats: ignoring a message without JetStream metadata", "subject", msg.Subject(), "error", err)
			continue
		}
		// A delivery proves the consumer works again: an old permission or
		// quota error no longer explains later timeouts.
		b.asyncMu.Lock()
		b.lastAsync = nil
		b.asyncMu.Unlock()
		return &message{b: b, msg: msg, md: md}, nil
	}
}

var _ trigger.Releaser = (*Broker)(nil)

// Lag returns the consumer's backlog: messages not yet delivered
// (NumPending) plus delivered but not yet acknowledged (NumAckPending).
func (b *Broker) Lag(ctx context.Context) (int64, error) {
	b.mu.Lock()
	cons := b.cons
	b.mu.Unlock()
	if cons == nil {
		// Not created yet (Open started disconnected) or to be recreated.
		if !b.nc.IsConnected() {
			return 0, b.disconnected("lag")
		}
		if err := b.ensure(ctx); err != nil {
			return 0, err
		}
		b.mu.Lock()
		cons = b.cons
		b.mu.Unlock()
	}
	info, err := cons.Info(ctx)
	if err != nil {
		return 0, &trigger.BrokerError{Kind: b.classify(err), Op: "lag", Err: err}
	}
	return int64(info.NumPending) + int64(info.NumAckPending), nil
}

// disconnected is the error of op while the connection is down. A
// connection closed for good (nats.go gives up after the server refused
// the credentials twice) reports why, classified: Permission for refused
// credentials, rather than Disconnected.
func (b *Broker) disconnected(op string) error {
	if b.nc.IsClosed() {
		if err := b.nc.LastError(); err != nil {
			return &trigger.BrokerError{Kind: Classify(err), Op: op, Err: fmt.Errorf("connection closed: %w", err)}
		}
	}
	return &trigger.BrokerError{Kind: "Disconnected", Op: op, Err: fmt.Errorf("connection %s", b.nc.Status())}
}

// Connected reports whether the connection to the server is up (for
// readiness checks).
func (b *Broker) Connected() bool { return b.nc.IsConnected() }

// Conn returns the underlying connection (for publishing).
func (b *Broker) Conn() *nats.Conn { return b.nc }

// Close stops the pull iterator, nacks the messages it had buffered but
// Receive had not yet returned (so they are redelivered at once rather than
// after AckWait), and closes the connection if the broker opened it. Call it
// after the consumer's Run has returned. It is idempotent.
func (b *Broker) Close() error {
	b.mu.Lock()
	if b.closed {
		b.mu.Unlock()
		return nil
	}
	b.closed = true
	it := b.iter
	b.iter = nil
	b.mu.Unlock()
	if it != nil {
		ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
		_ = b.handBack(ctx, it)
		cancel()
	}
	if b.nc.IsConnected() {
		_ = b.nc.Flush()
	}
	b.closeConn()
	return nil
}

// Release implements trigger.Releaser: it stops the pull iterator and
// hands the messages it had buffered ahead of Receive back to the server
// (Nack without delay; on a message's last allowed delivery that
// dead-letters it, as Message.Nack does), so that a paused consumer holds
// no trigger the leader could schedule. The next Receive starts a new
// iterator.
func (b *Broker) Release(ctx context.Context) error {
	b.mu.Lock()
	it := b.iter
	b.iter = nil
	b.mu.Unlock()
	if it == nil {
		return nil
	}
	return b.handBack(ctx, it)
}

// handBack drains it and nacks every message it had buffered.
func (b *Broker) handBack(ctx context.Context, it jetstream.MessagesContext) error {
	it.Drain()
	defer it.Stop()
	var errs []error
	for {
		msg, err := it.Next(jetstream.NextContext(ctx))
		if err != nil {
			break // drained (the iterator is closed), or ctx ended
		}
		md, err := msg.Metadata()
		if err != nil {
			continue // not a JetStream delivery, as in Receive
		}
		if err := (&message{b: b, msg: msg, md: md}).Nack(ctx, 0); err != nil {
			errs = append(errs, err)
		}
	}
	return errors.Join(errs...)
}

func (b *Broker) closeConn() {
	if b.ownConn {
		b.nc.Close()
	}
}

// classify is Classify, also using the last asynchronous server error
// (a permission violation surfaces as a timeout on the request it broke).
func (b *Broker) classify(err error) string {
	kind := Classify(err)
	if kind != "" && kind != "Disconnected" {
		return kind
	}
	b.asyncMu.Lock()
	last := b.lastAsync
	b.asyncMu.Unlock()
	if last != nil && b.nc.IsConnected() {
		if k := Classify(last); k == "Permission" || k == "Quota" {
			return k
		}
	}
	if !b.nc.IsConnected() {
		return "Disconnected"
	}
	return kind
}

// message is one JetStream delivery.
type message struct {
	b    *Broker
	msg  jetstream.Msg
	md   *jetstream.MsgMetadata
	dead bool // Nack dead-lettered it (set by the receiving goroutine, read after Nack returns)
}

// DeadLettered reports whether Nack dead-lettered the message because it
// was on its last allowed delivery (trigger.DeadLetterer).
func (m *message) DeadLettered() bool { return m.dead }

func (m *message) Data() []byte { return m.msg.Data() }

// InProgress pushes the delivery's AckWait back.
func (m *message) InProgress(context.Context) error {
	if err := m.msg.InProgress(); err != nil {
		return &trigger.BrokerError{Kind: m.b.classify(err), Op: "in-progress", Err: err}
	}
	return nil
}

// Reply publishes data to the message's HeaderReplyTo subject, if it has
// one. Only an inbox is answered (a subject under the connection's inbox
// prefix, "_INBOX." by default, as Request uses): a publisher may not
// make the operator publish to any other subject, such as the trigger
// stream's own.
func (m *message) Reply(ctx context.Context, data []byte) error {
	to := m.msg.Headers().Get(HeaderReplyTo)
	if to == "" {
		return nil
	}
	if prefix := cmp.Or(m.b.nc.Opts.InboxPrefix, nats.InboxPrefix); !strings.HasPrefix(to, strings.TrimSuffix(prefix, ".")+".") {
		return fmt.Errorf("natsbroker: not replying to %q: %s must name an inbox (%s...)", to, HeaderReplyTo, prefix)
	}
	if err := m.b.nc.Publish(to, data); err != nil {
		return &trigger.BrokerError{Kind: m.b.classify(err), Op: "reply", Err: err}
	}
	return m.flush(ctx, "reply")
}

// Deliveries is the server's delivery count for this message (1 on the first).
func (m *message) Deliveries() int { return int(m.md.NumDelivered) }

// Ack acknowledges and waits for the server to confirm.
func (m *message) Ack(ctx context.Context) error {
	if err := m.msg.DoubleAck(ctx); err != nil {
		return &trigger.BrokerError{Kind: m.b.classify(err), Op: "ack", Err: err}
	}
	return nil
}

// Nack asks for redelivery after delay. From delivery MaxDeliver on it
// dead-letters instead. The server sets no delivery limit of its own, so a
// last delivery that is never settled (its dead-letter copy failed, its
// receiver died) is redelivered after AckWait, not stranded.
func (m *message) Nack(ctx context.Context, delay time.Duration) error {
	if m.Deliveries() >= m.b.cfg.MaxDeliver {
		err := m.deadLetter(ctx, ReasonMaxDeliveries, "nack")
		m.dead = err == nil
		return err
	}
	if err := m.msg.NakWithDelay(delay); err != nil {
		return &trigger.BrokerError{Kind: m.b.classify(err), Op: "nack", Err: err}
	}
	return m.flush(ctx, "nack")
}

// Term copies the message to the dead-letter subject, then terminates it.
// If the copy fails the message is left alone (it is redelivered after
// AckWait), so a dead letter is never lost.
func (m *message) Term(ctx context.Context, reason string) error {
	return m.deadLetter(ctx, reason, "term")
}

func (m *message) deadLetter(ctx context.Context, reason, op string) error {
	dl := nats.NewMsg(m.b.cfg.DeadLetterSubject)
	dl.Data = m.msg.Data()
	dl.Header.Set(HeaderTermReason, reason)
	dl.Header.Set(HeaderStreamSeq, strconv.FormatUint(m.md.Sequence.Stream, 10))
	dl.Header.Set(HeaderDeliveries, strconv.FormatUint(m.md.NumDelivered, 10))
	dl.Header.Set(HeaderSubject, m.msg.Subject())
	// The stream sequence as message ID: a retried dead-letter of the same
	// message within the duplicate window is stored once.
	dl.Header.Set(jetstream.MsgIDHeader, m.b.cfg.Stream+"-"+strconv.FormatUint(m.md.Sequence.Stream, 10))
	if _, err := m.b.js.PublishMsg(ctx, dl); err != nil {
		return &trigger.BrokerError{Kind: m.b.classify(err), Op: op + ": publish dead letter", Err: err}
	}
	if err := m.msg.TermWithReason(reason); err != nil {
		return &trigger.BrokerError{Kind: m.b.classify(err), Op: op, Err: err}
	}
	return m.flush(ctx, op)
}

// flush makes sure the server has read what was sent (nak and term are
// fire-and-forget in the protocol).
func (m *message) flush(ctx context.Context, op string) error {
	if _, ok := ctx.Deadline(); !ok {
		var cancel context.CancelFunc
		ctx, cancel = context.WithTimeout(ctx, 5*time.Second)
		defer cancel()
	}
	if err := m.b.nc.FlushWithContext(ctx); err != nil {
		return &trigger.BrokerError{Kind: m.b.classify(err), Op: op, Err: err}
	}
	return nil
}
