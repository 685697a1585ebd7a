package test

import (
	"bufio"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"os/exec"
	"regexp"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/kvpool/kvpool/api/wire"
	"github.com/kvpool/kvpool/internal/eventually"
	"github.com/kvpool/kvpool/transfer"
)

// metricValue returns the value of one series on a node's /metrics, e.g.
// `kvpool_pool_open_connections{door="tcp"}`; ok is false while the scrape
// cannot get through or the series is absent.
func metricValue(metrics, series string) (v float64, ok bool) {
	c := http.Client{Timeout: 2 * time.Second}
	resp, err := c.Get("http://" + metrics + "/metrics")
	if err != nil {
		return 0, false
	}
	defer resp.Body.Close()
	body, err := io.ReadAll(resp.Body)
	if err != nil {
		return 0, false
	}
	m := regexp.MustCompile(`(?m)^` + regexp.QuoteMeta(series) + ` (\S+)$`).FindSubmatch(body)
	if m == nil {
		return 0, false
	}
	v, err = strconv.ParseFloat(string(m[1]), 64)
	return v, err == nil
}

// dialFrom connects to addr from the loopback address 127.0.0.<host>, so
// one test can be many remote addresses.
func dialFrom(host int, addr string) (net.Conn, error) {
	d := net.Dialer{Timeout: time.Second, LocalAddr: &net.TCPAddr{IP: net.IPv4(127, 0, 0, byte(host))}}
	return d.Dial("tcp", addr)
}

// closedBy reports whether the other end closed c (end of file or reset)
// within d.
func closedBy(c net.Conn, d time.Duration) bool {
	c.SetReadDeadline(time.Now().Add(d))
	var b [4096]byte
	for {
		_, err := c.Read(b[:])
		if err == nil {
			continue // a hello, a GOAWAY: read on to the end
		}
		var ne net.Error
		return !(errors.As(err, &ne) && ne.Timeout())
	}
}

// A door holds at most --max-conns connections and one remote address at
// most --max-conns-per-remote: past either, a connection is closed at
// accept, counted by reason, and the node goes on serving the rest.
func TestConnectionCaps(t *testing.T) {
	const perDoor, perRemote = 48, 16
	s := startServe(t, "--standalone", "--capacity", "16MiB", "--max-conns", strconv.Itoa(perDoor),
		"--max-conns-per-remote", strconv.Itoa(perRemote))
	var held []net.Conn
	defer func() {
		for _, c := range held {
			c.Close()
		}
	}()
	// Data-channel connections that said their preamble: they may idle
	// for --idle-timeout, so only the caps close them.
	open := func(host, n int) {
		for range n {
			c, err := dialFrom(host, s.addr)
			if err != nil {
				t.Fatal(err)
			}
			if _, err := c.Write(wire.Preamble[:]); err != nil {
				t.Fatal(err)
			}
			held = append(held, c)
		}
	}
	open(2, 2*perRemote) // half refused: remote_full
	// The node refuses asynchronously: wait for its count first, so a
	// loaded machine does not make a refused connection look admitted.
	eventually.True(t, "the remote_full refusals to be counted", 10*time.Second, func() bool {
		r, ok := metricValue(s.metrics, `kvpool_pool_refused_connections_total{door="tcp",reason="remote_full"}`)
		return ok && r == perRemote
	})
	refusedRemote := 0
	for _, c := range held {
		if closedBy(c, 100*time.Millisecond) {
			refusedRemote++
		}
	}
	if refusedRemote != perRemote {
		t.Fatalf("%d of %d connections from one address were refused, want %d", refusedRemote, 2*perRemote, perRemote)
	}
	for host := 3; host < 3+perDoor/perRemote; host++ {
		open(host, perRemote) // the door fills; the last address is refused: door_full
	}
	var last string
	defer func() {
		if t.Failed() {
			t.Log("last scrape:", last)
		}
	}()
	eventually.True(t, "the refusals to be counted", 10*time.Second, func() bool {
		r, ok1 := metricValue(s.metrics, `kvpool_pool_refused_connections_total{door="tcp",reason="remote_full"}`)
		d, ok2 := metricValue(s.metrics, `kvpool_pool_refused_connections_total{door="tcp",reason="door_full"}`)
		o, ok3 := metricValue(s.metrics, `kvpool_pool_open_connections{door="tcp"}`)
		last = fmt.Sprintf("remote_full %v, door_full %v, open %v", r, d, o)
		return ok1 && ok2 && ok3 && r == perRemote && d == perRemote && o == perDoor
	})
	for _, c := range held {
		c.Close()
	}
	held = nil
	eventually.True(t, "the door to empty", 10*time.Second, func() bool {
		o, ok := metricValue(s.metrics, `kvpool_pool_open_connections{door="tcp"}`)
		return ok && o == 0
	})
	mustOK(t, kv(t, []byte("value"), "block", "put", "--server", s.addr, "--tenant", "t", "--namespace", "n", "--key", "k"))
	if got := mustOK(t, kv(t, nil, "block", "get", "--server", s.addr, "--tenant", "t", "--namespace", "n", "--key", "k")); got.stdout != "value" {
		t.Fatalf("read back %q", got.stdout)
	}
}

