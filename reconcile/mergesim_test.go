package reconcile_test

import (
	"context"
	"fmt"
	"math/rand/v2"
	"strconv"
	"strings"
	"testing"
	"testing/synctest"
	"time"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/types"

	"github.com/opkit/opkit"
	"github.com/opkit/opkit/queue"
	"github.com/opkit/opkit/reconcile"
)

// This file drives the controller's queue (MergeEvents as its merge rule)
// through random histories of one key: object a, replaced once by b
// (deleted and created, or swapped by a relist with its tombstone early or
// late), changes, label-selector leaves and returns, triggers and Deleted
// triggers carrying the current UID, the previous one or none (some
// delayed), hand-outs and their outcomes as the controller re-adds them
// (success, a requeue that carries no object unless it is a delete, a
// retry with backoff that keeps its object), and time passing. Then every
// reconcile succeeds until the queue is empty, and three properties must
// hold (see runSim). A failing history is shrunk before it is reported.

type cmEv = opkit.Event[*corev1.ConfigMap]

// simAdd is an add the history made.
type simAdd struct {
	seq      int
	ev       cmEv
	accepted bool
	desc     string
}

// simRec is a hand-out: what the reconcile saw.
type simRec struct {
	seq  int
	typ  opkit.Type
	seen string // UID of the object reconciled ("" none/skip)
	rv   string
	skip bool
	desc string
}

// simWorld is the cluster as the history left it.
type simWorld struct {
	uid     string
	rv      int
	inSel   bool
	created bool // b was created
	prev    string
}

// simObj is object "a" of the namespace "ns" with uid and rv.
func simObj(uid string, rv int) *corev1.ConfigMap {
	cm := &corev1.ConfigMap{}
	cm.Namespace, cm.Name, cm.UID, cm.ResourceVersion = "ns", "a", types.UID(uid), strconv.Itoa(rv)
	return cm
}

// uidS is o's UID, "" for nil.
func uidS(o *corev1.ConfigMap) string {
	if o == nil {
		return ""
	}
	return string(o.UID)
}

// dEv describes an event for the failure log.
func dEv(e cmEv) string {
	s := fmt.Sprintf("%s/%s/%s", e.Source, e.Type, uidS(e.Object))
	if e.Object == nil {
		s += "(nil)"
	} else {
		s += "@" + e.Object.ResourceVersion
	}
	if e.FinalStateUnknown {
		s += "/tomb"
	}
	if e.Retried {
		s += "/retried"
	}
	if e.Requeued {
		s += "/requeued"
	}
	return s
}

