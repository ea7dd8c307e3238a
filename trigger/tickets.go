package trigger

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"fmt"
	"sync"

	"k8s.io/apimachinery/pkg/types"

	"github.com/opkit/opkit"
)

// State is what became of the reconcile that served a trigger: Pending;
// Succeeded, or Requeued; Failed, to be retried, or Terminal; Skipped (the
// object gone or out of scope); or Unknown here (another term's or
// replica's, forgotten, or its term ended first).
type State string

const (
	Pending   State = "pending"
	Succeeded State = "succeeded"
	Requeued  State = "requeued"
	Failed    State = "failed"
	Terminal  State = "terminal"
	Skipped   State = "skipped"
	Unknown   State = "unknown"
)

// final reports whether s is an outcome a broker may acknowledge on: the
// reconcile ran and nothing will retry it.
func (s State) final() bool {
	return s == Succeeded || s == Requeued || s == Terminal || s == Skipped
}

// Outcome is the result of the reconcile that served a tracked trigger:
// its State and Error, the key's Attempts in its streak (1 for a first
// success), its Duration, and the Replica and Term that ran it.
type Outcome struct {
	ID       string `json:"id"`
	State    State  `json:"state"`
	Error    string `json:"error,omitempty"`
	Attempts int    `json:"attempts,omitempty"`
	Duration string `json:"duration,omitempty"`
	Replica  string `json:"replica,omitempty"`
	Term     int32  `json:"term,omitempty"`
}

// Limits of the tickets a Trigger keeps: the tracked triggers whose
// reconcile has not finished, in all and for one key (beyond, Intake
// refuses to track: ErrBusy), and the finished outcomes kept for lookups
// (the oldest are forgotten: Unknown).
const (
	maxTracked       = 10_000
	maxTrackedPerKey = 64
	maxRemembered    = 4096
)

// Ticket is a tracked trigger: its reconcile's outcome arrives on it.
// The last 4096 outcomes stay known by ID (GET .../triggers/{id}).
type Ticket struct {
	ID string

	key   opkit.Key
	uid   types.UID // the object's, when the trigger read it
	n     uint64
	final bool // resolve only on a final state (a broker acknowledging)
	out   chan Outcome
}

// Wait returns the outcome, once there is one (see Tracking), or ctx's
// error (the ticket stays tracked).
func (tk *Ticket) Wait(ctx context.Context) (Outcome, error) {
	select {
	case o := <-tk.out:
		tk.out <- o // for a later Wait
		return o, nil
	case <-ctx.Done():
		return Outcome{ID: tk.ID, State: Pending}, ctx.Err()
	}
}

// remembered is a finished ticket's outcome, with its key: an id is
// answered only for the key it was taken for.
type remembered struct {
	key opkit.Key
	out Outcome
}

// tickets is a Trigger's record of tracked triggers. A tracked add takes
// the next number under mu and hands it to the queue with the cause
// (Cause.Ticket, merged as the highest): the turn that takes the entry
// serves exactly the tickets of its key up to that number, since the adds
// of a key happen in number order.
type tickets struct {
	nonce string // this Trigger's, in every id

	mu      sync.Mutex
	epoch   int // bumped by each abandon, so that ids tell the terms apart
	next    uint64
	waiting map[opkit.Key][]*Ticket
	nWait   int
	done    map[string]remembered
	order   []string // done's ids, oldest first
}

func newTickets() *tickets {
	b := make([]byte, 4)
	_, _ = rand.Read(b)
	return &tickets{nonce: hex.EncodeToString(b), waiting: map[opkit.Key][]*Ticket{}, done: map[string]remembered{}}
}

