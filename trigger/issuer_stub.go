// The stand-in for the service-account issuer check (issuer.go, next):
// until it lands every token is reviewed, under the review budget.

package trigger

import (
	"context"

	"k8s.io/client-go/rest"
)

type verdict uint8

const (
	tokenUnknown verdict = iota
	tokenSigned
	tokenForged
)

type issuerKeys struct{}

func newIssuerKeys(rc rest.Interface, audiences []string) *issuerKeys { return &issuerKeys{} }
func (k *issuerKeys) check(ctx context.Context, tok string) verdict   { return tokenUnknown }
func (k *issuerKeys) err() error                                      { return nil }
