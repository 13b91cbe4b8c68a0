package proxy_test

import (
	"bytes"
	"context"
	"crypto/tls"
	"io"
	"net/http"
	"net/http/httptest"
	"testing"

	"github.com/kproxy/kproxy/internal/telemetry"
)

// BenchmarkProxyGet measures kproxy's own cost per small GET against a
// local upstream (no apiserver): TLS on both sides, forwarding, replay,
// record. Compare with BenchmarkDirectGet in the same run.
func BenchmarkProxyGet(b *testing.B) {
	up := smallUpstream(b)
	addr, pool := startProxy(b, up, &collect{})
	c := &http.Client{Transport: &http.Transport{TLSClientConfig: &tls.Config{RootCAs: pool}}}
	benchGet(b, c, "https://"+addr+"/api/v1/namespaces/default/pods/p")
}

func BenchmarkDirectGet(b *testing.B) {
	up := smallUpstream(b)
	benchGet(b, up.Client(), up.URL+"/api/v1/namespaces/default/pods/p")
}

func smallUpstream(b testing.TB) *httptest.Server {
	body := []byte(`{"kind":"Pod","apiVersion":"v1","metadata":{"name":"p","namespace":"default"}}`)
	srv := httptest.NewUnstartedServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "application/json")
		w.Write(body)
	}))
	srv.EnableHTTP2 = false
	srv.StartTLS()
	b.Cleanup(srv.Close)
	return srv
}

func benchGet(b *testing.B, c *http.Client, url string) {
	b.ReportAllocs()
	for b.Loop() {
		req, _ := http.NewRequest("GET", url, nil)
		req.Header.Set("Authorization", "Bearer t")
		resp, err := c.Do(req)
		if err != nil {
			b.Fatal(err)
		}
		io.Copy(io.Discard, resp.Body)
		resp.Body.Close()
	}
}

// BenchmarkProxyGetTraced is BenchmarkProxyGet with the OpenTelemetry SDK
// recording every span and exporting them over OTLP/HTTP to a local sink.
func BenchmarkProxyGetTraced(b *testing.B) {
	sink := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		io.Copy(io.Discard, r.Body)
	}))
	b.Cleanup(sink.Close)
	tracing, err := telemetry.Setup(context.Background(), telemetry.Options{Endpoint: sink.URL}, func(string) string { return "" })
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() { tracing.Shutdown(context.Background()) })
	tp := tracing.Provider
	up := smallUpstream(b)
	addr, pool := startProxyWith(b, up, &collect{}, tp)
	c := &http.Client{Transport: &http.Transport{TLSClientConfig: &tls.Config{RootCAs: pool}}}
	benchGet(b, c, "https://"+addr+"/api/v1/namespaces/default/pods/p")
}

// BenchmarkProxyBigList streams a 32 MiB chunked response (as the
// apiserver streams a big LIST) through kproxy.
func BenchmarkProxyBigList(b *testing.B) {
	chunk := bytes.Repeat([]byte("x"), 32<<10)
	up := httptest.NewUnstartedServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "application/json")
		f := w.(http.Flusher)
		for i := 0; i < 1024; i++ {
			w.Write(chunk)
			if i%4 == 0 {
				f.Flush()
			}
		}
	}))
	up.EnableHTTP2 = false
	up.StartTLS()
	b.Cleanup(up.Close)
	addr, pool := startProxy(b, up, &collect{})
	c := &http.Client{Transport: &http.Transport{TLSClientConfig: &tls.Config{RootCAs: pool}, DisableCompression: true}}
	b.SetBytes(32 << 20)
	benchGet(b, c, "https://"+addr+"/api/v1/configmaps")
}
