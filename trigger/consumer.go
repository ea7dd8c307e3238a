package trigger

import (
	"cmp"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"sync"
	"sync/atomic"
	"time"

	"github.com/opkit/opkit"
	"github.com/opkit/opkit/internal/typed"
	"github.com/opkit/opkit/queue"
)

// The reasons a message is settled for, as the package documentation's
// consumer table lists them.
const (
	ackScheduled  = "Scheduled"
	ackNotFound   = "NotFound"
	ackReconciled = "Reconciled"

	nackDropped    = "Dropped"
	nackOutOfScope = "OutOfScope"
	nackStopping   = "Stopping"
	nackTermEnded  = "TermEnded"

	termTooLarge      = "TooLarge"
	termMaxDeliveries = "MaxDeliveries"
	termMalformed     = "Malformed"
	termInvalid       = "Invalid"
)

// errNotRunning is Check's error when Run is not running.
var errNotRunning = errors.New("trigger: consumer is not running")

// ErrLagUnavailable is wrapped by Check's error while only the broker's
// Lag fails: a readiness check may let it pass.
var ErrLagUnavailable = errors.New("trigger: broker lag unavailable")

// ConsumerConfig configures a Consumer; a zero field means its default.
// Broker and Trigger are required; Type is the triggers' (zero:
// Modified). It handles Concurrency messages at once (1; a message waiting
// for its reconcile holds one), of at most MaxMessageBytes (8 KiB). A
// read takes at most APITimeout (10s), a broker call BrokerTimeout (5s).
// A Nack after an API error is delayed RetryBase, doubling per delivery up
// to RetryCap (1s and 1m), any other DroppedDelay (1s: give the broker no
// small delivery limit); the wait after a failed Receive doubles from
// ReconnectBase to ReconnectCap (500ms and 30s).
//
// Paused, asked before each Receive and every PausePoll (250ms) while one
// blocks, keeps the messages in the broker while true (nil: while this
// replica works on no shard); it must be safe for concurrent use.
// AckAfterReconcile acknowledges a message once its reconcile succeeded or
// failed for good (a FinalOnly ticket), calling a Progresser's InProgress
// every ProgressInterval (10s) meanwhile, and replies the Outcome to a
// Replier. A Lag broker is asked every LagInterval (15s; negative: never).
// The Logger logs keys and reasons, never bodies.
type ConsumerConfig[T opkit.Object] struct {
	Broker                      Broker
	Trigger                     *Trigger[T]
	Type                        opkit.Type
	Concurrency                 int
	MaxMessageBytes             int
	AllowUnknownFields          bool
	APITimeout, BrokerTimeout   time.Duration
	RetryBase, RetryCap         time.Duration
	DroppedDelay                time.Duration
	ReconnectBase, ReconnectCap time.Duration
	Paused                      func() bool
	PausePoll                   time.Duration
	AckAfterReconcile           bool
	ProgressInterval            time.Duration
	LagInterval                 time.Duration
	Metrics                     Metrics
	Logger                      *slog.Logger
}

// Consumer turns broker messages into reconciles (see the package
// documentation).
type Consumer[T opkit.Object] struct {
	cfg ConsumerConfig[T] // validated, defaults applied

	running atomic.Bool
	paused  atomic.Bool // in pause: receiving nothing
	mu      sync.Mutex
	recvErr error // last Receive failure, cleared by a successful Receive
	ackErr  error // last Ack/Nack/Term failure, cleared by a successful one
	lagErr  error // last Lag failure, cleared by a successful one
}

