package trigger

import (
	"context"
	"crypto"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rsa"
	_ "crypto/sha512" // SHA-384 and SHA-512 for the *384 and *512 algorithms
	"encoding/base64"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"math/big"
	"slices"
	"strings"
	"sync"
	"time"

	"golang.org/x/sync/singleflight"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/rest"
)

// verdict is what a local look at a bearer token decided.
type verdict uint8

const (
	tokenUnknown verdict = iota // not a JWT of the service-account issuer, or its keys are not known: a TokenReview decides (under the global budget)
	tokenSigned                 // a JWT of the service-account issuer, signed by one of its current keys, for one of the audiences, within its validity (exp, nbf, with 1 minute of skew): a TokenReview still decides (revocation), outside the global budget
	tokenForged                 // claims the service-account issuer (iss), but its signature, algorithm, audience or validity is wrong, or its kid is unknown to a fetch made for it: refused without a review
)

// Timing and size of the key and verdict caches.
const (
	jwtSkew       = time.Minute      // tolerance on exp and nbf
	keysRetry     = 10 * time.Second // least time between two fetches of the keys
	keysRefresh   = 10 * time.Minute // age at which the keys are fetched again anyway
	keysTimeout   = 10 * time.Second // limit of one fetch (discovery and JWKS)
	verdictsLimit = 4096             // token hashes whose verdict is remembered
)

// issuerKeys classifies bearer tokens by the published keys of the API
// server's service-account issuer (see check). The zero value is not
// usable; call newIssuerKeys.
type issuerKeys struct {
	rc        rest.Interface // nil: every token is tokenUnknown
	audiences []string
	log       *slog.Logger // warned when the keys cannot be read (nil: nothing)
	fetches   singleflight.Group

	verdicts *ttlCache[pastVerdict] // by the tokens' SHA-256

	mu        sync.Mutex
	set       *jwkSet   // nil until a fetch works, and after one fails
	fetchedAt time.Time // end of the last fetch, whether it worked or not
	fetchErr  error     // of the last fetch
}

// jwkSet is one fetched, immutable set of the issuer's keys by kid.
type jwkSet struct {
	issuer string
	keys   map[string]jwk
}

// jwk is one key of a JSON Web Key Set (RFC 7517), with the parsed key in pub.
type jwk struct {
	Kty, Use, Kid, Alg, Crv, N, E, X, Y string
	pub                                 crypto.PublicKey // *rsa.PublicKey or *ecdsa.PublicKey
}

// pastVerdict is a verdict on one token (with its subject when signed),
// valid while set is the current key set (and its cache entry lives).
type pastVerdict struct {
	v   verdict
	set *jwkSet
	sub string
}

// newIssuerKeys returns the keys of the API server's service-account
// issuer, fetched lazily through rc (GET /.well-known/openid-configuration
// for "issuer", then GET /openid/v1/jwks). A token must be for one of audiences. rc may be nil,
// or a typed nil *rest.RESTClient (as fake clientsets return), and
// audiences empty: then every token is tokenUnknown. log, if not nil,
// gets a warning each time the keys cannot be read after they could.
func newIssuerKeys(rc rest.Interface, audiences []string, log *slog.Logger) *issuerKeys {
	if c, ok := rc.(*rest.RESTClient); (ok && c == nil) || len(audiences) == 0 {
		rc = nil
	}
	return &issuerKeys{rc: rc, audiences: slices.Clone(audiences), log: log, verdicts: newTTLCache[pastVerdict](verdictsLimit)}
}

// err returns why the last fetch of the keys failed; nil when the keys
// are known (or were never needed).
func (k *issuerKeys) err() error {
	k.mu.Lock()
	defer k.mu.Unlock()
	return k.fetchErr
}

// check classifies tok, whose SHA-256 is sum. It never logs or returns
// the token. A string that is not a JWT, or a JWT of another issuer, is
// tokenUnknown; a JWT whose iss is the service-account issuer's is
// tokenSigned or tokenForged. A signature is verified once: the verdicts
// of the last verdictsLimit tokens used are remembered (by sum) while the
// keys stay the same, a tokenSigned until the token expires, a
// tokenForged for keysRetry only. The subject (sub) comes with
// tokenSigned. Safe for concurrent use.
func (k *issuerKeys) check(ctx context.Context, tok, sum string) (v verdict, subject string) {
	head, payload, sig, ok := splitJWT(tok)
	if k.rc == nil || !ok {
		return tokenUnknown, ""
	}
	var claims jwtClaims
	badClaims := json.Unmarshal(payload, &claims) // sets Iss even if a later claim is of the wrong type
	if claims.Iss == "" {
		return tokenUnknown, ""
	}
	var header struct{ Alg, Kid string }
	badHeader := json.Unmarshal(head, &header)
	set, refetched := k.keys(ctx, claims.Iss, header.Kid)
	if set == nil || claims.Iss != set.issuer {
		return tokenUnknown, ""
	}
	if r, ok := k.verdicts.get(sum); ok && r.set == set {
		return r.v, r.sub
	}
	now := time.Now()
	r, until := pastVerdict{v: tokenForged, set: set}, now.Add(keysRetry)
	key, known := set.keys[header.Kid] // the zero jwk if unknown: it verifies nothing
	if !known && (!refetched || k.err() != nil) {
		return tokenUnknown, "" // maybe a key published since the keys were read (or could not be read again)
	}
	signed := []byte(tok[:strings.LastIndexByte(tok, '.')])
	if badClaims == nil && badHeader == nil && (key.Alg == "" || key.Alg == header.Alg) &&
		jwsVerify(header.Alg, key.pub, signed, sig) && slices.ContainsFunc(k.audiences, claims.Aud.has) {
		if exp, ok := claims.validAt(now); ok {
			r.v, r.sub, until = tokenSigned, claims.Sub, exp
		}
	}
	k.verdicts.put(sum, r, until)
	return r.v, r.sub
}

