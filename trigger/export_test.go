package trigger

// AuthCacheLen returns how many entries a KubeAuthenticator caches, for tests.
func AuthCacheLen(a *KubeAuthenticator) int {
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
)
