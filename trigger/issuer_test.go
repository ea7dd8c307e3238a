package trigger

import (
	"crypto"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/hmac"
	"crypto/rand"
	"crypto/rsa"
	"crypto/sha256"
	"encoding/base64"
	"encoding/json"
	"fmt"
	"log/slog"
	"math/big"
	"net/http"
	"net/http/httptest"
	"net/url"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"testing/synctest"
	"time"

	"github.com/opkit/opkit/internal/logsink"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/client-go/rest"
)

const (
	testIssuer   = "https://kubernetes.default.svc.cluster.local"
	testAudience = "opkit-trigger"
)

// testKey is a signing key of the fake issuer.
type testKey struct {
	kid, alg string
	priv     crypto.Signer
}

var (
	rsaKey = sync.OnceValue(func() *rsa.PrivateKey { k, _ := rsa.GenerateKey(rand.Reader, 2048); return k })
	ecKey  = sync.OnceValue(func() *ecdsa.PrivateKey { k, _ := ecdsa.GenerateKey(elliptic.P256(), rand.Reader); return k })
	ec384  = sync.OnceValue(func() *ecdsa.PrivateKey { k, _ := ecdsa.GenerateKey(elliptic.P384(), rand.Reader); return k })
	ecKey2 = sync.OnceValue(func() *ecdsa.PrivateKey { k, _ := ecdsa.GenerateKey(elliptic.P256(), rand.Reader); return k })
)

func rs256() testKey { return testKey{"rsa-1", "RS256", rsaKey()} }
func es256() testKey { return testKey{"ec-1", "ES256", ecKey()} }

// jwk returns the key as the API server publishes it.
func (k testKey) jwk() map[string]string {
	b64 := base64.RawURLEncoding.EncodeToString
	switch pub := k.priv.Public().(type) {
	case *rsa.PublicKey:
		return map[string]string{"kty": "RSA", "use": "sig", "kid": k.kid, "alg": k.alg,
			"n": b64(pub.N.Bytes()), "e": b64(big.NewInt(int64(pub.E)).Bytes())}
	case *ecdsa.PublicKey:
		raw, _ := pub.Bytes()
		size := (len(raw) - 1) / 2
		return map[string]string{"kty": "EC", "use": "sig", "kid": k.kid, "alg": k.alg,
			"crv": pub.Curve.Params().Name, "x": b64(raw[1 : 1+size]), "y": b64(raw[1+size:])}
	}
	panic("unknown key type")
}

// sign returns the compact JWS of claims with header {alg, kid} (alg
// overrides the key's unless ""), signed by k whatever alg says.
func (k testKey) sign(t *testing.T, alg string, claims map[string]any) string {
	t.Helper()
	if alg == "" {
		alg = k.alg
	}
	b64 := base64.RawURLEncoding.EncodeToString
	head, _ := json.Marshal(map[string]string{"alg": alg, "kid": k.kid, "typ": "JWT"})
	body, _ := json.Marshal(claims)
	signed := b64(head) + "." + b64(body)
	hash := jwsHashes[k.alg[2:]]
	h := hash.New()
	h.Write([]byte(signed))
	var sig []byte
	var err error
	switch priv := k.priv.(type) {
	case *rsa.PrivateKey:
		if k.alg[:2] == "PS" {
			sig, err = rsa.SignPSS(rand.Reader, priv, hash, h.Sum(nil), &rsa.PSSOptions{SaltLength: rsa.PSSSaltLengthEqualsHash})
		} else {
			sig, err = rsa.SignPKCS1v15(nil, priv, hash, h.Sum(nil))
		}
	case *ecdsa.PrivateKey:
		var r, s *big.Int
		r, s, err = ecdsa.Sign(rand.Reader, priv, h.Sum(nil))
		size := (priv.Curve.Params().BitSize + 7) / 8
		sig = append(r.FillBytes(make([]byte, size)), s.FillBytes(make([]byte, size))...)
	}
	if err != nil {
		t.Fatal(err)
	}
	return signed + "." + b64(sig)
}

// claims are valid claims of the issuer for the trigger's audience, at
// the (bubble's) current time, with changes.
func claims(changes map[string]any) map[string]any {
	now := time.Now().Unix()
	c := map[string]any{"iss": testIssuer, "aud": []string{testAudience}, "sub": "system:serviceaccount:ns:sa",
		"iat": now, "nbf": now, "exp": now + 3600}
	for k, v := range changes {
		if v == nil {
			delete(c, k)
		} else {
			c[k] = v
		}
	}
	return c
}

