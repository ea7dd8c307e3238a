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
		adminToken: randToken(),
		userToken:  randToken(),
		kcmToken:   randToken(),
		caFile:     filepath.Join(dir, "ca.crt"),
		certFile:   filepath.Join(dir, "apiserver.crt"),
		keyFile:    filepath.Join(dir, "apiserver.key"),
		saPubFile:  filepath.Join(dir, "sa.pub"),
		saKeyFile:  filepath.Join(dir, "sa.key"),
		tokenFile:  filepath.Join(dir, "tokens.csv"),
	}
	caKey, ca, err := newCert(&x509.Certificate{
		Subject:               pkix.Name{CommonName: "opkit-envtest-ca"},
		KeyUsage:              x509.KeyUsageCertSign | x509.KeyUsageDigitalSignature | x509.KeyUsageCRLSign,
		BasicConstraintsValid: true,
		IsCA:                  true,
	}, nil, nil)
	if err != nil {
		return nil, err
	}
	p.caPEM = pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: ca.Raw})
	// For the loopback addresses and the kubernetes Service's names.
	srvKey, srv, err := newCert(&x509.Certificate{
		Subject:     pkix.Name{CommonName: "kube-apiserver"},
		KeyUsage:    x509.KeyUsageDigitalSignature,
		ExtKeyUsage: []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth},
		DNSNames:    []string{"localhost", "kubernetes", "kubernetes.default", "kubernetes.default.svc"},
		IPAddresses: []net.IP{net.IPv4(127, 0, 0, 1), net.IPv6loopback},
	}, ca, caKey)
	if err != nil {
		return nil, err
	}
	srvKeyDER, err := x509.MarshalECPrivateKey(srvKey)
	if err != nil {
		return nil, fmt.Errorf("marshal serving key: %w", err)
	}
	saKeyPEM, saPubPEM, err := newServiceAccountKey()
	if err != nil {
		return nil, err
	}
	files := []struct {
		path string
		data []byte
	}{
		{p.caFile, p.caPEM},
		{p.certFile, pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: srv.Raw})},
		{p.keyFile, pem.EncodeToMemory(&pem.Block{Type: "EC PRIVATE KEY", Bytes: srvKeyDER})},
		{p.saKeyFile, saKeyPEM},
		{p.saPubFile, saPubPEM},
		{p.tokenFile, []byte(p.tokens())},
	}
	for _, f := range files {
		if err := os.WriteFile(f.path, f.data, 0o600); err != nil {
			return nil, fmt.Errorf("write %s: %w", f.path, err)
		}
	}
	return p, nil
}

// newCert generates a P-256 key and a certificate for it from tmpl, valid
// from an hour ago until a week from now, signed by parentKey as parent,
// or self-signed when parent is nil. It returns the key and the
// certificate.
func newCert(tmpl, parent *x509.Certificate, parentKey *ecdsa.PrivateKey) (*ecdsa.PrivateKey, *x509.Certificate, error) {
	name := tmpl.Subject.CommonName
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return nil, nil, fmt.Errorf("generate %s key: %w", name, err)
	}
	if tmpl.SerialNumber, err = rand.Int(rand.Reader, new(big.Int).Lsh(big.NewInt(1), 120)); err != nil {
		return nil, nil, fmt.Errorf("%s serial number: %w", name, err)
	}
	now := time.Now()
	tmpl.NotBefore = now.Add(-time.Hour)
	tmpl.NotAfter = now.Add(7 * 24 * time.Hour)
	if parent == nil {
		parent, parentKey = tmpl, key
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, parent, &key.PublicKey, parentKey)
	if err != nil {
		return nil, nil, fmt.Errorf("create %s certificate: %w", name, err)
	}
	cert, err := x509.ParseCertificate(der)
	if err != nil {
		return nil, nil, fmt.Errorf("parse %s certificate: %w", name, err)
	}
	return key, cert, nil
}

// newServiceAccountKey generates the key pair that signs and verifies
// service-account tokens, and returns both keys PEM-encoded.
func newServiceAccountKey() (keyPEM, pubPEM []byte, err error) {
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return nil, nil, fmt.Errorf("generate service-account key: %w", err)
	}
	keyDER, err := x509.MarshalECPrivateKey(key)
	if err != nil {
		return nil, nil, fmt.Errorf("marshal service-account key: %w", err)
	}
	pubDER, err := x509.MarshalPKIXPublicKey(&key.PublicKey)
	if err != nil {
		return nil, nil, fmt.Errorf("marshal service-account public key: %w", err)
	}
	return pem.EncodeToMemory(&pem.Block{Type: "EC PRIVATE KEY", Bytes: keyDER}),
		pem.EncodeToMemory(&pem.Block{Type: "PUBLIC KEY", Bytes: pubDER}), nil
}

// tokens renders the static token file (token,user,uid[,groups]) of the
// three users, AdminUser and ControllerManagerUser in system:masters.
func (p *pki) tokens() string {
	return fmt.Sprintf("%s,%s,%s,\"system:masters\"\n%s,%s,%s\n%s,%s,%s,\"system:masters\"\n",
		p.adminToken, AdminUser, AdminUser, p.userToken, UnprivilegedUser, UnprivilegedUser,
		p.kcmToken, ControllerManagerUser, ControllerManagerUser)
}

// randToken returns 24 random bytes as 48 hex digits.
func randToken() string {
	b := make([]byte, 24)
	_, _ = rand.Read(b) // it never fails
	return hex.EncodeToString(b)
}

// kubeconfig renders a kubeconfig for server in which user authenticates
// with token.
func kubeconfig(server string, caPEM []byte, user, token string) []byte {
	return []byte(fmt.Sprintf(`apiVersion: v1
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
`, server, base64.StdEncoding.EncodeToString(caPEM), user, token, user))
}