// NewConsumer validates cfg and returns a Consumer.
func NewConsumer[T opkit.Object](cfg ConsumerConfig[T]) (*Consumer[T], error) {
	cfg.Type = cmp.Or(cfg.Type, opkit.Modified)
	switch {
	case cfg.Broker == nil:
		return nil, errors.New("trigger: ConsumerConfig.Broker is required")
	case cfg.Trigger == nil:
		return nil, errors.New("trigger: ConsumerConfig.Trigger is required")
	case cfg.Trigger.cfg.Get == nil:
		return nil, errNoGetter
	case !cfg.Type.Valid():
		return nil, fmt.Errorf("trigger: ConsumerConfig.Type %v is invalid", cfg.Type)
	case cfg.Concurrency < 0 || cfg.MaxMessageBytes < 0 || min(cfg.APITimeout, cfg.BrokerTimeout, cfg.RetryBase, cfg.RetryCap,
		cfg.DroppedDelay, cfg.ReconnectBase, cfg.ReconnectCap, cfg.PausePoll, cfg.ProgressInterval) < 0:
		return nil, errors.New("trigger: ConsumerConfig sizes, counts and durations (but LagInterval) must not be negative")
	}
	cfg.Concurrency = cmp.Or(cfg.Concurrency, 1)
	cfg.MaxMessageBytes = cmp.Or(cfg.MaxMessageBytes, defaultMaxBytes)
	cfg.APITimeout = cmp.Or(cfg.APITimeout, 10*time.Second)
	cfg.BrokerTimeout = cmp.Or(cfg.BrokerTimeout, 5*time.Second)
	cfg.RetryBase = cmp.Or(cfg.RetryBase, time.Second)
	cfg.RetryCap = cmp.Or(cfg.RetryCap, time.Minute)
	cfg.DroppedDelay = cmp.Or(cfg.DroppedDelay, time.Second)
	cfg.ReconnectBase = cmp.Or(cfg.ReconnectBase, 500*time.Millisecond)
	cfg.ReconnectCap = cmp.Or(cfg.ReconnectCap, 30*time.Second)
	cfg.PausePoll = cmp.Or(cfg.PausePoll, 250*time.Millisecond)
	cfg.ProgressInterval = cmp.Or(cfg.ProgressInterval, 10*time.Second)
	cfg.LagInterval = cmp.Or(cfg.LagInterval, 15*time.Second)
	cfg.Metrics = cmp.Or[Metrics](cfg.Metrics, nopMetrics{})
	cfg.Logger = cmp.Or(cfg.Logger, slog.Default())
	if cfg.Paused == nil {
		// Paused while this replica works on no shard (a Trigger on one
		// queue, Config.Queue, always works on its one).
		cfg.Paused = func() bool { return !cfg.Trigger.holds() }
	}
	return &Consumer[T]{cfg: cfg}, nil
}

// Run receives and handles messages until ctx ends, then lets the
// messages being handled finish (within APITimeout and BrokerTimeout),
// and returns nil once its goroutines have. Broker failures do not end
// it. It may be called again after it returned,
// not concurrently.
func (c *Consumer[T]) Run(ctx context.Context) error {
	if !c.running.CompareAndSwap(false, true) {
		return errors.New("trigger: consumer is already running")
	}
	defer c.running.Store(false)
	c.setErr(&c.lagErr, nil)
	c.forget()

	var wg sync.WaitGroup
	defer wg.Wait()
	if lb, ok := c.cfg.Broker.(Lag); ok && c.cfg.LagInterval > 0 {
		wg.Go(func() { c.pollLag(ctx, lb) })
	}
	work := context.WithoutCancel(ctx) // in-flight messages finish after a stop
	slots := make(chan struct{}, c.cfg.Concurrency)
	failures := 0
	for {
		// Take a slot before receiving: a message is only taken from the
		// broker when it can be handled right away.
		select {
		case slots <- struct{}{}:
		case <-ctx.Done():
			return nil
		}
		if c.cfg.Paused() {
			<-slots
			if !c.pause(ctx) {
				return nil
			}
			failures = 0
			continue
		}
		msg, paused, err := c.receive(ctx, &wg)
		if err != nil {
			<-slots
			if ctx.Err() != nil {
				return nil
			}
			if paused {
				continue // the check above pauses
			}
			failures++
			c.setErr(&c.recvErr, err)
			wait := backoff(c.cfg.ReconnectBase, c.cfg.ReconnectCap, failures)
			c.brokerFailed(ctx, brokerLevel(err), "trigger consumer: receive failed; retrying", err, slog.Duration("retryIn", wait))
			if !sleep(ctx, wait) {
				return nil
			}
			continue
		}
		if failures > 0 {
			c.cfg.Logger.LogAttrs(ctx, slog.LevelInfo, "trigger consumer: receiving again", slog.Int("failures", failures))
		}
		failures = 0
		c.setErr(&c.recvErr, nil)
		c.cfg.Metrics.Received()
		start := time.Now()
		if ctx.Err() != nil {
			c.nack(work, msg, nackStopping, 0, start) // received but not handled: hand it back at once
			return nil
		}
		wg.Go(func() {
			defer func() { <-slots }()
			c.handle(work, msg, start)
		})
	}
}