// fakeIssuer serves the discovery document and the JWKS of an API server.
type fakeIssuer struct {
	mu       sync.Mutex
	keys     []testKey
	extra    []map[string]string // more JWKS entries, served as they are
	status   int                 // non-zero: every request fails with it
	gate     chan struct{}       // non-nil: requests wait until it is closed
	requests atomic.Int32        // discovery requests, one a fetch
}

func (f *fakeIssuer) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	f.mu.Lock()
	status, gate, keys := f.status, f.gate, f.extra
	for _, k := range f.keys {
		keys = append(keys, k.jwk())
	}
	f.mu.Unlock()
	if r.URL.Path == "/.well-known/openid-configuration" {
		f.requests.Add(1)
	}
	if gate != nil {
		<-gate
	}
	if status != 0 {
		http.Error(w, `{"kind":"Status","apiVersion":"v1","status":"Failure","code":403,"reason":"Forbidden","message":"forbidden"}`, status)
		return
	}
	switch r.URL.Path {
	case "/.well-known/openid-configuration":
		// jwks_uri as --service-account-jwks-uri sets it: not this server.
		json.NewEncoder(w).Encode(map[string]any{"issuer": testIssuer, "jwks_uri": "https://oidc.example.com/keys"})
	case "/openid/v1/jwks":
		json.NewEncoder(w).Encode(map[string]any{"keys": keys})
	default:
		http.NotFound(w, r)
	}
}

func (f *fakeIssuer) set(update func(f *fakeIssuer)) {
	f.mu.Lock()
	defer f.mu.Unlock()
	update(f)
}

// handlerTransport serves requests in memory, so that they stay in a
// synctest bubble.
type handlerTransport struct{ http.Handler }

func (h handlerTransport) RoundTrip(r *http.Request) (*http.Response, error) {
	w := httptest.NewRecorder()
	h.ServeHTTP(w, r)
	return w.Result(), nil
}

// newTestIssuer returns issuerKeys for the trigger audience that fetch
// from a fake API server publishing keys.
func newTestIssuer(t *testing.T, keys ...testKey) (*issuerKeys, *fakeIssuer) {
	t.Helper()
	f := &fakeIssuer{keys: keys}
	rc, err := rest.NewRESTClient(&url.URL{Scheme: "https", Host: "10.0.0.1:6443"}, "", rest.ClientContentConfig{},
		nil, &http.Client{Transport: handlerTransport{f}})
	if err != nil {
		t.Fatal(err)
	}
	return newIssuerKeys(rc, []string{"other", testAudience}, nil), f
}

func wantVerdict(t *testing.T, k *issuerKeys, tok string, want verdict) {
	t.Helper()
	if got, _ := k.check(t.Context(), tok, tokenSum(tok)); got != want {
		t.Errorf("check = %d, want %d", got, want)
	}
}

func TestIssuerTakesATokenSignedByAPublishedKey(t *testing.T) {
	ps256 := testKey{"rsa-ps", "PS256", rsaKey()}
	es384 := testKey{"ec-384", "ES384", ec384()}
	for _, key := range []testKey{rs256(), ps256, es256(), es384} {
		t.Run(key.alg, func(t *testing.T) {
			synctest.Test(t, func(t *testing.T) {
				k, _ := newTestIssuer(t, rs256(), ps256, es256(), es384)
				wantVerdict(t, k, key.sign(t, "", claims(nil)), tokenSigned)
				wantVerdict(t, k, key.sign(t, "", claims(map[string]any{"aud": testAudience})), tokenSigned)
				if err := k.err(); err != nil {
					t.Errorf("err() = %v with the keys known", err)
				}
			})
		})
	}
}

func TestIssuerAllowsAMinuteOfClockSkew(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		k, _ := newTestIssuer(t, es256())
		now := time.Now().Unix()
		wantVerdict(t, k, es256().sign(t, "", claims(map[string]any{"exp": now - 59})), tokenSigned)
		wantVerdict(t, k, es256().sign(t, "", claims(map[string]any{"nbf": now + 59})), tokenSigned)
	})
}

