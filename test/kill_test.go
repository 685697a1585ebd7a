package test

import (
	"bufio"
	"bytes"
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"os"
	"os/exec"
	"strconv"
	"syscall"
	"testing"
	"time"

	"github.com/kvpool/kvpool/api"
	"github.com/kvpool/kvpool/api/admin"
	"github.com/kvpool/kvpool/internal/eventually"
)

// The kill -9 tests run daemons, and where a client is killed the client
// too, as separate processes, and kill them with SIGKILL in the middle of
// a put, a fetch or a replication. Whatever was in flight, a block is
// whole or absent everywhere, and no reservation outlives its owner.

// kill9 kills s with SIGKILL and waits for it to exit (the exit stays
// for the cleanup).
func kill9(s *server) {
	s.cmd.Process.Signal(syscall.SIGKILL)
	s.done <- <-s.done
}

// killValue is the deterministic value of key i of size n in these tests.
func killValue(seed uint64, i, n int) []byte {
	r := rand.New(rand.NewPCG(seed, uint64(i)))
	v := make([]byte, n)
	for j := 0; j+8 <= n; j += 8 {
		x := r.Uint64()
		for k := range 8 {
			v[j+k] = byte(x >> (8 * k))
		}
	}
	return v
}

func dialPath(t *testing.T, addr string, p api.Path) *api.Client {
	t.Helper()
	c, err := api.Dial(context.Background(), api.ClientConfig{Server: addr, Path: p})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	return c
}

// wholeOrAbsent checks that every key reads back as its whole value or not
// at all from c, and says how many were whole.
func wholeOrAbsent(t *testing.T, c *api.Client, keys []api.BlockKey, values [][]byte) (whole int) {
	t.Helper()
	buf := make([]byte, 64<<20)
	for i, k := range keys {
		n, err := c.Get(context.Background(), k, buf)
		switch {
		case errors.Is(err, api.ErrNotFound):
		case err != nil:
			t.Errorf("get %s: %v", k.Key, err)
		case !bytes.Equal(buf[:n], values[i]):
			t.Errorf("get %s: %d bytes that are not the %d put", k.Key, n, len(values[i]))
		default:
			whole++
		}
	}
	return whole
}

// noReservations waits until the node behind c holds no reservation.
func noReservations(t *testing.T, c *api.Client, within time.Duration) {
	t.Helper()
	var st api.NodeStats
	eventually.True(t, "the node to hold no reservation", within, func() bool {
		var err error
		st, err = c.Stats(context.Background())
		return err == nil && st.Reservations == 0
	})
}

