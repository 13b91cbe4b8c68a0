package e2e

import (
	"bytes"
	"context"
	"crypto/tls"
	"encoding/json"
	"fmt"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"k8s.io/apimachinery/pkg/util/wait"

	"github.com/kproxy/kproxy/internal/localcluster"
)

// tmuxSession is a terminal of a fixed size running one command, read
// and typed into as a person would (tmux capture-pane and send-keys).
type tmuxSession struct {
	t    *testing.T
	name string
}

func startTmux(t *testing.T, width, height int, command string) *tmuxSession {
	t.Helper()
	if _, err := exec.LookPath("tmux"); err != nil {
		t.Fatalf("tmux is not installed: %v (.ci/run installs it; locally: apt-get install tmux)", err)
	}
	s := &tmuxSession{t: t, name: fmt.Sprintf("kproxy-e2e-%d", time.Now().UnixNano())}
	cmd := exec.Command("tmux", "new-session", "-d", "-s", s.name, "-x", fmt.Sprint(width), "-y", fmt.Sprint(height), command)
	cmd.Env = append(os.Environ(), "TERM=xterm-256color")
	if out, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("tmux new-session: %v\n%s", err, out)
	}
	t.Cleanup(func() { _ = exec.Command("tmux", "kill-session", "-t", s.name).Run() })
	return s
}

func (s *tmuxSession) screen() string {
	out, err := exec.Command("tmux", "capture-pane", "-p", "-t", s.name).Output()
	if err != nil {
		return ""
	}
	return string(out)
}

// keys types into the terminal; tmux key names (Enter, Escape) or text.
func (s *tmuxSession) keys(keys ...string) {
	s.t.Helper()
	for _, k := range keys {
		args := []string{"send-keys", "-t", s.name}
		if k == "Enter" || k == "Escape" {
			args = append(args, k)
		} else {
			args = append(args, "-l", k)
		}
		if out, err := exec.Command("tmux", args...).CombinedOutput(); err != nil {
			s.t.Fatalf("tmux send-keys %q: %v\n%s", k, err, out)
		}
	}
}

// waitFor polls the screen until every want is on it.
func (s *tmuxSession) waitFor(what string, want ...string) string {
	s.t.Helper()
	var screen string
	err := wait.PollUntilContextTimeout(context.Background(), 100*time.Millisecond, 30*time.Second, true, func(context.Context) (bool, error) {
		screen = s.screen()
		for _, w := range want {
			if !strings.Contains(screen, w) {
				return false, nil
			}
		}
		return true, nil
	})
	if err != nil {
		s.t.Fatalf("%s: the screen never showed %q:\n%s", what, want, screen)
	}
	return screen
}

// waitGone polls the screen until gone is off it.
func (s *tmuxSession) waitGone(what, gone string) {
	s.t.Helper()
	var screen string
	err := wait.PollUntilContextTimeout(context.Background(), 100*time.Millisecond, 30*time.Second, true, func(context.Context) (bool, error) {
		screen = s.screen()
		return !strings.Contains(screen, gone), nil
	})
	if err != nil {
		s.t.Fatalf("%s: the screen still shows %q:\n%s", what, gone, screen)
	}
}