// idleConnCount is how many idle connections TestManyIdleConnections
// opens: 4,000 in the suite, KVPOOL_IDLE_CONNS for the closing note's run.
func idleConnCount(t *testing.T) int {
	if s := os.Getenv("KVPOOL_IDLE_CONNS"); s != "" {
		n, err := strconv.Atoi(s)
		if err != nil || n < 1 {
			t.Fatalf("KVPOOL_IDLE_CONNS=%q: want a positive count", s)
		}
		return n
	}
	return 4000
}

// idleConnsPerHelper is the most connections one helper process holds,
// well under a default descriptor limit.
const idleConnsPerHelper = 8000

// Thousands of connections that never send a byte, held by separate
// client processes from eight addresses, against a node with 2,048
// descriptors: the caps refuse what the node cannot hold, the handshake
// timeout closes the rest, /healthz answers throughout, and once the
// handshake timeout has passed a client puts and gets while every idle
// connection is still open at its client.
func TestManyIdleConnections(t *testing.T) {
	const fdLimit, perDoor, perRemote = 2048, 1500, 400
	s := startServeCmd(t, func(bin string, args ...string) *exec.Cmd {
		return exec.Command("/bin/sh", append([]string{"-c", fmt.Sprintf(`ulimit -n %d && exec "$0" "$@"`, fdLimit), bin}, args...)...)
	}, "--standalone", "--capacity", "16MiB", "--handshake-timeout", "1s",
		"--max-conns", strconv.Itoa(perDoor), "--max-conns-per-remote", strconv.Itoa(perRemote))
	n := idleConnCount(t)
	var healthy atomic.Bool
	healthy.Store(true)
	stopCheck, checked := make(chan struct{}), make(chan struct{})
	go func() {
		defer close(checked)
		for {
			select {
			case <-stopCheck:
				return
			case <-time.After(50 * time.Millisecond):
			}
			resp, err := (&http.Client{Timeout: 2 * time.Second}).Get("http://" + s.metrics + "/healthz")
			if err != nil || resp.StatusCode != 200 {
				healthy.Store(false)
			}
			if err == nil {
				resp.Body.Close()
			}
		}
	}()
	start := time.Now()
	var helpers []*exec.Cmd
	defer func() {
		for _, h := range helpers {
			h.Process.Kill()
			h.Wait()
		}
	}()
	type report struct {
		line string
		err  error
	}
	reports := make(chan report, n/idleConnsPerHelper+1)
	for first := 0; first < n; first += idleConnsPerHelper {
		h := exec.Command(os.Args[0], "-test.run=^$")
		h.Env = append(os.Environ(), "KVPOOL_TEST_HELPER=idle", "KVPOOL_HELPER_ADDR="+s.addr,
			"KVPOOL_HELPER_CONNS="+strconv.Itoa(min(idleConnsPerHelper, n-first)), "KVPOOL_HELPER_HOST="+strconv.Itoa(10+len(helpers)*8))
		h.Stderr = os.Stderr
		out, err := h.StdoutPipe()
		if err != nil {
			t.Fatal(err)
		}
		if err := h.Start(); err != nil {
			t.Fatal(err)
		}
		helpers = append(helpers, h)
		go func() {
			line, err := bufio.NewReader(out).ReadString('\n')
			reports <- report{strings.TrimSpace(line), err}
		}()
	}
	opened, failed := 0, 0
	for range helpers {
		r := <-reports
		var o, f int
		if _, err := fmt.Sscanf(r.line, "opened %d failed %d", &o, &f); err != nil {
			t.Fatalf("a helper said %q (%v)", r.line, r.err)
		}
		opened, failed = opened+o, failed+f
	}
	took := time.Since(start)
	close(stopCheck)
	<-checked
	select {
	case err := <-s.done:
		t.Fatalf("the node exited under %d idle connections: %v", n, err)
	default:
	}
	if !healthy.Load() {
		t.Error("/healthz failed while the idle connections were opened")
	}
	// Every idle connection is closed by the node within the handshake
	// timeout (or at once when refused), although the clients hold them.
	eventually.True(t, "the node to close every idle connection", 30*time.Second, func() bool {
		o, ok := metricValue(s.metrics, `kvpool_pool_open_connections{door="tcp"}`)
		return ok && o == 0
	})
	rr, _ := metricValue(s.metrics, `kvpool_pool_refused_connections_total{door="tcp",reason="remote_full"}`)
	rd, _ := metricValue(s.metrics, `kvpool_pool_refused_connections_total{door="tcp",reason="door_full"}`)
	ae, _ := metricValue(s.metrics, `kvpool_pool_accept_errors_total{door="tcp"}`)
	mustOK(t, kv(t, []byte("value"), "block", "put", "--server", s.addr, "--tenant", "t", "--namespace", "n", "--key", "k"))
	if got := mustOK(t, kv(t, nil, "block", "get", "--server", s.addr, "--tenant", "t", "--namespace", "n", "--key", "k")); got.stdout != "value" {
		t.Fatalf("read back %q", got.stdout)
	}
	t.Logf("%d idle connections held by %d client processes from %d addresses, opened in %v (%d dials failed at the kernel), against %d descriptors: "+
		"%.0f refused as remote_full, %.0f as door_full, %.0f accepts failed; the rest closed by the handshake timeout; the node served a put and get after",
		opened, len(helpers), 8*len(helpers), took.Round(time.Millisecond), failed, fdLimit, rr, rd, ae)
}

