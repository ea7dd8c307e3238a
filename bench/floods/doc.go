// Package floodsbench measures opkit's HTTP trigger endpoint under the
// floods of issue 22, next to the same endpoint idle, in one run: what a
// well-behaved client still gets from it, and what the controller's watch
// still gets done.
//
// The system under test is what trigger/flood_integration_test.go asserts
// on, on a real control plane: a reconcile.Controller over the ConfigMaps
// of one namespace whose client has a request budget of 50 requests a
// second (burst 100) and whose reconciler makes two GETs through it, 16
// workers, its default trigger budget (5 a second, burst 20); its
// endpoint, trigger.NewHandler with the Kubernetes-native authenticator
// (real TokenReviews and SubjectAccessReviews) and its other defaults,
// served by trigger.NewServer on loopback; and a driver that updates one
// of 198 ConfigMaps every 20ms (twice what the budget lets the controller
// reconcile), so the queue always holds watch work. The floods trigger
// those 198.
//
// A run has four phases of 8s each, in this order:
//
//   - idle: no flood;
//   - valid: valid triggers (another ServiceAccount's token) from 64
//     goroutines (floodtest.Valid), then a 5s pause so that the trigger
//     budget they spent is full again;
//   - slow: 200 connections that send a valid trigger's body one byte a
//     second (floodtest.SlowBodies);
//   - garbage: a new garbage bearer token on every request from 64
//     goroutines (floodtest.GarbageTokens).
//
// The floods come from 127.0.0.3. The well-behaved client, from 127.0.0.2
// (the handler counts failed authentications by address), with another
// ServiceAccount's token than the valid flood's (one caller takes at most
// half of the trigger budget), sends a trigger every 500ms (2 a second,
// under its half of the budget) throughout, each from its own
// goroutine, so a slow answer delays no later trigger. Each goes to
// another of 128 ConfigMaps of its own, which nothing else changes or
// triggers, so each takes the whole path: a SubjectAccessReview (the
// TokenReview is cached), a token of the trigger budget, a read through
// the controller's client (waiting its turn in that client's budget) and
// an enqueue. (A trigger of a key the queue already holds would join it
// and cost nothing; most of the valid flood's do.) Before the idle phase,
// the controller's initial list is reconciled (which spends its client's
// burst), only then the driver starts (list entries wait below its watch
// events: started earlier, it would leave some of the client's keys
// queued, for its triggers to join) and fills the queue, and one trigger
// is answered 202.
//
// Metrics, for each phase (idle, valid, slow, garbage): <phase>-ok-%, the
// share of the well-behaved client's 16 triggers answered 202 (no answer
// counts as a failure); <phase>-p50-ms and <phase>-p99-ms, from its
// request to the end of the answer, over the answered triggers (nearest
// rank: with 16 per phase the p99 is the slowest); <phase>-watch-rec/s,
// the reconciles whose Sources include opkit.APIServer, per second of the
// phase. ns/op is suppressed: it would only be the phases' length. The
// benchmark fails, rather than report, when a phase got no answer for the
// well-behaved client, no watch reconcile, or (a flood phase) no answer for
// the flood, or when the idle phase got no 202.
//
// One iteration is the whole phased run, with a fresh controller, endpoint
// and driver (about 50s): run it with -benchtime=1x, and -count for
// several runs. It uses b.Loop, so the function runs once per -count, and
// the default -benchtime=1s (`make bench` sets none) also gives one
// iteration, the first being longer than 1s; -benchtime=Nx gives N runs,
// whose figures are then pooled (triggers and reconciles summed, latencies
// together).
//
// The benchmark starts a private control plane (internal/testcluster) on
// first use and skips when its binaries are missing. It needs the loopback
// addresses 127.0.0.2 and 127.0.0.3 (Linux routes all of 127.0.0.0/8 to
// the loopback interface). The benchmark goroutine owns every controller,
// server, driver and flood it starts and stops them before the next
// iteration.
package floodsbench
