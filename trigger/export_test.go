package trigger

import (
	"context"
	"crypto/sha256"
	"fmt"
	"testing"

	"github.com/opkit/opkit"
)

// AuthCacheLen returns how many entries a NewKubeAuthenticator caches, for tests.
func AuthCacheLen(auth Authenticator) int {
	a := auth.(*kubeAuthenticator)
	a.tokens.mu.Lock()
	defer a.tokens.mu.Unlock()
	a.perms.mu.Lock()
	defer a.perms.mu.Unlock()
	return a.tokens.order.Len() + a.perms.order.Len()
}

// APILevel and BrokerLevel are the log levels of failed calls.
var APILevel, BrokerLevel = apiLevel, brokerLevel

// Limits and defaults the tests check against.
const (
	MaxNameLen      = maxNameLen
	DefaultMaxBytes = defaultMaxBytes
	DefaultPriority = defaultPriority
	MaxCallers      = maxCallers
)

// KindOf and ErrNotRunning are the consumer's, for its tests.
var (
	KindOf        = kindOf
	ErrNotRunning = errNotRunning
)

// Lookup is what the HTTP handler's GET .../triggers/{id} answers from.
func Lookup[T opkit.Object](t *Trigger[T], key opkit.Key, id string) Outcome {
	return t.tickets.lookup(key, id)
}

// For issuer_integration_test.go, which is package trigger_test (the
// control plane it needs imports this package).
var (
	NewIssuerKeys = newIssuerKeys
	IssuerErr     = (*issuerKeys).err
)

// The types and verdicts, for issuer_integration_test.go.
type (
	IssuerKeysT = issuerKeys
	Verdict     = verdict
)

const TokenUnknown, TokenSigned, TokenForged = tokenUnknown, tokenSigned, tokenForged

// IssuerCheck is k's verdict on tok.
func IssuerCheck(k *issuerKeys, ctx context.Context, tok string) verdict {
	v, _ := k.check(ctx, tok, tokenSum(tok))
	return v
}

// tokenSum is tok's SHA-256, the key the caches know it by.
func tokenSum(tok string) string {
	sum := sha256.Sum256([]byte(tok))
	return string(sum[:])
}

// SignedTokens makes auth, a NewKubeAuthenticator for DefaultAudience,
// check service-account tokens against the keys of a fake cluster issuer,
// and returns a function that mints a new token of that issuer for sub
// each time it is called.
func SignedTokens(t *testing.T, auth Authenticator) (mint func(sub string) string) {
	key := es256()
	auth.(*kubeAuthenticator).issuer, _ = newTestIssuer(t, key)
	n := 0
	return func(sub string) string {
		n++
		return key.sign(t, "", claims(map[string]any{"sub": sub, "jti": fmt.Sprint(n)}))
	}
}