// jwtClaims are the claims check looks at; Exp is required.
type jwtClaims struct {
	Iss, Sub string
	Aud      jwtAudience
	Exp, Nbf *float64
}

// validAt reports whether now is within the claims' validity, with jwtSkew
// either side, and until when.
func (c jwtClaims) validAt(now time.Time) (until time.Time, ok bool) {
	if c.Exp == nil {
		return time.Time{}, false
	}
	until = time.Unix(int64(*c.Exp), 0).Add(jwtSkew)
	started := c.Nbf == nil || !now.Before(time.Unix(int64(*c.Nbf), 0).Add(-jwtSkew))
	return until, started && now.Before(until)
}

// keys returns the current key set (nil: not known), fetching it first
// when it is due: never fetched, keysRefresh old, or for keysRetry either
// missing or lacking kid of issuer iss (not of others: their kids are not
// for this issuer to know). Concurrent callers share one fetch. The caller
// waits for it, or for its ctx, unless it only refreshes the set;
// refetched says it waited for a fetch that ended.
func (k *issuerKeys) keys(ctx context.Context, iss, kid string) (set *jwkSet, refetched bool) {
	k.mu.Lock()
	set, last := k.set, k.fetchedAt
	k.mu.Unlock()
	age := time.Since(last)
	lacking := set == nil || (set.issuer == iss && set.keys[kid].pub == nil)
	if !last.IsZero() && age < keysRefresh && (!lacking || age < keysRetry) {
		return set, false
	}
	done := k.fetches.DoChan("", func() (any, error) {
		k.mu.Lock()
		fresh := k.fetchedAt != last // another fetch ended since this caller looked
		k.mu.Unlock()
		if !fresh {
			fctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), keysTimeout)
			set, err := k.fetch(fctx)
			cancel()
			k.mu.Lock()
			if err == nil { // a failed fetch keeps the keys it had
				k.set = set
			}
			failing := err != nil && k.fetchErr == nil // the first failure in a row
			k.fetchErr, k.fetchedAt = err, time.Now()
			k.mu.Unlock()
			if failing && k.log != nil {
				k.log.LogAttrs(ctx, slog.LevelWarn, "trigger: the service-account issuer's keys cannot be read, so every token costs a TokenReview, under the budget of tokens not checked here (grant get on /.well-known/openid-configuration and /openid/v1/jwks: ClusterRole system:service-account-issuer-discovery)", slog.Any("error", err))
			}
		}
		return nil, nil
	})
	if !lacking {
		return set, false // a refresh: the keys serve on while it runs
	}
	select {
	case <-done:
		refetched = true
	case <-ctx.Done():
	}
	k.mu.Lock()
	defer k.mu.Unlock()
	return k.set, refetched
}

// fetch reads the issuer from the discovery document, then the keys from
// the API server's own JWKS endpoint. That is not always the document's
// jwks_uri: with --service-account-jwks-uri (as managed clusters set it)
// that points elsewhere, maybe out of reach, but the API server still
// serves the same keys at /openid/v1/jwks.
func (k *issuerKeys) fetch(ctx context.Context) (*jwkSet, error) {
	var disc struct{ Issuer string }
	if err := k.get(ctx, "/.well-known/openid-configuration", &disc); err != nil {
		return nil, err
	}
	if disc.Issuer == "" {
		return nil, errors.New("service-account issuer keys: no issuer in the discovery document")
	}
	var jwks struct{ Keys []jwk }
	if err := k.get(ctx, "/openid/v1/jwks", &jwks); err != nil {
		return nil, err
	}
	set := &jwkSet{issuer: disc.Issuer, keys: map[string]jwk{}}
	for _, key := range jwks.Keys {
		if key.Use == "" || key.Use == "sig" {
			if key.pub = key.parse(); key.pub != nil {
				set.keys[key.Kid] = key
			}
		}
	}
	return set, nil
}

