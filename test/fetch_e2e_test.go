package test

import (
	"bytes"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"
)

// Two daemon processes on one host, pulling with --transport shm: node A
// fetches node B's blocks by mapping B's segment, and serves them after.
// Then the same with tcp, to show both paths deliver identical bytes.
func TestFetchBetweenTwoDaemonProcesses(t *testing.T) {
	for _, tr := range []string{"shm", "tcp"} {
		t.Run(tr, func(t *testing.T) {
			a := startServe(t, "--capacity", "64MiB", "--transport", tr)
			b := startServe(t, "--capacity", "64MiB", "--node-id", "e2e-holder-"+tr, "--etcd-endpoints", a.etcd, "--transport", tr)
			dir := t.TempDir()
			const blocks = 6
			var keys []string
			var values [][]byte
			for i := range blocks {
				v := randomBytes(2<<20 + i)
				f := filepath.Join(dir, fmt.Sprintf("block-%d", i))
				os.WriteFile(f, v, 0o644)
				keys = append(keys, fmt.Sprintf("blk-%d", i))
				values = append(values, v)
				mustOK(t, kv(t, nil, "block", "put", "--server", b.addr, "--tenant", "acme", "--namespace", "m", "--key", keys[i], "--file", f))
			}
			deadline := time.Now().Add(20 * time.Second)
			for {
				r := mustOK(t, kv(t, nil, "cluster", "locate", "--server", a.addr, "--tenant", "acme", "--namespace", "m", "--keys", strings.Join(keys, ","), "--json"))
				if strings.Contains(r.stdout, fmt.Sprintf(`"deepest_blocks": %d`, blocks)) {
					break
				}
				if time.Now().After(deadline) {
					t.Fatalf("node A never located node B's blocks: %s", r.stdout)
				}
				time.Sleep(20 * time.Millisecond)
			}
			// Direct mode first: this client reads from B itself; A stores
			// nothing.
			out := filepath.Join(dir, "direct")
			os.Mkdir(out, 0o755)
			mustOK(t, kv(t, nil, "block", "fetch", "--server", a.addr, "--tenant", "acme", "--namespace", "m", "--keys", strings.Join(keys, ","), "--direct", "--dir", out))
			for i, k := range keys {
				got, _ := os.ReadFile(filepath.Join(out, hex.EncodeToString([]byte(k))))
				if !bytes.Equal(got, values[i]) {
					t.Fatalf("block %d read directly from node B differs from what it stored", i)
				}
			}
			if r := kv(t, nil, "exists", "--server", a.addr, "--tenant", "acme", "--namespace", "m", "--key", keys[0]); r.code == 0 {
				t.Fatalf("a direct read stored the block on node A: %s", r.stdout)
			}
			r := mustOK(t, kv(t, nil, "block", "fetch", "--server", a.addr, "--tenant", "acme", "--namespace", "m", "--keys", strings.Join(keys, ","), "--json"))
			var res struct {
				Blocks []struct {
					Source string `json:"source"`
					Size   int    `json:"bytes"`
					Error  string `json:"error"`
				} `json:"blocks"`
				FetchedBytes int64 `json:"fetched_bytes"`
			}
			if err := json.Unmarshal([]byte(r.stdout), &res); err != nil || len(res.Blocks) != blocks {
				t.Fatalf("fetch --json: %v %s", err, r.stdout)
			}
			for i, blk := range res.Blocks {
				if blk.Source != "e2e-holder-"+tr || blk.Size != len(values[i]) || blk.Error != "" {
					t.Fatalf("block %d: %+v", i, blk)
				}
			}
			for i, k := range keys {
				out := filepath.Join(dir, "got-"+k)
				mustOK(t, kv(t, nil, "block", "get", "--server", a.addr, "--tenant", "acme", "--namespace", "m", "--key", k, "--file", out))
				got, _ := os.ReadFile(out)
				if !bytes.Equal(got, values[i]) {
					t.Fatalf("block %d read back from node A differs from what node B stored", i)
				}
			}
			// The bytes moved over the transport asked for.
			var total int
			for _, v := range values {
				total += len(v)
			}
			want := fmt.Sprintf(`kvpool_transfer_fetched_bytes_total{transport=%q} %s`, tr, strconv.FormatFloat(float64(total), 'g', -1, 64))
			if m := scrape(t, a.metrics); !strings.Contains(m, want) {
				t.Fatalf("node A's metrics lack %s:\n%s", want, grepLines(m, "kvpool_transfer"))
			}
			r = mustOK(t, kv(t, nil, "cluster", "links", "--server", a.addr, "--json"))
			if !strings.Contains(r.stdout, `"transport": "`+tr+`"`) || !strings.Contains(r.stdout, `"peer": "e2e-holder-`+tr+`"`) {
				t.Fatalf("admin links after the fetch: %s", r.stdout)
			}
		})
	}
}

func scrape(t *testing.T, addr string) string {
	t.Helper()
	resp, err := http.Get("http://" + addr + "/metrics")
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	if err != nil {
		t.Fatal(err)
	}
	return string(b)
}

func grepLines(s, substr string) string {
	var out []string
	for _, l := range strings.Split(s, "\n") {
		if strings.Contains(l, substr) {
			out = append(out, l)
		}
	}
	return strings.Join(out, "\n")
}
