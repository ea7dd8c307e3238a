// config.go holds Config, its defaults and validation, the package's errors and Metrics.

package leader

import (
	"cmp"
	"errors"
	"fmt"
	"log/slog"
	"math/rand/v2"
	"os"
	"strings"
	"time"

	"k8s.io/apimachinery/pkg/util/validation"
	"k8s.io/client-go/kubernetes"

	"github.com/opkit/opkit/queue"
)

// Defaults applied by [New] to zero fields of [Config].
const (
	DefaultLeaseDuration = 15 * time.Second
	DefaultRenewDeadline = 10 * time.Second
	DefaultRetryPeriod   = 2 * time.Second
	DefaultClockSkew     = 1 * time.Second
)

// Errors returned by the package. Use errors.Is to test for them.
var (
	// ErrInvalidConfig wraps every validation error returned by New.
	ErrInvalidConfig = errors.New("leader: invalid config")
	// ErrLeadershipLost is returned by Run when a term ends without
	// shutdown and Config.ExitOnLoss is set.
	ErrLeadershipLost = errors.New("leader: leadership lost")
	// ErrNotRenewed is returned by Check when this replica leads but has not
	// renewed the Lease within RenewDeadline.
	ErrNotRenewed = errors.New("leader: lease not renewed within RenewDeadline")
	// ErrWorkOverrun is returned by Check while a finished term's work is
	// still running past the bound after which another replica may lead.
	ErrWorkOverrun = errors.New("leader: term work still running after its term ended")
	// ErrAlreadyRunning is returned by Run when it is called a second time.
	ErrAlreadyRunning = errors.New("leader: Run already called")
	// ErrWorkPanicked is wrapped by the error Run returns when a term's work
	// panicked (on the goroutine Run started it on); the message carries
	// the panic value and stack.
	ErrWorkPanicked = errors.New("leader: term work panicked")
	// ErrYielded is the cause of a term's context when the term ends
	// because Elector.Yield was called: the work may finish what it has
	// in flight (the Lease is released only once it returned).
	ErrYielded = errors.New("leader: term yielded")
	// ErrCannotCampaign is returned by Check while the API server refuses
	// this replica's reads or writes of the Lease for a reason retrying
	// does not fix (forbidden, unauthorized, invalid, namespace missing):
	// such a replica could never lead.
	ErrCannotCampaign = errors.New("leader: the API server refuses this replica's Lease requests")
)

// Config configures an [Elector]. The zero value of every optional field
// means its default; Client, Namespace and Name are required.
type Config struct {
	// Client is used for coordination.k8s.io/v1 Leases only (get, create,
	// update, watch on the one Lease). Required.
	Client kubernetes.Interface
	// Namespace and Name locate the Lease. Required.
	Namespace, Name string

	// Identity is this replica's holder identity; it must be unique among
	// the replicas. Default: the hostname, "_" and 8 random hex digits.
	Identity string
	// Annotations are what the holder publishes on the Lease while it
	// holds it (set when it acquires it, removed when it releases it),
	// read by the other replicas with Elector.LeaderAnnotation: where the
	// leader's trigger endpoint listens, say. Their names are recorded
	// in PublishedAnnotation so that the next holder removes them even
	// if this one dies without releasing the Lease. New copies the map;
	// Elector.Publish replaces the set later, for a value known only
	// once the elector exists (the URL of a listener bound since).
	Annotations map[string]string

	// LeaseDuration is how long followers wait, after observing the last
	// change of the Lease, before they consider it expired and acquire it.
	// It is written to the Lease rounded up to whole seconds. Minimum 1s.
	// Default 15s.
	LeaseDuration time.Duration
	// RenewDeadline is how long the leader keeps trying to renew before it
	// gives up the term (measured from the start of its last successful
	// renew request). Must be less than LeaseDuration - ClockSkew.
	// Default 10s.
	RenewDeadline time.Duration
	// RetryPeriod is the interval between the leader's renewals and
	// between a follower's polls (followers also watch the Lease, and set a
	// timer for its expiry; a follower polls after 80 to 100% of it). It
	// must be less than RenewDeadline. Default 2s.
	RetryPeriod time.Duration
	// ClockSkew is the safety margin between the end of an ex-leader's work
	// and the earliest moment a follower may acquire: the work must return
	// by (last renew + LeaseDuration - ClockSkew) or it is reported as
	// overrunning. It covers clock-rate differences between nodes and
	// request latency (wall-clock offsets are irrelevant, see the package
	// doc). Must be less than LeaseDuration - RenewDeadline; negative is an
	// error; zero means the default, 1s (there is no way to ask for none).
	ClockSkew time.Duration

	// Gate is the queue's intake. It is suspended at start, resumed when a
	// term starts and suspended first when a term ends. Nil: no gate.
	Gate queue.Gate
	// Admit, if set, is asked before every attempt to acquire a Lease
	// that is free or expired; false: the replica keeps following and
	// asks again within RetryPeriod. A Balancer's Admit spreads the
	// Leases of shards over the replicas.
	Admit func() bool
	// ExitOnLoss makes Run return ErrLeadershipLost (after the term's work
	// has returned) instead of campaigning again when a term is lost.
	ExitOnLoss bool
	// Metrics receives the elector's measurements. Nil: no metrics.
	Metrics Metrics
	// Logger receives the elector's logs; lines about a term carry "term".
	// Nil: slog.Default().
	Logger *slog.Logger
}

