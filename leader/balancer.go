// balancer.go holds the Balancer, which spreads a group's shard Leases over its live replicas.

package leader

import (
	"cmp"
	"context"
	"fmt"
	"hash/fnv"
	"log/slog"
	"slices"
	"sync"
	"time"

	coordinationv1 "k8s.io/api/coordination/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/validation"
	"k8s.io/client-go/kubernetes"
	coordclient "k8s.io/client-go/kubernetes/typed/coordination/v1"
)

// GroupLabel is the label that marks the member Leases of a Balancer's
// group; its value is the group's name.
const GroupLabel = "leader.opkit.dev/group"

// BalancerConfig configures a Balancer. Client, Namespace, Group,
// Identity and Shards are required.
type BalancerConfig struct {
	// Client is used for Leases only: this replica's member Lease (create,
	// update, delete) and the group's (list, delete when long dead).
	Client    kubernetes.Interface
	Namespace string
	// Group names the replicas that share the shards: a DNS label of at
	// most 40 characters. Each replica keeps a member Lease labelled
	// GroupLabel=Group.
	Group string
	// Identity is this replica's identity, the one its electors hold
	// their Leases with. Required.
	Identity string
	// Shards is the number of shards S, one elector each.
	Shards int
	// LeaseDuration is how long a member Lease that stopped changing
	// counts as alive; RetryPeriod how often this replica renews its own
	// and looks at the others'. Defaults as Config's (15s, 2s).
	LeaseDuration, RetryPeriod time.Duration
	// Logger: nil means slog.Default().
	Logger *slog.Logger
}

// Balancer spreads the S shard Leases of a group over its live replicas:
// each replica takes at most its share, ⌈S/N⌉ for N live replicas, and
// hands a shard over (Elector.Yield) while it holds more, one per
// RetryPeriod. Every shard's elector is configured with the Balancer's
// Admit and registered with Add; Balancer.Run runs beside them.
//
// The Balancer only decides who may campaign: that no two replicas ever
// work on one shard at once is the electors' guarantee. A replica that
// dies stops renewing its member Lease; after LeaseDuration the others
// count one replica fewer, and take its shards as their Leases expire. A
// replica that stops gracefully deletes its member Lease.
type Balancer struct {
	cfg      BalancerConfig
	leases   coordclient.LeaseInterface
	log      *slog.Logger
	name     string // this replica's member Lease
	electors []*Elector

	mu      sync.Mutex
	members int   // live replicas, this one included; 0 until the first count
	lastErr error // of the last round; nil once one succeeded
	// admitted holds when Admit last said yes, for acquisitions that
	// may not show in Held yet (a RetryPeriod/2 covers one Lease write).
	admitted []time.Time
	// seen: per member Lease the last count listed, its resourceVersion
	// and when it was last seen to change (Run's goroutine only).
	seen map[string]memberSeen
}

type memberSeen struct {
	rv      string
	changed time.Time
}

// NewBalancer validates cfg and returns a Balancer.
func NewBalancer(cfg BalancerConfig) (*Balancer, error) {
	bad := func(format string, args ...any) (*Balancer, error) {
		return nil, fmt.Errorf("%w: balancer: "+format, append([]any{ErrInvalidConfig}, args...)...)
	}
	cfg.LeaseDuration = cmp.Or(cfg.LeaseDuration, DefaultLeaseDuration)
	cfg.RetryPeriod = cmp.Or(cfg.RetryPeriod, DefaultRetryPeriod)
	switch {
	case cfg.Client == nil:
		return bad("Client is nil")
	case cfg.Namespace == "" || cfg.Identity == "":
		return bad("Namespace and Identity are required")
	case len(validation.IsDNS1123Label(cfg.Group)) > 0 || len(cfg.Group) > 40:
		return bad("Group %q: want a DNS label of at most 40 characters", cfg.Group)
	case cfg.Shards < 1:
		return bad("%d shards: want at least 1", cfg.Shards)
	case cfg.RetryPeriod <= 0 || cfg.LeaseDuration <= cfg.RetryPeriod:
		return bad("RetryPeriod %v must be positive and below LeaseDuration %v", cfg.RetryPeriod, cfg.LeaseDuration)
	}
	h := fnv.New64a()
	h.Write([]byte(cfg.Identity))
	name := fmt.Sprintf("%s-member-%016x", cfg.Group, h.Sum64())
	log := cmp.Or(cfg.Logger, slog.Default())
	return &Balancer{cfg: cfg, leases: cfg.Client.CoordinationV1().Leases(cfg.Namespace), name: name,
		log: log.With("group", cfg.Group, "identity", cfg.Identity)}, nil
}

// Add registers electors of this replica's shards, before Run.
func (b *Balancer) Add(e ...*Elector) {
	b.mu.Lock()
	defer b.mu.Unlock()
	b.electors = append(b.electors, e...)
}

// Members returns the number of live replicas last counted (0 before the
// first count), and Share the most shards this replica should hold.
func (b *Balancer) Members() int {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.members
}

// Share is ⌈S/N⌉ for the N live replicas last counted; 0 before the
// first count.
func (b *Balancer) Share() int {
	n := b.Members()
	if n == 0 {
		return 0
	}
	return (b.cfg.Shards + n - 1) / n
}

// Held returns how many of the registered electors lead.
func (b *Balancer) Held() int {
	b.mu.Lock()
	es := b.electors
	b.mu.Unlock()
	n := 0
	for _, e := range es {
		if e.IsLeader() {
			n++
		}
	}
	return n
}

