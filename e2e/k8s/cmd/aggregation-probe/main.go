// aggregation-probe is a minimal aggregated API server for the e2e tests of the local cluster:
// it serves group probe.kubevirt.io/v1 with one read-only resource, "echoes", whose objects
// report who kube-apiserver said was calling (X-Remote-User/Group) and whether the request came
// with a front-proxy client certificate that verifies against the CA given in -requestheader-ca.
// It proves that the cluster's aggregation layer (front-proxy CA and client certificate,
// --enable-aggregator-routing) works, independently of our own API server.
package main

import (
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/json"
	"flag"
	"log"
	"math/big"
	"net/http"
	"os"
	"strings"
	"time"
)

const group, version = "probe.kubevirt.io", "v1"

func main() {
	addr := flag.String("listen", ":8443", "address to serve HTTPS on")
	caFile := flag.String("requestheader-ca", "", "PEM file of the front-proxy CA")
	flag.Parse()

	pool := x509.NewCertPool()
	if pem, err := os.ReadFile(*caFile); err != nil || !pool.AppendCertsFromPEM(pem) {
		log.Fatalf("reading front-proxy CA %q: %v", *caFile, err)
	}
	cert, err := selfSigned()
	if err != nil {
		log.Fatal(err)
	}

	mux := http.NewServeMux()
	gv := "/apis/" + group + "/" + version
	mux.HandleFunc(gv, func(w http.ResponseWriter, r *http.Request) {
		write(w, map[string]any{
			"kind": "APIResourceList", "apiVersion": "v1", "groupVersion": group + "/" + version,
			"resources": []map[string]any{{
				"name": "echoes", "singularName": "echo", "namespaced": false, "kind": "Echo",
				"verbs": []string{"get"},
			}},
		})
	})
	mux.HandleFunc(gv+"/echoes/", func(w http.ResponseWriter, r *http.Request) {
		name := strings.TrimPrefix(r.URL.Path, gv+"/echoes/")
		verified, cn := false, ""
		if r.TLS != nil && len(r.TLS.PeerCertificates) > 0 {
			leaf := r.TLS.PeerCertificates[0]
			cn = leaf.Subject.CommonName
			inter := x509.NewCertPool()
			for _, c := range r.TLS.PeerCertificates[1:] {
				inter.AddCert(c)
			}
			_, err := leaf.Verify(x509.VerifyOptions{
				Roots: pool, Intermediates: inter,
				KeyUsages: []x509.ExtKeyUsage{x509.ExtKeyUsageClientAuth},
			})
			verified = err == nil
		}
		write(w, map[string]any{
			"apiVersion": group + "/" + version, "kind": "Echo",
			"metadata":        map[string]any{"name": name},
			"user":            r.Header.Get("X-Remote-User"),
			"groups":          r.Header.Values("X-Remote-Group"),
			"clientCertCN":    cn,
			"clientCertValid": verified,
		})
	})
	mux.HandleFunc("/", func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Path == "/healthz" || r.URL.Path == "/readyz" || r.URL.Path == "/livez" {
			w.Write([]byte("ok"))
			return
		}
		http.NotFound(w, r)
	})

	srv := &http.Server{
		Addr:    *addr,
		Handler: mux,
		TLSConfig: &tls.Config{
			Certificates: []tls.Certificate{cert},
			// Verified by hand above: the point is to report what arrived, not to refuse it.
			ClientAuth: tls.RequestClientCert,
		},
		ReadHeaderTimeout: 10 * time.Second,
	}
	log.Printf("serving %s/%s on %s", group, version, *addr)
	log.Fatal(srv.ListenAndServeTLS("", ""))
}

func write(w http.ResponseWriter, v any) {
	w.Header().Set("Content-Type", "application/json")
	_ = json.NewEncoder(w).Encode(v)
}

// selfSigned makes a throw-away serving certificate; the APIService uses insecureSkipTLSVerify.
func selfSigned() (tls.Certificate, error) {
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return tls.Certificate{}, err
	}
	tmpl := &x509.Certificate{
		SerialNumber: big.NewInt(1),
		Subject:      pkix.Name{CommonName: "aggregation-probe"},
		NotBefore:    time.Now().Add(-time.Hour),
		NotAfter:     time.Now().Add(24 * time.Hour),
		KeyUsage:     x509.KeyUsageDigitalSignature,
		ExtKeyUsage:  []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth},
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, &key.PublicKey, key)
	if err != nil {
		return tls.Certificate{}, err
	}
	return tls.Certificate{Certificate: [][]byte{der}, PrivateKey: key}, nil
}