func TestIssuerRefusesATokenOfTheIssuerThatIsBadInAnyWay(t *testing.T) {
	other := testKey{"ec-1", "ES256", ecKey2()} // the published kid, another key
	pubBytes := x509PublicBytes(t, ecKey())
	for _, tc := range []struct {
		name string
		tok  func(t *testing.T) string
	}{
		{"signed by another key", func(t *testing.T) string { return other.sign(t, "", claims(nil)) }},
		{"signature changed", func(t *testing.T) string { return flipLastSignatureByte(es256().sign(t, "", claims(nil))) }},
		{"signature not base64url", func(t *testing.T) string { return es256().sign(t, "", claims(nil)) + "!" }},
		{"no signature", func(t *testing.T) string { return unsigned("none", "ec-1", claims(nil)) }},
		{"alg none", func(t *testing.T) string { return unsigned("none", "ec-1", claims(nil)) + "c2ln" }},
		{"HS256 keyed with the public key", func(t *testing.T) string { return hs256(t, "ec-1", pubBytes, claims(nil)) }},
		{"alg not the key's", func(t *testing.T) string { return es256().sign(t, "ES384", claims(nil)) }},
		{"RSA alg on an EC key", func(t *testing.T) string { return es256().sign(t, "RS256", claims(nil)) }},
		{"expired", func(t *testing.T) string {
			return es256().sign(t, "", claims(map[string]any{"exp": time.Now().Unix() - 61}))
		}},
		{"not yet valid", func(t *testing.T) string {
			return es256().sign(t, "", claims(map[string]any{"nbf": time.Now().Unix() + 61}))
		}},
		{"no exp", func(t *testing.T) string { return es256().sign(t, "", claims(map[string]any{"exp": nil})) }},
		{"exp not a number", func(t *testing.T) string { return es256().sign(t, "", claims(map[string]any{"exp": "soon"})) }},
		{"another audience", func(t *testing.T) string {
			return es256().sign(t, "", claims(map[string]any{"aud": []string{"https://kubernetes.default.svc"}}))
		}},
		{"no audience", func(t *testing.T) string { return es256().sign(t, "", claims(map[string]any{"aud": nil})) }},
		{"header not JSON", func(t *testing.T) string {
			tok := es256().sign(t, "", claims(nil))
			return base64.RawURLEncoding.EncodeToString([]byte("{alg")) + tok[len(tok[:strings.IndexByte(tok, '.')]):]
		}},
		{"kid not published", func(t *testing.T) string { return testKey{"ec-9", "ES256", ecKey()}.sign(t, "", claims(nil)) }},
		{"kid of a key not for signatures", func(t *testing.T) string {
			return testKey{"ec-enc", "ES256", ecKey()}.sign(t, "", claims(nil))
		}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			synctest.Test(t, func(t *testing.T) {
				k, f := newTestIssuer(t, es256())
				enc := es256().jwk()
				enc["kid"], enc["use"] = "ec-enc", "enc"
				f.extra = append(f.extra, enc)
				wantVerdict(t, k, tc.tok(t), tokenForged)
			})
		})
	}
}

func TestIssuerLeavesOtherTokensToATokenReview(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		k, f := newTestIssuer(t, es256())
		for _, tok := range []string{"", "opaque-token-of-another-authenticator", "a.b.c", "e30.e30.", "a.b.c.d"} {
			wantVerdict(t, k, tok, tokenUnknown)
		}
		if n := f.requests.Load(); n != 0 {
			t.Errorf("%d fetches for tokens that are not JWTs, want none", n)
		}
		wantVerdict(t, k, es256().sign(t, "", claims(map[string]any{"iss": "https://dex.example.com"})), tokenUnknown)
		wantVerdict(t, k, es256().sign(t, "", claims(map[string]any{"iss": "kubernetes/serviceaccount"})), tokenUnknown)
		time.Sleep(keysRetry)
		dex := testKey{"dex-1", "RS256", rsaKey()}
		wantVerdict(t, k, dex.sign(t, "", claims(map[string]any{"iss": "https://dex.example.com"})), tokenUnknown)
		if n := f.requests.Load(); n != 1 {
			t.Errorf("%d fetches, want 1: another issuer's kid is not one to refetch for", n)
		}
	})
}

func TestIssuerWithoutAClientOrAudiencesLeavesEveryTokenToATokenReview(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		for _, rc := range []rest.Interface{nil, (*rest.RESTClient)(nil)} {
			k := newIssuerKeys(rc, []string{testAudience}, nil)
			wantVerdict(t, k, es256().sign(t, "", claims(nil)), tokenUnknown)
			wantVerdict(t, k, "garbage", tokenUnknown)
		}
		k, _ := newTestIssuer(t, es256())
		k = newIssuerKeys(k.rc, nil, nil) // and without audiences
		wantVerdict(t, k, es256().sign(t, "", claims(nil)), tokenUnknown)
	})
}

