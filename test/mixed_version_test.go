package test

import (
	"bytes"
	"context"
	"fmt"
	"net"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/kvpool/kvpool/api"
	"github.com/kvpool/kvpool/api/admin"
	"github.com/kvpool/kvpool/internal/eventually"
)

// previousRelease is the commit of the release before this one (the last
// that landed on main): the mixed-version test runs it next to this tree.
// Move it forward when a release lands.
const previousRelease = "052cd73e6269fe2189b37f2224b751f77660aedb"

// previousBinary builds kvpool as of previousRelease from this
// repository's history; it skips in a shallow clone, which lacks it.
func previousBinary(t *testing.T) string {
	t.Helper()
	git := requireTool(t, "git")
	root, err := exec.Command(git, "rev-parse", "--show-toplevel").Output()
	if err != nil {
		t.Skipf("not in a git checkout: %v", err)
	}
	if err := exec.Command(git, "cat-file", "-e", previousRelease+"^{commit}").Run(); err != nil {
		if shallow, _ := exec.Command(git, "rev-parse", "--is-shallow-repository").Output(); strings.TrimSpace(string(shallow)) == "true" {
			t.Skipf("commit %s is not in this shallow clone's history (git fetch --unshallow brings it)", previousRelease)
		}
		t.Fatalf("commit %s is not in this repository's history: set previousRelease to the last release's commit", previousRelease)
	}
	src := t.TempDir()
	archive := exec.Command(git, "-C", strings.TrimSpace(string(root)), "archive", previousRelease)
	untar := exec.Command("tar", "-x", "-C", src)
	var archiveErr, untarErr bytes.Buffer
	untar.Stdin, _ = archive.StdoutPipe()
	archive.Stderr, untar.Stderr = &archiveErr, &untarErr
	if err := untar.Start(); err != nil {
		t.Fatal(err)
	}
	if err := archive.Run(); err != nil {
		t.Fatalf("git archive: %v: %s", err, archiveErr.String())
	}
	if err := untar.Wait(); err != nil {
		t.Fatalf("tar: %v: %s", err, untarErr.String())
	}
	bin := filepath.Join(t.TempDir(), "kvpool-previous")
	build := exec.Command("go", "build", "-o", bin, "-ldflags", "-X main.version=previous", "./cmd/kvpool")
	build.Dir = src
	if out, err := build.CombinedOutput(); err != nil {
		t.Fatalf("build %s: %v\n%s", previousRelease, err, out)
	}
	return bin
}

