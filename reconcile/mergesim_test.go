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
// retry with backoff that keeps its object), leader terms, and time
// passing. Then every reconcile succeeds until the queue is empty, and
// the properties of runHistory must hold. A failing history is shrunk
// before it is reported.

type cmEv = opkit.Event[*corev1.ConfigMap]

// simAdd is an add the history made.
type simAdd struct {
	seq      int
	ev       cmEv
	accepted bool
	desc     string
	term     int // the leader term it was added in
}

// simRec is a hand-out: what the reconcile saw.
type simRec struct {
	seq    int
	failed bool   // the reconcile failed (it is retried)
	record string // the trigger reason RecordTriggerEvents records, "" none
	typ    opkit.Type
	seen   string // UID of the object reconciled ("" none/skip)
	rv     string
	skip   bool
	desc   string
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

// maxSimParked bounds the entries parked for the key in any history: the
// chain holds at most one entry per kind of event that must not be merged
// away (a delete per object, a teardown, a selector return, a delayed
// trigger...).
const maxSimParked = 8

// trE is what the watcher's tracker holds for one object of the name (see
// watcher/state.go): its UID and last resourceVersion, whether it is held
// as deleted, and in which Run its delete was queued.
type trE struct {
	uid, rv  string
	deleted  bool
	queuedIn int
	epoch    int
}

// reemit mirrors the tracker's rule for emitting a held delete again.
func (e trE) reemit(initial bool, run int) bool {
	return !e.deleted || e.queuedIn == 0 || initial && e.queuedIn != run
}

// simTracker is the watcher's tracker for the key: the current object and
// the deletes of earlier objects of the name it still holds.
type simTracker struct {
	cur     *trE
	earlier []trE
	run     int
}

// runHistory replays ops (two bytes per step) over one key and returns "" or
// the property that failed, with the history when verbose:
//   - (a) every accepted event that is not a delete, of the object that
//     exists at the end (or of no known UID), is followed by a reconcile
//     that saw that object (a Deleted reconcile counts: a trigger merges
//     into a delete of its object that has not run yet, as documented);
//   - (b) every watch delete is handed out afterwards with its object and
//     reconciled without failing, unless the object came back;
//   - (c) at most maxSimParked entries are ever parked for the key (two
//     more with three or four objects of the name: multi);
//   - (d) after the drain the watcher's tracker holds no delete unsettled;
//   - (f) no trigger is recorded twice (RecordTriggerEvents), and (g)
//     every Deleted trigger accepted in the last term is recorded, or a
//     later trigger is (one that took it over);
//   - (e) every Deleted trigger accepted in the last term is followed by a
//     Deleted reconcile of its object (its own, or a watch delete it merged
//     with); the end of a term clears the queue, and the next term's list
//     reconciles what exists, without the trigger's type (documented in
//     the trigger package).
// What it simulates:
//   - the watcher is modelled by its tracker (hold, displace/earlier,
//     settle, reemit rules, RetainDeletes), so deletes of earlier objects
//     are re-emitted as the watcher does, and leader terms (Suspend, Clear,
//     in-flight interrupted or finished, initial list) are modelled;
//   - the worker applies needsRefetch (FreshFor 1s, Fetched, watch rv,
//     delayed, Retries>0), a re-fetch may fail (retry keeping the carried
//     object), and Settle is called as afterReconcile calls it;
//   - requeue delays include 0, retries use backoff-like delays and the
//     requeue floor, triggers have 4 delays, user retries, priorities.

func runHistory(ops []byte, multi, verbose bool) (fail string) {
	k := opkit.Key{Namespace: "ns", Name: "a"}
	q := queue.New[opkit.Key](queue.Config[cmEv]{Merge: reconcile.MergeEvents[*corev1.ConfigMap], Timestamps: true})
	w := &simWorld{uid: "a", rv: 1, inSel: true}
	tr := &simTracker{run: 1}
	ncreated := 0
	var prevs []string
	seq := 0
	var adds []simAdd
	var recs []simRec
	var log []string
	start := time.Now()
	logf := func(f string, a ...any) {
		log = append(log, fmt.Sprintf("%8v ", time.Since(start))+fmt.Sprintf(f, a...))
	}
	add := func(e cmEv, o queue.AddOptions, what string) queue.Outcome {
		seq++
		out := q.Add(k, e, o)
		adds = append(adds, simAdd{seq: seq, ev: e, accepted: out.Accepted(), desc: what, term: tr.run})
		logf("#%d add %s %s delay=%v retries=%d prio=%d -> %v parked=%d", seq, what, dEv(e), o.Delay, o.Retries, o.Priority, out, q.Stats().Parked)
		return out
	}
	tomb := func(uid, rv string) *corev1.ConfigMap {
		cm := &corev1.ConfigMap{}
		cm.Namespace, cm.Name, cm.UID, cm.ResourceVersion = "ns", "a", types.UID(uid), rv
		return cm
	}
	// --- watcher model ---
	emit := func(obj *corev1.ConfigMap, typ opkit.Type, fsu bool, prio int, what string) queue.Outcome {
		return add(cmEv{Object: obj, Type: typ, Source: opkit.APIServer, FinalStateUnknown: fsu}, queue.AddOptions{Priority: prio}, what)
	}
	emitEarlierOf := func(initial bool, prio int) {
		for i := range tr.earlier {
			e := tr.earlier[i]
			if e.reemit(initial, tr.run) {
				out := emit(tomb(e.uid, e.rv), opkit.Deleted, true, prio, "watch-earlier")
				tr.earlier[i].queuedIn = 0
				if out.Accepted() {
					tr.earlier[i].queuedIn = tr.run
				}
			}
		}
	}
	observe := func(uid string, rv int, initial, inList bool) {
		prio := 0
		if inList {
			prio = -1
		}
		emitEarlierOf(initial, prio)
		typ := opkit.Type(0)
		srv := strconv.Itoa(rv)
		switch {
		case tr.cur != nil && tr.cur.uid != uid:
			old := *tr.cur
			if old.reemit(initial, tr.run) {
				old.queuedIn = tr.run
				old.deleted = true
				tr.earlier = append(tr.earlier, old)
				out := emit(tomb(old.uid, old.rv), opkit.Deleted, true, prio, "watch-recreated-tomb")
				if !out.Accepted() {
					tr.earlier[len(tr.earlier)-1].queuedIn = 0
				}
			} else {
				old.deleted = true
				tr.earlier = append(tr.earlier, old)
			}
			typ = opkit.Added
		case tr.cur == nil, tr.cur.deleted, initial:
			typ = opkit.Added
		case tr.cur.rv == srv:
		default:
			typ = opkit.Modified
		}
		tr.cur = &trE{uid: uid, rv: srv}
		if typ != 0 {
			emit(simObj(uid, rv), typ, false, prio, "watch")
		}
	}
	deleted := func(uid string, rv string, obj *corev1.ConfigMap, fsu bool, inList bool, what string) {
		prio := 0
		if inList {
			prio = -1
		} else {
			emitEarlierOf(false, prio)
		}
		tr.cur = &trE{uid: uid, rv: rv, deleted: true, queuedIn: tr.run}
		out := emit(obj, opkit.Deleted, fsu, prio, what)
		if !out.Accepted() {
			tr.cur.queuedIn = 0
		}
	}
	settle := func(uid, rv string) {
		if tr.cur != nil && tr.cur.deleted && tr.cur.uid == uid && tr.cur.rv == rv {
			tr.cur = nil
			logf("settled %s@%s", uid, rv)
			return
		}
		for i, e := range tr.earlier {
			if e.uid == uid && e.rv == rv {
				tr.earlier = append(tr.earlier[:i:i], tr.earlier[i+1:]...)
				logf("settled earlier %s@%s", uid, rv)
				return
			}
		}
		logf("settle %s@%s: nothing held", uid, rv)
	}
	watchRV := func() (string, bool) {
		if tr.cur == nil || tr.cur.deleted {
			return "", false
		}
		return tr.cur.rv, true
	}
	// --- controller model ---
	maxParked := 0
	var inflight *queue.Item[opkit.Key, cmEv]
	var seen *corev1.ConfigMap
	var skip, refetched bool
	var recIdx int
	get := func(ctx context.Context) bool {
		it, err := q.Get(ctx)
		if err != nil {
			return false
		}
		seq++
		inflight = &it
		ev := it.Value
		seen, skip, refetched = nil, false, false
		if ev.Type != opkit.Deleted {
			need := it.Retries > 0 || ev.Object == nil
			if !need && ev.Source != opkit.APIServer {
				if !ev.Fetched {
					need = true
				} else if rv, ok := watchRV(); !ok || rv != ev.Object.ResourceVersion {
					need = true
				}
			}
			if !need && it.Due.After(it.Enqueued) {
				need = true
			}
			if !need && time.Since(it.Enqueued) > time.Second {
				need = true
			}
			if need {
				refetched = true
				if w.uid == "" || !w.inSel {
					skip = true
				} else {
					seen = simObj(w.uid, w.rv)
				}
			} else {
				seen = ev.Object
			}
		} else {
			seen = ev.Object
		}
		r := simRec{seq: seq, typ: ev.Type, skip: skip, desc: dEv(ev)}
		if ev.Source == opkit.Operator && !ev.Requeued && !ev.Retried && ev.Object != nil {
			r.record = ev.Reason // as the controller records a trigger
		}
		if !skip {
			r.seen = uidS(seen)
			if seen != nil {
				r.rv = seen.ResourceVersion
			}
		}
		recs = append(recs, r)
		recIdx = len(recs) - 1
		logf("#%d GET rec=%q %s retries=%d prio=%d seen=%s@%s skip=%v refetched=%v", seq, r.record, dEv(ev), it.Retries, it.Priority, r.seen, r.rv, skip, refetched)
		return true
	}
	backoff := func(r int) time.Duration {
		return min(5*time.Millisecond<<(r-1), 5*time.Minute)
	}
	// finish applies an outcome; addOK false: the intake is closed (end of term).
	finish := func(outcome byte) {
		it := *inflight
		ev := it.Value
		if skip {
			q.Done(k)
			logf("done (skipped)")
			inflight = nil
			return
		}
		if refetched && outcome%8 == 7 {
			// The re-fetch failed: retried without an object, reading the
			// name again.
			recs[recIdx].skip, recs[recIdx].seen = true, ""
			ev.Fetched = false
			ev.Retried = true
			ev.Object = nil
			r := it.Retries + 1
			add(ev, queue.AddOptions{Delay: backoff(r), Retries: r, Priority: it.Priority}, "refetch-failed-retry")
			q.Done(k)
			logf("done")
			inflight = nil
			return
		}
		if seen != nil {
			ev.Object = seen
		}
		ev.Fetched = false
		doSettle := func() {
			if ev.Type == opkit.Deleted && (ev.Source == opkit.APIServer || ev.Watched) && ev.Object != nil { // as the controller settles
				settle(uidS(ev.Object), ev.Object.ResourceVersion)
			}
		}
		switch outcome % 8 {
		case 0, 1, 6, 7:
			doSettle()
		case 2:
			after := []time.Duration{time.Minute, 10 * time.Minute, time.Hour, 90 * time.Second, 0, 0, 5 * time.Second, time.Millisecond}[(outcome>>3)%8]
			if ev.Type != opkit.Deleted {
				ev.Object = nil
			}
			ev.Requeued = true
			add(ev, queue.AddOptions{Delay: after}, "requeue")
		case 3, 4, 5:
			r := it.Retries + 1
			d := backoff(r + int(outcome>>3)%12)
			if outcome%8 == 5 {
				d = max(d, []time.Duration{0, time.Minute, time.Hour, 10 * time.Second}[(outcome>>5)%4])
			}
			ev.Retried = true
			recs[recIdx].failed = true
			add(ev, queue.AddOptions{Delay: d, Retries: r, Priority: it.Priority}, "retry")
		}
		q.Done(k)
		logf("done")
		inflight = nil
	}
	cancelled, cancel := context.WithCancel(context.Background())
	cancel()
	observe("a", 1, true, true)
	for len(ops) >= 2 {
		op, arg := ops[0]%12, ops[1]
		ops = ops[2:]
		switch op {
		case 0: // change
			if w.uid != "" {
				w.rv++
				if w.inSel {
					observe(w.uid, w.rv, false, false)
				}
			}
		case 1: // delete (watch, or vanished at a relist)
			if w.uid != "" {
				w.rv++
				if w.inSel {
					if arg&1 != 0 {
						// a relist: the tracker's last rv
						last := tr.cur.rv
						deleted(w.uid, last, tomb(w.uid, last), true, true, "relist-vanished")
					} else {
						deleted(w.uid, strconv.Itoa(w.rv), simObj(w.uid, w.rv), false, false, "watch")
					}
				}
				w.prev, w.uid = w.uid, ""
			}
		case 2: // create b (or c, d with SIM4_MULTI)
			if w.uid == "" && (!w.created || multi && ncreated < 3) {
				ncreated++
				w.created, w.uid, w.inSel = true, string(rune('a'+ncreated)), true
				prevs = append(prevs, w.prev)
				w.rv++
				observe(w.uid, w.rv, false, false)
			}
		case 3: // relist: a replaced by b, unseen by the watch
			if w.uid != "" && w.inSel && (!w.created || multi && ncreated < 3) {
				w.rv++ // the delete
				w.rv++ // b's creation
				ncreated++
				prevs = append(prevs, w.uid)
				w.created, w.prev, w.uid = true, w.uid, string(rune('a'+ncreated))
				observe(w.uid, w.rv, false, true)
			}
		case 4: // selector leave / enter
			if w.uid != "" {
				w.rv++
				if w.inSel {
					if arg&1 != 0 && tr.cur != nil && !tr.cur.deleted {
						last := tr.cur.rv
						deleted(w.uid, last, tomb(w.uid, last), true, true, "relist-left")
					} else {
						deleted(w.uid, strconv.Itoa(w.rv), simObj(w.uid, w.rv), false, false, "watch-leave")
					}
				} else {
					observe(w.uid, w.rv, false, arg&1 != 0)
				}
				w.inSel = !w.inSel
			}
		case 5, 6: // trigger / Deleted trigger
			var obj *corev1.ConfigMap
			switch arg % 3 {
			case 0:
				if w.uid == "" || !w.inSel && op == 5 {
					continue
				}
				obj = simObj(w.uid, w.rv)
			case 1:
				if w.prev == "" {
					continue
				}
				obj = simObj(w.prev, 0)
				if multi && len(prevs) > 0 && arg&4 != 0 {
					if p := prevs[int(arg>>4)%len(prevs)]; p != "" {
						obj = simObj(p, 0)
					}
				}
			case 2:
				obj = simObj("", 0)
			}
			e := cmEv{Object: obj, Type: opkit.Modified, Source: opkit.Operator, Reason: fmt.Sprintf("t%d", seq+1), Fetched: arg%3 == 0}
			if arg&64 != 0 {
				e.Type = opkit.Added
			}
			if op == 6 {
				e.Type, e.Fetched = opkit.Deleted, false
			}
			d := []time.Duration{0, time.Second, 30 * time.Second, time.Hour}[(arg>>3)%4]
			retries := 0
			if arg&128 != 0 {
				retries = 2
			}
			add(e, queue.AddOptions{Delay: d, Priority: 100, Retries: retries}, "trigger")
		case 7, 10:
			if inflight == nil {
				get(cancelled)
			}
		case 8:
			if inflight != nil {
				finish(arg)
			}
		case 9:
			time.Sleep([]time.Duration{time.Second, 30 * time.Second, 5 * time.Minute, time.Hour, 2 * time.Second, 10 * time.Millisecond, 90 * time.Second, 10 * time.Minute}[arg%8])
		case 11: // leader term ends, a new one starts
			q.Suspend()
			n := q.Clear()
			logf("term end: suspended, cleared %d", n)
			if inflight != nil {
				if arg&1 != 0 {

					finish(arg >> 1) // finished before it saw the cancel; re-adds dropped
				} else {
					q.Done(k)
					recs[recIdx].skip, recs[recIdx].seen = true, "" // interrupted: did not happen
					logf("interrupted")
					inflight = nil
				}
			}
			tr.run++
			q.Resume()
			logf("term %d: initial list", tr.run)
			if w.uid != "" && w.inSel {
				observe(w.uid, w.rv, true, true)
			} else {
				emitEarlierOf(true, -1)
				if tr.cur != nil && tr.cur.reemit(true, tr.run) {
					c := *tr.cur
					deleted(c.uid, c.rv, tomb(c.uid, c.rv), true, true, "initial-vanished")
				}
			}
		}
		maxParked = max(maxParked, q.Stats().Parked)
	}
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
	if limit := maxSimParked + 2*btoi(multi); maxParked > limit {
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
				if r.seq > a.seq && !r.failed && (r.seen == fu || r.seen == "" && !r.skip) {
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
				if b.accepted && b.ev.Source == opkit.APIServer && b.ev.Type != opkit.Deleted && !b.ev.Retried && !b.ev.Requeued && uidS(b.ev.Object) == u {
					back = true
				}
			}
			if back {
				continue
			}
			ok := false
			for _, r := range recs {
				if r.seq > a.seq && r.typ == opkit.Deleted && r.seen == u && !r.skip && !r.failed {
					ok = true
				}
			}
			if !ok {
				return dump(fmt.Sprintf("(b) watch delete #%d %s never handed out afterwards", a.seq, dEv(a.ev)))
			}
		}
		if a.ev.Type == opkit.Deleted && a.ev.Source == opkit.Operator && !a.ev.Retried && !a.ev.Requeued && a.term == tr.run {
			ok := false
			for _, r := range recs {
				if r.seq > a.seq && r.typ == opkit.Deleted && (r.seen == u || u == "") && !r.skip && !r.failed {
					ok = true
				}
			}
			if !ok {
				return dump(fmt.Sprintf("(e) Deleted trigger #%d %s never served by a Deleted reconcile", a.seq, dEv(a.ev)))
			}
		}
	}
	{
		if tr.cur != nil && tr.cur.deleted || len(tr.earlier) > 0 {
			s := ""
			if tr.cur != nil && tr.cur.deleted {
				s += fmt.Sprintf(" cur %s@%s", tr.cur.uid, tr.cur.rv)
			}
			for _, e := range tr.earlier {
				s += fmt.Sprintf(" earlier %s@%s", e.uid, e.rv)
			}
			return dump("(d) unsettled at the end:" + s)
		}
	}
	seenRec := map[string]bool{}
	for _, r := range recs {
		if r.record == "" {
			continue
		}
		if seenRec[r.record] {
			return dump(fmt.Sprintf("(f) trigger %s recorded twice", r.record))
		}
		seenRec[r.record] = true
	}
	for _, a := range adds {
		if !a.accepted || a.ev.Source != opkit.Operator || a.ev.Type != opkit.Deleted || readdEv(a.ev) || a.term != tr.run {
			continue
		}
		ok := false
		for _, r := range recs {
			if r.seq > a.seq && r.record != "" {
				ok = true
			}
		}
		if !ok {
			return dump(fmt.Sprintf("(g) Deleted trigger #%d %s never recorded, nor any later trigger", a.seq, dEv(a.ev)))
		}
	}
	return ""
}