// receive calls the broker's Receive. While it blocks, a goroutine (in wg)
// asks Paused every PausePoll and ends the Receive once it reports true,
// so that a replica that loses its leadership while waiting for a message
// stops taking them; paused reports that it did.
func (c *Consumer[T]) receive(ctx context.Context, wg *sync.WaitGroup) (msg Message, paused bool, err error) {
	rctx, cancel := context.WithCancel(ctx)
	defer cancel()
	wg.Go(func() {
		for sleep(rctx, c.cfg.PausePoll) {
			if c.cfg.Paused() {
				cancel()
			}
		}
	})
	msg, err = c.cfg.Broker.Receive(rctx)
	if err == nil && msg == nil {
		err = &BrokerError{Op: "receive", Err: errors.New("broker returned no message and no error")}
	}
	return msg, rctx.Err() != nil && ctx.Err() == nil, err
}

// pause waits, receiving nothing, until Paused reports false (true) or ctx
// ends (false). It first asks a Releaser broker to hand back what it
// buffered. A paused consumer does not use the broker: Check ignores the
// broker failures while it pauses (those seen before, and those of
// messages settled meanwhile), and it forgets them when the pause ends, so
// a follower is ready whatever the broker did before it paused, and the
// first Receive after the pause tests the broker afresh.
func (c *Consumer[T]) pause(ctx context.Context) bool {
	c.paused.Store(true)
	defer c.forget()
	c.cfg.Logger.LogAttrs(ctx, slog.LevelInfo, "trigger consumer: paused (the queue's intake is suspended or shut down: not the leader); receiving nothing until it resumes")
	if r, ok := c.cfg.Broker.(Releaser); ok {
		bctx, cancel := context.WithTimeout(ctx, c.cfg.BrokerTimeout)
		err := r.Release(bctx)
		cancel()
		if err != nil && ctx.Err() == nil {
			c.brokerFailed(ctx, slog.LevelError, "trigger consumer: releasing buffered messages failed; they return to the broker when their acknowledgement deadline passes", err)
		}
	}
	for c.cfg.Paused() {
		if !sleep(ctx, c.cfg.PausePoll) {
			return false
		}
	}
	c.cfg.Logger.LogAttrs(ctx, slog.LevelInfo, "trigger consumer: intake resumed; receiving")
	return true
}