// Admit reports whether this replica may acquire one more shard: it
// holds fewer than its share, counting the acquisitions it admitted in
// the last half RetryPeriod (so that shards freed at once do not all go
// to the replica whose electors ask first). It is every shard elector's
// Config.Admit.
func (b *Balancer) Admit() bool {
	held, share := b.Held(), b.Share()
	b.mu.Lock()
	defer b.mu.Unlock()
	now := time.Now()
	b.admitted = slices.DeleteFunc(b.admitted, func(at time.Time) bool { return now.Sub(at) > b.cfg.RetryPeriod/2 })
	if held+len(b.admitted) >= share {
		return false
	}
	b.admitted = append(b.admitted, now)
	return true
}

// Check reports the last round's failure (renewing or counting the
// members), nil when it succeeded.
func (b *Balancer) Check() error {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.lastErr
}

// Run renews this replica's member Lease and counts the live ones every
// RetryPeriod, and yields one shard per RetryPeriod while this replica
// holds more than its share, until ctx ends; then it deletes its member
// Lease, so that the others count it gone at once. It returns nil.
func (b *Balancer) Run(ctx context.Context) error {
	defer func() {
		dctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), b.cfg.RetryPeriod)
		defer cancel()
		if err := b.leases.Delete(dctx, b.name, metav1.DeleteOptions{}); err != nil && !apierrors.IsNotFound(err) {
			b.log.Warn("deleting the member lease failed; the others count this replica until it expires", "err", err)
		}
	}()
	tick := time.NewTicker(b.cfg.RetryPeriod)
	defer tick.Stop()
	for {
		b.round(ctx)
		select {
		case <-ctx.Done():
			return nil
		case <-tick.C:
		}
	}
}

// round is one RetryPeriod's work: count, renew, rebalance. It renews
// this replica's member Lease only after it could count the others: a
// replica that cannot list the member Leases would take no shard (its
// share unknown) while the others counted it.
func (b *Balancer) round(ctx context.Context) {
	rctx, cancel := context.WithTimeout(ctx, b.cfg.RetryPeriod)
	defer cancel()
	n, own, err := b.count(rctx)
	if err != nil {
		err = fmt.Errorf("leader: counting the group's members: %w", err)
	} else if err = b.renew(rctx, own); err != nil {
		err = fmt.Errorf("leader: renewing the member lease: %w", err)
	}
	b.mu.Lock()
	b.lastErr = err
	b.mu.Unlock()
	if err != nil {
		if ctx.Err() == nil {
			b.log.Warn("balancer round failed; retrying", "after", b.cfg.RetryPeriod, "err", err)
		}
		return
	}
	b.mu.Lock()
	changed := n != b.members
	b.members = n
	es := b.electors
	b.mu.Unlock()
	if changed {
		b.log.Info("members counted", "members", n, "share", b.Share())
	}
	if held, share := b.Held(), b.Share(); held > share {
		for _, e := range slices.Backward(es) {
			if e.Yield() {
				b.log.Info("yielding a shard", "lease", e.cfg.Name, "held", held, "share", share)
				return
			}
		}
	}
}

// renew writes this replica's member Lease with a new renewTime: an
// update of own, the Lease as count listed it, or a create when it was
// not listed.
func (b *Balancer) renew(ctx context.Context, own *coordinationv1.Lease) error {
	l := own
	if l == nil {
		l = &coordinationv1.Lease{ObjectMeta: metav1.ObjectMeta{Name: b.name, Namespace: b.cfg.Namespace,
			Labels: map[string]string{GroupLabel: b.cfg.Group}}}
	}
	now, secs := metav1.NewMicroTime(time.Now()), wholeSeconds(b.cfg.LeaseDuration)
	l.Spec.HolderIdentity, l.Spec.LeaseDurationSeconds, l.Spec.RenewTime = &b.cfg.Identity, &secs, &now
	var err error
	if own == nil {
		_, err = b.leases.Create(ctx, l, metav1.CreateOptions{})
	} else {
		_, err = b.leases.Update(ctx, l, metav1.UpdateOptions{})
	}
	return err
}

// count lists the group's member Leases and returns how many replicas
// are alive, and this replica's member Lease as listed (nil if none):
// this one, and those whose member Lease changed its
// resourceVersion within its leaseDurationSeconds (at least
// LeaseDuration) as this replica saw it (no clock of another node is
// compared). A Lease first seen counts from then. One dead for four
// times that is deleted, with its resourceVersion as precondition.
func (b *Balancer) count(ctx context.Context) (int, *coordinationv1.Lease, error) {
	list, err := b.leases.List(ctx, metav1.ListOptions{LabelSelector: GroupLabel + "=" + b.cfg.Group})
	if err != nil {
		return 0, nil, err
	}
	now, live := time.Now(), 1 // this replica
	var own *coordinationv1.Lease
	seen := map[string]memberSeen{} // of the members listed now: the others are gone
	for i, l := range list.Items {
		if l.Name == b.name {
			own = &list.Items[i]
			continue
		}
		s, ok := b.seen[l.Name]
		if !ok || s.rv != l.ResourceVersion {
			s = memberSeen{rv: l.ResourceVersion, changed: now}
		}
		seen[l.Name] = s
		ttl := b.cfg.LeaseDuration
		if l.Spec.LeaseDurationSeconds != nil {
			ttl = max(ttl, time.Duration(*l.Spec.LeaseDurationSeconds)*time.Second)
		}
		switch age := now.Sub(s.changed); {
		case age < ttl:
			live++
		case age > 4*ttl:
			err := b.leases.Delete(ctx, l.Name, *metav1.NewRVDeletionPrecondition(l.ResourceVersion))
			if err != nil && !apierrors.IsNotFound(err) && !apierrors.IsConflict(err) {
				b.log.Debug("deleting a dead member lease", "lease", l.Name, "err", err)
			}
		}
	}
	b.seen = seen
	return live, own, nil
}
