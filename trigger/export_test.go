package trigger

// AuthCacheLen returns how many entries a KubeAuthenticator caches, for tests.
func AuthCacheLen(a *KubeAuthenticator) int { return a.tokens.len() + a.perms.len() }
