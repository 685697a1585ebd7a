// Package rolling runs a cluster of kvpool daemons as separate processes,
// each with --drain-on-stop, and measures what operators do to it (issue
// 18):
//
//   - a drain: one node holds DrainBytes, `kvpool cluster drain` empties
//     it, and every block it held is looked for on the others;
//   - a rolling restart under load: while workers put (some with a
//     replica, some then leased) and read blocks anywhere, each daemon in
//     turn gets SIGTERM, drains, exits and is started again on the same
//     port; afterwards every block a put acknowledged is looked for.
//
// A worker whose call fails with Unavailable (a draining node, a stopped
// one) tries the next node: that is a retry, not an error. The etcd is
// Debian's, a process of its own, so the map outlives every daemon. Only
// test/ imports this package (test/rollingbench, TestRollingRestart).
package rolling

import (
	"bufio"
	"context"
	"encoding/binary"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"math/rand/v2"
	"net"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/kvpool/kvpool/api"
	"github.com/kvpool/kvpool/api/admin"
)

// Config sizes a run. Zero fields take the defaults noted.
type Config struct {
	// Kvpool and Etcd are the binaries. Required.
	Kvpool, Etcd string
	// Dir holds the daemons' sockets and etcd's data. Required.
	Dir string
	// Nodes is how many daemons. Default 3.
	Nodes int
	// CapacityBytes is each daemon's arena. Default 4 GiB.
	CapacityBytes int64
	// DrainBytes is what the drained node holds, in DrainBlockBytes
	// blocks. Default 1 GiB of 2 MiB; 0 blocks skip the drain.
	DrainBytes, DrainBlockBytes int64
	// LoadBlockBytes is the size of the workers' blocks; Workers how many
	// put and read at once; Preload how many blocks they put before the
	// first restart. Defaults 256 KiB, 4, 256.
	LoadBlockBytes int64
	Workers        int
	Preload        int
	// Settle is how long the load runs between two restarts. Default 2 s.
	Settle time.Duration
	// DrainBudget is each daemon's --drain-budget. Default 60 s.
	DrainBudget time.Duration
	// Log receives progress lines, one Write at a time. Default: discard.
	Log io.Writer
}

func (c *Config) fill() {
	if c.Nodes == 0 {
		c.Nodes = 3
	}
	if c.CapacityBytes == 0 {
		c.CapacityBytes = 4 << 30
	}
	if c.DrainBlockBytes == 0 {
		c.DrainBlockBytes = 2 << 20
	}
	if c.LoadBlockBytes == 0 {
		c.LoadBlockBytes = 256 << 10
	}
	if c.Workers == 0 {
		c.Workers = 4
	}
	if c.Preload == 0 {
		c.Preload = 256
	}
	if c.Settle == 0 {
		c.Settle = 2 * time.Second
	}
	if c.DrainBudget == 0 {
		c.DrainBudget = time.Minute
	}
	if c.Log == nil {
		c.Log = io.Discard
	}
	c.Log = &lockedWriter{w: c.Log} // the daemons' log readers and the run write at once
}

type lockedWriter struct {
	mu sync.Mutex
	w  io.Writer
}

func (l *lockedWriter) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.w.Write(p)
}

// Report is what a run measured.
type Report struct {
	Drain   *DrainResult    `json:"drain,omitempty"`
	Rolling RollingResult   `json:"rolling_restart"`
	Nodes   []RestartResult `json:"restarts"`
}

// DrainResult is the drain of one node holding DrainBytes.
type DrainResult struct {
	Node   string            `json:"node"`
	Report admin.DrainReport `json:"report"`
	Took   float64           `json:"took_s"` // the admin call, as the operator waits for it
	Where  map[string]int    `json:"blocks_now_on"`
	Lost   int               `json:"blocks_on_no_node"`
	Leased int               `json:"blocks_leased_before"`
}

// RestartResult is one daemon's turn in the rolling restart.
type RestartResult struct {
	Node string `json:"node"`
	// StopS is from SIGTERM to the process's exit (the drain and the
	// shutdown), ServingS from the new process's start until it serves.
	StopS    float64 `json:"sigterm_to_exit_s"`
	ServingS float64 `json:"start_to_serving_s"`
	// RejoinedS is from the start until another node sees it registered
	// and alive in gossip.
	RejoinedS float64 `json:"start_to_rejoined_s"`
	// The drain's own report, from the daemon's log.
	HandedOff  int `json:"handed_off_blocks"`
	Replicated int `json:"replicated_blocks"`
	Kept       int `json:"kept_blocks"`
	// Errors are why the drain did not hand blocks off.
	Errors []any `json:"drain_errors,omitempty"`
}

