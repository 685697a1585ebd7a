package auth

import (
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"errors"
	"fmt"
	"math/big"
	"net"
	"net/url"
	"os"
	"path/filepath"
	"time"
)

// CA is a certificate authority for a test or small cluster: its
// certificate and key, as kvpool auth certs keeps them in a directory
// (ca.pem, ca-key.pem). Production clusters use their own PKI.
type CA struct {
	Cert *x509.Certificate
	Key  *ecdsa.PrivateKey
}

// LoadOrMakeCA reads dir's CA, or makes one there (ECDSA P-256, valid
// for valid), writing ca.pem and ca-key.pem (mode 0600).
func LoadOrMakeCA(dir string, valid time.Duration) (*CA, error) {
	certFile, keyFile := filepath.Join(dir, "ca.pem"), filepath.Join(dir, "ca-key.pem")
	if pair, err := tls.LoadX509KeyPair(certFile, keyFile); err == nil {
		key, ok := pair.PrivateKey.(*ecdsa.PrivateKey)
		if !ok {
			return nil, fmt.Errorf("%s: not an ECDSA key", keyFile)
		}
		cert, err := x509.ParseCertificate(pair.Certificate[0])
		return &CA{cert, key}, err
	} else if !errors.Is(err, os.ErrNotExist) {
		return nil, fmt.Errorf("existing CA in %s: %w", dir, err)
	}
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return nil, err
	}
	tmpl := &x509.Certificate{
		SerialNumber: serial(), Subject: pkix.Name{CommonName: "kvpool test CA"},
		NotBefore: time.Now().Add(-time.Hour), NotAfter: time.Now().Add(valid),
		IsCA: true, BasicConstraintsValid: true, KeyUsage: x509.KeyUsageCertSign | x509.KeyUsageCRLSign,
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, &key.PublicKey, key)
	if err != nil {
		return nil, err
	}
	if err := writePEM(certFile, "CERTIFICATE", der, 0o644); err != nil {
		return nil, err
	}
	kb, err := x509.MarshalECPrivateKey(key)
	if err != nil {
		return nil, err
	}
	if err := writePEM(keyFile, "EC PRIVATE KEY", kb, 0o600); err != nil {
		return nil, err
	}
	cert, err := x509.ParseCertificate(der)
	return &CA{cert, key}, err
}

// Issue writes NAME.pem and NAME-key.pem (mode 0600) in dir: a
// certificate for id (its URI SAN in trust domain domain) signed by ca,
// for clients, and also for servers on hosts (DNS names and IP
// addresses) when server.
func (ca *CA) Issue(dir, name string, id Identity, domain string, hosts []string, server bool, valid time.Duration) error {
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return err
	}
	tmpl := &x509.Certificate{
		SerialNumber: serial(), Subject: pkix.Name{CommonName: name},
		NotBefore: time.Now().Add(-time.Hour), NotAfter: time.Now().Add(valid),
		KeyUsage:    x509.KeyUsageDigitalSignature,
		ExtKeyUsage: []x509.ExtKeyUsage{x509.ExtKeyUsageClientAuth},
		URIs:        []*url.URL{URI(id, domain)},
	}
	if server {
		tmpl.ExtKeyUsage = append(tmpl.ExtKeyUsage, x509.ExtKeyUsageServerAuth)
		for _, h := range hosts {
			if ip := net.ParseIP(h); ip != nil {
				tmpl.IPAddresses = append(tmpl.IPAddresses, ip)
			} else {
				tmpl.DNSNames = append(tmpl.DNSNames, h)
			}
		}
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, ca.Cert, &key.PublicKey, ca.Key)
	if err != nil {
		return err
	}
	if err := writePEM(filepath.Join(dir, name+".pem"), "CERTIFICATE", der, 0o644); err != nil {
		return err
	}
	kb, err := x509.MarshalECPrivateKey(key)
	if err != nil {
		return err
	}
	return writePEM(filepath.Join(dir, name+"-key.pem"), "EC PRIVATE KEY", kb, 0o600)
}

func serial() *big.Int {
	n, _ := rand.Int(rand.Reader, new(big.Int).Lsh(big.NewInt(1), 127))
	return n
}

func writePEM(path, kind string, der []byte, mode os.FileMode) error {
	return os.WriteFile(path, pem.EncodeToMemory(&pem.Block{Type: kind, Bytes: der}), mode)
}