// reserve registers the next ticket for key, of obj (nil when not read),
// before its add: ErrBusy when maxTracked tickets wait, or
// maxTrackedPerKey for key. The adds of a key may reach the queue in
// another order than their numbers: a turn that serves a higher number
// was taken after this ticket was registered, so it reconciled a state
// at least as new as the one this trigger asked about.
func (ts *tickets) reserve(key opkit.Key, obj opkit.Object, final bool) (*Ticket, error) {
	var uid types.UID
	if obj != nil && !isNil(obj) {
		uid = obj.GetUID()
	}
	ts.mu.Lock()
	defer ts.mu.Unlock()
	if ts.nWait >= maxTracked || len(ts.waiting[key]) >= maxTrackedPerKey {
		return nil, fmt.Errorf("trigger: %w: too many tracked triggers wait for their reconciles (%d in all, %d for one key)", ErrBusy, maxTracked, maxTrackedPerKey)
	}
	ts.next++
	tk := &Ticket{ID: fmt.Sprintf("%s-%d-%d", ts.nonce, ts.epoch, ts.next), key: key, uid: uid, n: ts.next, final: final, out: make(chan Outcome, 1)}
	ts.waiting[key] = append(ts.waiting[key], tk)
	ts.nWait++
	return tk, nil
}

// withdraw forgets tk, whose add stored nothing, unless an outcome
// reached it meanwhile.
func (ts *tickets) withdraw(tk *Ticket) {
	ts.mu.Lock()
	defer ts.mu.Unlock()
	ts.take(tk.key, func(o *Ticket) bool { return o == tk })
}

// report resolves the tickets of key numbered up to upTo of an object in
// (or not known) with o, but for tickets taken FinalOnly when o is not
// final (the retry that follows serves them).
func (ts *tickets) report(key opkit.Key, upTo uint64, in opkit.Shards, o Outcome) {
	if upTo == 0 {
		return
	}
	ts.mu.Lock()
	defer ts.mu.Unlock()
	for _, tk := range ts.take(key, func(tk *Ticket) bool { return tk.n <= upTo && (!tk.final || o.State.final()) && tk.of(in) }) {
		ts.resolve(tk, o)
	}
}

// abandon resolves as Unknown every waiting ticket of an object in (or
// of an object not known: it joined an entry without reading it), for
// the term ended and the queue that held them is cleared, and starts a
// new epoch.
func (ts *tickets) abandon(why string, in opkit.Shards) {
	ts.mu.Lock()
	defer ts.mu.Unlock()
	for key := range ts.waiting {
		for _, tk := range ts.take(key, func(tk *Ticket) bool { return tk.of(in) }) {
			ts.resolve(tk, Outcome{State: Unknown, Error: why})
		}
	}
	ts.epoch++
}

// of reports whether tk's object is in shards, or not known.
func (tk *Ticket) of(shards opkit.Shards) bool { return tk.uid == "" || shards.Contains(tk.uid) }

// take removes the waiting tickets of key that match, and returns them;
// the caller holds mu.
func (ts *tickets) take(key opkit.Key, match func(*Ticket) bool) (taken []*Ticket) {
	var kept []*Ticket
	for _, tk := range ts.waiting[key] {
		if match(tk) {
			taken = append(taken, tk)
		} else {
			kept = append(kept, tk)
		}
	}
	if len(kept) == 0 {
		delete(ts.waiting, key)
	} else {
		ts.waiting[key] = kept
	}
	ts.nWait -= len(taken)
	return taken
}

// resolve hands o to tk, taken, and remembers it; the caller holds mu.
func (ts *tickets) resolve(tk *Ticket, o Outcome) {
	o.ID = tk.ID
	tk.out <- o
	if len(ts.order) >= maxRemembered {
		delete(ts.done, ts.order[0])
		ts.order = ts.order[1:]
	}
	ts.done[tk.ID] = remembered{key: tk.key, out: o}
	ts.order = append(ts.order, tk.ID)
}

// lookup returns what is known of the trigger id of key (nothing of an
// id taken for another key).
func (ts *tickets) lookup(key opkit.Key, id string) Outcome {
	ts.mu.Lock()
	defer ts.mu.Unlock()
	if r, ok := ts.done[id]; ok && r.key == key {
		return r.out
	}
	for _, tk := range ts.waiting[key] {
		if tk.ID == id {
			return Outcome{ID: id, State: Pending}
		}
	}
	return Outcome{ID: id, State: Unknown}
}
