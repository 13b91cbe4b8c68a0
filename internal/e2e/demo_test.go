package e2e

import (
	"bufio"
	"net"
	"os"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"testing"
	"time"
)

// TestDemo runs `kproxy demo --no-tui --exit` as `make demo` does without
// a terminal: its own etcd, kube-apiserver and Jaeger, the sample
// requests, the table. Nothing it predicts may disagree with the
// apiserver, every request it counts is in the capture, it stops every
// process it started, and it stops kproxy before Jaeger, so the last
// spans are exported rather than logged as refused.
func TestDemo(t *testing.T) {
	dir := t.TempDir()
	bin, _ := kproxyBinary(t, dir)
	demoDir := filepath.Join(dir, "demo")
	out := runCLI(t, bin, 0, "demo", "--no-tui", "--exit", "--dir", demoDir)

	m := regexp.MustCompile(`(\d+) requests from (\d+) kubectl commands: (\d+) predicted as the apiserver answered, (\d+) unknown, (\d+) predicted wrong`).FindStringSubmatch(out)
	if m == nil {
		t.Fatalf("the demo printed no summary line:\n%s", out)
	}
	requests, _ := strconv.Atoi(m[1])
	if m[5] != "0" {
		t.Errorf("the demo predicted %s requests wrong:\n%s", m[5], out)
	}
	if requests < 19 {
		t.Errorf("%d requests from %s commands, want one at least per command:\n%s", requests, m[2], out)
	}
	if strings.Contains(out, "(no request reached the apiserver)") {
		t.Errorf("a sample command sent nothing:\n%s", out)
	}
	if strings.Contains(out, "traces export") {
		t.Errorf("kproxy failed to export its spans while the demo stopped (stopped after Jaeger?):\n%s", out)
	}

	f, err := os.Open(filepath.Join(demoDir, "capture.jsonl"))
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	lines := 0
	for sc := bufio.NewScanner(f); sc.Scan(); {
		lines++
	}
	if lines != requests {
		t.Errorf("the capture holds %d records, the demo counted %d requests", lines, requests)
	}

	// Every address the demo announced is closed once it has exited.
	for _, u := range regexp.MustCompile(`https?://(127\.0\.0\.1:\d+)`).FindAllStringSubmatch(out, -1) {
		if c, err := net.DialTimeout("tcp", u[1], time.Second); err == nil {
			c.Close()
			t.Errorf("%s still accepts connections after the demo exited", u[1])
		}
	}
}
