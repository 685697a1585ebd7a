package test

import (
	"bufio"
	"encoding/json"
	"fmt"
	"math"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

// TestShapedLinkEstimateConverges runs two daemons in two network
// namespaces joined by a veth pair whose holder side is shaped by tc tbf to
// 400 Mbit/s, fetches blocks across it, and checks that the fetching
// daemon's link estimate converges within 15% of the rate the link
// delivers, measured in the same run (at most the shaped rate). It skips,
// saying why, only where namespaces cannot be created.
func TestShapedLinkEstimateConverges(t *testing.T) {
	if testing.Short() {
		t.Skip("shaped-link test is skipped under -short")
	}
	ipTool := requireTool(t, "ip")
	tcTool := requireTool(t, "tc")
	bin := kvpoolBin(t)
	tag := fmt.Sprintf("%d", os.Getpid()%100000)
	nsA, nsB := "kvpa"+tag, "kvpb"+tag
	vA, vB := "kva"+tag, "kvb"+tag
	run := func(args ...string) error {
		out, err := exec.Command(args[0], args[1:]...).CombinedOutput()
		if err != nil {
			return fmt.Errorf("%s: %v: %s", strings.Join(args, " "), err, out)
		}
		return nil
	}
	if err := run(ipTool, "netns", "add", nsA); err != nil {
		t.Skipf("cannot create network namespaces here (needs root and CONFIG_NET_NS): %v", err)
	}
	t.Cleanup(func() { run(ipTool, "netns", "del", nsA) })
	if err := run(ipTool, "netns", "add", nsB); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { run(ipTool, "netns", "del", nsB) })
	const addrA, addrB = "10.77.7.1", "10.77.7.2"
	for _, cmd := range [][]string{
		{ipTool, "link", "add", vA, "type", "veth", "peer", "name", vB},
		{ipTool, "link", "set", vA, "netns", nsA},
		{ipTool, "link", "set", vB, "netns", nsB},
		{ipTool, "-n", nsA, "addr", "add", addrA + "/24", "dev", vA},
		{ipTool, "-n", nsB, "addr", "add", addrB + "/24", "dev", vB},
		{ipTool, "-n", nsA, "link", "set", vA, "up"},
		{ipTool, "-n", nsB, "link", "set", vB, "up"},
		{ipTool, "-n", nsA, "link", "set", "lo", "up"},
		{ipTool, "-n", nsB, "link", "set", "lo", "up"},
		// The holder's side sends the blocks: shape its egress.
		{ipTool, "netns", "exec", nsB, tcTool, "qdisc", "add", "dev", vB, "root", "tbf", "rate", "400mbit", "burst", "64kb", "latency", "100ms"},
	} {
		if err := run(cmd...); err != nil {
			t.Fatal(err)
		}
	}
	const shapedBytesPerSecond = 400e6 / 8
	dir := t.TempDir()
	serve := func(ns, id, addr string, extra ...string) {
		args := append([]string{"netns", "exec", ns, bin, "node", "serve", "--node-id", id, "--listen", addr + ":7070", "--metrics-listen", "",
			"--capacity", "256MiB", "--gossip-listen", addr + ":7946", "--shm-socket", filepath.Join(dir, id+".sock"), "--log-format", "json",
			// The namespaces are this test's own: open to the network is fine.
			"--insecure"}, extra...)
		cmd := exec.Command(ipTool, args...)
		stderr, _ := cmd.StderrPipe()
		if err := cmd.Start(); err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { cmd.Process.Kill(); cmd.Wait() })
		ready := make(chan bool, 1)
		go func() {
			sc := bufio.NewScanner(stderr)
			sent := false
			for sc.Scan() {
				if !sent && strings.Contains(sc.Text(), `"kvpool node starting"`) {
					ready <- true
					sent = true
				}
				if testing.Verbose() {
					t.Logf("%s: %s", id, sc.Text())
				}
			}
			if !sent {
				ready <- false
			}
		}()
		select {
		case ok := <-ready:
			if !ok {
				t.Fatalf("%s exited before serving", id)
			}
		case <-time.After(30 * time.Second):
			t.Fatalf("%s did not start", id)
		}
	}
	serve(nsA, "shaped-a", addrA, "--embedded-etcd-listen", addrA+":2379", "--etcd-data-dir", filepath.Join(dir, "etcd"))
	serve(nsB, "shaped-b", addrB, "--etcd-endpoints", "http://"+addrA+":2379")
	in := func(ns string, args ...string) result {
		return kvIn(t, ipTool, ns, bin, args...)
	}
	block := filepath.Join(dir, "block")
	os.WriteFile(block, randomBytes(2<<20), 0o644)
	const blocks = 24
	var keys []string
	for i := range blocks {
		k := fmt.Sprintf("shaped-%d", i)
		keys = append(keys, k)
		mustOK(t, in(nsB, "block", "put", "--server", addrB+":7070", "--tenant", "t", "--namespace", "n", "--key", k, "--file", block))
	}
	deadline := time.Now().Add(30 * time.Second)
	for {
		r := in(nsA, "cluster", "locate", "--server", addrA+":7070", "--tenant", "t", "--namespace", "n", "--keys", strings.Join(keys, ","), "--json")
		if r.code == 0 && strings.Contains(r.stdout, fmt.Sprintf(`"deepest_blocks": %d`, blocks)) {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("node A never located node B's blocks: %s %s", r.stdout, r.stderr)
		}
		time.Sleep(100 * time.Millisecond)
	}
	// One block per fetch: each is one bandwidth sample.
	var took time.Duration
	for _, k := range keys {
		r := mustOK(t, in(nsA, "block", "fetch", "--server", addrA+":7070", "--tenant", "t", "--namespace", "n", "--keys", k, "--json", "--holder-timeout", "10s"))
		var res struct {
			Seconds float64 `json:"seconds"`
		}
		json.Unmarshal([]byte(r.stdout), &res)
		took += time.Duration(res.Seconds * float64(time.Second))
	}
	r := mustOK(t, in(nsA, "cluster", "links", "--server", addrA+":7070", "--json"))
	var links struct {
		Links []struct {
			Peer           string  `json:"peer"`
			BytesPerSecond float64 `json:"bytes_per_second"`
			Samples        int     `json:"bandwidth_samples"`
		} `json:"links"`
	}
	if err := json.Unmarshal([]byte(r.stdout), &links); err != nil {
		t.Fatalf("admin links: %v\n%s", err, r.stdout)
	}
	// What the link delivers, measured now over the same path: 2 MiB
	// frames from B's data channel, one at a time as the fetches went.
	// tbf on a busy VM delivers less than its rate (its timer is late
	// and TCP backs off on its drops), and the estimate is right to
	// follow what is delivered.
	var bench struct {
		Baseline float64 `json:"baseline_gbps"`
	}
	b := mustOK(t, in(nsA, "node", "bench", "--server", addrB+":7070", "--op", "get", "--block-size", "2MiB", "--working-set", "8MiB",
		"--duration", "2s", "--quiet", "--json"))
	if err := json.Unmarshal([]byte(b.stdout), &bench); err != nil || bench.Baseline <= 0 {
		t.Fatalf("node bench over the shaped link: %v\n%s", err, b.stdout)
	}
	delivered := bench.Baseline * 1e9
	for _, l := range links.Links {
		if l.Peer != "shaped-b" {
			continue
		}
		off := math.Abs(l.BytesPerSecond-delivered) / delivered
		t.Logf("shaped at %.1f MB/s, delivering %.1f MB/s (raw frames, same run); %d fetches of 2 MiB took %v; estimate %.1f MB/s after %d samples (%.1f%% off what is delivered)",
			shapedBytesPerSecond/1e6, delivered/1e6, blocks, took.Round(time.Millisecond), l.BytesPerSecond/1e6, l.Samples, 100*off)
		if off > 0.15 {
			t.Fatalf("the estimate %.1f MB/s is more than 15%% off the %.1f MB/s the link delivers", l.BytesPerSecond/1e6, delivered/1e6)
		}
		if delivered > 1.15*shapedBytesPerSecond {
			t.Fatalf("the link delivers %.1f MB/s, above its shaped %.1f MB/s: the shaping did not take", delivered/1e6, shapedBytesPerSecond/1e6)
		}
		return
	}
	t.Fatalf("no link to shaped-b in %s", r.stdout)
}

// kvIn runs the kvpool binary inside a network namespace.
func kvIn(t *testing.T, ipTool, ns, bin string, args ...string) result {
	t.Helper()
	cmd := exec.Command(ipTool, append([]string{"netns", "exec", ns, bin}, args...)...)
	var out, errb strings.Builder
	cmd.Stdout, cmd.Stderr = &out, &errb
	err := cmd.Run()
	code := 0
	if ee, ok := err.(*exec.ExitError); ok {
		code = ee.ExitCode()
	} else if err != nil {
		t.Fatal(err)
	}
	return result{out.String(), errb.String(), code}
}