// An unknown kid may be a key published since the keys were read: until
// the keys can be read again (10s after the last fetch), a TokenReview
// decides; once a fetch made for it lacks it too, it is forged.
func TestIssuerRefetchesAtMostEveryTenSecondsForAnUnknownKid(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		k, f := newTestIssuer(t, es256())
		wantVerdict(t, k, es256().sign(t, "", claims(nil)), tokenSigned)
		unknown := testKey{"ec-9", "ES256", ecKey()}
		wantVerdict(t, k, unknown.sign(t, "", claims(nil)), tokenUnknown)
		time.Sleep(keysRetry - time.Second)
		wantVerdict(t, k, unknown.sign(t, "", claims(map[string]any{"sub": "another"})), tokenUnknown)
		if n := f.requests.Load(); n != 1 {
			t.Errorf("%d fetches within 10s, want the first only", n)
		}
		time.Sleep(time.Second)
		wantVerdict(t, k, unknown.sign(t, "", claims(nil)), tokenForged)
		if n := f.requests.Load(); n != 2 {
			t.Errorf("%d fetches after 10s, want a refetch", n)
		}
	})
}

// A key published just after a fetch: its tokens go to a TokenReview
// until the keys can be read again, then are taken as signed.
func TestIssuerTakesAKeyPublishedJustAfterAFetch(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		k, f := newTestIssuer(t, es256())
		wantVerdict(t, k, es256().sign(t, "", claims(nil)), tokenSigned)
		time.Sleep(time.Second)
		f.set(func(f *fakeIssuer) { f.keys = append(f.keys, rs256()) })
		wantVerdict(t, k, rs256().sign(t, "", claims(nil)), tokenUnknown)
		time.Sleep(keysRetry)
		wantVerdict(t, k, rs256().sign(t, "", claims(nil)), tokenSigned)
	})
}

func TestIssuerTakesARotatedKeyAfterTheRefetch(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		k, f := newTestIssuer(t, es256())
		wantVerdict(t, k, es256().sign(t, "", claims(nil)), tokenSigned)
		time.Sleep(keysRetry)
		f.set(func(f *fakeIssuer) { f.keys = append(f.keys, rs256()) })
		wantVerdict(t, k, rs256().sign(t, "", claims(nil)), tokenSigned)
		if n := f.requests.Load(); n != 2 {
			t.Errorf("%d fetches, want 2", n)
		}
	})
}

func TestIssuerRefreshesTheKeysEveryTenMinutes(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		k, f := newTestIssuer(t, es256(), rs256())
		tok := es256().sign(t, "", claims(map[string]any{"exp": time.Now().Unix() + 7200}))
		wantVerdict(t, k, tok, tokenSigned)
		f.set(func(f *fakeIssuer) { f.keys = f.keys[1:] }) // es256 retired
		time.Sleep(keysRefresh - time.Second)
		wantVerdict(t, k, tok, tokenSigned) // remembered
		time.Sleep(time.Second)
		wantVerdict(t, k, tok, tokenSigned) // the old keys serve while the refresh runs
		synctest.Wait()
		wantVerdict(t, k, tok, tokenUnknown) // retired, or new: a TokenReview decides
		time.Sleep(keysRetry)
		wantVerdict(t, k, tok, tokenForged) // a fetch for its kid lacks it
		if n := f.requests.Load(); n != 3 {
			t.Errorf("%d fetches, want 3", n)
		}
	})
}

func TestIssuerChecksShareOneFetch(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		k, f := newTestIssuer(t, es256())
		gate := make(chan struct{})
		f.set(func(f *fakeIssuer) { f.gate = gate })
		var wg sync.WaitGroup
		for i := range 8 {
			tok := es256().sign(t, "", claims(map[string]any{"sub": fmt.Sprint(i)}))
			wg.Go(func() { wantVerdict(t, k, tok, tokenSigned) })
		}
		synctest.Wait() // every check waits for the fetch
		close(gate)
		wg.Wait()
		if n := f.requests.Load(); n != 1 {
			t.Errorf("%d fetches for 8 concurrent checks, want 1", n)
		}
	})
}