// MergeEvents through the queue, over random histories of one key with
// the watcher's tracker, the worker's re-fetch and settle, and leader
// terms simulated (see runHistory): no trigger or change of the object that
// exists is left without a reconcile, no watch delete is lost or left
// unsettled, and no chain grows; with two objects of the name in a
// history, and with three or four (multi).
func TestMergeEventsOverRandomHistories(t *testing.T) {
	for _, tc := range []struct {
		n, length int
		multi     bool
	}{{3000, 40, false}, {300, 300, false}, {1000, 40, true}} {
		simHistories(t, tc.n, tc.length, func(ops []byte, verbose bool) string {
			return runHistory(ops, tc.multi, verbose)
		})
	}
}

// simHistories runs n random histories of length steps (seeded, so that a
// failure is reproducible) and reports each failing property once, with
// its history shrunk.
func simHistories(t *testing.T, n, length int, run func(ops []byte, verbose bool) string) {
	t.Helper()
	counts := map[string]int{}
	shortest := map[string][]byte{}
	for seed := range n {
		r := rand.New(rand.NewPCG(uint64(seed), 11))
		ops := make([]byte, 2*length)
		for i := range ops {
			ops[i] = byte(r.IntN(256))
		}
		var f string
		synctest.Test(t, func(t *testing.T) { f = run(ops, false) })
		if f == "" {
			continue
		}
		cls := f[:3]
		counts[cls]++
		if counts[cls] <= 3 {
			if m := shrink(t, ops, run); shortest[cls] == nil || len(m) < len(shortest[cls]) {
				shortest[cls] = m
			}
		}
	}
	for cls, c := range counts {
		var f string
		synctest.Test(t, func(t *testing.T) { f = run(shortest[cls], true) })
		t.Errorf("%s: %d of %d histories of %d steps; shrunk to %v:\n%s", cls, c, n, length, shortest[cls], f)
	}
}

// shrink drops steps from a failing history while it fails the same way.
func shrink(t *testing.T, ops []byte, run func(ops []byte, verbose bool) string) []byte {
	fails := func(o []byte) string {
		var f string
		synctest.Test(t, func(t *testing.T) { f = run(o, false) })
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

// btoi is 1 for true.
func btoi(b bool) int {
	if b {
		return 1
	}
	return 0
}

// readdEv reports whether e is a re-add.
func readdEv(e cmEv) bool { return e.Retried || e.Requeued }
