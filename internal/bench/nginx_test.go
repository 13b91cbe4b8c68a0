package bench

import (
	"crypto/tls"
	"crypto/x509"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"

	"github.com/kproxy/kproxy/internal/localcluster"
	"github.com/kproxy/kproxy/internal/pki"
)

// startNginx runs nginx as a pure TLS reverse proxy in front of the
// apiserver: the practical floor for a hop that terminates TLS on both
// sides (issue 16), with nothing recorded, replayed or traced. One
// process (master_process off, one worker: it uses one CPU, as the
// apiserver's hop in most deployments does per connection), HTTP/1.1 to
// the apiserver over a keep-alive pool, nothing buffered either way (a
// watch streams, a big LIST streams). It returns nil when nginx is not
// installed: the bench runs without this peer and says so.
func (e *env) startNginx() (*target, error) {
	bin := nginxBinary()
	if bin == "" {
		fmt.Fprintln(os.Stderr, "bench: nginx is not installed: the tables have no TLS-proxy peer (install it, e.g. apt-get install nginx, for that column)")
		return nil, nil
	}
	dir := filepath.Join(e.dir, "nginx")
	if err := os.MkdirAll(filepath.Join(dir, "tmp"), 0o755); err != nil {
		return nil, err
	}
	ca, err := pki.NewCA("bench-nginx-ca")
	if err != nil {
		return nil, err
	}
	leaf, err := ca.Issue(pki.Leaf{CommonName: "nginx", IPs: []net.IP{net.IPv4(127, 0, 0, 1)}, Server: true})
	if err != nil {
		return nil, err
	}
	certFile, keyFile, err := pki.WritePair(dir, "serving", leaf.Cert, leaf.Key)
	if err != nil {
		return nil, err
	}
	ports, err := localcluster.FreePorts(1)
	if err != nil {
		return nil, err
	}
	upstream := strings.TrimPrefix(e.cluster.URL, "https://")
	conf := filepath.Join(dir, "nginx.conf")
	tmp := filepath.Join(dir, "tmp")
	cfg := fmt.Sprintf(`daemon off;
master_process off;
worker_processes 1;
pid %[1]s/nginx.pid;
error_log %[1]s/error.log warn;
events { worker_connections 8192; }
http {
  access_log off;
  client_body_temp_path %[2]s/body;
  proxy_temp_path %[2]s/proxy;
  fastcgi_temp_path %[2]s/fastcgi;
  uwsgi_temp_path %[2]s/uwsgi;
  scgi_temp_path %[2]s/scgi;
  upstream apiserver { server %[3]s; keepalive 512; }
  server {
    listen 127.0.0.1:%[4]d ssl;
    ssl_certificate %[5]s;
    ssl_certificate_key %[6]s;
    keepalive_requests 100000;
    location / {
      proxy_pass https://apiserver;
      proxy_http_version 1.1;
      proxy_set_header Connection "";
      proxy_buffering off;
      proxy_request_buffering off;
      proxy_read_timeout 1h;
      proxy_send_timeout 1h;
      proxy_ssl_session_reuse on;
      client_max_body_size 0;
    }
  }
}
`, dir, tmp, upstream, ports[0], certFile, keyFile)
	if err := os.WriteFile(conf, []byte(cfg), 0o644); err != nil {
		return nil, err
	}
	pid, err := e.cluster.Process("nginx", bin, nil, "-c", conf, "-p", dir, "-e", filepath.Join(dir, "error.log"))
	if err != nil {
		return nil, err
	}
	pool := x509.NewCertPool()
	pool.AddCert(ca.Cert)
	t := &target{name: "nginx", base: "https://127.0.0.1:" + strconv.Itoa(ports[0]), token: true,
		client: httpClient(&tls.Config{RootCAs: pool}, false), pid: pid}
	return t, waitReady(t)
}

// nginxBinary is nginx's path, or "" when it is not installed.
func nginxBinary() string {
	bin, err := exec.LookPath("nginx")
	if err != nil {
		return ""
	}
	return bin
}