// RollingResult is the load's view of the rolling restart.
type RollingResult struct {
	Puts       int64 `json:"puts_acked"`
	Replicated int64 `json:"puts_with_a_replica"`
	Leased     int64 `json:"puts_then_leased"`
	Gets       int64 `json:"gets_ok"`
	// Retries are calls that failed on one node and were sent to the
	// next; Errors calls that failed on every node.
	Retries int64    `json:"retries"`
	Errors  int64    `json:"errors"`
	Samples []string `json:"error_samples,omitempty"`
	// Lost are acknowledged blocks no node holds at the end, by kind.
	LostLeased     int     `json:"lost_leased"`
	LostReplicated int     `json:"lost_replicated"`
	LostOther      int     `json:"lost_other"`
	Took           float64 `json:"took_s"`
}

// daemon is one kvpool node serve process.
type daemon struct {
	id, addr string
	args     []string
	cmd      *exec.Cmd
	done     chan struct{}
	mu       sync.Mutex
	drained  map[string]any // the "drained" log record
}

// Run runs the drain, then the rolling restart, and reports.
func Run(ctx context.Context, cfg Config) (*Report, error) {
	cfg.fill()
	etcdURL, stopEtcd, err := startEtcd(cfg)
	if err != nil {
		return nil, err
	}
	defer stopEtcd()
	nodes := make([]*daemon, cfg.Nodes)
	for i := range nodes {
		port, err := freePort()
		if err != nil {
			return nil, err
		}
		d := &daemon{id: fmt.Sprintf("roll-%d", i), addr: fmt.Sprintf("127.0.0.1:%d", port)}
		d.args = []string{"node", "serve", "--node-id", d.id, "--listen", d.addr, "--metrics-listen", "", "--log-format", "json",
			"--etcd-endpoints", etcdURL, "--shm-socket", filepath.Join(cfg.Dir, d.id+".sock"), "--capacity", strconv.FormatInt(cfg.CapacityBytes, 10),
			"--max-block-size", strconv.FormatInt(max(cfg.DrainBlockBytes, cfg.LoadBlockBytes), 10),
			"--drain-on-stop", "--drain-budget", cfg.DrainBudget.String(), "--lease-ttl", "2s", "--lease-max", "10m"}
		if err := d.start(cfg); err != nil {
			return nil, err
		}
		// At the end the cluster goes at once: a drain would only wait
		// out the leases with nowhere to hand blocks.
		defer d.kill()
		nodes[i] = d
	}
	c := &load{cfg: cfg, nodes: nodes, clients: map[[2]int]*api.Client{}}
	defer c.closeClients()
	if err := c.waitNodes(ctx, len(nodes)); err != nil {
		return nil, err
	}
	rep := &Report{}
	if cfg.DrainBytes > 0 {
		if rep.Drain, err = c.drainOne(ctx); err != nil {
			return nil, err
		}
	}
	if err := c.rolling(ctx, rep); err != nil {
		return nil, err
	}
	return rep, nil
}

func freePort() (int, error) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return 0, err
	}
	defer ln.Close()
	return ln.Addr().(*net.TCPAddr).Port, nil
}

