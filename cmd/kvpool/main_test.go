package main

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"io"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

// These tests run the command line in this process, through run(): flags,
// exit codes, output shapes, and daemons started by "node serve" itself.
// The tests under test/ run the built binary for what needs separate
// processes.

type result struct {
	stdout, stderr string
	code           int
}

// kv runs the command line args with stdin.
func kv(t *testing.T, stdin []byte, args ...string) result {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	var out, errb bytes.Buffer
	code := run(ctx, args, bytes.NewReader(stdin), &out, &errb)
	return result{out.String(), errb.String(), code}
}

func mustOK(t *testing.T, r result) result {
	t.Helper()
	if r.code != 0 {
		t.Fatalf("exit %d\nstdout: %s\nstderr: %s", r.code, r.stdout, r.stderr)
	}
	return r
}

// decode parses a command's --json output into v.
func decode(t *testing.T, r result, v any) {
	t.Helper()
	if err := json.Unmarshal([]byte(r.stdout), v); err != nil {
		t.Fatalf("not JSON: %v\n%s", err, r.stdout)
	}
}

// served is a daemon started by "node serve" in this process.
type served struct {
	addr, metrics, etcd string
}

// serve runs "node serve" with args (on free loopback ports, logging JSON)
// until the test ends, and waits until it serves.
func serve(t *testing.T, args ...string) *served {
	t.Helper()
	dir := t.TempDir()
	args = append([]string{"node", "serve", "--listen", "127.0.0.1:0", "--metrics-listen", "127.0.0.1:0",
		"--node-id", "cmd-" + strings.NewReplacer("/", "-", "#", "-").Replace(t.Name()), "--shm-socket", filepath.Join(dir, "shm.sock"),
		"--log-format", "json", "--embedded-etcd-listen", "127.0.0.1:0", "--etcd-data-dir", filepath.Join(dir, "etcd")}, args...)
	ctx, cancel := context.WithCancel(context.Background())
	pr, pw := io.Pipe()
	done := make(chan int, 1)
	go func() {
		done <- run(ctx, args, bytes.NewReader(nil), io.Discard, pw)
		pw.Close()
	}()
	s := &served{}
	ready := make(chan error, 1)
	go func() {
		lines := bufio.NewScanner(pr)
		found := false
		var tail []string
		for lines.Scan() {
			var rec map[string]any
			if json.Unmarshal(lines.Bytes(), &rec) == nil {
				switch rec["msg"] {
				case "embedded etcd serving":
					s.etcd, _ = rec["client_url"].(string)
				case "kvpool node starting":
					s.addr, _ = rec["listen"].(string)
					s.metrics, _ = rec["metrics"].(string)
				case "serving":
					// Run has made the node ready: /readyz answers 200.
					if s.addr != "" && !found {
						found = true
						ready <- nil
					}
				}
			}
			tail = append(tail, lines.Text())
		}
		if !found {
			ready <- errors.New("serve ended before it was ready: " + strings.Join(tail, "\n"))
		}
	}()
	t.Cleanup(func() {
		cancel()
		select {
		case code := <-done:
			if code != 0 {
				t.Errorf("node serve exited %d after its context ended, want 0", code)
			}
		case <-time.After(15 * time.Second):
			t.Error("node serve did not stop within 15 s of its context ending")
		}
	})
	select {
	case err := <-ready:
		if err != nil {
			t.Fatal(err)
		}
	case <-time.After(30 * time.Second):
		t.Fatal("node serve did not start within 30 s")
	}
	return s
}