// get decodes the JSON at path on the API server into v; its error is the
// API server's Status when it sent one.
func (k *issuerKeys) get(ctx context.Context, path string, v any) error {
	raw, err := k.rc.Get().AbsPath(path).DoRaw(ctx)
	var status metav1.Status
	if err != nil && json.Unmarshal(raw, &status) == nil && status.Kind == "Status" {
		err = &apierrors.StatusError{ErrStatus: status}
	}
	if err == nil {
		err = json.Unmarshal(raw, v)
	}
	if err != nil {
		return fmt.Errorf("service-account issuer keys: GET %s: %w", path, err)
	}
	return nil
}

// jwkCurves are the JWK curves; jwsCurves, those of the ES algorithms.
var jwkCurves = map[string]elliptic.Curve{"P-256": elliptic.P256(), "P-384": elliptic.P384(), "P-521": elliptic.P521()}
var jwsCurves = map[string]elliptic.Curve{"ES256": elliptic.P256(), "ES384": elliptic.P384(), "ES512": elliptic.P521()}

// jwsHashes are the hashes of the algorithms, by their last three characters.
var jwsHashes = map[string]crypto.Hash{"256": crypto.SHA256, "384": crypto.SHA384, "512": crypto.SHA512}

// parse returns the public key of an RSA or EC JWK; nil if it is malformed.
func (j jwk) parse() crypto.PublicKey {
	b64 := base64.RawURLEncoding
	switch j.Kty {
	case "RSA":
		n, err1 := b64.DecodeString(j.N)
		e, err2 := b64.DecodeString(j.E)
		if err1 != nil || err2 != nil || len(e) == 0 || len(e) > 4 {
			return nil
		}
		return &rsa.PublicKey{N: new(big.Int).SetBytes(n), E: int(new(big.Int).SetBytes(e).Int64())}
	case "EC":
		x, err1 := b64.DecodeString(j.X)
		y, err2 := b64.DecodeString(j.Y)
		if c := jwkCurves[j.Crv]; c != nil && err1 == nil && err2 == nil && len(x) == len(y) {
			if pub, err := ecdsa.ParseUncompressedPublicKey(c, slices.Concat([]byte{4}, x, y)); err == nil {
				return pub
			}
		}
	}
	return nil
}

// jwsVerify reports whether sig is alg's signature of signed by key: RS*
// and PS* with an RSA key, ES* with an EC key of the matching curve; any
// other alg ("none", HMAC) is refused.
func jwsVerify(alg string, key crypto.PublicKey, signed, sig []byte) bool {
	if len(alg) != 5 || jwsHashes[alg[2:]] == 0 {
		return false
	}
	hash := jwsHashes[alg[2:]]
	h := hash.New()
	h.Write(signed)
	digest := h.Sum(nil)
	switch pub := key.(type) {
	case *rsa.PublicKey:
		switch alg[:2] {
		case "RS":
			return rsa.VerifyPKCS1v15(pub, hash, digest, sig) == nil
		case "PS":
			return rsa.VerifyPSS(pub, hash, digest, sig, &rsa.PSSOptions{SaltLength: rsa.PSSSaltLengthEqualsHash}) == nil
		}
	case *ecdsa.PublicKey:
		size := (pub.Curve.Params().BitSize + 7) / 8
		if jwsCurves[alg] == pub.Curve && len(sig) == 2*size {
			return ecdsa.Verify(pub, digest, new(big.Int).SetBytes(sig[:size]), new(big.Int).SetBytes(sig[size:]))
		}
	}
	return false
}

// splitJWT decodes the three base64url parts of a compact JWS; ok is
// false unless the header and payload decode (the signature may not).
func splitJWT(tok string) (header, payload, sig []byte, ok bool) {
	h, more, _ := strings.Cut(tok, ".")
	p, s, ok := strings.Cut(more, ".")
	if !ok || strings.Contains(s, ".") {
		return nil, nil, nil, false
	}
	b64 := base64.RawURLEncoding
	header, err1 := b64.DecodeString(h)
	payload, err2 := b64.DecodeString(p)
	sig, _ = b64.DecodeString(s)
	return header, payload, sig, err1 == nil && err2 == nil
}

// jwtAudience is a JWT's aud claim: one string or a list of them.
type jwtAudience []string

// UnmarshalJSON takes either form.
func (a *jwtAudience) UnmarshalJSON(b []byte) error {
	var one string
	if json.Unmarshal(b, &one) == nil {
		*a = jwtAudience{one}
		return nil
	}
	return json.Unmarshal(b, (*[]string)(a))
}

// has reports whether aud is among a.
func (a jwtAudience) has(aud string) bool { return slices.Contains(a, aud) }
