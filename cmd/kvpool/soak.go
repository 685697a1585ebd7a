package main

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"text/tabwriter"
	"time"

	"github.com/kvpool/kvpool/pool/bench"
)

// soakOptions are bench's flags for --soak.
type soakOptions struct {
	duration time.Duration
	metrics  string
	pid      int
	keys     int
	maxValue int64
}

// runSoak runs bench --soak: against --server (with --metrics and, for
// memory and descriptors from /proc, --pid), or against a daemon it
// starts as a child process of this binary and stops at the end.
func runSoak(ctx context.Context, e *env, server string, capacity int64, o soakOptions, asJSON bool) error {
	cfg := bench.SoakConfig{Server: server, Metrics: o.metrics, PID: o.pid, Duration: o.duration, Keys: o.keys, MaxValueBytes: int(o.maxValue)}
	if server == "" {
		d, err := startSoakDaemon(ctx, capacity, e.stderr)
		if err != nil {
			return err
		}
		defer d.stop()
		cfg.Server, cfg.Metrics, cfg.PID = d.addr, d.metrics, d.cmd.Process.Pid
		fmt.Fprintf(e.stderr, "soak: daemon pid %d on %s, metrics %s, arena %s\n", cfg.PID, d.addr, d.metrics, formatSize(capacity))
	} else if o.metrics == "" {
		return usagef("--soak with --server needs --metrics, the node's metrics address")
	}
	cfg.Progress = e.stderr
	res, err := bench.Soak(ctx, cfg)
	if err != nil {
		return err
	}
	if asJSON {
		if err := printJSON(e.stdout, res); err != nil {
			return err
		}
	} else {
		printSoak(e.stdout, res)
	}
	if len(res.Failures) > 0 {
		return fmt.Errorf("soak failed: %s", strings.Join(res.Failures, "; "))
	}
	return nil
}

func printSoak(w io.Writer, res *bench.SoakResult) {
	fmt.Fprintf(w, "soak of %s for %s\n\n", res.Server, time.Duration(res.DurationS*float64(time.Second)).Round(time.Second))
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', tabwriter.AlignRight)
	fmt.Fprintln(tw, "phase\tat\tops\tRSS\tarena (shmem)\tprivate (anon)\theap in use\tgoroutines\tfds\t")
	row := func(s bench.SoakSample) {
		fmt.Fprintf(tw, "%s\t%.0fs\t%d\t%s\t%s\t%s\t%s\t%d\t%d\t\n", s.Phase, s.AtS, s.Ops, mibOrNA(s.RSSBytes), mibOrNA(s.ShmemBytes),
			mibOrNA(s.AnonBytes), mibOrNA(s.HeapBytes), s.Goroutines, s.FDs)
	}
	for _, s := range res.Samples {
		row(s)
	}
	row(res.Warm)
	row(res.End)
	tw.Flush()
	fmt.Fprintln(w)
	tw = tabwriter.NewWriter(w, 0, 0, 2, ' ', tabwriter.AlignRight)
	fmt.Fprintln(tw, "path\tputs\treserved\tgets\tviews\tremoves\tchecked\tevicted\trefused\treconnects\t")
	for _, p := range []string{"shm", "data", "grpc"} {
		st, ok := res.Paths[p]
		if !ok {
			continue
		}
		fmt.Fprintf(tw, "%s\t%d\t%d\t%d\t%d\t%d\t%s\t%d\t%d\t%d\t\n", p, st.Puts, st.Reserved, st.Gets, st.Views, st.Removes,
			mibOrNA(int64(st.CheckedB)), st.Evicted, st.Refused, st.Reconnects)
	}
	tw.Flush()
	b := bench.DefaultSoakBounds
	fmt.Fprintf(w, "\nbounds (warm = median of the load's second quarter, end = median of its last): RSS ×%.2f + %s, private ×%.2f + %s, heap ×%.2f + %s, goroutines +%d, fds +%d (also idle after against idle before)\n",
		b.RSSRatio, formatSize(int64(b.RSSSlackBytes)), b.AnonRatio, formatSize(int64(b.AnonSlackBytes)), b.HeapRatio, formatSize(int64(b.HeapSlackBytes)), b.GoroutineSlack, b.FDSlack)
	if len(res.Failures) == 0 {
		fmt.Fprintln(w, "PASS: every byte read back matched; nothing grew past its bound")
		return
	}
	for _, f := range res.Failures {
		fmt.Fprintln(w, "FAIL:", f)
	}
}

func mibOrNA(b int64) string {
	if b < 0 {
		return "n/a"
	}
	return fmt.Sprintf("%.1f MiB", float64(b)/(1<<20))
}

// soakDaemon is the `kvpool node serve` child a soak runs against.
type soakDaemon struct {
	cmd           *exec.Cmd
	dir           string
	addr, metrics string
	done          chan error
}

func startSoakDaemon(ctx context.Context, capacity int64, logs io.Writer) (*soakDaemon, error) {
	self, err := os.Executable()
	if err != nil {
		return nil, err
	}
	dir, err := os.MkdirTemp("", "kvpool-soak-")
	if err != nil {
		return nil, err
	}
	d := &soakDaemon{dir: dir, done: make(chan error, 1)}
	d.cmd = exec.Command(self, "node", "serve", "--standalone", "--node-id", fmt.Sprintf("soak-%d", os.Getpid()),
		"--capacity", fmt.Sprint(capacity), "--listen", "127.0.0.1:0", "--metrics-listen", "127.0.0.1:0",
		"--shm-socket", filepath.Join(dir, "shm.sock"), "--log-format", "json")
	stderr, err := d.cmd.StderrPipe()
	if err != nil {
		os.RemoveAll(dir)
		return nil, err
	}
	if err := d.cmd.Start(); err != nil {
		os.RemoveAll(dir)
		return nil, fmt.Errorf("soak: start the daemon: %w", err)
	}
	go func() { d.done <- d.cmd.Wait() }()
	ready := make(chan error, 1)
	go func() {
		lines := bufio.NewScanner(stderr)
		found := false
		for lines.Scan() {
			var rec map[string]any
			if json.Unmarshal(lines.Bytes(), &rec) == nil && rec["msg"] == "kvpool node starting" && !found {
				d.addr, _ = rec["listen"].(string)
				d.metrics, _ = rec["metrics"].(string)
				found = true
				ready <- nil
				continue
			}
			if lvl, _ := rec["level"].(string); lvl == "WARN" || lvl == "ERROR" {
				fmt.Fprintf(logs, "daemon: %s\n", lines.Text())
			}
		}
		if !found {
			ready <- errors.New("soak: the daemon exited before it was ready")
		}
	}()
	select {
	case err = <-ready:
	case <-time.After(30 * time.Second):
		err = errors.New("soak: the daemon did not start within 30 s")
	case <-ctx.Done():
		err = ctx.Err()
	}
	if err != nil {
		d.stop()
		return nil, err
	}
	return d, nil
}

// stop ends the daemon with SIGTERM (SIGKILL after 10 s) and removes its
// directory.
func (d *soakDaemon) stop() {
	d.cmd.Process.Signal(syscall.SIGTERM)
	select {
	case <-d.done:
	case <-time.After(10 * time.Second):
		d.cmd.Process.Kill()
		<-d.done
	}
	os.RemoveAll(d.dir)
}
