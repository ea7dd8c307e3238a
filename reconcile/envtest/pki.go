package envtest

import (
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/base64"
	"encoding/hex"
	"encoding/pem"
	"fmt"
	"math/big"
	"net"
	"os"
	"path/filepath"
	"strings"
	"time"
)

// Names of the static-token users every environment has.
const (
	// AdminUser is in group system:masters, which RBAC lets do anything.
	AdminUser = "opkit-admin"
	// UnprivilegedUser is authenticated but has no RBAC grants.
	UnprivilegedUser = "opkit-user"
	// ControllerManagerUser is the identity of the kube-controller-manager
	// (Options.ControllerManager): in group system:masters like AdminUser,
	// but its own name, so that its requests can be told apart.
	ControllerManagerUser = "opkit-controller-manager"
)

// pki holds the credentials of one environment, written as files into its dir.
type pki struct {
	caPEM      []byte // CA certificate, for clients' TLS verification
	adminToken string
	userToken  string
	kcmToken   string // ControllerManagerUser's

	caFile, certFile, keyFile string // serving cert and key, signed by the CA
	saPubFile, saKeyFile      string // service-account token verify/sign keys
	tokenFile                 string // static token file
}

// writePKI generates a CA, a serving certificate for the loopback addresses,
// a service-account key pair and a static token file in dir.
func writePKI(dir string) (*pki, error) {
	p := &pki{
		caFile:    filepath.Join(dir, "ca.crt"),
		certFile:  filepath.Join(dir, "apiserver.crt"),
		keyFile:   filepath.Join(dir, "apiserver.key"),
		saPubFile: filepath.Join(dir, "sa.pub"),
		saKeyFile: filepath.Join(dir, "sa.key"),
		tokenFile: filepath.Join(dir, "tokens.csv"),
	}
	now := time.Now()
	caKey, caCert, err := newCA(now)
	if err != nil {
		return nil, err
	}
	p.caPEM = pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: caCert.Raw})
	srvDER, srvKeyDER, err := newServingCert(now, caCert, caKey)
	if err != nil {
		return nil, err
	}
	saKeyDER, saPubDER, err := newServiceAccountKey()
	if err != nil {
		return nil, err
	}
	p.adminToken = randToken()
	p.userToken = randToken()
	p.kcmToken = randToken()

	files := []struct {
		path string
		data []byte
	}{
		{p.caFile, p.caPEM},
		{p.certFile, pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: srvDER})},
		{p.keyFile, pem.EncodeToMemory(&pem.Block{Type: "EC PRIVATE KEY", Bytes: srvKeyDER})},
		{p.saKeyFile, pem.EncodeToMemory(&pem.Block{Type: "EC PRIVATE KEY", Bytes: saKeyDER})},
		{p.saPubFile, pem.EncodeToMemory(&pem.Block{Type: "PUBLIC KEY", Bytes: saPubDER})},
		{p.tokenFile, []byte(p.tokens())},
	}
	for _, f := range files {
		if err := os.WriteFile(f.path, f.data, 0o600); err != nil {
			return nil, fmt.Errorf("write %s: %w", f.path, err)
		}
	}
	return p, nil
}

// newCA generates the self-signed CA of an environment, valid from an hour
// before now for a week, and returns its key and certificate.
func newCA(now time.Time) (*ecdsa.PrivateKey, *x509.Certificate, error) {
	caKey, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return nil, nil, fmt.Errorf("generate CA key: %w", err)
	}
	caTmpl := &x509.Certificate{
		SerialNumber:          randSerial(),
		Subject:               pkix.Name{CommonName: "opkit-envtest-ca"},
		NotBefore:             now.Add(-time.Hour),
		NotAfter:              now.Add(7 * 24 * time.Hour),
		KeyUsage:              x509.KeyUsageCertSign | x509.KeyUsageDigitalSignature | x509.KeyUsageCRLSign,
		BasicConstraintsValid: true,
		IsCA:                  true,
	}
	caDER, err := x509.CreateCertificate(rand.Reader, caTmpl, caTmpl, &caKey.PublicKey, caKey)
	if err != nil {
		return nil, nil, fmt.Errorf("create CA certificate: %w", err)
	}
	caCert, err := x509.ParseCertificate(caDER)
	if err != nil {
		return nil, nil, fmt.Errorf("parse CA certificate: %w", err)
	}
	return caKey, caCert, nil
}

