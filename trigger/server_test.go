package trigger_test

import (
	"context"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"math/big"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/opkit/opkit/trigger"
)

// writeCert writes a self-signed certificate for 127.0.0.1 with the given
// serial number and returns it.
func writeCert(t *testing.T, certFile, keyFile string, serial int64) *x509.Certificate {
	t.Helper()
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	tmpl := &x509.Certificate{
		SerialNumber: big.NewInt(serial),
		Subject:      pkix.Name{CommonName: "opkit-trigger"},
		IPAddresses:  []net.IP{net.ParseIP("127.0.0.1")},
		NotBefore:    time.Now().Add(-time.Hour),
		NotAfter:     time.Now().Add(time.Hour),
		KeyUsage:     x509.KeyUsageDigitalSignature,
		ExtKeyUsage:  []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth},
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, &key.PublicKey, key)
	if err != nil {
		t.Fatal(err)
	}
	kder, err := x509.MarshalECPrivateKey(key)
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(keyFile, pem.EncodeToMemory(&pem.Block{Type: "EC PRIVATE KEY", Bytes: kder}), 0o600); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(certFile, pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der}), 0o600); err != nil {
		t.Fatal(err)
	}
	// Distinct, explicit modification times: the reload must not depend
	// on the file system's timestamp granularity.
	mt := time.Unix(1_700_000_000+serial, 0)
	for _, f := range []string{certFile, keyFile} {
		if err := os.Chtimes(f, mt, mt); err != nil {
			t.Fatal(err)
		}
	}
	c, err := x509.ParseCertificate(der)
	if err != nil {
		t.Fatal(err)
	}
	return c
}

func servedSerial(t *testing.T, addr string) int64 {
	t.Helper()
	client := &http.Client{Transport: &http.Transport{
		DisableKeepAlives: true,
		// The test checks which certificate is served, not the chain.
		TLSClientConfig: &tls.Config{InsecureSkipVerify: true},
	}}
	resp, err := client.Post("https://"+addr+"/reconcile/ns/a", "", nil)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusAccepted {
		t.Fatalf("status %d", resp.StatusCode)
	}
	return resp.TLS.PeerCertificates[0].SerialNumber.Int64()
}

func TestServerServesTLSAndReloadsTheCertificate(t *testing.T) {
	dir := t.TempDir()
	certFile, keyFile := filepath.Join(dir, "tls.crt"), filepath.Join(dir, "tls.key")
	writeCert(t, certFile, keyFile, 1)
	e := newHandlerEnv(t, nil)
	srv, err := trigger.NewServer(trigger.ServerConfig{Handler: e.h, CertFile: certFile, KeyFile: keyFile, Logger: discard})
	if err != nil {
		t.Fatal(err)
	}
	addr := serveOn(t, srv)

	if s := servedSerial(t, addr); s != 1 {
		t.Fatalf("serial = %d, want 1", s)
	}
	writeCert(t, certFile, keyFile, 2)
	if s := servedSerial(t, addr); s != 2 {
		t.Fatalf("after rotation serial = %d, want 2", s)
	}
	// A broken rotation keeps the previous certificate.
	if err := os.WriteFile(certFile, []byte("garbage"), 0o600); err != nil {
		t.Fatal(err)
	}
	if s := servedSerial(t, addr); s != 2 {
		t.Fatalf("after a broken rotation serial = %d, want 2", s)
	}
	// Plain HTTP is not served on the TLS port.
	if resp, err := http.Post("http://"+addr+"/reconcile/ns/a", "", nil); err == nil {
		resp.Body.Close()
		if resp.StatusCode == http.StatusAccepted {
			t.Error("plain HTTP request accepted on the TLS port")
		}
	}
}

// serveOn serves s on a new loopback listener and returns its address;
// when the test ends it stops s and checks that Serve returned nil.
func serveOn(t *testing.T, s *trigger.Server) string {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- s.Serve(ctx, ln) }()
	t.Cleanup(func() {
		cancel()
		if err := <-done; err != nil {
			t.Errorf("Serve = %v, want nil after ctx ended", err)
		}
	})
	return ln.Addr().String()
}

func TestNewServerValidates(t *testing.T) {
	h := http.NotFoundHandler()
	for name, cfg := range map[string]trigger.ServerConfig{
		"no handler":   {},
		"only cert":    {Handler: h, CertFile: "x"},
		"missing file": {Handler: h, CertFile: "/nonexistent/c", KeyFile: "/nonexistent/k"},
		"negative":     {Handler: h, ReadTimeout: -1},
	} {
		if _, err := trigger.NewServer(cfg); err == nil {
			t.Errorf("%s: NewServer succeeded", name)
		}
	}
}