// Metrics is what the elector reports. Implementations must be safe for
// concurrent use and must not block. A nil Metrics in Config disables them.
type Metrics interface {
	// Leading sets the "is leader" gauge (1 when true). Every call is a
	// transition of this replica: true when a term starts, false when it
	// ends.
	Leading(leading bool)
	// Renewed records a successful acquisition or renewal; at is when the
	// request was sent. The age of the last renewal is time.Since(at).
	Renewed(at time.Time)
	// RenewFailed counts a failed renew attempt (the term may go on).
	RenewFailed()
	// WorkOverran counts a term whose work did not return within its
	// bound; see the package doc.
	WorkOverran()
}

type nopMetrics struct{}

func (nopMetrics) Leading(bool)      {}
func (nopMetrics) Renewed(time.Time) {}
func (nopMetrics) RenewFailed()      {}
func (nopMetrics) WorkOverran()      {}

type nopGate struct{}

func (nopGate) Suspend()   {}
func (nopGate) Resume()    {}
func (nopGate) Clear() int { return 0 }

// withDefaults returns cfg with defaults applied, or an error wrapping
// ErrInvalidConfig.
func (cfg Config) withDefaults() (Config, error) {
	invalid := func(format string, args ...any) (Config, error) {
		return Config{}, fmt.Errorf("%w: %s", ErrInvalidConfig, fmt.Sprintf(format, args...))
	}
	// The defaults replace zeros only: a negative duration stays for its case.
	cfg.LeaseDuration = cmp.Or(cfg.LeaseDuration, DefaultLeaseDuration)
	cfg.RenewDeadline = cmp.Or(cfg.RenewDeadline, DefaultRenewDeadline)
	cfg.RetryPeriod = cmp.Or(cfg.RetryPeriod, DefaultRetryPeriod)
	cfg.ClockSkew = cmp.Or(cfg.ClockSkew, DefaultClockSkew)
	// The DNS checks also reject an empty Namespace or Name.
	switch nsErrs, nameErrs := validation.IsDNS1123Label(cfg.Namespace), validation.IsDNS1123Subdomain(cfg.Name); {
	case cfg.Client == nil:
		return invalid("Client is nil")
	case len(nsErrs) > 0:
		return invalid("Namespace %q: %s", cfg.Namespace, strings.Join(nsErrs, "; "))
	case len(nameErrs) > 0:
		return invalid("Name %q is not a valid Lease name: %s", cfg.Name, strings.Join(nameErrs, "; "))
	case cfg.LeaseDuration < 0 || cfg.RenewDeadline < 0 || cfg.RetryPeriod < 0 || cfg.ClockSkew < 0:
		return invalid("negative duration")
	case cfg.LeaseDuration < time.Second:
		return invalid("LeaseDuration %s is less than 1s (the Lease stores whole seconds)", cfg.LeaseDuration)
	case cfg.RetryPeriod >= cfg.RenewDeadline:
		return invalid("RetryPeriod %s must be less than RenewDeadline %s", cfg.RetryPeriod, cfg.RenewDeadline)
	case cfg.RenewDeadline+cfg.ClockSkew >= cfg.LeaseDuration:
		// ClockSkew is positive here: this also keeps RenewDeadline below LeaseDuration.
		return invalid("RenewDeadline %s + ClockSkew %s must be less than LeaseDuration %s", cfg.RenewDeadline, cfg.ClockSkew, cfg.LeaseDuration)
	}
	if cfg.Identity == "" {
		id, err := DefaultIdentity()
		if err != nil {
			return Config{}, fmt.Errorf("%w: %w", ErrInvalidConfig, err)
		}
		cfg.Identity = id
	}
	cfg.Gate = cmp.Or[queue.Gate](cfg.Gate, nopGate{})
	cfg.Metrics = cmp.Or[Metrics](cfg.Metrics, nopMetrics{})
	cfg.Logger = cmp.Or(cfg.Logger, slog.Default())
	return cfg, nil
}

// DefaultIdentity is the identity a replica gets when Config.Identity is
// empty: the hostname, "_" and 8 random hex digits.
func DefaultIdentity() (string, error) {
	host, err := os.Hostname()
	if err != nil {
		return "", fmt.Errorf("default identity: %w", err)
	}
	return fmt.Sprintf("%s_%08x", host, rand.Uint32()), nil
}

// wholeSeconds is d rounded up to whole seconds, as a Lease stores its
// duration: the promise written to a Lease is never shorter than the one
// its holder keeps.
func wholeSeconds(d time.Duration) int32 {
	return int32((d + time.Second - 1) / time.Second)
}