func startEtcd(cfg Config) (string, func(), error) {
	client, err := freePort()
	if err != nil {
		return "", nil, err
	}
	peer, err := freePort()
	if err != nil {
		return "", nil, err
	}
	url, purl := fmt.Sprintf("http://127.0.0.1:%d", client), fmt.Sprintf("http://127.0.0.1:%d", peer)
	cmd := exec.Command(cfg.Etcd, "--name", "roll", "--data-dir", filepath.Join(cfg.Dir, "etcd"), "--listen-client-urls", url,
		"--advertise-client-urls", url, "--listen-peer-urls", purl, "--initial-advertise-peer-urls", purl,
		"--initial-cluster", "roll="+purl, "--log-level", "error")
	if err := cmd.Start(); err != nil {
		return "", nil, err
	}
	stop := func() { cmd.Process.Kill(); cmd.Wait() }
	deadline := time.Now().Add(30 * time.Second)
	for {
		if c, err := net.DialTimeout("tcp", fmt.Sprintf("127.0.0.1:%d", client), time.Second); err == nil {
			c.Close()
			return url, stop, nil
		}
		if time.Now().After(deadline) {
			stop()
			return "", nil, errors.New("etcd did not listen within 30 s")
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// start runs the daemon and waits until it serves.
func (d *daemon) start(cfg Config) error {
	d.cmd = exec.Command(cfg.Kvpool, d.args...)
	stderr, err := d.cmd.StderrPipe()
	if err != nil {
		return err
	}
	if err := d.cmd.Start(); err != nil {
		return err
	}
	d.done = make(chan struct{})
	ready := make(chan struct{})
	go func() {
		sc := bufio.NewScanner(stderr)
		sc.Buffer(make([]byte, 1<<20), 1<<20)
		serving := false
		for sc.Scan() {
			var rec map[string]any
			if json.Unmarshal(sc.Bytes(), &rec) != nil {
				fmt.Fprintf(cfg.Log, "%s: %s\n", d.id, sc.Text())
				continue
			}
			switch {
			case rec["msg"] == "serving" && !serving:
				serving = true
				close(ready)
			case rec["msg"] == "drained":
				d.mu.Lock()
				d.drained = rec
				d.mu.Unlock()
				fmt.Fprintf(cfg.Log, "%s: %s\n", d.id, sc.Text())
			case rec["level"] == "ERROR" || rec["level"] == "WARN":
				fmt.Fprintf(cfg.Log, "%s: %s\n", d.id, sc.Text())
			}
		}
		d.cmd.Wait()
		if !serving {
			close(ready)
		}
		close(d.done)
	}()
	select {
	case <-ready:
	case <-time.After(60 * time.Second):
		d.cmd.Process.Kill()
		<-d.done
		return fmt.Errorf("%s did not serve within 60 s", d.id)
	}
	select {
	case <-d.done:
		return fmt.Errorf("%s exited before it served", d.id)
	default:
		return nil
	}
}

// stop sends SIGTERM and waits for the exit.
func (d *daemon) stop() {
	if d.cmd == nil || d.cmd.Process == nil {
		return
	}
	select {
	case <-d.done:
		return
	default:
	}
	d.cmd.Process.Signal(syscall.SIGTERM)
	<-d.done
}

// kill ends the daemon with SIGKILL, if it runs.
func (d *daemon) kill() {
	if d.cmd == nil || d.cmd.Process == nil {
		return
	}
	d.cmd.Process.Kill()
	<-d.done
}

func (d *daemon) drainErrors() []any {
	d.mu.Lock()
	defer d.mu.Unlock()
	errs, _ := d.drained["errors"].([]any)
	return errs
}

func (d *daemon) drainedField(name string) int {
	d.mu.Lock()
	defer d.mu.Unlock()
	v, _ := d.drained[name].(float64)
	return int(v)
}

// load is the cluster as its clients see it.
type load struct {
	cfg   Config
	nodes []*daemon

	mu sync.Mutex
	// clients are by (user, node): each worker has its own, so one
	// closing a client after a failure never cuts another's call. User
	// -1 is the run itself.
	clients map[[2]int]*api.Client
}

func (c *load) client(ctx context.Context, user, i int) (*api.Client, error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if cl := c.clients[[2]int{user, i}]; cl != nil {
		return cl, nil
	}
	cl, err := api.Dial(ctx, api.ClientConfig{Server: c.nodes[i].addr, Path: api.PathData})
	if err != nil {
		return nil, err
	}
	c.clients[[2]int{user, i}] = cl
	return cl, nil
}

// forget closes user's client of node i after a failure: the next call
// dials anew (the node may be a new process on the same port).
func (c *load) forget(user, i int) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if cl := c.clients[[2]int{user, i}]; cl != nil {
		cl.Close()
		delete(c.clients, [2]int{user, i})
	}
}

func (c *load) closeClients() {
	c.mu.Lock()
	defer c.mu.Unlock()
	for k, cl := range c.clients {
		cl.Close()
		delete(c.clients, k)
	}
}

// onAny runs call on node first, then on each other node in turn while
// the call fails with Unavailable (or cannot reach the node), or with one
// of the errors in also. It returns the node that answered, and how many
// retries that took.
func (c *load) onAny(ctx context.Context, user, first int, call func(*api.Client) error, also ...error) (int, int, error) {
	var err error
	for k := range len(c.nodes) * 3 {
		i := (first + k) % len(c.nodes)
		var cl *api.Client
		if cl, err = c.client(ctx, user, i); err == nil {
			if err = call(cl); err == nil {
				return i, k, nil
			}
		}
		if !errors.Is(err, api.ErrUnavailable) && !slices.ContainsFunc(also, func(e error) bool { return errors.Is(err, e) }) {
			return i, k, err
		}
		if cl != nil {
			c.forget(user, i)
		}
		if k%len(c.nodes) == len(c.nodes)-1 {
			time.Sleep(100 * time.Millisecond) // every node refused: one is restarting
		}
	}
	return first, len(c.nodes)*3 - 1, err
}

// waitNodes waits until node 0 sees want live nodes.
func (c *load) waitNodes(ctx context.Context, want int) error {
	deadline := time.Now().Add(60 * time.Second)
	for time.Now().Before(deadline) {
		_, _, err := c.onAny(ctx, -1, 0, func(cl *api.Client) error {
			ns, err := admin.New(cl).Nodes(ctx)
			if err != nil {
				return err
			}
			live := 0
			for _, n := range ns.Nodes {
				if n.EtcdState == "registered" && n.GossipState == "alive" {
					live++
				}
			}
			if live != want {
				return fmt.Errorf("%w: %d of %d nodes live", api.ErrUnavailable, live, want)
			}
			return nil
		})
		if err == nil {
			return nil
		}
		time.Sleep(50 * time.Millisecond)
	}
	return fmt.Errorf("rolling: fewer than %d nodes live after 60 s", want)
}

const tenant, namespace = "rolling", "blocks"

func keyOf(prefix string, i int) api.BlockKey {
	return api.BlockKey{Tenant: tenant, Namespace: namespace, Key: fmt.Appendf(nil, "%s-%d", prefix, i)}
}

// valueOf is block i's bytes: a seeded pattern, so any copy can be checked.
func valueOf(prefix string, i int, size int64) []byte {
	v := make([]byte, size)
	r := rand.New(rand.NewPCG(uint64(i), uint64(len(prefix))))
	for off := 0; off+8 <= len(v); off += 8 {
		binary.LittleEndian.PutUint64(v[off:], r.Uint64())
	}
	return v
}

// whereAre reports, for each key, the nodes that hold it (asking each
// node that answers).
func (c *load) whereAre(ctx context.Context, keys [][]byte) ([][]string, error) {
	out := make([][]string, len(keys))
	for i, d := range c.nodes {
		cl, err := c.client(ctx, -1, i)
		if err != nil {
			return nil, err
		}
		for off := 0; off < len(keys); off += 1024 {
			part := keys[off:min(off+1024, len(keys))]
			have, err := cl.Exists(ctx, tenant, namespace, part)
			if err != nil {
				return nil, fmt.Errorf("exists on %s: %w", d.id, err)
			}
			for k, ok := range have {
				if ok {
					out[off+k] = append(out[off+k], d.id)
				}
			}
		}
	}
	return out, nil
}

// drainOne fills node 0 with DrainBytes (a tenth leased), drains it with
// the admin call, and looks for every block, then starts it again.
func (c *load) drainOne(ctx context.Context) (*DrainResult, error) {
	n := int(c.cfg.DrainBytes / c.cfg.DrainBlockBytes)
	fmt.Fprintf(c.cfg.Log, "putting %d blocks of %d bytes on %s\n", n, c.cfg.DrainBlockBytes, c.nodes[0].id)
	cl, err := c.client(ctx, -1, 0)
	if err != nil {
		return nil, err
	}
	keys := make([][]byte, n)
	res := &DrainResult{Node: c.nodes[0].id, Where: map[string]int{}}
	for i := range n {
		k := keyOf("drain", i)
		if err := cl.Put(ctx, k, valueOf("drain", i, c.cfg.DrainBlockBytes)); err != nil {
			return nil, err
		}
		keys[i] = k.Key
		if i%10 == 0 {
			if _, _, err := cl.LocateLease(ctx, tenant, namespace, [][]byte{k.Key}, 5*time.Minute); err != nil {
				return nil, err
			}
			res.Leased++
		}
	}
	// The peers must see node 0's blocks before they can pull them.
	if err := c.untilPublished(ctx, 1, keys); err != nil {
		return nil, err
	}
	fmt.Fprintf(c.cfg.Log, "draining %s\n", c.nodes[0].id)
	asker, err := c.client(ctx, -1, 1)
	if err != nil {
		return nil, err
	}
	start := time.Now()
	// As an operator would: ask any daemon where the node is, then it.
	ns, err := admin.New(asker).Nodes(ctx)
	if err != nil {
		return nil, err
	}
	var addr string
	for _, nd := range ns.Nodes {
		if nd.ID == c.nodes[0].id {
			addr = nd.Addrs["grpc"]
		}
	}
	target, err := api.Dial(ctx, api.ClientConfig{Server: addr, Path: api.PathGRPC})
	if err != nil {
		return nil, err
	}
	res.Report, err = admin.New(target).Drain(ctx, c.nodes[0].id, 0)
	target.Close()
	if err != nil {
		return nil, err
	}
	res.Took = time.Since(start).Seconds()
	<-c.nodes[0].done
	c.forget(-1, 0)
	if err := c.nodes[0].start(c.cfg); err != nil {
		return nil, err
	}
	if err := c.waitNodes(ctx, len(c.nodes)); err != nil {
		return nil, err
	}
	where, err := c.whereAre(ctx, keys)
	if err != nil {
		return nil, err
	}
	for i, w := range where {
		if len(w) == 0 {
			res.Lost++
			continue
		}
		for _, id := range w {
			res.Where[id]++
		}
		// The copy a peer holds is the block that was put.
		if i%97 == 0 {
			if err := c.check(ctx, w[0], "drain", i, c.cfg.DrainBlockBytes); err != nil {
				return nil, err
			}
		}
	}
	// Free the room for the rolling restart.
	for i := range c.nodes {
		if cl, err := c.client(ctx, -1, i); err == nil {
			cl.RemoveMany(ctx, tenant, namespace, keys)
		}
	}
	return res, nil
}

// untilPublished waits until node i's map lists a holder for every key.
func (c *load) untilPublished(ctx context.Context, i int, keys [][]byte) error {
	cl, err := c.client(ctx, -1, i)
	if err != nil {
		return err
	}
	a := admin.New(cl)
	deadline := time.Now().Add(60 * time.Second)
	for time.Now().Before(deadline) {
		ok := true
		for off := 0; off < len(keys) && ok; off += 256 {
			loc, err := a.Locate(ctx, tenant, namespace, keys[off:min(off+256, len(keys))])
			if err != nil {
				return err
			}
			ok = loc.PoolPrefixBlocks == min(256, len(keys)-off)
		}
		if ok {
			return nil
		}
		time.Sleep(50 * time.Millisecond)
	}
	return errors.New("rolling: the blocks never showed in the cluster map")
}

// check reads block i from node id and compares it with what was put.
func (c *load) check(ctx context.Context, id, prefix string, i int, size int64) error {
	idx := slices.IndexFunc(c.nodes, func(d *daemon) bool { return d.id == id })
	cl, err := c.client(ctx, -1, idx)
	if err != nil {
		return err
	}
	buf := make([]byte, size)
	if _, err := cl.Get(ctx, keyOf(prefix, i), buf); err != nil {
		return fmt.Errorf("read %s-%d from %s: %w", prefix, i, id, err)
	}
	if want := valueOf(prefix, i, size); string(buf) != string(want) {
		return fmt.Errorf("%s-%d on %s differs from what was put", prefix, i, id)
	}
	return nil
}

// acked is a block whose put was acknowledged.
type acked struct {
	i                  int
	replicated, leased bool
}

// rolling restarts every node in turn under load.
func (c *load) rolling(ctx context.Context, rep *Report) error {
	var (
		mu      sync.Mutex
		blocks  []acked
		next    atomic.Int64
		r       RollingResult
		retries atomic.Int64
		errs    atomic.Int64
		gets    atomic.Int64
	)
	sample := func(err error) {
		mu.Lock()
		if len(r.Samples) < 8 {
			r.Samples = append(r.Samples, err.Error())
		}
		mu.Unlock()
	}
	size := c.cfg.LoadBlockBytes
	worker := func(w int, stop <-chan struct{}) {
		rng := rand.New(rand.NewPCG(uint64(w), 99))
		buf := make([]byte, size)
		for {
			select {
			case <-stop:
				return
			default:
			}
			mu.Lock()
			have := len(blocks)
			mu.Unlock()
			node := rng.IntN(len(c.nodes))
			if have == 0 || rng.IntN(2) == 0 {
				i := int(next.Add(1))
				k, v := keyOf("load", i), valueOf("load", i, size)
				a := acked{i: i, replicated: rng.IntN(4) == 0, leased: rng.IntN(4) == 0}
				_, tries, err := c.onAny(ctx, w, node, func(cl *api.Client) error {
					if a.replicated {
						if err := cl.PutReplicas(ctx, k, v, 2); err != nil {
							return err
						}
					} else if err := cl.Put(ctx, k, v); err != nil {
						return err
					}
					if a.leased {
						_, _, err := cl.LocateLease(ctx, tenant, namespace, [][]byte{k.Key}, 5*time.Minute)
						return err
					}
					return nil
				})
				retries.Add(int64(tries))
				if err != nil {
					errs.Add(1)
					sample(fmt.Errorf("put %s: %w", k.Key, err))
					continue
				}
				mu.Lock()
				blocks = append(blocks, a)
				mu.Unlock()
				continue
			}
			mu.Lock()
			a := blocks[rng.IntN(have)]
			mu.Unlock()
			k := keyOf("load", a.i)
			// Read it anywhere: the node fetches it from whoever holds it.
			_, tries, err := c.onAny(ctx, w, node, func(cl *api.Client) error {
				res, err := cl.Fetch(ctx, tenant, namespace, [][]byte{k.Key}, 0)
				if err != nil {
					return err
				}
				if res[0].Err != nil {
					return res[0].Err
				}
				if _, err := cl.Get(ctx, k, buf); err != nil {
					return err
				}
				if string(buf) != string(valueOf("load", a.i, size)) {
					return fmt.Errorf("%w: %s differs from what was put", api.ErrDataLoss, k.Key)
				}
				return nil
			}, api.ErrNotFound) // a node whose map has not yet heard of a new block: ask the next, as a router would

			retries.Add(int64(tries))
			if err != nil {
				errs.Add(1)
				sample(fmt.Errorf("get %s: %w", k.Key, err))
				continue
			}
			gets.Add(1)
		}
	}
	start := time.Now()
	stop := make(chan struct{})
	var wg sync.WaitGroup
	for w := range c.cfg.Workers {
		wg.Go(func() { worker(w, stop) })
	}
	for {
		mu.Lock()
		n := len(blocks)
		mu.Unlock()
		if n >= c.cfg.Preload {
			break
		}
		time.Sleep(20 * time.Millisecond)
	}
	for _, d := range c.nodes {
		time.Sleep(c.cfg.Settle)
		fmt.Fprintf(c.cfg.Log, "restarting %s\n", d.id)
		t0 := time.Now()
		d.stop()
		stopped := time.Since(t0)
		t1 := time.Now()
		if err := d.start(c.cfg); err != nil {
			close(stop)
			wg.Wait()
			return err
		}
		serving := time.Since(t1)
		if err := c.waitNodes(ctx, len(c.nodes)); err != nil {
			close(stop)
			wg.Wait()
			return err
		}
		rejoined := time.Since(t1)
		rep.Nodes = append(rep.Nodes, RestartResult{Node: d.id, StopS: stopped.Seconds(), ServingS: serving.Seconds(), RejoinedS: rejoined.Seconds(),
			HandedOff: d.drainedField("handed_off"), Replicated: d.drainedField("replicated"), Kept: d.drainedField("kept"), Errors: d.drainErrors()})
	}
	time.Sleep(c.cfg.Settle)
	close(stop)
	wg.Wait()
	r.Took = time.Since(start).Seconds()
	r.Retries, r.Errors, r.Gets = retries.Load(), errs.Load(), gets.Load()
	keys := make([][]byte, len(blocks))
	for i, a := range blocks {
		keys[i] = keyOf("load", a.i).Key
		r.Puts++
		if a.replicated {
			r.Replicated++
		}
		if a.leased {
			r.Leased++
		}
	}
	where, err := c.whereAre(ctx, keys)
	if err != nil {
		return err
	}
	for i, w := range where {
		if len(w) > 0 {
			continue
		}
		switch a := blocks[i]; {
		case a.leased:
			r.LostLeased++
		case a.replicated:
			r.LostReplicated++
		default:
			r.LostOther++
		}
	}
	rep.Rolling = r
	return nil
}

// WriteJSON prints rep.
func (rep *Report) WriteJSON(w io.Writer) error {
	enc := json.NewEncoder(w)
	enc.SetIndent("", "  ")
	return enc.Encode(rep)
}