// A holder killed with SIGKILL while another node fetches a chain from
// it, over each transport: the fetch ends within the fetch timeout, and
// the fetcher holds each block whole or not at all, with no reservation
// left.
func TestKillHolderDuringFetch(t *testing.T) {
	e := startEtcdProcess(t)
	const blocks, size = 32, 8 << 20
	for _, tr := range []string{"tcp", "shm", "grpc"} {
		t.Run(tr, func(t *testing.T) {
			common := []string{"--etcd-endpoints", e.client, "--lease-ttl", "2s", "--capacity", "512MiB",
				"--reservation-timeout", "2s", "--fetch-timeout", "1s", "--transport", tr}
			holder := startServe(t, append([]string{"--node-id", "kill-holder-" + tr}, common...)...)
			fetcher := startServe(t, append([]string{"--node-id", "kill-fetcher-" + tr}, common...)...)
			hc, fc := dialPath(t, holder.addr, api.PathData), dialPath(t, fetcher.addr, api.PathData)
			ns := "fetch-" + tr
			var keys [][]byte
			var bks []api.BlockKey
			var values [][]byte
			for i := range blocks {
				k := api.BlockKey{Tenant: "acme", Namespace: ns, Key: fmt.Appendf(nil, "b%02d", i)}
				v := killValue(7, i, size)
				if err := hc.Put(context.Background(), k, v); err != nil {
					t.Fatal(err)
				}
				keys, bks, values = append(keys, k.Key), append(bks, k), append(values, v)
			}
			eventually.True(t, "the fetcher to see the holder's blocks", 10*time.Second, func() bool {
				hs, err := fc.Route(context.Background(), "acme", ns, keys)
				return err == nil && len(hs) == blocks && len(hs[blocks-1]) > 0
			})
			type fetched struct {
				res []api.FetchResult
				err error
			}
			out := make(chan fetched, 1)
			start := time.Now()
			go func() {
				res, err := fc.Fetch(context.Background(), "acme", ns, keys, 0)
				out <- fetched{res, err}
			}()
			// 256 MiB take 50 ms or more here: 10 ms in, the fetch is under way.
			time.Sleep(10 * time.Millisecond)
			kill9(holder)
			killed := time.Since(start)
			f := <-out
			took := time.Since(start)
			if took > killed+10*time.Second {
				t.Errorf("the fetch ended %v after the kill; the fetch timeout is 1 s", (took - killed).Round(time.Millisecond))
			}
			ok, failed := 0, 0
			if f.err == nil {
				for _, r := range f.res {
					if r.Err == nil {
						ok++
					} else {
						failed++
						if !errors.Is(r.Err, api.ErrUnavailable) && !errors.Is(r.Err, api.ErrNotFound) {
							t.Errorf("a block failed with %v, want Unavailable or NotFound", r.Err)
						}
					}
				}
			}
			if ok == blocks {
				// A machine fast enough to move 256 MiB in 10 ms: the kill
				// came after the fetch; what follows still checks the blocks.
				t.Logf("%s: every block was fetched before the kill", tr)
			}
			whole := wholeOrAbsent(t, fc, bks, values)
			if whole < ok {
				t.Errorf("%d blocks fetched but only %d whole on the fetcher", ok, whole)
			}
			noReservations(t, fc, 5*time.Second)
			t.Logf("%s: holder killed %v into the fetch; the fetch returned %v later (call error %v): %d fetched, %d failed; %d whole on the fetcher, the rest absent, no reservation left",
				tr, killed.Round(time.Millisecond), (took - killed).Round(time.Millisecond), f.err, ok, failed, whole)
		})
	}
}

// Replication (PutReplicas, 2 copies) with either end killed by SIGKILL
// in the middle: with the target killed, the put reports it and the
// source keeps its whole copy; with the source killed, the target holds
// each block whole or not at all and reclaims what was being written.
func TestKillDuringReplication(t *testing.T) {
	e := startEtcdProcess(t)
	const size = 16 << 20
	common := []string{"--etcd-endpoints", e.client, "--lease-ttl", "2s", "--capacity", "512MiB", "--reservation-timeout", "2s"}
	for _, victim := range []string{"target", "source"} {
		t.Run("kill the "+victim, func(t *testing.T) {
			src := startServe(t, append([]string{"--node-id", "repl-src-" + victim}, common...)...)
			dst := startServe(t, append([]string{"--node-id", "repl-dst-" + victim}, common...)...)
			sc, dc := dialPath(t, src.addr, api.PathData), dialPath(t, dst.addr, api.PathData)
			eventually.True(t, "the source to see the target", 10*time.Second, func() bool {
				k := api.BlockKey{Tenant: "acme", Namespace: "probe", Key: []byte("probe-" + victim)}
				return sc.PutReplicas(context.Background(), k, []byte("probe"), 2) == nil
			})
			type put struct {
				i   int
				err error
			}
			puts := make(chan put, 64)
			stop := make(chan struct{})
			var bks []api.BlockKey
			var values [][]byte
			for i := range 24 {
				bks = append(bks, api.BlockKey{Tenant: "acme", Namespace: "repl-" + victim, Key: fmt.Appendf(nil, "r%02d", i)})
				values = append(values, killValue(11, i, size))
			}
			go func() {
				defer close(puts)
				for i := range bks {
					select {
					case <-stop:
						return
					default:
					}
					puts <- put{i, sc.PutReplicas(context.Background(), bks[i], values[i], 2)}
				}
			}()
			// Kill once a few copies have been placed.
			var done []put
			for len(done) < 3 {
				p, ok := <-puts
				if !ok {
					break
				}
				done = append(done, p)
			}
			killedAt := time.Now()
			if victim == "target" {
				kill9(dst)
			} else {
				kill9(src)
			}
			close(stop)
			for p := range puts {
				done = append(done, p)
			}
			failedAfter := 0
			for _, p := range done[3:] {
				if p.err != nil {
					failedAfter++
				}
			}
			if victim == "target" {
				// Every put the source acknowledged, and every one that
				// failed for want of a copy, left a whole local copy.
				if whole := wholeOrAbsent(t, sc, bks[:len(done)], values[:len(done)]); whole != len(done) {
					t.Errorf("the source holds %d whole of the %d blocks it was given", whole, len(done))
				}
				noReservations(t, sc, 5*time.Second)
				t.Logf("target killed after %d replicated puts: %d more puts ended (%d reported too few copies, within %v); the source holds all %d whole",
					3, len(done)-3, failedAfter, time.Since(killedAt).Round(time.Millisecond), len(done))
				return
			}
			whole := wholeOrAbsent(t, dc, bks, values)
			if whole < 3 {
				t.Errorf("the target holds %d whole blocks; the first 3 replicated puts were acknowledged", whole)
			}
			noReservations(t, dc, 5*time.Second)
			t.Logf("source killed after %d replicated puts (%d in flight or after): the target holds %d whole, the rest absent, no reservation left",
				3, len(done)-3, whole)
		})
	}
}

