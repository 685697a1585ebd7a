// Command restartbench measures what a daemon with --data-dir keeps when it
// restarts, and how long it takes to come back (issue 17):
//
//   - a daemon holding --blocks blocks of --block-size (default 4,096 of
//     2 MiB, 8 GiB) is stopped with SIGTERM and started again with the
//     same command line, then killed with SIGKILL and started again: the
//     blocks kept, the time from the start until it serves a block, and
//     the time until another node sees all of them in the cluster map;
//   - --kills times, the daemon is killed with SIGKILL in the middle of
//     puts and removals (so pages are reused under journaled blocks), at a
//     random moment, and started again: every block it then serves is
//     compared with the bytes that were put.
//
// Each daemon is its own process; the observer node runs the embedded etcd
// the daemon under test joins, so the map outlives the restarts.
//
//	go run ./test/restartbench --json
package main

import (
	"bufio"
	"bytes"
	"context"
	"encoding/binary"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"math/rand/v2"
	"os"
	"os/exec"
	"path/filepath"
	"syscall"
	"time"

	"github.com/kvpool/kvpool/api"
)

func main() {
	if err := run(); err != nil {
		fmt.Fprintln(os.Stderr, "restartbench:", err)
		os.Exit(1)
	}
}

type restart struct {
	How          string  `json:"how"`
	Blocks       int     `json:"blocks_before"`
	Kept         int     `json:"blocks_kept"`
	Wrong        int     `json:"blocks_wrong"`
	ServingS     float64 `json:"until_serving_s"`
	RepublishedS float64 `json:"until_republished_s"`
}

type killRound struct {
	Round       int `json:"round"`
	Acked       int `json:"puts_acked"`
	Held        int `json:"blocks_held_at_kill"`
	Served      int `json:"blocks_served"`
	Wrong       int `json:"blocks_wrong"`
	AckedLost   int `json:"acked_puts_lost"`
	KilledAfter int `json:"killed_after_ms"`
}

type report struct {
	BlockBytes int         `json:"block_bytes"`
	Restarts   []restart   `json:"restarts"`
	Kills      []killRound `json:"kill_rounds"`
	WrongTotal int         `json:"blocks_wrong_total"`
}

const tenant, namespace = "bench", "restart"

