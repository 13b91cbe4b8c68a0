package e2e

import (
	"bufio"
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"io"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"k8s.io/apimachinery/pkg/util/wait"

	"github.com/kproxy/kproxy/internal/localcluster"
	"github.com/kproxy/kproxy/internal/serve"
)

// TestCaptureFillsTmpfs runs kproxy (its own process) with its capture on
// a 256 KiB tmpfs, and fills it: a filler file, then traffic until a
// record does not fit, then more requests while it is full, then the
// filler removed and more requests. The capture must never hold a
// partial line, must write again once space returns, and kproxy must say
// so once each way (not per request), with the records lost counted.
// As root the tmpfs is mounted here; otherwise kproxy runs in a user and
// mount namespace of its own (unshare) that mounts it.
func TestCaptureFillsTmpfs(t *testing.T) {
	dir := t.TempDir()
	tmpfs := filepath.Join(dir, "tmpfs")
	if err := os.Mkdir(tmpfs, 0o755); err != nil {
		t.Fatal(err)
	}
	o := processOptions{capture: filepath.Join(tmpfs, "capture.jsonl")}
	// view is where this process reaches a path of kproxy's tmpfs.
	view := func(p string) string { return p }
	namespaced := os.Geteuid() != 0
	if !namespaced {
		if err := syscall.Mount("tmpfs", tmpfs, "tmpfs", 0, "size=256k"); err != nil {
			t.Fatalf("mount a tmpfs on %s as root: %v", tmpfs, err)
		}
		// Registered after t.TempDir's removal, so run before it; and
		// before startKproxyProcess's cleanup, so after kproxy is gone.
		t.Cleanup(func() {
			if err := syscall.Unmount(tmpfs, 0); err != nil {
				t.Errorf("unmount %s: %v", tmpfs, err)
			}
		})
	} else {
		unshare, err := exec.LookPath("unshare")
		if err != nil {
			t.Fatalf("not root, and no unshare (util-linux) to mount a tmpfs in a user namespace: %v", err)
		}
		o.wrap = []string{unshare, "--user", "--map-root-user", "--mount", "sh", "-c", `mount -t tmpfs -o size=256k tmpfs "$0" && exec "$@"`, tmpfs}
		probe := append(append([]string(nil), o.wrap...), "true")
		if out, err := exec.Command(probe[0], probe[1:]...).CombinedOutput(); err != nil {
			t.Fatalf("not root, and cannot mount a tmpfs in a user namespace (%s): %v\n%s\n(unprivileged user namespaces must be allowed: kernel.unprivileged_userns_clone, user.max_user_namespaces, AppArmor's apparmor_restrict_unprivileged_userns)",
				strings.Join(probe, " "), err, out)
		}
	}
	k := startKproxyProcess(t, o)
	if namespaced {
		// The tmpfs is in kproxy's mount namespace: reach it through
		// kproxy's root.
		root := fmt.Sprintf("/proc/%d/root", k.cmd.Process.Pid)
		view = func(p string) string { return root + p }
	}
	capture, filler := view(o.capture), view(filepath.Join(tmpfs, "filler"))

	client := &http.Client{Timeout: prompt, Transport: &http.Transport{TLSClientConfig: &tls.Config{RootCAs: k.pool}}}
	sent := 0
	// send makes one request and waits until its record has been handed
	// to the capture (written or dropped): requests go one at a time, so
	// the capture is never read mid-write.
	send := func(padding int) {
		t.Helper()
		req, _ := http.NewRequest("GET", "https://"+k.addr+"/api/v1/namespaces/"+testNS, nil)
		req.Header.Set("Authorization", "Bearer "+localcluster.TokenOf("admin"))
		if padding > 0 {
			req.Header.Set("X-Test-Padding", strings.Repeat("p", padding))
		}
		sent++
		resp, err := client.Do(req)
		if err != nil {
			t.Fatalf("request %d: %v", sent, err)
		}
		_, _ = io.Copy(io.Discard, resp.Body)
		resp.Body.Close()
		if resp.StatusCode != http.StatusOK {
			t.Fatalf("request %d: %d", sent, resp.StatusCode)
		}
		err = wait.PollUntilContextTimeout(context.Background(), 50*time.Millisecond, prompt, true, func(context.Context) (bool, error) {
			total, _ := captureCounts(t, k.metricsAddr)
			return total >= sent, nil
		})
		if err != nil {
			t.Fatalf("request %d: its record never reached the capture", sent)
		}
	}
	// whole checks the capture: whole lines only, n of them.
	whole := func(when string, n int) int64 {
		t.Helper()
		b, err := os.ReadFile(capture)
		if err != nil {
			t.Fatalf("%s: %v", when, err)
		}
		recs, err := parseCapture(b)
		if err != nil {
			t.Fatalf("%s: %v", when, err)
		}
		if len(recs) != n {
			t.Fatalf("%s: %d records in the capture, want %d", when, len(recs), n)
		}
		return int64(len(b))
	}

	// Room to spare: every record is written.
	for range 3 {
		send(0)
	}
	whole("before the disk fills", 3)

	// A filler leaves about 12 KiB, then traffic until a record does not
	// fit: the write that fails has written what fitted, which must not
	// stay.
	var fs syscall.Statfs_t
	if err := syscall.Statfs(view(tmpfs), &fs); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filler, make([]byte, int64(fs.Bavail)*fs.Bsize-12<<10), 0o600); err != nil {
		t.Fatalf("filler: %v", err)
	}
	for {
		send(0)
		if _, dropped := captureCounts(t, k.metricsAddr); dropped > 0 {
			break
		}
		whole("while the disk fills", sent)
		if sent > 40 {
			t.Fatalf("%d requests and no capture write failed on a full tmpfs", sent)
		}
	}
	written := sent - 1
	size := whole("once a write failed", written)
	t.Logf("%d records written before the disk was full (%d bytes)", written, size)

	// Full: the filler takes every free page. Each request now carries an
	// 8 KiB header (recorded): its record is bigger than a page, so none
	// fits in the capture's last, partly used page either.
	f, err := os.OpenFile(filler, os.O_WRONLY|os.O_APPEND, 0)
	if err != nil {
		t.Fatal(err)
	}
	for err == nil {
		_, err = f.Write(make([]byte, 4<<10))
	}
	f.Close()
	if !errors.Is(err, syscall.ENOSPC) {
		t.Fatalf("filling the tmpfs: %v, want ENOSPC", err)
	}
	for i := range 10 {
		send(8 << 10)
		if s := whole(fmt.Sprintf("full, request %d", i), written); s != size {
			t.Fatalf("full, request %d: the capture went from %d to %d bytes with no record added", i, size, s)
		}
	}
	if _, dropped := captureCounts(t, k.metricsAddr); dropped != 11 {
		t.Errorf("kproxy_capture_records_dropped_total %d, want 11 (one as the disk filled, ten while full)", dropped)
	}

	// Space returns: records are written again.
	if err := os.Remove(filler); err != nil {
		t.Fatal(err)
	}
	for range 5 {
		send(0)
	}
	whole("after space returned", written+5)
	if total, dropped := captureCounts(t, k.metricsAddr); total != sent || dropped != 11 {
		t.Errorf("metrics: %d records handed to the capture, %d dropped; want %d and 11", total, dropped, sent)
	}

	// Once each way, with the count; nothing per request.
	logs, err := os.ReadFile(k.logPath)
	if err != nil {
		t.Fatal(err)
	}
	var failed, again, other int
	for _, l := range strings.Split(string(logs), "\n") {
		switch {
		case strings.Contains(l, "capture write failed"):
			failed++
			if !strings.Contains(l, "no space left on device") {
				t.Errorf("the failure does not say why: %s", l)
			}
		case strings.Contains(l, "capture writing again"):
			again++
			if !strings.Contains(l, "recordsLost=11") {
				t.Errorf("the recovery does not count the 11 records lost: %s", l)
			}
		case strings.Contains(l, "capture"):
			other++
		}
	}
	if failed != 1 || again != 1 || other != 0 {
		t.Errorf("kproxy logged the failure %d times, the recovery %d times, and %d other capture lines; want once, once, none:\n%s", failed, again, other, logs)
	}

	took := k.stop(t, serve.ShutdownTimeout+25*time.Second)
	t.Logf("%d requests, 11 records dropped, kproxy exited %v after SIGTERM", sent, took.Round(time.Millisecond))
	if !namespaced {
		// The tmpfs outlives kproxy here: closing it left the file whole.
		whole("after kproxy exited", written+5)
	}
}

// captureCounts reads kproxy_capture_records_total and
// kproxy_capture_records_dropped_total from kproxy's /metrics.
func captureCounts(t *testing.T, metricsAddr string) (total, dropped int) {
	t.Helper()
	resp, err := http.Get("http://" + metricsAddr + "/metrics")
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	sc := bufio.NewScanner(resp.Body)
	for sc.Scan() {
		f := strings.Fields(sc.Text())
		if len(f) != 2 {
			continue
		}
		v, _ := strconv.ParseFloat(f[1], 64)
		switch f[0] {
		case "kproxy_capture_records_total":
			total = int(v)
		case "kproxy_capture_records_dropped_total":
			dropped = int(v)
		}
	}
	return total, dropped
}