// runSim replays ops (two bytes per step) and returns "" or what failed,
// prefixed by the property's name:
//   - (a) every accepted event that is not a delete, of the object that
//     exists at the end (or of no known UID), is followed by a reconcile
//     that saw that object (a Deleted reconcile counts: a trigger merges
//     into a delete of its object that has not run yet, as documented);
//   - (b) every watch delete is handed out afterwards with its object,
//     unless the object came back into the watch;
//   - (c) at most maxSimParked entries are ever parked for the key.
func runSim(ops []byte, verbose bool) (fail string) {
	k := opkit.Key{Namespace: "ns", Name: "a"}
	q := queue.New[opkit.Key](queue.Config[cmEv]{Merge: reconcile.MergeEvents[*corev1.ConfigMap], Timestamps: true})
	w := &simWorld{uid: "a", rv: 1, inSel: true}
	seq := 0
	var adds []simAdd
	var recs []simRec
	var log []string
	start := time.Now()
	logf := func(f string, a ...any) {
		log = append(log, fmt.Sprintf("%8v ", time.Since(start))+fmt.Sprintf(f, a...))
	}
	add := func(e cmEv, o queue.AddOptions, what string) {
		seq++
		out := q.Add(k, e, o)
		adds = append(adds, simAdd{seq: seq, ev: e, accepted: out.Accepted(), desc: what})
		logf("#%d add %s %s delay=%v retries=%d -> %v parked=%d", seq, what, dEv(e), o.Delay, o.Retries, out, q.Stats().Parked)
	}
	maxParked := 0
	var inflight *queue.Item[opkit.Key, cmEv]
	var seen *corev1.ConfigMap
	var skip bool
	get := func(ctx context.Context) bool {
		it, err := q.Get(ctx)
		if err != nil {
			return false
		}
		seq++
		inflight = &it
		ev := it.Value
		seen, skip = nil, false
		if ev.Type != opkit.Deleted {
			if ev.Source == opkit.APIServer && !ev.Retried && !ev.Requeued && it.Retries == 0 && ev.Object != nil {
				seen = ev.Object
			} else if w.uid == "" || !w.inSel {
				skip = true
			} else {
				seen = simObj(w.uid, w.rv)
			}
		} else {
			seen = ev.Object
		}
		r := simRec{seq: seq, typ: ev.Type, skip: skip, desc: dEv(ev)}
		if !skip {
			r.seen = uidS(seen)
			if seen != nil {
				r.rv = seen.ResourceVersion
			}
		}
		recs = append(recs, r)
		logf("#%d GET %s retries=%d seen=%s skip=%v", seq, dEv(ev), it.Retries, r.seen, skip)
		return true
	}
	finish := func(outcome byte) {
		it := *inflight
		ev := it.Value
		if !skip {
			if seen != nil {
				ev.Object = seen
			}
			ev.Fetched = false
			switch outcome % 4 {
			case 0, 1:
			case 2:
				after := []time.Duration{time.Minute, 10 * time.Minute, time.Hour, 90 * time.Second}[(outcome>>2)%4]
				if ev.Type != opkit.Deleted {
					ev.Object = nil
				}
				ev.Requeued = true
				add(ev, queue.AddOptions{Delay: after}, "requeue")
			case 3:
				r := it.Retries + 1
				d := min(time.Second<<r, 5*time.Minute)
				ev.Retried = true
				add(ev, queue.AddOptions{Delay: d, Retries: r}, "retry")
			}
		}
		q.Done(k)
		logf("done")
		inflight = nil
	}
	cancelled, cancel := context.WithCancel(context.Background())
	cancel()
	for len(ops) >= 2 {
		op, arg := ops[0]%10, ops[1]
		ops = ops[2:]
		switch op {
		case 0: // change
			if w.uid != "" {
				w.rv++
				if w.inSel {
					add(cmEv{Object: simObj(w.uid, w.rv), Type: opkit.Modified, Source: opkit.APIServer}, queue.AddOptions{}, "watch")
				}
			}
		case 1: // delete
			if w.uid != "" {
				w.rv++
				if w.inSel {
					e := cmEv{Object: simObj(w.uid, w.rv), Type: opkit.Deleted, Source: opkit.APIServer}
					if arg&1 != 0 {
						e.Object = simObj(w.uid, w.rv-1)
						e.FinalStateUnknown = true
					}
					add(e, queue.AddOptions{}, "watch")
				}
				w.prev, w.uid = w.uid, ""
			}
		case 2: // create b
			if w.uid == "" && !w.created {
				w.created, w.uid, w.inSel = true, "b", true
				w.rv++
				add(cmEv{Object: simObj(w.uid, w.rv), Type: opkit.Added, Source: opkit.APIServer}, queue.AddOptions{}, "watch")
			}
		case 3: // relist: a replaced by b, tombstone of a late or early
			if w.uid == "a" && w.inSel && !w.created {
				w.rv++
				tomb := cmEv{Object: simObj("a", w.rv-1), Type: opkit.Deleted, Source: opkit.APIServer, FinalStateUnknown: true}
				w.rv++
				w.created, w.prev, w.uid = true, "a", "b"
				added := cmEv{Object: simObj("b", w.rv), Type: opkit.Added, Source: opkit.APIServer}
				if arg&1 != 0 {
					add(added, queue.AddOptions{}, "watch")
					add(tomb, queue.AddOptions{}, "watch")
				} else {
					add(tomb, queue.AddOptions{}, "watch")
					add(added, queue.AddOptions{}, "watch")
				}
			}
		case 4: // selector leave / enter
			if w.uid != "" {
				w.rv++
				if w.inSel {
					add(cmEv{Object: simObj(w.uid, w.rv), Type: opkit.Deleted, Source: opkit.APIServer}, queue.AddOptions{}, "watch-leave")
				} else {
					add(cmEv{Object: simObj(w.uid, w.rv), Type: opkit.Added, Source: opkit.APIServer}, queue.AddOptions{}, "watch-enter")
				}
				w.inSel = !w.inSel
			}
		case 5, 6: // trigger / Deleted trigger
			var obj *corev1.ConfigMap
			switch arg % 3 {
			case 0:
				if w.uid == "" {
					continue
				}
				obj = simObj(w.uid, w.rv)
			case 1:
				if w.prev == "" {
					continue
				}
				obj = simObj(w.prev, 0)
			case 2:
				obj = simObj("", 0)
			}
			e := cmEv{Object: obj, Type: opkit.Modified, Source: opkit.Operator, Reason: "r", Fetched: arg%3 == 0}
			if op == 6 {
				e.Type, e.Fetched = opkit.Deleted, false
			}
			var d time.Duration
			if arg&8 != 0 {
				d = 30 * time.Second
			}
			add(e, queue.AddOptions{Delay: d}, "trigger")
		case 7:
			if inflight == nil {
				get(cancelled)
			}
		case 8:
			if inflight != nil {
				finish(arg)
			}
		case 9:
			time.Sleep([]time.Duration{time.Second, 30 * time.Second, 5 * time.Minute, time.Hour}[arg%4])
		}
		maxParked = max(maxParked, q.Stats().Parked)
	}
	// Quiesce: every reconcile now succeeds.
	logf("---- drain")
	for range 10000 {
		if inflight != nil {
			finish(0)
		}
		ctx, cancel := context.WithTimeout(context.Background(), 3*time.Hour)
		ok := get(ctx)
		cancel()
		if !ok {
			break
		}
	}
	if q.Len() != 0 || inflight != nil {
		return "did not drain"
	}
	dump := func(msg string) string {
		if verbose {
			return msg + "\n" + strings.Join(log, "\n")
		}
		return msg
	}
	if maxParked > maxSimParked {
		return dump(fmt.Sprintf("(c) %d parked", maxParked))
	}
	fu := ""
	if w.uid != "" && w.inSel {
		fu = w.uid
	}
	for i, a := range adds {
		if !a.accepted {
			continue
		}
		u := uidS(a.ev.Object)
		if a.ev.Type != opkit.Deleted && fu != "" && (u == fu || u == "") {
			ok := false
			for _, r := range recs {
				if r.seq > a.seq && (r.seen == fu || r.seen == "" && !r.skip) {
					ok = true
				}
			}
			if !ok {
				return dump(fmt.Sprintf("(a) add #%d %s %s of the final object %s gets no later reconcile of it", a.seq, a.desc, dEv(a.ev), fu))
			}
		}
		if a.ev.Type == opkit.Deleted && a.ev.Source == opkit.APIServer && !a.ev.Retried && !a.ev.Requeued {
			back := false
			for _, b := range adds[i+1:] {
				if b.ev.Source == opkit.APIServer && b.ev.Type != opkit.Deleted && !b.ev.Retried && !b.ev.Requeued && uidS(b.ev.Object) == u {
					back = true
				}
			}
			if back {
				continue
			}
			ok := false
			for _, r := range recs {
				if r.seq > a.seq && r.typ == opkit.Deleted && r.seen == u {
					ok = true
				}
			}
			if !ok {
				return dump(fmt.Sprintf("(b) watch delete #%d %s never handed out afterwards", a.seq, dEv(a.ev)))
			}
		}
	}
	return ""
}