func run() error {
	blocks := flag.Int("blocks", 4096, "blocks the daemon holds before the restarts")
	blockSize := flag.Int("block-size", 2<<20, "block size in bytes")
	kills := flag.Int("kills", 20, "SIGKILL rounds in the middle of puts")
	flush := flag.Duration("journal-flush-interval", 100*time.Millisecond, "the daemon's --journal-flush-interval")
	kvpoolBin := flag.String("kvpool", "", "kvpool binary (default: build ./cmd/kvpool)")
	asJSON := flag.Bool("json", false, "print JSON")
	flag.Parse()

	dir, err := os.MkdirTemp("", "restartbench")
	if err != nil {
		return err
	}
	defer os.RemoveAll(dir)
	bin := *kvpoolBin
	if bin == "" {
		bin = filepath.Join(dir, "kvpool")
		if out, err := exec.Command("go", "build", "-o", bin, "github.com/kvpool/kvpool/cmd/kvpool").CombinedOutput(); err != nil {
			return fmt.Errorf("go build: %v\n%s", err, out)
		}
	}
	ctx := context.Background()
	observer, err := startDaemon(bin, "observer", "--capacity", "64MiB", "--embedded-etcd-listen", "127.0.0.1:0",
		"--etcd-data-dir", filepath.Join(dir, "etcd"), "--shm-socket", filepath.Join(dir, "observer.sock"))
	if err != nil {
		return err
	}
	defer observer.stop()
	segment := fmt.Sprintf("/dev/shm/kvpool-restartbench-%d", rand.Uint64())
	defer os.Remove(segment)
	capacity := (int64(*blocks)*int64(*blockSize)*21/20 + 256<<20) &^ (2<<20 - 1) // below the eviction watermark, whole pages
	args := []string{"--capacity", fmt.Sprint(capacity), "--data-dir", filepath.Join(dir, "data"), "--segment-path", segment,
		"--journal-flush-interval", flush.String(), "--etcd-endpoints", observer.etcd, "--shm-socket", filepath.Join(dir, "a.sock"),
		"--max-block-size", fmt.Sprint(*blockSize)}
	a, err := startDaemon(bin, "under-test", args...)
	if err != nil {
		return err
	}
	defer func() { a.stop() }()
	rep := report{BlockBytes: *blockSize}
	base := make([]byte, *blockSize)
	for i := range base {
		base[i] = byte(rand.Uint32())
	}
	held := map[int]bool{}
	fmt.Fprintf(os.Stderr, "putting %d blocks of %d bytes\n", *blocks, *blockSize)
	c, err := api.Dial(ctx, api.ClientConfig{Server: a.addr, Path: api.PathShm})
	if err != nil {
		return err
	}
	for i := range *blocks {
		if err := c.Put(ctx, keyOf(i), valueOf(base, i)); err != nil {
			return fmt.Errorf("put %d: %w", i, err)
		}
		held[i] = true
	}
	c.Close()

	for _, how := range []string{"SIGTERM", "SIGKILL"} {
		before := len(held)
		if how == "SIGTERM" {
			a.signal(syscall.SIGTERM)
		} else {
			time.Sleep(3 * *flush) // quiet: everything flushed
			a.signal(syscall.SIGKILL)
		}
		began := time.Now()
		if a, err = startDaemon(bin, "under-test", args...); err != nil {
			return err
		}
		serving, err := untilServing(ctx, a, keyOf(firstOf(held)), began)
		if err != nil {
			return err
		}
		republished, err := untilRepublished(ctx, observer, held, began)
		if err != nil {
			return err
		}
		kept, wrong, err := verify(ctx, a, base, held)
		if err != nil {
			return err
		}
		rep.Restarts = append(rep.Restarts, restart{How: how, Blocks: before, Kept: kept, Wrong: wrong, ServingS: serving.Seconds(), RepublishedS: republished.Seconds()})
		rep.WrongTotal += wrong
		fmt.Fprintf(os.Stderr, "%s: kept %d of %d, %d wrong, serving after %v, republished after %v\n", how, kept, before, wrong, serving.Round(time.Millisecond), republished.Round(time.Millisecond))
	}

	next := *blocks
	for round := range *kills {
		// Churn: remove the oldest blocks and put new ones in their pages,
		// killed at a random moment.
		c, err := api.Dial(ctx, api.ClientConfig{Server: a.addr, Path: api.PathShm})
		if err != nil {
			return err
		}
		killAt := time.Duration(200+rand.IntN(800)) * time.Millisecond
		timer := time.AfterFunc(killAt, func() { a.signal(syscall.SIGKILL) })
		acked := map[int]bool{}
		oldest := 0
		for {
			if len(held) >= *blocks {
				for !held[oldest] {
					oldest++
				}
				if c.Remove(ctx, keyOf(oldest)) != nil {
					break
				}
				delete(held, oldest)
			}
			if c.Put(ctx, keyOf(next), valueOf(base, next)) != nil {
				break
			}
			held[next], acked[next] = true, true
			next++
		}
		if timer.Stop() {
			a.signal(syscall.SIGKILL) // the loop ended on its own: an error
			return fmt.Errorf("round %d: the puts failed before the kill", round+1)
		}
		c.Close()
		a.wait()
		// What was put before the kill may or may not have reached the
		// journal: count the candidates, verify what is served.
		if a, err = startDaemon(bin, "under-test", args...); err != nil {
			return err
		}
		candidates := map[int]bool{}
		for i := range next + 1 {
			candidates[i] = true
		}
		served, wrong, err := verify(ctx, a, base, candidates)
		if err != nil {
			return err
		}
		present, err := existing(ctx, a, next+1)
		if err != nil {
			return err
		}
		// Acked puts still held at the kill that the restart lost: those
		// after the last journal flush, and those whose journaled pages
		// the churn reused before the removal's record was flushed.
		lost := 0
		for i := range held {
			if acked[i] && !present[i] {
				lost++
			}
		}
		heldAtKill := len(held)
		held = present
		next++
		rep.Kills = append(rep.Kills, killRound{Round: round + 1, Acked: len(acked), Held: heldAtKill, Served: served, Wrong: wrong, AckedLost: lost, KilledAfter: int(killAt.Milliseconds())})
		rep.WrongTotal += wrong
		fmt.Fprintf(os.Stderr, "kill %d after %v: %d puts acked, %d blocks held, %d served after the restart, %d wrong, %d held not kept\n",
			round+1, killAt, len(acked), heldAtKill, served, wrong, lost)
	}
	if *asJSON {
		enc := json.NewEncoder(os.Stdout)
		enc.SetIndent("", "  ")
		return enc.Encode(rep)
	}
	for _, r := range rep.Restarts {
		fmt.Printf("%-8s kept %d/%d wrong %d serving %.2fs republished %.2fs\n", r.How, r.Kept, r.Blocks, r.Wrong, r.ServingS, r.RepublishedS)
	}
	fmt.Printf("kill -9 in the middle of puts, %d rounds: %d wrong blocks\n", len(rep.Kills), rep.WrongTotal)
	if rep.WrongTotal > 0 {
		return errors.New("a block's bytes differ from what was put")
	}
	return nil
}