func TestIssuerLeavesTokensToATokenReviewWhileItCannotFetchTheKeys(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		k, f := newTestIssuer(t, es256())
		f.set(func(f *fakeIssuer) { f.status = http.StatusForbidden })
		tok := es256().sign(t, "", claims(nil))
		wantVerdict(t, k, tok, tokenUnknown)
		if err := k.err(); !apierrors.IsForbidden(err) {
			t.Errorf("err() = %v after a refused fetch, want the API server's Forbidden", err)
		}
		f.set(func(f *fakeIssuer) { f.status = 0 })
		time.Sleep(keysRetry - time.Second)
		wantVerdict(t, k, tok, tokenUnknown) // no fetch yet
		time.Sleep(time.Second)
		wantVerdict(t, k, tok, tokenSigned)
		if err := k.err(); err != nil {
			t.Errorf("err() = %v after a fetch that worked", err)
		}
		if n := f.requests.Load(); n != 2 {
			t.Errorf("%d fetches, want 2", n)
		}
	})
}

func TestIssuerWarnsOnceEachTimeItCannotReadTheKeys(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		k, f := newTestIssuer(t, es256())
		var out logsink.Buffer
		k.log = slog.New(slog.NewTextHandler(&out, nil))
		warnings := func() int { return out.Count("keys cannot be read") }
		tok := es256().sign(t, "", claims(nil))
		f.set(func(f *fakeIssuer) { f.status = http.StatusForbidden })
		wantVerdict(t, k, tok, tokenUnknown)
		time.Sleep(keysRetry)
		wantVerdict(t, k, tok, tokenUnknown) // a second failed fetch in a row
		if n := warnings(); n != 1 {
			t.Errorf("%d warnings after two failed fetches, want 1", n)
		}
		f.set(func(f *fakeIssuer) { f.status = 0 })
		time.Sleep(keysRetry)
		wantVerdict(t, k, tok, tokenSigned)
		f.set(func(f *fakeIssuer) { f.status = http.StatusForbidden })
		time.Sleep(keysRefresh)
		wantVerdict(t, k, tok, tokenSigned) // the refresh fails; the keys serve on
		synctest.Wait()
		if n := warnings(); n != 2 {
			t.Errorf("%d warnings after a failure, a success and a failure, want 2", n)
		}
	})
}

func TestIssuerVerifiesATokenOnceUntilItExpires(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		k, _ := newTestIssuer(t, es256())
		tok := es256().sign(t, "", claims(nil))
		wantVerdict(t, k, tok, tokenSigned)
		r := k.verdicts.items[tokenSum(tok)].Value.(*cacheEntry[pastVerdict])
		r.val.v = tokenForged // a marker: only a remembered verdict says so now
		wantVerdict(t, k, tok, tokenForged)
		if want := time.Now().Add(time.Hour + jwtSkew); !r.expires.Equal(want) {
			t.Errorf("remembered until %v, want exp+skew %v", r.expires, want)
		}
	})
}

func TestIssuerRemembersABoundedNumberOfVerdicts(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		k, _ := newTestIssuer(t, es256())
		for i := range verdictsLimit + 10 {
			wantVerdict(t, k, unsigned("none", "ec-1", claims(map[string]any{"sub": fmt.Sprint(i)}))+"AA", tokenForged)
		}
		if len(k.verdicts.items) != verdictsLimit || k.verdicts.order.Len() != verdictsLimit {
			t.Errorf("%d verdicts in a list of %d, want %d", len(k.verdicts.items), k.verdicts.order.Len(), verdictsLimit)
		}
	})
}

// unsigned returns header.payload. of a JWT with no signature.
func unsigned(alg, kid string, claims map[string]any) string {
	b64 := base64.RawURLEncoding.EncodeToString
	head, _ := json.Marshal(map[string]string{"alg": alg, "kid": kid})
	body, _ := json.Marshal(claims)
	return b64(head) + "." + b64(body) + "."
}

// hs256 returns a JWT signed with HMAC-SHA256 under secret.
func hs256(t *testing.T, kid string, secret []byte, claims map[string]any) string {
	t.Helper()
	tok := unsigned("HS256", kid, claims)
	mac := hmac.New(sha256.New, secret)
	mac.Write([]byte(tok[:len(tok)-1]))
	return tok + base64.RawURLEncoding.EncodeToString(mac.Sum(nil))
}

// x509PublicBytes returns the uncompressed point of key's public key.
func x509PublicBytes(t *testing.T, key *ecdsa.PrivateKey) []byte {
	t.Helper()
	b, err := key.PublicKey.Bytes()
	if err != nil {
		t.Fatal(err)
	}
	return b
}

// flipLastSignatureByte changes one byte of the token's signature.
func flipLastSignatureByte(tok string) string {
	i := strings.LastIndexByte(tok, '.')
	sig, _ := base64.RawURLEncoding.DecodeString(tok[i+1:])
	sig[len(sig)-1] ^= 1
	return tok[:i+1] + base64.RawURLEncoding.EncodeToString(sig)
}