// A client process killed with SIGKILL in the middle of a put: on shared
// memory with a reservation half written, on the data channel mid-frame.
// The node drops what was in flight at once (the session ends with the
// socket), the block is absent, and the node serves on.
func TestKillClientDuringPut(t *testing.T) {
	s := startServe(t, "--standalone", "--capacity", "512MiB", "--max-block-size", "256MiB", "--reservation-timeout", "30s")
	c := dialPath(t, s.addr, api.PathData)
	for _, path := range []string{"shm", "data"} {
		t.Run(path, func(t *testing.T) {
			key := "killed-" + path
			helper := exec.Command(os.Args[0], "-test.run=^$")
			helper.Env = append(os.Environ(), "KVPOOL_TEST_HELPER=put", "KVPOOL_HELPER_ADDR="+s.addr, "KVPOOL_HELPER_PATH="+path,
				"KVPOOL_HELPER_KEY="+key)
			stdout, err := helper.StdoutPipe()
			if err != nil {
				t.Fatal(err)
			}
			helper.Stderr = os.Stderr
			if err := helper.Start(); err != nil {
				t.Fatal(err)
			}
			line, err := bufio.NewReader(stdout).ReadString('\n')
			if err != nil {
				t.Fatalf("the helper said nothing: %v", err)
			}
			if path == "data" {
				time.Sleep(20 * time.Millisecond) // let the frame get under way
			}
			helper.Process.Signal(syscall.SIGKILL)
			helper.Wait()
			killed := time.Now()
			noReservations(t, c, 5*time.Second)
			reclaimed := time.Since(killed)
			k := api.BlockKey{Tenant: "acme", Namespace: "killed", Key: []byte(key)}
			whole := wholeOrAbsent(t, c, []api.BlockKey{k}, [][]byte{killValue(3, 0, helperPutBytes)})
			if err := c.Put(context.Background(), api.BlockKey{Tenant: "acme", Namespace: "killed", Key: []byte("after-" + path)}, []byte("v")); err != nil {
				t.Fatalf("put after the kill: %v", err)
			}
			t.Logf("%s: client killed after %q; no reservation left %v after the kill; the block is %s",
				path, line[:len(line)-1], reclaimed.Round(time.Millisecond), map[int]string{0: "absent", 1: "whole (the put finished first)"}[whole])
		})
	}
}

// helperPutBytes is the value size of the killed client's put.
const helperPutBytes = 256 << 20

