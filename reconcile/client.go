package reconcile

// The client's rate limit: none once the API server shows it has API
// Priority and Fairness, a bounded guard until then.

import (
	"context"
	"net/http"
	"sync/atomic"

	"k8s.io/client-go/rest"
	"k8s.io/client-go/util/flowcontrol"
)

// flowSchemaHeader is the response header of an API server with API
// Priority and Fairness: the UID of the flow schema that classified the
// request.
const flowSchemaHeader = "X-Kubernetes-Pf-Flowschema-Uid"

// WithClientDefaults returns a copy of cfg that, unless cfg sets a rate
// limit of its own (QPS, Burst or RateLimiter: the one override), has no
// client-side limit once an answer shows the API server has Priority and
// Fairness (which queues and sheds load fairly itself), and until then a
// guard of 100 requests a second (burst 200). client-go honours a 429's
// Retry-After. NewController applies it to Config.RESTConfig.
func WithClientDefaults(cfg *rest.Config) *rest.Config {
	cfg = rest.CopyConfig(cfg)
	if cfg.QPS != 0 || cfg.Burst != 0 || cfg.RateLimiter != nil {
		return cfg
	}
	l := &apfLimiter{guard: flowcontrol.NewTokenBucketRateLimiter(defaultQPS, defaultBurst)}
	cfg.RateLimiter = l
	cfg.Wrap(func(rt http.RoundTripper) http.RoundTripper { return apfWatch{rt, &l.apf} })
	return cfg
}

// apfLimiter is the guard until the API server showed it has Priority
// and Fairness, and no limit from then on.
type apfLimiter struct {
	guard flowcontrol.RateLimiter
	apf   atomic.Bool
}

func (l *apfLimiter) TryAccept() bool { return l.apf.Load() || l.guard.TryAccept() }
func (l *apfLimiter) Accept() {
	if !l.apf.Load() {
		l.guard.Accept()
	}
}
func (l *apfLimiter) Stop() { l.guard.Stop() }
func (l *apfLimiter) QPS() float32 {
	if l.apf.Load() {
		return -1
	}
	return l.guard.QPS()
}
func (l *apfLimiter) Wait(ctx context.Context) error {
	if l.apf.Load() {
		return ctx.Err()
	}
	return l.guard.Wait(ctx)
}

// apfWatch notes an answer that carries the flow schema header.
type apfWatch struct {
	next http.RoundTripper
	apf  *atomic.Bool
}

func (w apfWatch) RoundTrip(r *http.Request) (*http.Response, error) {
	resp, err := w.next.RoundTrip(r)
	if err == nil && resp.Header.Get(flowSchemaHeader) != "" {
		w.apf.Store(true)
	}
	return resp, err
}
