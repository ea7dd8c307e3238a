// Package leaderbench measures leadership handoff on a real control plane
// (internal/testcluster), opkit's leader.Elector against client-go's
// tools/leaderelection with the same LeaseDuration, RenewDeadline and
// RetryPeriod, in the same run:
//
//   - graceful handoff: from the moment the leader's context is cancelled
//     (it stops its work and releases the Lease) to the moment the
//     follower's term starts (opkit: its work is called; client-go:
//     OnStartedLeading, with ReleaseOnCancel set);
//   - crash takeover: from the moment the leader's client starts failing
//     every request (a dead process, as far as the API server can tell; it
//     does not release) to the moment the follower's term starts.
//
// Each iteration uses a fresh Lease, starts the leader, waits until it
// leads, starts one follower and lets it settle (watch established, a few
// polls) before the handoff. The figures are reported as the median and
// the maximum over b.N iterations (run with -benchtime=Nx).
//
// The benchmarks start a private control plane on first use and skip when
// its binaries are missing. The benchmark goroutine owns every elector it
// starts and stops it before the next iteration.
package leaderbench