// runIdleHelper opens KVPOOL_HELPER_CONNS connections to KVPOOL_HELPER_ADDR
// from 127.0.0.(KVPOOL_HELPER_HOST + 0..7), says how many on stdout, and
// holds them until killed.
func runIdleHelper() int {
	n, _ := strconv.Atoi(os.Getenv("KVPOOL_HELPER_CONNS"))
	host, _ := strconv.Atoi(os.Getenv("KVPOOL_HELPER_HOST"))
	addr := os.Getenv("KVPOOL_HELPER_ADDR")
	var (
		mu             sync.Mutex
		conns          []net.Conn
		opened, failed int
		wg             sync.WaitGroup
	)
	for h := range 8 {
		wg.Go(func() {
			for range n / 8 {
				c, err := dialFrom(host+h, addr)
				mu.Lock()
				if err != nil {
					failed++
				} else {
					opened++
					conns = append(conns, c)
				}
				mu.Unlock()
			}
		})
	}
	wg.Wait()
	fmt.Printf("opened %d failed %d\n", opened, failed)
	time.Sleep(time.Hour) // until killed, holding conns
	return 0
}

// doorCase is one way to hold a connection open on a door without
// finishing what it started; the node must close it within closeBy.
type doorCase struct {
	name    string
	dial    func(t *testing.T, s *server) net.Conn
	closeBy time.Duration
}