func firstOf(m map[int]bool) int {
	for i := range m {
		return i
	}
	return 0
}

func keyOf(i int) api.BlockKey {
	return api.BlockKey{Tenant: tenant, Namespace: namespace, Key: fmt.Appendf(nil, "block-%06d", i)}
}

// valueOf is block i's bytes: base with i stamped into every 4 KiB, so
// every block and every page of it differs.
func valueOf(base []byte, i int) []byte {
	v := bytes.Clone(base)
	for off := 0; off+8 <= len(v); off += 4096 {
		binary.LittleEndian.PutUint64(v[off:], uint64(i)<<20|uint64(off>>12))
	}
	return v
}

// existing is which of blocks 0..n-1 the daemon holds.
func existing(ctx context.Context, d *daemon, n int) (map[int]bool, error) {
	c, err := d.client(ctx)
	if err != nil {
		return nil, err
	}
	keys := make([][]byte, n)
	for i := range keys {
		keys[i] = keyOf(i).Key
	}
	ok, err := c.Exists(ctx, tenant, namespace, keys)
	if err != nil {
		return nil, err
	}
	out := map[int]bool{}
	for i, o := range ok {
		if o {
			out[i] = true
		}
	}
	return out, nil
}

// verify reads every block of want the daemon serves and compares it
// with what was put.
func verify(ctx context.Context, d *daemon, base []byte, want map[int]bool) (served, wrong int, err error) {
	c, err := d.client(ctx)
	if err != nil {
		return 0, 0, err
	}
	buf := make([]byte, len(base))
	for i := range want {
		n, err := c.Get(ctx, keyOf(i), buf)
		switch {
		case errors.Is(err, api.ErrNotFound):
		case err != nil:
			return served, wrong, fmt.Errorf("get %d: %w", i, err)
		case !bytes.Equal(buf[:n], valueOf(base, i)):
			wrong++
			served++
		default:
			served++
		}
	}
	return served, wrong, nil
}