// newServingCert generates the API servers' serving key and a certificate
// for it, for the loopback addresses and the kubernetes Service's names,
// signed by the CA; it returns both DER-encoded.
func newServingCert(now time.Time, caCert *x509.Certificate, caKey *ecdsa.PrivateKey) (certDER, keyDER []byte, err error) {
	srvKey, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return nil, nil, fmt.Errorf("generate serving key: %w", err)
	}
	srvTmpl := &x509.Certificate{
		SerialNumber: randSerial(),
		Subject:      pkix.Name{CommonName: "kube-apiserver"},
		NotBefore:    now.Add(-time.Hour),
		NotAfter:     now.Add(7 * 24 * time.Hour),
		KeyUsage:     x509.KeyUsageDigitalSignature,
		ExtKeyUsage:  []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth},
		DNSNames:     []string{"localhost", "kubernetes", "kubernetes.default", "kubernetes.default.svc"},
		IPAddresses:  []net.IP{net.IPv4(127, 0, 0, 1), net.IPv6loopback},
	}
	certDER, err = x509.CreateCertificate(rand.Reader, srvTmpl, caCert, &srvKey.PublicKey, caKey)
	if err != nil {
		return nil, nil, fmt.Errorf("create serving certificate: %w", err)
	}
	keyDER, err = x509.MarshalECPrivateKey(srvKey)
	if err != nil {
		return nil, nil, fmt.Errorf("marshal serving key: %w", err)
	}
	return certDER, keyDER, nil
}

// newServiceAccountKey generates the key pair that signs and verifies
// service-account tokens, and returns the private key and the public key
// DER-encoded.
func newServiceAccountKey() (keyDER, pubDER []byte, err error) {
	saKey, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return nil, nil, fmt.Errorf("generate service-account key: %w", err)
	}
	keyDER, err = x509.MarshalECPrivateKey(saKey)
	if err != nil {
		return nil, nil, fmt.Errorf("marshal service-account key: %w", err)
	}
	pubDER, err = x509.MarshalPKIXPublicKey(&saKey.PublicKey)
	if err != nil {
		return nil, nil, fmt.Errorf("marshal service-account public key: %w", err)
	}
	return keyDER, pubDER, nil
}

// tokens renders the static token file (token,user,uid[,groups]) of the
// three users, AdminUser and ControllerManagerUser in system:masters.
func (p *pki) tokens() string {
	return fmt.Sprintf("%s,%s,%s,\"system:masters\"\n%s,%s,%s\n%s,%s,%s,\"system:masters\"\n",
		p.adminToken, AdminUser, AdminUser, p.userToken, UnprivilegedUser, UnprivilegedUser,
		p.kcmToken, ControllerManagerUser, ControllerManagerUser)
}

func randSerial() *big.Int {
	n, err := rand.Int(rand.Reader, new(big.Int).Lsh(big.NewInt(1), 120))
	if err != nil {
		panic("envtest: crypto/rand failed: " + err.Error())
	}
	return n
}

func randToken() string {
	b := make([]byte, 24)
	if _, err := rand.Read(b); err != nil {
		panic("envtest: crypto/rand failed: " + err.Error())
	}
	return hex.EncodeToString(b)
}

// kubeconfig renders a kubeconfig for server in which user authenticates
// with token.
func kubeconfig(server string, caPEM []byte, user, token string) []byte {
	var b strings.Builder
	fmt.Fprintf(&b, `apiVersion: v1
kind: Config
clusters:
- name: opkit
  cluster:
    server: %s
    certificate-authority-data: %s
users:
- name: %s
  user:
    token: %s
contexts:
- name: opkit
  context:
    cluster: opkit
    user: %s
current-context: opkit
`, server, base64.StdEncoding.EncodeToString(caPEM), user, token, user)
	return []byte(b.String())
}