// runHelper runs the helper process role names: "idle" for
// TestManyIdleConnections (runIdleHelper), "put" for
// TestKillClientDuringPut, which kills it: it puts
// one 256 MiB block (on shm: reserves it, writes half, and waits to be
// killed) and says on stdout when it is under way.
func runHelper(role string) int {
	switch role {
	case "idle":
		return runIdleHelper()
	case "shm-uid":
		return runShmUIDHelper()
	case "put":
	default:
		fmt.Fprintf(os.Stderr, "unknown helper role %q\n", role)
		return 2
	}
	ctx := context.Background()
	p, err := api.ParsePath(os.Getenv("KVPOOL_HELPER_PATH"))
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 2
	}
	c, err := api.Dial(ctx, api.ClientConfig{Server: os.Getenv("KVPOOL_HELPER_ADDR"), Path: p})
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	k := api.BlockKey{Tenant: "acme", Namespace: "killed", Key: []byte(os.Getenv("KVPOOL_HELPER_KEY"))}
	v := killValue(3, 0, helperPutBytes)
	if p == api.PathShm {
		r, err := c.Reserve(ctx, k, len(v))
		if err != nil {
			fmt.Fprintln(os.Stderr, err)
			return 1
		}
		copy(r.Bytes(), v[:len(v)/2])
		fmt.Println("reserved " + strconv.Itoa(len(v)) + " bytes, wrote half")
		time.Sleep(time.Hour) // until killed
		return 1
	}
	fmt.Println("putting " + strconv.Itoa(len(v)) + " bytes")
	if err := c.Put(ctx, k, v); err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	time.Sleep(time.Hour) // until killed
	return 1
}

// A daemon process killed with SIGKILL and started again under its id,
// on a new port and a new gossip port: its peer sees it alive at the new
// gossip address within 2 s of its start, and fetches what it holds.
func TestKillAndRestartOnANewGossipPort(t *testing.T) {
	e := startEtcdProcess(t)
	common := []string{"--etcd-endpoints", e.client, "--lease-ttl", "2s", "--capacity", "64MiB"}
	peer := startServe(t, append([]string{"--node-id", "regossip-peer"}, common...)...)
	first := startServe(t, append([]string{"--node-id", "regossip-a"}, common...)...)
	pc := dialPath(t, peer.addr, api.PathData)
	a := admin.New(pc)
	gossipOf := func(id string) (state, addr string) {
		nodes, err := a.Nodes(context.Background())
		if err != nil {
			return "", ""
		}
		for _, n := range nodes.Nodes {
			if n.ID == id {
				return n.GossipState, n.Addrs["gossip"]
			}
		}
		return "", ""
	}
	eventually.True(t, "the peer to see regossip-a alive", 10*time.Second, func() bool { s, _ := gossipOf("regossip-a"); return s == "alive" })
	_, before := gossipOf("regossip-a")
	kill9(first)
	eventually.True(t, "the peer to see regossip-a dead", 10*time.Second, func() bool { s, _ := gossipOf("regossip-a"); return s == "dead" })
	second := startServe(t, append([]string{"--node-id", "regossip-a"}, common...)...)
	started := time.Now()
	var after string
	eventually.True(t, "the peer to see the restarted regossip-a alive at a new gossip address", 5*time.Second, func() bool {
		s, addr := gossipOf("regossip-a")
		after = addr
		return s == "alive" && addr != before && addr != ""
	})
	alive := time.Since(started) // logged: the wait above bounds it loosely, for loaded machines
	ac := dialPath(t, second.addr, api.PathData)
	keys := chainKeys(t, 31, 3)
	putChain(t, ac, keys)
	eventually.True(t, "the peer to fetch the restarted node's blocks", 10*time.Second, func() bool {
		res, err := pc.Fetch(context.Background(), "acme", "llama3-8b", keys, time.Second)
		if err != nil {
			return false
		}
		for _, r := range res {
			if r.Err != nil {
				return false
			}
		}
		return true
	})
	t.Logf("restarted regossip-a alive to its peer %v after its start, gossiping on %s (was %s); its blocks fetched %v after its start",
		alive.Round(time.Millisecond), after, before, time.Since(started).Round(time.Millisecond))
}
