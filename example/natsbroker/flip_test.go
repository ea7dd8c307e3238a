package natsbroker_test

import (
	"context"
	"flag"
	"fmt"
	"log/slog"
	"math/rand/v2"
	"slices"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/types"
	dynamicfake "k8s.io/client-go/dynamic/fake"

	"github.com/opkit/opkit"
	"github.com/opkit/opkit/example/natsbroker"
	"github.com/opkit/opkit/queue"
	"github.com/opkit/opkit/trigger"
)

var flipSeed = flag.Uint64("flipseed", 0, "seed of TestFlipLosesNoTriggerOverNATS (0: random)")

// The shape of the flip test.
const (
	flipMessages = 1000
	flipObjects  = 100
	// flipStableTail is how many messages are published after the last
	// flip, with one leader throughout.
	flipStableTail = 150
)

var flipConfigMaps = opkit.Resource{
	GroupVersionResource: schema.GroupVersionResource{Version: "v1", Resource: "configmaps"},
	Kind:                 "ConfigMap",
	Namespaced:           true,
}

type cmEvent = opkit.Cause[*corev1.ConfigMap]

// msgKind is what the test expects the consumer to do with a message.
type msgKind uint8

const (
	kindExisting  msgKind = iota + 1 // ack after a scheduled enqueue
	kindMissing                      // ack as not found, no reconcile
	kindMalformed                    // dead-letter as Malformed
	kindInvalid                      // dead-letter as Invalid
)

// flipMsg is one published message and what happened to it.
type flipMsg struct {
	id     int
	kind   msgKind
	key    opkit.Key // for kindExisting and kindMissing
	data   string
	reason string // the pointer's reason: unique per message ("m<id>")
	pubSeq int64  // logical time just before Publish was called

	// Guarded by flipLog.mu.
	acked, termed int
	ackedDropped  int // acks while this replica's last enqueue of it was dropped
	nacks         int
}

// flipLog is the shared record of the run, ordered by one logical clock.
type flipLog struct {
	clock atomic.Int64

	mu         sync.Mutex
	byData     map[string]*flipMsg
	reconciles map[opkit.Key][]reconcileRec
}

type reconcileRec struct {
	seq     int64
	sources opkit.Sources
	replica int
}

func (l *flipLog) tick() int64 { return l.clock.Add(1) }

// recordingQueue is the Adder the replica's Trigger writes to: the real
// queue, plus the last outcome per message (by the pointer's unique reason)
// so that an Ack can be checked against what the queue did.
type recordingQueue struct {
	q        *queue.Queue[opkit.Key, cmEvent]
	mu       sync.Mutex
	last     map[string]queue.Outcome
	accepted int
	dropped  int
}