// TestMixedVersionCluster runs a daemon of the previous release and one
// of this tree on one etcd, as during a rolling upgrade: each reads the
// other's node, location and policy records; blocks put on either are
// fetched by the other, byte for byte; and this version's drain hands
// its blocks to the older node.
func TestMixedVersionCluster(t *testing.T) {
	oldBin := previousBinary(t)
	e := startEtcdProcess(t)
	common := []string{"--etcd-endpoints", e.client, "--lease-ttl", "2s", "--capacity", "64MiB"}
	older := startServeBin(t, oldBin, exec.Command, append([]string{"--node-id", "mixed-previous"}, common...)...)
	newer := startServe(t, append([]string{"--node-id", "mixed-current"}, common...)...)
	ctx := context.Background()
	dial := func(s *server, p api.Path) *api.Client {
		c, err := api.Dial(ctx, api.ClientConfig{Server: s.addr, Path: p})
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { c.Close() })
		return c
	}
	co, cn := dial(older, api.PathData), dial(newer, api.PathData)
	for _, s := range []*server{older, newer} {
		a := admin.New(dial(s, api.PathGRPC))
		eventually.True(t, "both nodes registered and alive in "+s.addr+"'s view", 20*time.Second, func() bool {
			ns, err := a.Nodes(ctx)
			live := 0
			for _, n := range ns.Nodes {
				if n.EtcdState == "registered" && n.GossipState == "alive" {
					live++
				}
			}
			return err == nil && live == 2
		})
	}

	const size = 128 << 10
	put := func(c *api.Client, prefix string) [][]byte {
		var keys [][]byte
		for i := range 8 {
			k := api.BlockKey{Tenant: "mixed", Namespace: "n", Key: fmt.Appendf(nil, "%s-%d", prefix, i)}
			if err := c.Put(ctx, k, randomBlock(prefix, i, size)); err != nil {
				t.Fatal(err)
			}
			keys = append(keys, k.Key)
		}
		return keys
	}
	oldKeys, newKeys := put(co, "old"), put(cn, "new")
	fetchAll := func(c *api.Client, who, prefix string, keys [][]byte) {
		// The last attempt's failure, for the message if none succeeds.
		var last error
		if !eventually.Within(20*time.Second, func() bool {
			res, err := c.Fetch(ctx, "mixed", "n", keys, 0)
			if err != nil {
				last = err
				return false
			}
			for i, r := range res {
				if r.Err != nil {
					last = fmt.Errorf("block %s from %q: %w", keys[i], r.Source, r.Err)
					return false
				}
			}
			return true
		}) {
			t.Fatalf("timed out after 20s waiting for %s to fetch the other's blocks; the last attempt: %v", who, last)
		}
		buf := make([]byte, size)
		for i, k := range keys {
			if _, err := c.Get(ctx, api.BlockKey{Tenant: "mixed", Namespace: "n", Key: k}, buf); err != nil {
				t.Fatalf("%s: get %s: %v", who, k, err)
			}
			if !bytes.Equal(buf, randomBlock(prefix, i, size)) {
				t.Fatalf("%s: %s differs from what was put", who, k)
			}
		}
	}
	fetchAll(cn, "the current node", "old", oldKeys)
	fetchAll(co, "the previous node", "new", newKeys)

	// A policy either version stores, the other applies.
	for _, tc := range []struct {
		tenant        string
		writer, other *server
	}{{"set-by-current", newer, older}, {"set-by-previous", older, newer}} {
		if _, err := admin.New(dial(tc.writer, api.PathGRPC)).SetPolicy(ctx, admin.Policy{Tenant: tc.tenant, Kind: "lfu", QuotaBytes: 8 << 20}); err != nil {
			t.Fatal(err)
		}
		a := admin.New(dial(tc.other, api.PathGRPC))
		eventually.True(t, tc.tenant+"'s policy to reach the other node", 20*time.Second, func() bool {
			p, err := a.Policy(ctx, tc.tenant)
			return err == nil && p.Kind == "lfu" && p.QuotaBytes == 8<<20
		})
	}

	// The current node drains into the previous one: the 8 blocks only it
	// holds (the older node holds the rest, having fetched them).
	onlyNew := [][]byte{}
	for i := range 8 {
		k := api.BlockKey{Tenant: "mixed", Namespace: "n", Key: fmt.Appendf(nil, "late-%d", i)}
		if err := cn.Put(ctx, k, randomBlock("late", i, size)); err != nil {
			t.Fatal(err)
		}
		onlyNew = append(onlyNew, k.Key)
	}
	rep, err := admin.New(dial(newer, api.PathGRPC)).Drain(ctx, "mixed-current", 20*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	if rep.Blocks != 24 || rep.HandedOffBlocks != 8 || rep.ReplicatedBlocks != 16 || rep.KeptBlocks != 0 || rep.PeerBlocks["mixed-previous"] != 8 {
		t.Fatalf("drain into the previous version: %+v", rep)
	}
	have, err := co.Exists(ctx, "mixed", "n", onlyNew)
	if err != nil {
		t.Fatal(err)
	}
	for i, ok := range have {
		if !ok {
			t.Errorf("%s is not on the previous node after the drain", onlyNew[i])
		}
	}
	eventually.True(t, "the drained node to exit", 20*time.Second, func() bool {
		c, err := net.DialTimeout("tcp", newer.addr, time.Second)
		if err == nil {
			c.Close()
		}
		return err != nil
	})
}

// randomBlock is block i of a series: seeded bytes, so any copy can be
// checked.
func randomBlock(prefix string, i, size int) []byte {
	b := make([]byte, size)
	for k := range b {
		b[k] = byte(k*31 + i*7 + len(prefix))
	}
	return b
}