// TestTUI runs the real binaries as a person would: kproxy serve in front
// of the real apiserver with its flow API, and kproxy tui in a terminal
// (tmux). A request RBAC refuses appears in the list; the filter ~c 403
// finds it; opening it shows the deciding stage and its explanation; the
// Stages tab shows the waterfall; :export har writes it.
func TestTUI(t *testing.T) {
	f := setupFixtures(t)
	_ = f
	dir := t.TempDir()
	bin, manifest := kproxyBinary(t, dir)
	kc, err := cluster.UpstreamKubeconfig(dir)
	if err != nil {
		t.Fatal(err)
	}
	ports, err := localcluster.FreePorts(2)
	if err != nil {
		t.Fatal(err)
	}
	listen, api := fmt.Sprintf("127.0.0.1:%d", ports[0]), fmt.Sprintf("127.0.0.1:%d", ports[1])
	serveLog, err := os.Create(filepath.Join(dir, "serve.log"))
	if err != nil {
		t.Fatal(err)
	}
	defer serveLog.Close()
	serve := exec.Command(bin, "serve", "--listen", listen, "--api-listen", api, "--upstream-kubeconfig", kc,
		"--apiserver-manifest", manifest, "--pki-dir", filepath.Join(dir, "pki"))
	serve.Stdout, serve.Stderr = serveLog, serveLog
	if err := serve.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = serve.Process.Signal(os.Interrupt); _ = serve.Wait() })

	// kproxy's own CA signs its serving certificate; this test only needs
	// the request to reach it, as any client configured for it would.
	client := &http.Client{Transport: &http.Transport{TLSClientConfig: &tls.Config{InsecureSkipVerify: true}}} //nolint:gosec // a throwaway test CA
	send := func() (int, error) {
		req, _ := http.NewRequest("GET", "https://"+listen+"/api/v1/namespaces/corpus/secrets", nil)
		req.Header.Set("Authorization", "Bearer "+tokenOf("alice"))
		resp, err := client.Do(req)
		if err != nil {
			return 0, err
		}
		resp.Body.Close()
		return resp.StatusCode, nil
	}
	var status int
	if err := wait.PollUntilContextTimeout(context.Background(), 200*time.Millisecond, 90*time.Second, true, func(context.Context) (bool, error) {
		status, err = send()
		return err == nil, nil
	}); err != nil {
		log, _ := os.ReadFile(serveLog.Name())
		t.Fatalf("kproxy serve never answered: %v\n%s", err, log)
	}
	if status != http.StatusForbidden {
		t.Fatalf("alice listing secrets: %d, want 403", status)
	}
	// One allowed request too, so the filter has something to hide.
	req, _ := http.NewRequest("GET", "https://"+listen+"/api/v1/namespaces/corpus/pods", nil)
	req.Header.Set("Authorization", "Bearer "+tokenOf("alice"))
	if resp, err := client.Do(req); err == nil {
		resp.Body.Close()
	}

	term := startTmux(t, 120, 40, bin+" tui --connect http://"+api)
	term.waitFor("the list", "secrets -n corpus", "403 @authorization", "pods -n corpus")

	term.keys("/", "~c 403", "Enter")
	screen := term.waitFor("the filtered list", `filter "~c 403"`, "secrets -n corpus")
	if strings.Contains(screen, "pods -n corpus") {
		t.Errorf("~c 403 still shows the allowed request:\n%s", screen)
	}

	term.keys("Enter")
	term.waitFor("the verdict", "Deciding stage: authorization (reject)", `denied for user "alice"`, "The apiserver's message",
		`User "alice" cannot list resource "secrets"`)
	term.keys("2")
	term.waitFor("the waterfall", "kproxy's replay (its own cost, not the apiserver's time)", "authorization", "upstream (apiserver)")
	// The next key waits until Escape has been taken alone: typed at
	// once, a terminal's Escape and ":" read as one Alt+":".
	term.keys("Escape")
	term.waitGone("back at the list", "kproxy's replay (its own cost")

	harFile := filepath.Join(dir, "flows.har")
	term.keys(":", "export har "+harFile, "Enter")
	term.waitFor("the export", "exported 1 filtered flows to "+harFile)
	b, err := os.ReadFile(harFile)
	if err != nil {
		t.Fatal(err)
	}
	var h struct {
		Log struct {
			Version string
			Entries []struct {
				Request  struct{ Method, URL string }
				Response struct{ Status int }
				Kproxy   struct {
					Predicted struct {
						Status int
						Stage  string
					}
				} `json:"_kproxy"`
			}
		}
	}
	if err := json.Unmarshal(b, &h); err != nil {
		t.Fatalf("the HAR file is not JSON: %v\n%s", err, b)
	}
	if len(h.Log.Entries) != 1 || h.Log.Version != "1.2" {
		t.Fatalf("HAR: version %q, %d entries, want 1.2 and 1", h.Log.Version, len(h.Log.Entries))
	}
	e := h.Log.Entries[0]
	if e.Request.Method != "GET" || !strings.HasSuffix(e.Request.URL, "/api/v1/namespaces/corpus/secrets") || e.Response.Status != 403 ||
		e.Kproxy.Predicted.Status != 403 || e.Kproxy.Predicted.Stage != "authorization" {
		t.Errorf("HAR entry: %+v", e)
	}
	if bytes.Contains(b, []byte(tokenOf("alice"))) {
		t.Errorf("alice's token reached the HAR file")
	}

	term.keys("q")
	if err := wait.PollUntilContextTimeout(context.Background(), 100*time.Millisecond, 10*time.Second, true, func(context.Context) (bool, error) {
		return exec.Command("tmux", "has-session", "-t", term.name).Run() != nil, nil
	}); err != nil {
		t.Errorf("q did not end kproxy tui:\n%s", term.screen())
	}
}