// Check reports the consumer's readiness: an error when Run is not
// running, or the last broker failure (a *BrokerError, for errors.As)
// while the broker fails, else nil. A paused consumer is ready.
func (c *Consumer[T]) Check() error {
	if !c.running.Load() {
		return errNotRunning
	}
	if c.paused.Load() {
		return nil
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	if err := cmp.Or(c.recvErr, c.ackErr, c.lagErr); err != nil {
		return fmt.Errorf("trigger: consumer: broker %s: %w", kindOf(err), err)
	}
	return nil
}

func (c *Consumer[T]) setErr(p *error, err error) {
	c.mu.Lock()
	*p = err
	c.mu.Unlock()
}

// forget clears the Receive and settle failures, then the pause.
func (c *Consumer[T]) forget() {
	c.mu.Lock()
	c.recvErr, c.ackErr = nil, nil
	c.mu.Unlock()
	c.paused.Store(false)
}

// brokerLevel is the log level of a failed broker call: an error when
// someone has to act (permissions, a missing stream or subject, a quota),
// a warning for what retrying mends (a lost connection).
func brokerLevel(err error) slog.Level {
	if k := kindOf(err); k == "Disconnected" || k == "Unknown" {
		return slog.LevelWarn
	}
	return slog.LevelError
}

// brokerFailed counts and logs a failed broker call.
func (c *Consumer[T]) brokerFailed(ctx context.Context, level slog.Level, msg string, err error, attrs ...slog.Attr) {
	kind := kindOf(err)
	c.cfg.Metrics.BrokerError(kind)
	c.cfg.Logger.LogAttrs(ctx, level, msg, append(attrs, slog.String("kind", kind), slog.Any("error", err))...)
}

// decode parses one message body {"namespace", "name", "reason"} into a
// Pointer of the configured type; Intake validates it. The reason is what
// to Term the message with if it fails (termInvalid, if Intake refuses it).
func (c *Consumer[T]) decode(data []byte) (Pointer, string, error) {
	p := Pointer{Type: c.cfg.Type}
	if len(data) > c.cfg.MaxMessageBytes {
		return p, termTooLarge, invalid("message of %d bytes exceeds the limit of %d", len(data), c.cfg.MaxMessageBytes)
	}
	members := map[string]any{"namespace": &p.Key.Namespace, "name": &p.Key.Name, "reason": &p.Reason}
	if err := decodeObject(data, members, c.cfg.AllowUnknownFields); err != nil {
		return p, termMalformed, invalid("message: %w", err)
	}
	return p, termInvalid, nil
}

func (c *Consumer[T]) handle(ctx context.Context, msg Message, start time.Time) {
	p, term, err := c.decode(msg.Data())
	var d Decision[T]
	if err == nil {
		ictx, cancel := context.WithTimeout(ctx, c.cfg.APITimeout)
		track := notTracked
		if c.cfg.AckAfterReconcile {
			track = FinalOnly
		}
		d, err = c.cfg.Trigger.Intake(ictx, p, IntakeOptions{Track: track, NoForward: true, wait: true})
		cancel()
	}
	key := slog.String("key", p.Key.String())
	switch {
	case errors.Is(err, ErrInvalid):
		c.cfg.Logger.LogAttrs(ctx, slog.LevelError, "trigger consumer: dead-lettering message",
			slog.String("reason", term), slog.Any("error", err), slog.Int("deliveries", msg.Deliveries()))
		c.settle(ctx, start, "term", func(ctx context.Context) error { return msg.Term(ctx, term) }, func() { c.cfg.Metrics.Terminated(term) })
	case errors.Is(err, ErrOutOfScope):
		// Never acknowledged: controllers of other scopes (shards by
		// namespace or label) may share the subscription and get it on
		// redelivery; if none does, the broker's delivery limit
		// dead-letters it, where it stays visible.
		c.cfg.Logger.LogAttrs(ctx, slog.LevelWarn, "trigger consumer: object outside this controller's scope; handing it back",
			key, slog.Any("error", err), slog.Int("deliveries", msg.Deliveries()))
		c.nack(ctx, msg, nackOutOfScope, c.cfg.DroppedDelay, start)
	case errors.Is(err, ErrNotFound):
		c.cfg.Logger.LogAttrs(ctx, slog.LevelWarn, "trigger consumer: object no longer exists; acknowledging", key, slog.String("triggerReason", p.Reason))
		c.ack(ctx, msg, ackNotFound, start)
	case errors.Is(err, ErrBusy):
		// Too many tracked triggers wait: later, as for a drop (it is not
		// the message's fault, nor the API server's).
		c.nack(ctx, msg, nackDropped, c.cfg.DroppedDelay, start)
	case err != nil:
		// The API server failed, or returned something the trigger
		// refuses (another kind): not the message's fault. What an API
		// server's restart answers is retried soon, whatever the
		// deliveries (hand-backs to a shard's holder among them); the rest
		// backs off with them.
		class, delay := typed.Class(err), c.cfg.DroppedDelay
		if class == typed.Failed || class == typed.Refused && msg.Deliveries() > queue.TransientRefusals {
			delay = backoff(c.cfg.RetryBase, c.cfg.RetryCap, msg.Deliveries())
		}
		c.cfg.Logger.LogAttrs(ctx, apiLevel(err), "trigger consumer: reading the object failed; nacking for a redelivery",
			key, slog.String("class", class), slog.Any("error", err), slog.Int("deliveries", msg.Deliveries()), slog.Duration("delay", delay))
		c.nack(ctx, msg, class, delay, start)
	case !d.Outcome.Accepted():
		// Never ack a dropped trigger: the broker must redeliver it, to the
		// leader or to this replica once it leads.
		c.nack(ctx, msg, nackDropped, c.cfg.DroppedDelay, start)
	case d.Ticket != nil:
		c.settleReconciled(ctx, msg, d.Ticket, start)
	default:
		c.ack(ctx, msg, ackScheduled, start)
	}
}

// settleReconciled waits for the final outcome of the reconcile that
// serves msg (keeping msg alive meanwhile), replies it, and acknowledges
// msg, or hands it back when the term ended or the consumer stops first.
func (c *Consumer[T]) settleReconciled(ctx context.Context, msg Message, tk *Ticket, start time.Time) {
	progress := time.NewTicker(c.cfg.ProgressInterval)
	defer progress.Stop()
	for {
		select {
		case out := <-tk.out:
			if out.State == Unknown {
				c.nack(ctx, msg, nackTermEnded, c.cfg.DroppedDelay, start)
				return
			}
			if r, ok := msg.(Replier); ok {
				if data, err := json.Marshal(out); err == nil {
					rctx, cancel := context.WithTimeout(ctx, c.cfg.BrokerTimeout)
					if err := r.Reply(rctx, data); err != nil {
						c.brokerFailed(ctx, brokerLevel(err), "trigger consumer: replying the outcome failed", err)
					}
					cancel()
				}
			}
			c.ack(ctx, msg, ackReconciled, start)
			return
		case <-ctx.Done():
			c.nack(context.WithoutCancel(ctx), msg, nackStopping, 0, start)
			return
		case <-progress.C: // still waiting: keep the message
			if p, ok := msg.(Progresser); ok {
				pctx, cancel := context.WithTimeout(ctx, c.cfg.BrokerTimeout)
				if err := p.InProgress(pctx); err != nil {
					c.brokerFailed(ctx, brokerLevel(err), "trigger consumer: extending the message's deadline failed", err)
				}
				cancel()
			}
		}
	}
}

// settle makes one Ack, Nack or Term call (op) within BrokerTimeout and,
// once it succeeded, counts it.
func (c *Consumer[T]) settle(ctx context.Context, start time.Time, op string, call func(context.Context) error, count func()) {
	bctx, cancel := context.WithTimeout(ctx, c.cfg.BrokerTimeout)
	err := call(bctx)
	cancel()
	c.cfg.Metrics.Processed(time.Since(start))
	c.setErr(&c.ackErr, err)
	if err != nil {
		c.brokerFailed(ctx, slog.LevelError, "trigger consumer: broker "+op+" failed", err)
		return
	}
	count()
}

func (c *Consumer[T]) ack(ctx context.Context, msg Message, reason string, start time.Time) {
	c.settle(ctx, start, "ack", msg.Ack, func() { c.cfg.Metrics.Acked(reason) })
}

func (c *Consumer[T]) nack(ctx context.Context, msg Message, reason string, delay time.Duration, start time.Time) {
	c.settle(ctx, start, "nack", func(ctx context.Context) error { return msg.Nack(ctx, delay) }, func() {
		if dl, ok := msg.(DeadLetterer); ok && dl.DeadLettered() {
			c.cfg.Metrics.Terminated(termMaxDeliveries)
			c.cfg.Logger.LogAttrs(ctx, slog.LevelWarn, "trigger consumer: message dead-lettered by the broker on its last delivery",
				slog.String("nackReason", reason), slog.Int("deliveries", msg.Deliveries()))
			return
		}
		c.cfg.Metrics.Nacked(reason)
	})
}

func (c *Consumer[T]) pollLag(ctx context.Context, lb Lag) {
	for ctx.Err() == nil {
		lctx, cancel := context.WithTimeout(ctx, c.cfg.BrokerTimeout)
		n, err := lb.Lag(lctx)
		cancel()
		switch {
		case err == nil:
			c.setErr(&c.lagErr, nil)
			c.cfg.Metrics.Lag(n)
		case ctx.Err() == nil:
			// The Lag gauge keeps its last value: Check says it is stale.
			c.setErr(&c.lagErr, fmt.Errorf("%w: %w", ErrLagUnavailable, err))
			c.brokerFailed(ctx, slog.LevelWarn, "trigger consumer: lag unavailable", err)
		}
		sleep(ctx, c.cfg.LagInterval)
	}
}

// backoff returns base*2^(n-1) capped at limit, for n >= 1, without jitter
// (a broker's redelivery is its own to spread).
func backoff(base, limit time.Duration, n int) time.Duration {
	return queue.Backoff{Base: base, Cap: limit, Jitter: -1}.Delay(max(n, 1))
}

// sleep waits d or until ctx ends; it reports whether d elapsed.
func sleep(ctx context.Context, d time.Duration) bool {
	select {
	case <-ctx.Done():
		return false
	case <-time.After(d):
		return true
	}
}
