package floodtest

import (
	"context"
	"sync"
	"sync/atomic"

	authnv1 "k8s.io/api/authentication/v1"
	authzv1 "k8s.io/api/authorization/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
	authnclient "k8s.io/client-go/kubernetes/typed/authentication/v1"
	authzclient "k8s.io/client-go/kubernetes/typed/authorization/v1"
)

// Reviews is a trigger.ReviewClient that counts the reviews it sends to
// the API server through Client: TokenReviews (apart, those of tokens
// not made Known), SubjectAccessReviews, and those in flight. Its methods
// are safe for concurrent use.
type Reviews struct {
	Client kubernetes.Interface

	mu    sync.Mutex
	known map[string]bool

	tokens, garbage, sars, inflight atomic.Int64
}

// ReviewCounts is what Reviews counted so far.
type ReviewCounts struct {
	TokenReviews int64
	// Garbage are the TokenReviews of tokens not made Known.
	Garbage              int64
	SubjectAccessReviews int64
	// InFlight are the reviews sent and not answered yet.
	InFlight int64
}

// Known adds tokens to those whose TokenReviews are not Garbage.
func (r *Reviews) Known(tokens ...string) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.known == nil {
		r.known = map[string]bool{}
	}
	for _, t := range tokens {
		r.known[t] = true
	}
}

// Counts returns the counts so far.
func (r *Reviews) Counts() ReviewCounts {
	return ReviewCounts{TokenReviews: r.tokens.Load(), Garbage: r.garbage.Load(), SubjectAccessReviews: r.sars.Load(), InFlight: r.inflight.Load()}
}

// Sub returns the counts of c less those of before (InFlight: c's).
func (c ReviewCounts) Sub(before ReviewCounts) ReviewCounts {
	return ReviewCounts{TokenReviews: c.TokenReviews - before.TokenReviews, Garbage: c.Garbage - before.Garbage,
		SubjectAccessReviews: c.SubjectAccessReviews - before.SubjectAccessReviews, InFlight: c.InFlight}
}

func (r *Reviews) AuthenticationV1() authnclient.AuthenticationV1Interface {
	return countingAuthn{r.Client.AuthenticationV1(), r}
}

func (r *Reviews) AuthorizationV1() authzclient.AuthorizationV1Interface {
	return countingAuthz{r.Client.AuthorizationV1(), r}
}

type countingAuthn struct {
	authnclient.AuthenticationV1Interface
	r *Reviews
}

func (a countingAuthn) TokenReviews() authnclient.TokenReviewInterface {
	return countingTokenReviews{a.AuthenticationV1Interface.TokenReviews(), a.r}
}

type countingTokenReviews struct {
	authnclient.TokenReviewInterface
	r *Reviews
}

func (t countingTokenReviews) Create(ctx context.Context, tr *authnv1.TokenReview, opts metav1.CreateOptions) (*authnv1.TokenReview, error) {
	t.r.tokens.Add(1)
	t.r.mu.Lock()
	known := t.r.known[tr.Spec.Token]
	t.r.mu.Unlock()
	if !known {
		t.r.garbage.Add(1)
	}
	t.r.inflight.Add(1)
	defer t.r.inflight.Add(-1)
	return t.TokenReviewInterface.Create(ctx, tr, opts)
}

type countingAuthz struct {
	authzclient.AuthorizationV1Interface
	r *Reviews
}

func (a countingAuthz) SubjectAccessReviews() authzclient.SubjectAccessReviewInterface {
	return countingSARs{a.AuthorizationV1Interface.SubjectAccessReviews(), a.r}
}

type countingSARs struct {
	authzclient.SubjectAccessReviewInterface
	r *Reviews
}

func (s countingSARs) Create(ctx context.Context, sar *authzv1.SubjectAccessReview, opts metav1.CreateOptions) (*authzv1.SubjectAccessReview, error) {
	s.r.sars.Add(1)
	s.r.inflight.Add(1)
	defer s.r.inflight.Add(-1)
	return s.SubjectAccessReviewInterface.Create(ctx, sar, opts)
}