// maxSimParked bounds the entries parked for the key in any history: the
// chain holds at most one entry per kind of event that must not be merged
// away (a delete per object, a teardown, a selector return, a delayed
// trigger...); 20,000 histories of 40 steps and 5,000 of 300 reached 7.
const maxSimParked = 8

// MergeEvents through the queue, over random histories of one key: no
// trigger or change of the object that exists is left without a reconcile,
// no watch delete is lost, and no chain grows (see runSim).
func TestMergeEventsOverRandomHistories(t *testing.T) {
	for _, tc := range []struct{ n, length int }{{4000, 40}, {300, 300}} {
		simHistories(t, tc.n, tc.length)
	}
}

// simHistories runs n random histories of length steps (seeded, so that
// a failure is reproducible) and reports each failing property once, with
// its shortest history shrunk.
func simHistories(t *testing.T, n, length int) {
	counts := map[string]int{}
	var firstOps = map[string][]byte{}
	for seed := range n {
		r := rand.New(rand.NewPCG(uint64(seed), 7))
		ops := make([]byte, 2*length)
		for i := range ops {
			ops[i] = byte(r.IntN(256))
		}
		var f string
		synctest.Test(t, func(t *testing.T) { f = runSim(ops, false) })
		if f != "" {
			cls := f[:3]
			counts[cls]++
			if firstOps[cls] == nil || len(ops) < len(firstOps[cls]) {
				firstOps[cls] = minimize(t, ops)
			}
		}
	}
	for cls, c := range counts {
		ops := firstOps[cls]
		var f string
		synctest.Test(t, func(t *testing.T) { f = runSim(ops, true) })
		t.Errorf("%s: %d of %d runs; minimized ops %v:\n%s", cls, c, n, ops, f)
	}
}

// minimize drops steps from a failing history while it fails the same way.
func minimize(t *testing.T, ops []byte) []byte {
	fails := func(o []byte) string {
		var f string
		synctest.Test(t, func(t *testing.T) { f = runSim(o, false) })
		return f
	}
	cls := fails(ops)[:3]
	for changed := true; changed; {
		changed = false
		for i := 0; i+2 <= len(ops); i += 2 {
			c := append(append([]byte{}, ops[:i]...), ops[i+2:]...)
			if f := fails(c); f != "" && f[:3] == cls {
				ops, changed = c, true
				i -= 2
			}
		}
	}
	return ops
}