// untilServing polls the restarted daemon until it serves key.
func untilServing(ctx context.Context, d *daemon, key api.BlockKey, began time.Time) (time.Duration, error) {
	buf := make([]byte, 64<<20)
	for time.Since(began) < 5*time.Minute {
		if c, err := d.client(ctx); err == nil {
			if _, err := c.Get(ctx, key, buf); err == nil {
				return time.Since(began), nil
			}
		}
		time.Sleep(5 * time.Millisecond)
	}
	return 0, errors.New("the restarted daemon did not serve within 5 minutes")
}

// untilRepublished polls the observer until the cluster map says the
// daemon holds every block of held.
func untilRepublished(ctx context.Context, observer *daemon, held map[int]bool, began time.Time) (time.Duration, error) {
	c, err := observer.client(ctx)
	if err != nil {
		return 0, err
	}
	var keys [][]byte
	for i := range held {
		keys = append(keys, keyOf(i).Key)
	}
	for time.Since(began) < 5*time.Minute {
		routes, err := c.Route(ctx, tenant, namespace, keys)
		if err == nil {
			all := true
			for _, hs := range routes {
				found := false
				for _, h := range hs {
					found = found || h.NodeID == "under-test"
				}
				all = all && found
			}
			if all {
				return time.Since(began), nil
			}
		}
		time.Sleep(10 * time.Millisecond)
	}
	return 0, errors.New("the observer did not see the blocks within 5 minutes")
}

type daemon struct {
	cmd        *exec.Cmd
	addr       string
	etcd       string
	done       chan error
	cli        *api.Client
	terminated bool
}

func startDaemon(bin, id string, args ...string) (*daemon, error) {
	all := append([]string{"node", "serve", "--node-id", id, "--listen", "127.0.0.1:0", "--metrics-listen", "", "--log-format", "json"}, args...)
	d := &daemon{cmd: exec.Command(bin, all...), done: make(chan error, 1)}
	stderr, err := d.cmd.StderrPipe()
	if err != nil {
		return nil, err
	}
	if err := d.cmd.Start(); err != nil {
		return nil, err
	}
	sc := bufio.NewScanner(stderr)
	sc.Buffer(make([]byte, 1<<20), 1<<20)
	for sc.Scan() {
		var rec map[string]any
		if json.Unmarshal(sc.Bytes(), &rec) != nil {
			fmt.Fprintf(os.Stderr, "%s: %s\n", id, sc.Text())
			continue
		}
		if rec["level"] == "ERROR" || rec["level"] == "WARN" {
			fmt.Fprintf(os.Stderr, "%s: %s\n", id, sc.Text())
		}
		if rec["msg"] == "embedded etcd serving" {
			d.etcd, _ = rec["client_url"].(string)
		}
		if rec["msg"] == "arena opened" {
			fmt.Fprintf(os.Stderr, "%s: %s\n", id, sc.Text())
		}
		if rec["msg"] == "kvpool node starting" {
			d.addr, _ = rec["listen"].(string)
			go io.Copy(io.Discard, stderr)
			go func() { d.done <- d.cmd.Wait() }()
			return d, nil
		}
	}
	d.cmd.Process.Kill()
	d.cmd.Wait()
	return nil, fmt.Errorf("%s: kvpool serve exited before it was ready", id)
}

func (d *daemon) client(ctx context.Context) (*api.Client, error) {
	if d.cli != nil {
		return d.cli, nil
	}
	c, err := api.Dial(ctx, api.ClientConfig{Server: d.addr, Path: api.PathData})
	if err != nil {
		return nil, err
	}
	d.cli = c
	return c, nil
}

// signal sends sig and waits for the exit.
func (d *daemon) signal(sig syscall.Signal) {
	if d.terminated {
		return
	}
	d.cmd.Process.Signal(sig)
	d.wait()
}

func (d *daemon) wait() {
	if d.terminated {
		return
	}
	<-d.done
	d.terminated = true
	if d.cli != nil {
		d.cli.Close()
		d.cli = nil
	}
}

func (d *daemon) stop() { d.signal(syscall.SIGTERM) }