// Every door closes a connection that says nothing or stops halfway, at
// the deadline that applies: the handshake timeout before a connection's
// first bytes, the io timeout inside a started frame or request, the idle
// timeout between them. Driven against a daemon process over real
// sockets, all at once.
func TestIdleAndTruncatedOnEveryDoor(t *testing.T) {
	const handshake, io, idle = 500 * time.Millisecond, time.Second, 3 * time.Second
	s := startServe(t, "--standalone", "--capacity", "16MiB", "--handshake-timeout", handshake.String(),
		"--io-timeout", io.String(), "--idle-timeout", idle.String())
	tcp := func(first ...[]byte) func(t *testing.T, s *server) net.Conn {
		return func(t *testing.T, s *server) net.Conn {
			c, err := net.Dial("tcp", s.addr)
			if err != nil {
				t.Fatal(err)
			}
			for _, b := range first {
				if _, err := c.Write(b); err != nil {
					t.Fatal(err)
				}
			}
			return c
		}
	}
	unixDoor := func(path func(*server) string, first ...[]byte) func(t *testing.T, s *server) net.Conn {
		return func(t *testing.T, s *server) net.Conn {
			c, err := net.Dial("unix", path(s))
			if err != nil {
				t.Fatal(err)
			}
			for _, b := range first {
				if _, err := c.Write(b); err != nil {
					t.Fatal(err)
				}
			}
			return c
		}
	}
	shmSocket := func(s *server) string { return s.shm }
	shmTransfer := func(s *server) string { return s.shm + ".transfer" }
	metrics := func(first string) func(t *testing.T, s *server) net.Conn {
		return func(t *testing.T, s *server) net.Conn {
			c, err := net.Dial("tcp", s.metrics)
			if err != nil {
				t.Fatal(err)
			}
			if _, err := c.Write([]byte(first)); err != nil {
				t.Fatal(err)
			}
			return c
		}
	}
	// A frame header cut after 3 of its bytes, on the data channel.
	halfFrame := []byte{1, 2, 3}
	h2Preface := []byte("PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n")
	h2Settings := []byte{0, 0, 0, 4, 0, 0, 0, 0, 0} // an empty SETTINGS frame
	const slack = 3 * time.Second
	cases := []doorCase{
		{"tcp: nothing", tcp(), handshake},
		{"tcp: half a preamble", tcp(wire.Preamble[:3]), handshake},
		{"data: preamble, then idle", tcp(wire.Preamble[:]), idle},
		{"data: a truncated frame", tcp(wire.Preamble[:], halfFrame), io},
		{"transfer: preamble, then idle", tcp(transfer.TCPPreamble[:]), idle},
		{"transfer: a truncated request", tcp(transfer.TCPPreamble[:], []byte{1, 0, 0}), io},
		{"grpc: half the HTTP/2 preface", tcp(h2Preface[:10]), handshake},
		{"grpc: preface, no settings", tcp(h2Preface), handshake},
		{"grpc: settings, then idle", tcp(h2Preface, h2Settings), 2 * io},
		{"grpc: a truncated frame", tcp(h2Preface, h2Settings, []byte{0, 0, 8, 6}), 2 * io},
		{"shm: hello, then idle", unixDoor(shmSocket), idle},
		{"shm: a truncated frame", unixDoor(shmSocket, halfFrame), io},
		{"shm transfer: nothing", unixDoor(shmTransfer), handshake},
		{"shm transfer: a truncated request", unixDoor(shmTransfer, transfer.SHMPreamble[:], []byte{1, 0}), io},
		{"metrics: nothing", metrics(""), handshake},
		{"metrics: half a request header", metrics("GET /metrics HTTP/1.1\r\nHost: x\r\n"), handshake},
	}
	type result struct {
		name   string
		took   time.Duration
		closed bool
	}
	results := make(chan result, len(cases))
	start := time.Now()
	for _, tc := range cases {
		c := tc.dial(t, s)
		go func() {
			defer c.Close()
			closed := closedBy(c, tc.closeBy+slack)
			results <- result{tc.name, time.Since(start), closed}
		}()
	}
	took := map[string]result{}
	for range cases {
		r := <-results
		took[r.name] = r
	}
	for _, tc := range cases {
		r := took[tc.name]
		if !r.closed {
			t.Errorf("%s: still open %v after it started (want closed at about %v)", tc.name, r.took.Round(time.Millisecond), tc.closeBy)
			continue
		}
		t.Logf("%-36s closed after %v (deadline %v)", tc.name+":", r.took.Round(10*time.Millisecond), tc.closeBy)
	}
	// The node served on through all of it.
	mustOK(t, kv(t, []byte("value"), "block", "put", "--server", s.addr, "--tenant", "t", "--namespace", "n", "--key", "k"))
	if o, ok := metricValue(s.metrics, `kvpool_pool_open_connections{door="shm-transfer"}`); !ok || o != 0 {
		t.Errorf("the shm transfer door holds %v connections after its clients left", o)
	}
}

// A thousand transfer connections that say their preamble and then
// nothing (or half a request) are all closed at the deadline, and the
// daemon's goroutines come back down: before, every one stayed open.
func TestThousandIdleTransferConnections(t *testing.T) {
	const n, idle, io = 1000, time.Second, time.Second
	s := startServe(t, "--standalone", "--capacity", "16MiB", "--idle-timeout", idle.String(), "--io-timeout", io.String())
	before, ok := metricValue(s.metrics, "go_goroutines")
	if !ok {
		t.Fatal("no go_goroutines metric")
	}
	conns := make([]net.Conn, 0, n)
	defer func() {
		for _, c := range conns {
			c.Close()
		}
	}()
	for i := range n {
		c, err := net.Dial("tcp", s.addr)
		if err != nil {
			t.Fatal(err)
		}
		c.Write(transfer.TCPPreamble[:])
		if i%2 == 1 {
			c.Write([]byte{1, 0, 0}) // half a request
		}
		conns = append(conns, c)
	}
	start := time.Now()
	peak, _ := metricValue(s.metrics, "go_goroutines")
	var wg sync.WaitGroup
	closed := make([]bool, n)
	for i, c := range conns {
		wg.Go(func() { closed[i] = closedBy(c, idle+5*time.Second) })
	}
	wg.Wait()
	took := time.Since(start)
	for i, ok := range closed {
		if !ok {
			t.Fatalf("connection %d still open %v after it went quiet", i, took.Round(time.Millisecond))
		}
	}
	var after float64
	eventually.True(t, "the daemon's goroutines to come back down", 10*time.Second, func() bool {
		after, _ = metricValue(s.metrics, "go_goroutines")
		return after <= before+5
	})
	t.Logf("%d quiet transfer connections (half with half a request) all closed within %v; goroutines %.0f before, %.0f with them open, %.0f after",
		n, took.Round(10*time.Millisecond), before, peak, after)
}