func (r *recordingQueue) Add(k opkit.Key, v cmEvent, o queue.AddOptions) queue.Outcome {
	out := r.q.Add(k, v, o)
	if out == queue.NotHeld {
		return out // Intake's try to join a waiting entry; it adds next
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	if len(v.Reasons) == 1 { // a trigger's (a message's reason is unique)
		r.last[v.Reasons[0]] = out
	}
	if out.Accepted() {
		r.accepted++
	} else {
		r.dropped++
	}
	return out
}

func (r *recordingQueue) lastOutcome(reason string) (queue.Outcome, bool) {
	r.mu.Lock()
	defer r.mu.Unlock()
	o, ok := r.last[reason]
	return o, ok
}

// recordingBroker wraps a replica's natsbroker.Broker and records every
// settlement per message, checking each Ack against the replica's enqueue.
type recordingBroker struct {
	b   *natsbroker.Broker
	rec *recordingQueue
	log *flipLog
}

// Release passes a paused consumer's release on to the broker.
func (rb *recordingBroker) Release(ctx context.Context) error { return rb.b.Release(ctx) }

func (rb *recordingBroker) Receive(ctx context.Context) (trigger.Message, error) {
	m, err := rb.b.Receive(ctx)
	if err != nil {
		return nil, err
	}
	return &recordingMsg{Message: m, rb: rb}, nil
}

type recordingMsg struct {
	trigger.Message
	rb *recordingBroker
}

func (m *recordingMsg) find() *flipMsg {
	m.rb.log.mu.Lock()
	defer m.rb.log.mu.Unlock()
	return m.rb.log.byData[string(m.Data())]
}

func (m *recordingMsg) Ack(ctx context.Context) error {
	fm := m.find()
	dropped := false
	if fm != nil && fm.kind == kindExisting {
		// The consumer enqueues, then settles, on the same goroutine: the
		// replica's last outcome for this message is this delivery's.
		o, ok := m.rb.rec.lastOutcome(fm.reason)
		dropped = !ok || !o.Accepted()
	}
	err := m.Message.Ack(ctx)
	if err == nil && fm != nil {
		m.rb.log.mu.Lock()
		fm.acked++
		if dropped {
			fm.ackedDropped++
		}
		m.rb.log.mu.Unlock()
	}
	return err
}

func (m *recordingMsg) Nack(ctx context.Context, delay time.Duration) error {
	err := m.Message.Nack(ctx, delay)
	if err == nil {
		if fm := m.find(); fm != nil {
			m.rb.log.mu.Lock()
			fm.nacks++
			m.rb.log.mu.Unlock()
		}
	}
	return err
}

func (m *recordingMsg) Term(ctx context.Context, reason string) error {
	err := m.Message.Term(ctx, reason)
	if err == nil {
		if fm := m.find(); fm != nil {
			m.rb.log.mu.Lock()
			fm.termed++
			m.rb.log.mu.Unlock()
		}
	}
	return err
}

// flipMetrics counts one replica's consumer outcomes.
type flipMetrics struct {
	mu         sync.Mutex
	acked      map[string]int
	nacked     map[string]int
	terminated map[string]int
	brokerErrs map[string]int
}

func newFlipMetrics() *flipMetrics {
	return &flipMetrics{acked: map[string]int{}, nacked: map[string]int{},
		terminated: map[string]int{}, brokerErrs: map[string]int{}}
}

func (m *flipMetrics) Enqueued(queue.Outcome)             {}
func (m *flipMetrics) Rejected()                          {}
func (m *flipMetrics) Request(int, string, time.Duration) {}
func (m *flipMetrics) Received()                          {}
func (m *flipMetrics) Processed(time.Duration)            {}
func (m *flipMetrics) Lag(int64)                          {}
func (m *flipMetrics) Acked(r string)                     { m.mu.Lock(); m.acked[r]++; m.mu.Unlock() }
func (m *flipMetrics) Nacked(r string)                    { m.mu.Lock(); m.nacked[r]++; m.mu.Unlock() }
func (m *flipMetrics) Terminated(r string) {
	m.mu.Lock()
	m.terminated[r]++
	m.mu.Unlock()
}
func (m *flipMetrics) BrokerError(k string) {
	m.mu.Lock()
	m.brokerErrs[k]++
	m.mu.Unlock()
}

// replica is one operator replica: its own queue, trigger, broker
// connection (to the shared durable consumer), consumer and worker.
type replica struct {
	idx     int
	q       *queue.Queue[opkit.Key, cmEvent]
	rec     *recordingQueue
	broker  *natsbroker.Broker
	metrics *flipMetrics
	cons    *trigger.Consumer[*corev1.ConfigMap]
	done    chan error
}

// lose is what package leader does when leadership is lost: close the
// intake and drop what is queued (in-flight reconciles finish).
func (r *replica) lose() {
	r.q.Suspend()
	r.q.Clear()
}

// acquire is what a new term does: open the intake, then the fresh list
// adds every existing object (as the watcher's initial list would, at
// relist priority), so everything queued by the previous leader and
// cleared is reconciled again.
func (r *replica) acquire(objs []*corev1.ConfigMap) {
	r.q.Resume()
	for _, o := range objs {
		r.q.Add(opkit.KeyOf(o), cmEvent{Object: o.DeepCopy(), Added: true, Sources: opkit.Sources(opkit.APIServer)},
			queue.AddOptions{Priority: -1})
	}
}

// TestFlipLosesNoTriggerOverNATS publishes 1,000 triggers (about 10%
// malformed or invalid, 10% for objects that do not exist) to a real
// embedded JetStream server while leadership flips between two replicas
// that share one durable consumer, and checks issue 7's rule end to end:
//   - every trigger for an existing object is followed by a reconcile of its
//     key that started after it was published (by the trigger itself, or by
//     the fresh list of a term that began later); triggers published after
//     the last flip are followed by a trigger-sourced reconcile;
//   - no message is acked while its replica's enqueue was dropped, and every
//     dropped enqueue was nacked;
//   - triggers for missing objects are acked and never reconciled;
//   - the dead-letter stream holds exactly the malformed and invalid ones,
//     by content and reason, and the trigger stream ends empty.
//
// It runs twice: with the consumers receiving whatever their queue's state
// (every follower delivery is a dropped enqueue, so the nack rule is
// exercised hard), and with the default pause, where a follower takes no
// message and drops happen only around flips.
func TestFlipLosesNoTriggerOverNATS(t *testing.T) {
	t.Run("receive-while-suspended", func(t *testing.T) { testFlipOverNATS(t, false) })
	t.Run("pause-while-suspended", func(t *testing.T) { testFlipOverNATS(t, true) })
}

func testFlipOverNATS(t *testing.T, pause bool) {
	seed := *flipSeed
	if seed == 0 {
		seed = rand.Uint64()
	}
	t.Logf("seed %d (rerun with -flipseed=%d)", seed, seed)
	rng := rand.New(rand.NewPCG(seed, 0))
	discard := slog.New(slog.DiscardHandler)

	// The "API server": a dynamic fake holding the existing objects.
	scheme := runtime.NewScheme()
	if err := corev1.AddToScheme(scheme); err != nil {
		t.Fatal(err)
	}
	var objs []*corev1.ConfigMap
	var seeds []runtime.Object
	for i := range flipObjects {
		o := &corev1.ConfigMap{
			TypeMeta: metav1.TypeMeta{APIVersion: "v1", Kind: "ConfigMap"},
			ObjectMeta: metav1.ObjectMeta{Namespace: "ns", Name: fmt.Sprintf("obj-%d", i),
				UID: types.UID(fmt.Sprintf("uid-obj-%d", i)), ResourceVersion: "1"},
		}
		objs = append(objs, o)
		seeds = append(seeds, o.DeepCopy())
	}
	dyn := dynamicfake.NewSimpleDynamicClient(scheme, seeds...)

	srv := startServer(t)
	log := &flipLog{byData: map[string]*flipMsg{}, reconciles: map[opkit.Key][]reconcileRec{}}

	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	var workers sync.WaitGroup
	var reps [2]*replica
	for i := range reps {
		q := queue.New[opkit.Key, cmEvent](queue.Config[cmEvent]{Merge: (*cmEvent).Merge})
		q.Suspend() // every replica starts as a follower
		rec := &recordingQueue{q: q, last: map[string]queue.Outcome{}}
		// No trigger budget: this test is about flips, not about pace.
		tr, err := trigger.New(trigger.Config[*corev1.ConfigMap]{Queue: rec, Resource: flipConfigMaps, Dynamic: dyn, Rate: -1, Logger: discard})
		if err != nil {
			t.Fatal(err)
		}
		// Every replica opens the same durable consumer on its own
		// connection: JetStream spreads deliveries over both.
		b := open(t, srv.URL(), func(c *natsbroker.Config) {
			c.Name = fmt.Sprintf("flip-replica-%d", i)
			c.Logger = discard
		})
		m := newFlipMetrics()
		paused := func() bool { return false }
		if pause {
			paused = q.Suspended
		}
		cons, err := trigger.NewConsumer(trigger.ConsumerConfig[*corev1.ConfigMap]{
			Paused:       paused,
			PausePoll:    20 * time.Millisecond,
			Broker:       &recordingBroker{b: b, rec: rec, log: log},
			Trigger:      tr,
			Concurrency:  4,
			DroppedDelay: 20 * time.Millisecond,
			LagInterval:  -1,
			Metrics:      m,
			Logger:       discard,
		})
		if err != nil {
			t.Fatal(err)
		}
		r := &replica{idx: i, q: q, rec: rec, broker: b, metrics: m, cons: cons, done: make(chan error, 1)}
		reps[i] = r
		go func() { r.done <- cons.Run(ctx) }()
		// The worker: takes entries as the reconciler would, records when
		// each reconcile started and spends a little while on it, so that
		// a flip finds entries still queued (and clears them).
		wrng := rand.New(rand.NewPCG(seed, uint64(i)+1))
		workers.Go(func() {
			for {
				it, err := q.Get(context.Background())
				if err != nil {
					return // shut down
				}
				seq := log.tick()
				log.mu.Lock()
				log.reconciles[it.Key] = append(log.reconciles[it.Key], reconcileRec{seq: seq, sources: it.Value.Sources, replica: r.idx})
				log.mu.Unlock()
				time.Sleep(time.Duration(wrng.IntN(1000)) * time.Microsecond) // the reconcile's work
				q.Done(it.Key)
			}
		})
	}

	// A separate connection publishes, as an outside system would.
	nc, err := nats.Connect(srv.URL(), nats.Name("flip-publisher"))
	if err != nil {
		t.Fatal(err)
	}
	defer nc.Close()
	js, err := jetstream.New(nc)
	if err != nil {
		t.Fatal(err)
	}

	var msgs []*flipMsg
	leader := -1 // -1: nobody leads
	flips, gaps := 0, 0
	var lastFlipSeq int64
	flip := func() {
		next := 0
		if leader >= 0 {
			next = 1 - leader
			reps[leader].lose()
			leader = -1
			if rng.IntN(3) == 0 { // sometimes nobody leads for a moment
				gaps++
				time.Sleep(time.Duration(rng.IntN(10)) * time.Millisecond)
			}
		}
		reps[next].acquire(objs)
		leader = next
		flips++
		lastFlipSeq = log.tick()
	}
	nextFlip := 0
	for i := range flipMessages {
		if i == nextFlip && i < flipMessages-flipStableTail {
			flip()
			nextFlip = i + 5 + rng.IntN(30)
			if rng.IntN(2) == 0 { // let the consumers work under this leader
				time.Sleep(time.Duration(rng.IntN(5)) * time.Millisecond)
			}
		}
		fm := &flipMsg{id: i, reason: fmt.Sprintf("m%d", i)}
		switch r := rng.IntN(20); {
		case r == 0:
			fm.kind, fm.data = kindMalformed, fmt.Sprintf(`{"namespace":"ns","name":"obj-%d"`, i) // truncated JSON
		case r == 1:
			if i%2 == 0 {
				fm.kind, fm.data = kindMalformed, fmt.Sprintf(`{"namespace":"ns","name":"obj-1","reason":%q,"priority":9}`, fm.reason) // unknown field
			} else {
				fm.kind, fm.data = kindInvalid, fmt.Sprintf(`{"namespace":"ns","name":"not/a/name-%d"}`, i)
			}
		case r == 2 || r == 3:
			fm.kind, fm.key = kindMissing, opkit.Key{Namespace: "ns", Name: fmt.Sprintf("gone-%d", rng.IntN(20))}
		default:
			fm.kind, fm.key = kindExisting, opkit.Key{Namespace: "ns", Name: fmt.Sprintf("obj-%d", rng.IntN(flipObjects))}
		}
		if fm.data == "" {
			fm.data = fmt.Sprintf(`{"namespace":%q,"name":%q,"reason":%q}`, fm.key.Namespace, fm.key.Name, fm.reason)
		}
		log.mu.Lock()
		log.byData[fm.data] = fm
		log.mu.Unlock()
		msgs = append(msgs, fm)
		fm.pubSeq = log.tick()
		pctx, pcancel := context.WithTimeout(ctx, 10*time.Second)
		_, err := js.Publish(pctx, natsbroker.DefaultSubject, []byte(fm.data))
		pcancel()
		if err != nil {
			t.Fatalf("publish %d: %v", i, err)
		}
	}
	t.Logf("published %d messages; %d flips (%d with nobody leading for a moment); replica %d leads at the end",
		len(msgs), flips, gaps, leader)

	// Wait (bounded polling) until every message is settled for good and
	// every trigger for an existing object is followed by a reconcile.
	pending := func() (unsettled, unreconciled int, example string) {
		log.mu.Lock()
		defer log.mu.Unlock()
		for _, fm := range msgs {
			if fm.acked+fm.termed == 0 {
				unsettled++
				if example == "" {
					example = fmt.Sprintf("message %d %s not settled (%d nacks)", fm.id, fm.data, fm.nacks)
				}
				continue
			}
			if fm.kind == kindExisting && !reconciledAfter(log.reconciles[fm.key], fm.pubSeq, fm.pubSeq > lastFlipSeq) {
				unreconciled++
				if example == "" {
					example = fmt.Sprintf("message %d for %v (published at %d, last flip at %d): no reconcile after it; reconciles %v",
						fm.id, fm.key, fm.pubSeq, lastFlipSeq, log.reconciles[fm.key])
				}
			}
		}
		return unsettled, unreconciled, example
	}
	// Generous bounds: a whole run takes a few seconds. Once everything is
	// settled, a missing reconcile can only be a worker still catching up.
	deadline := time.Now().Add(2 * time.Minute)
	var settledAt time.Time
	for {
		u, r, ex := pending()
		if u == 0 && r == 0 {
			break
		}
		if u == 0 && settledAt.IsZero() {
			settledAt = time.Now()
		}
		if time.Now().After(deadline) || (!settledAt.IsZero() && time.Since(settledAt) > 15*time.Second) {
			t.Errorf("gave up waiting: %d messages unsettled, %d triggers not followed by a reconcile; e.g. %s", u, r, ex)
			break
		}
		time.Sleep(20 * time.Millisecond)
	}
	if !t.Failed() {
		waitLag(t, reps[leader].broker, 0) // the work-queue stream is empty
	}

	// Stop: consumers first (they nack what they still hold), then the
	// brokers, then the queues (which ends the workers).
	cancel()
	for _, r := range reps {
		if err := <-r.done; err != nil {
			t.Errorf("replica %d: Run = %v", r.idx, err)
		}
		r.broker.Close()
		r.q.ShutDown()
	}
	workers.Wait()

	// Per message.
	var existing, missing, deadWant, unreconciled int
	errs := 0
	report := func(format string, args ...any) { // the first 20 per-message failures
		if errs++; errs <= 20 {
			t.Errorf(format, args...)
		}
	}
	log.mu.Lock()
	for _, fm := range msgs {
		switch fm.kind {
		case kindExisting:
			existing++
			if fm.ackedDropped > 0 {
				report("message %d (%v) was acked %d time(s) right after its enqueue was dropped", fm.id, fm.key, fm.ackedDropped)
			}
			if fm.acked != 1 || fm.termed != 0 {
				report("message %d (%v): acked %d, terminated %d; want acked once", fm.id, fm.key, fm.acked, fm.termed)
			}
			if !reconciledAfter(log.reconciles[fm.key], fm.pubSeq, fm.pubSeq > lastFlipSeq) {
				unreconciled++
			}
		case kindMissing:
			missing++
			if fm.acked != 1 || fm.termed != 0 {
				report("message %d for missing %v: acked %d, terminated %d; want acked once", fm.id, fm.key, fm.acked, fm.termed)
			}
			if n := len(log.reconciles[fm.key]); n > 0 {
				report("missing object %v was reconciled %d times", fm.key, n)
			}
		case kindMalformed, kindInvalid:
			deadWant++
			if fm.termed != 1 || fm.acked != 0 {
				report("malformed message %d %s: terminated %d, acked %d; want terminated once", fm.id, fm.data, fm.termed, fm.acked)
			}
		}
	}
	if errs > 20 {
		t.Errorf("... and %d more per-message failures", errs-20)
	}
	if unreconciled > 0 {
		t.Errorf("%d of %d triggers for existing objects were not followed by a reconcile", unreconciled, existing)
	}
	var relists, triggered int
	for _, recs := range log.reconciles {
		for _, rc := range recs {
			if rc.sources.Has(opkit.Operator) {
				triggered++
			} else {
				relists++
			}
		}
	}
	log.mu.Unlock()
	t.Logf("%d existing, %d missing, %d malformed/invalid; %d trigger-sourced and %d relist reconciles",
		existing, missing, deadWant, triggered, relists)

	// Per replica: every scheduled enqueue was acked as scheduled, every
	// dropped one nacked as dropped, and nothing failed on the broker.
	var dropped, ackedScheduled, ackedNotFound, terminated int
	for _, r := range reps {
		r.rec.mu.Lock()
		acc, drp := r.rec.accepted, r.rec.dropped
		r.rec.mu.Unlock()
		r.metrics.mu.Lock()
		t.Logf("replica %d: enqueues accepted %d, dropped %d; acked %v, nacked %v, terminated %v, broker errors %v",
			r.idx, acc, drp, r.metrics.acked, r.metrics.nacked, r.metrics.terminated, r.metrics.brokerErrs)
		if got := r.metrics.acked["Scheduled"]; got != acc {
			t.Errorf("replica %d: acked(Scheduled) = %d, accepted enqueues = %d", r.idx, got, acc)
		}
		if got := r.metrics.nacked["Dropped"]; got != drp {
			t.Errorf("replica %d: nacked(Dropped) = %d, dropped enqueues = %d", r.idx, got, drp)
		}
		if n := r.metrics.nacked["APIError"]; n != 0 {
			t.Errorf("replica %d: %d nacks after API errors (the fake never fails)", r.idx, n)
		}
		dropped += drp
		ackedScheduled += r.metrics.acked["Scheduled"]
		ackedNotFound += r.metrics.acked["NotFound"]
		for _, n := range r.metrics.terminated {
			terminated += n
		}
		r.metrics.mu.Unlock()
	}
	if ackedScheduled != existing || ackedNotFound != missing || terminated != deadWant {
		t.Errorf("acked(Scheduled) = %d want %d, acked(NotFound) = %d want %d, terminated = %d want %d",
			ackedScheduled, existing, ackedNotFound, missing, terminated, deadWant)
	}
	if dropped == 0 && !pause {
		t.Error("no enqueue was dropped: the flips did not exercise the rule")
	}
	if triggered == 0 {
		t.Error("no trigger-sourced reconcile at all")
	}

	// The dead-letter stream: exactly the malformed and invalid messages,
	// by content, each with the reason the consumer gave.
	want := map[string]string{}
	for _, fm := range msgs {
		switch fm.kind {
		case kindMalformed:
			want[fm.data] = "Malformed"
		case kindInvalid:
			want[fm.data] = "Invalid"
		}
	}
	dead := readDeadLetters(t, js)
	if len(dead) != len(want) {
		t.Errorf("dead-letter stream holds %d messages, want the %d malformed/invalid ones", len(dead), len(want))
	}
	for _, d := range dead {
		reason, ok := want[string(d.Data)]
		if !ok {
			t.Errorf("dead letter %s (reason %s) is not one of the malformed messages", d.Data, d.Header.Get(natsbroker.HeaderTermReason))
			continue
		}
		if got := d.Header.Get(natsbroker.HeaderTermReason); got != reason {
			t.Errorf("dead letter %s: reason %s, want %s", d.Data, got, reason)
		}
		delete(want, string(d.Data))
	}
	for data := range want {
		t.Errorf("malformed message %s is not in the dead-letter stream", data)
	}
}

// reconciledAfter reports whether recs holds a reconcile that started after
// seq (a trigger-sourced one if triggerOnly).
func reconciledAfter(recs []reconcileRec, seq int64, triggerOnly bool) bool {
	return slices.ContainsFunc(recs, func(r reconcileRec) bool {
		return r.seq > seq && (!triggerOnly || r.sources.Has(opkit.Operator))
	})
}

func (r reconcileRec) String() string {
	src := "a"
	if r.sources.Has(opkit.Operator) {
		src = "o"
	}
	return fmt.Sprintf("%d:%s@%d", r.seq, src, r.replica)
}

// readDeadLetters returns every message of the dead-letter stream.
func readDeadLetters(t *testing.T, js jetstream.JetStream) []*jetstream.RawStreamMsg {
	t.Helper()
	s, err := js.Stream(ctx5(t), natsbroker.DefaultDeadLetterStream)
	if err != nil {
		t.Fatal(err)
	}
	info, err := s.Info(ctx5(t))
	if err != nil {
		t.Fatal(err)
	}
	var out []*jetstream.RawStreamMsg
	for seq := info.State.FirstSeq; info.State.Msgs > 0 && seq <= info.State.LastSeq; seq++ {
		m, err := s.GetMsg(ctx5(t), seq)
		if err != nil {
			t.Fatalf("dead letter %d: %v", seq, err)
		}
		out = append(out, m)
	}
	return out
}
