package api

import (
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"log/slog"
	"math"
	"os"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/credentials/insecure"

	kvpoolv1 "github.com/kvpool/kvpool/api/kvpool/v1"
	"github.com/kvpool/kvpool/api/wire"
)

// Path is how a Client moves block bytes.
type Path int

const (
	// PathAuto uses shared memory when the node is on this host, else the
	// data channel.
	PathAuto Path = iota
	// PathShm requires the shared-memory path; Dial fails without it.
	PathShm
	// PathData uses the framed TCP data channel.
	PathData
	// PathGRPC sends bytes as protobuf over gRPC: the portable, slow path.
	PathGRPC
)

var pathNames = []string{"auto", "shm", "data", "grpc"}

func (p Path) String() string {
	if int(p) < len(pathNames) {
		return pathNames[p]
	}
	return fmt.Sprintf("Path(%d)", int(p))
}

// ParsePath maps "auto", "shm", "data" (alias "tcp") and "grpc" to a Path.
func ParsePath(s string) (Path, error) {
	if s == "tcp" {
		return PathData, nil
	}
	for i, n := range pathNames {
		if n == s {
			return Path(i), nil
		}
	}
	return 0, fmt.Errorf("%w: unknown path %q (want auto, shm, data or grpc)", ErrInvalidArgument, s)
}

// ClientConfig configures a Client.
type ClientConfig struct {
	// Server is the node's address (host:port). Required.
	Server string
	// Path selects how bytes move. Default PathAuto.
	Path Path
	// MaxIdleConns is how many data connections the client keeps open for
	// reuse; it opens more when more calls run at once. Default 8.
	MaxIdleConns int
	// DialTimeout bounds Dial and every new connection. Default 5 s.
	DialTimeout time.Duration
	// VerifySharedReads makes every Get over shared memory check the CRC
	// of the bytes it copies, repeats served from the location cache too.
	// Without it a same-host read is checked the first time this client
	// reads a version of a block (a Get that asks the node, a View of a
	// version it has not read), and a repeat from the cache relies on that
	// check: the version words say the block is the same one. Bytes that
	// cross a socket are always checked. Default false.
	VerifySharedReads bool
	// NoLocationCache turns off the shared-memory location cache, so every
	// Get asks the node (one round trip) instead of copying a block this
	// client read before straight from the segment.
	NoLocationCache bool
	// MapLazily leaves the node's shared memory to be mapped into this
	// process page by page, on first touch, instead of in the background
	// right after Dial (the pages the node has allocated; see
	// prefaultMapping). The first copy into each block then pays for its
	// page faults (about 8× the copy's own time for a 2 MiB block); the
	// page tables the background pass builds cost 2 MiB per GiB of arena.
	// Default false.
	MapLazily bool
	// NoShmMailbox keeps the same-host session's requests and answers on
	// its unix socket. By default, with a node that offers it, the
	// session's small requests (pins, reservations, commits, removes) and
	// their answers pass through a few pages both share (wire.Mailbox):
	// no system call while the node polls, about 5 µs less per round trip
	// here, a tenth of a 2 MiB put.
	NoShmMailbox bool
	// NoLocalServe keeps a session with a node in this process (a Go
	// program that embeds its node) waiting for the node's goroutine to
	// serve each post, as a client in another process does. By default
	// such a client serves its posts itself, calling the node's session
	// code in its own goroutine (see wire.LocalServer): no poll, no
	// sleep, no wake-up. For measuring the other path; default false.
	NoLocalServe bool
	// SpinWait is how long a call on the data channel or the same-host
	// session keeps polling its socket for the node's response before
	// its goroutine parks: those round trips take tens of microseconds,
	// about what a park and wake-up add on top. At most half the
	// process's processors spin at once, and a connection whose responses
	// keep coming later than SpinWait stops spinning for a while. Default
	// 50 µs; negative turns it off.
	SpinWait time.Duration
	// Logger receives the client's logs. Default: discard.
	Logger *slog.Logger
	// DialOptions are extra gRPC dial options.
	DialOptions []grpc.DialOption
	// TLS, when set, runs gRPC and the data channel through TLS: RootCAs
	// verifies the node, Certificates (a client certificate naming a
	// tenant, node or admin) identifies the caller. nil: plaintext.
	TLS *tls.Config
	// Token, when set, is the bearer token that identifies the caller: in
	// each gRPC call's metadata and in the data channel's preamble.
	Token string
	// TCPCongestion is the TCP congestion control of the data channel's
	// connections (Linux TCP_CONGESTION): they send Puts' bytes. Default
	// "cubic", as a node's (wire.DefaultCongestion: BBR's pacing stalls
	// bursts after idle time), or the host's where this process may not
	// set it; "host" keeps the host's. Dial refuses an algorithm named
	// here that the kernel does not have or does not allow this process.
	TCPCongestion string
}

// BearerToken is gRPC per-call credentials that send a bearer token in
// the authorization metadata, as every kvpool client and node does.
type BearerToken string

// GetRequestMetadata implements credentials.PerRPCCredentials.
func (b BearerToken) GetRequestMetadata(context.Context, ...string) (map[string]string, error) {
	return map[string]string{"authorization": "Bearer " + string(b)}, nil
}

// RequireTransportSecurity is false: a node on loopback or a trusted
// network may take tokens in plaintext; it decides what it accepts.
func (BearerToken) RequireTransportSecurity() bool { return false }

// Client talks to one kvpool node. It is safe for concurrent use.
//
// Block bytes (Put, Get, View, Reserve, Remove and their variants) move
// over the one path Dial chose, and only over it: the node's shared memory,
// the framed data channel, or gRPC. Control calls (Locate, Exists, Stats,
// Route, Plan, ReportLoad) are gRPC on every path; Fetch goes over the
// data channel on every path but PathGRPC.
type Client struct {
	cfg   ClientConfig
	log   *slog.Logger
	cc    *grpc.ClientConn
	rpc   kvpoolv1.KVPoolServiceClient
	info  *kvpoolv1.InfoResponse
	path  Path
	bytes bytePath
	// fetches is the data channel that Fetch frames go over (the byte
	// path's own when it is the data channel); nil: Fetch is a gRPC call
	// (PathGRPC, or a node without Fetch frames).
	fetches *dataPath
	// lastFetch is what the last Fetch that pulled anything cost beyond
	// the node's fetch, and how many keys it asked for (a fetchReport);
	// the next Fetch reports it.
	lastFetch atomic.Uint64

	holders holderClients // GetDirect's clients of other nodes

	closeOnce sync.Once
	closeErr  error
}

// Dial connects to a node, learns its limits and fast paths with an Info
// call, and attaches to its shared memory when Path allows and the node is
// on this host.
func Dial(ctx context.Context, cfg ClientConfig) (*Client, error) {
	if cfg.Server == "" {
		return nil, fmt.Errorf("%w: client: no server address", ErrInvalidArgument)
	}
	if cfg.MaxIdleConns == 0 {
		cfg.MaxIdleConns = 8
	}
	if cfg.DialTimeout == 0 {
		cfg.DialTimeout = 5 * time.Second
	}
	if cfg.SpinWait == 0 {
		cfg.SpinWait = 50 * time.Microsecond
	}
	cfg.TCPCongestion = wire.CongestionOrDefault(cfg.TCPCongestion)
	if err := wire.ValidateCongestion(cfg.TCPCongestion); err != nil {
		return nil, fmt.Errorf("%w: client: %v", ErrInvalidArgument, err)
	}
	if cfg.Logger == nil {
		cfg.Logger = slog.New(slog.DiscardHandler)
	}
	if cfg.Path < PathAuto || cfg.Path > PathGRPC {
		return nil, fmt.Errorf("%w: client: path %v", ErrInvalidArgument, cfg.Path)
	}
	creds := insecure.NewCredentials()
	if cfg.TLS != nil {
		creds = credentials.NewTLS(cfg.TLS)
	}
	opts := []grpc.DialOption{
		grpc.WithTransportCredentials(creds),
		grpc.WithDefaultCallOptions(grpc.MaxCallRecvMsgSize(80<<20), grpc.MaxCallSendMsgSize(80<<20)),
	}
	if cfg.Token != "" {
		opts = append(opts, grpc.WithPerRPCCredentials(BearerToken(cfg.Token)))
	}
	opts = append(opts, cfg.DialOptions...)
	cc, err := grpc.NewClient(cfg.Server, opts...)
	if err != nil {
		return nil, fmt.Errorf("%w: client: %v", ErrInvalidArgument, err)
	}
	c := &Client{cfg: cfg, log: cfg.Logger.With("component", "client", "server", cfg.Server), cc: cc, rpc: kvpoolv1.NewKVPoolServiceClient(cc)}
	ictx, cancel := context.WithTimeout(ctx, cfg.DialTimeout)
	defer cancel()
	c.info, err = c.rpc.Info(ictx, &kvpoolv1.InfoRequest{}, grpc.WaitForReady(true))
	if err != nil {
		cc.Close()
		return nil, fmt.Errorf("client: reach %s: %w", cfg.Server, FromStatus(err))
	}
	c.path = cfg.Path
	wc := wireConfig
	if cfg.SpinWait > 0 {
		wc.SpinWait, wc.Spinners = cfg.SpinWait, wire.NewSpinners()
	}
	if c.path == PathAuto || c.path == PathShm {
		s, err := attachShm(ictx, c.info, cfg, wc)
		switch {
		case err == nil:
			r := newReattachingShm(s, c.info, cfg, wc)
			c.path, c.bytes = PathShm, r
		case c.path == PathShm:
			cc.Close()
			return nil, err
		default:
			c.log.Debug("shared memory unavailable; using the data channel", "err", err)
			c.path = PathData
		}
	}
	if c.path == PathData && !c.info.GetDataChannel() {
		c.path = PathGRPC
	}
	switch c.path {
	case PathData:
		c.bytes = newDataPath(cfg, wc)
	case PathGRPC:
		c.bytes = &grpcPath{rpc: c.rpc}
	}
	if c.path != PathGRPC && c.info.GetDataChannel() && c.info.GetFetchFrames() {
		// Connections are dialed on the first Fetch.
		var ok bool
		if c.fetches, ok = c.bytes.(*dataPath); !ok {
			c.fetches = newDataPath(cfg, wc)
		}
	}
	return c, nil
}

// Path reports the path the client chose.
func (c *Client) Path() Path { return c.path }

// WaitMapped waits, within ctx, until the background mapping of the
// node's shared memory that Dial started (the pages the node held then;
// see prefaultMapping) is done, and returns at once on other paths. Calls
// work meanwhile, paying a page fault on each page not yet mapped; a
// benchmark waits for it so that it measures a client's steady state, not
// its first seconds (with a 4 GiB arena, four clients mapping it took
// 2.6 s of CPU on two vCPUs).
func (c *Client) WaitMapped(ctx context.Context) error {
	r, ok := c.bytes.(*reattachingShm)
	if !ok {
		return nil
	}
	select {
	case <-r.path(ctx, false).prefaulted:
		return nil
	case <-ctx.Done():
		return ctx.Err()
	}
}

// Info returns what the node reported at Dial.
func (c *Client) Info() *kvpoolv1.InfoResponse { return c.info }

// Conn returns the client's gRPC connection, for calls this package does
// not wrap (tests that drive the service's edge by hand). Engines and
// tools use the Client's methods and Admin.
func (c *Client) Conn() *grpc.ClientConn { return c.cc }

// Close releases the client's connections and its shared-memory mapping,
// after any Get or Put in flight has finished with the mapping. Views and
// reservations still open become invalid: their bytes MUST NOT be touched
// after Close. Commits of PutAsync still in flight are answered first
// (for up to 5 seconds), and the failures of PutAsync calls no Flush
// reported are part of Close's error. Close is idempotent.
func (c *Client) Close() error {
	c.closeOnce.Do(func() {
		errs := []error{c.holders.closeAll()}
		if c.bytes != nil {
			errs = append(errs, c.bytes.close())
		}
		if c.fetches != nil && c.fetches != c.bytes {
			errs = append(errs, c.fetches.close())
		}
		errs = append(errs, c.cc.Close())
		c.closeErr = errors.Join(errs...)
	})
	return c.closeErr
}

// FetchResult says where one block of a Fetch came from.
type FetchResult struct {
	// Source is the node the block was pulled from; "" if it was local.
	Source string
	Size   int64
	Err    error
	// Took is how long the node spent on the fetch that brought the
	// block, from the call to its commit (0 if it was local).
	Took time.Duration
}

// Fetch asks the node to make the blocks under keys local, pulling each
// one it lacks from the best node holding it; then Get serves them from
// here. timeout bounds one holder's transfer (0: the node's default). The
// error is for the whole call; per-key outcomes are in the results.
//
// Fetch goes over the data channel as one frame where the node serves
// them (InfoResponse.fetch_frames), on every path but PathGRPC: a gRPC
// call costs 0.1–0.3 ms more, up to a third of a 2 MiB block's fetch on
// loopback.
//
// Each call tells the node what the previous one cost beyond the node's
// own fetch (its request's way there, the answer's way back, this
// goroutine's wake-up): the node adds that to the fetch times its links
// learn from, so that its plans predict the wait a caller sees.
func (c *Client) Fetch(ctx context.Context, tenant, namespace string, keys [][]byte, timeout time.Duration) ([]FetchResult, error) {
	start := time.Now()
	report := fetchReport(c.lastFetch.Load())
	var out []FetchResult
	if c.fetches != nil {
		var err error
		if out, err = c.fetches.fetch(ctx, tenant, namespace, keys, timeout, report); err != nil {
			return nil, err
		}
	} else {
		resp, err := c.rpc.Fetch(ctx, &kvpoolv1.FetchRequest{Tenant: tenant, Namespace: namespace, Keys: keys, TimeoutMs: uint32(timeout / time.Millisecond),
			PreviousCallOverheadUs: report.overheadUs(), PreviousCallBlocks: report.blocks()})
		if err != nil {
			return nil, FromStatus(err)
		}
		out = make([]FetchResult, len(resp.GetResults()))
		for i, r := range resp.GetResults() {
			out[i] = FetchResult{Source: r.GetSourceNode(), Size: int64(r.GetSizeBytes()), Err: FromCode(codes.Code(r.GetStatus().GetCode()), r.GetStatus().GetMessage()),
				Took: time.Duration(r.GetFetchSeconds() * float64(time.Second))}
		}
	}
	if d, ok := callOverhead(time.Since(start), out); ok {
		c.lastFetch.Store(uint64(newFetchReport(d, len(keys))))
	}
	return out, nil
}

// fetchReport is what a client tells the node of its previous Fetch, as
// the data channel's header carries it (wire.Request.CallOverheadUs and
// PreviousCallBlocks): in the low 32 bits what the call cost beyond the
// node's fetch, in microseconds (saturated), in the high 32 how many
// keys it asked for. Packed, one atomic word holds both, so the two a
// Fetch reports always belong to one call. 0: nothing to report.
type fetchReport uint64

func newFetchReport(overhead time.Duration, blocks int) fetchReport {
	us := min(uint64(max(overhead, 0)/time.Microsecond), math.MaxUint32)
	return fetchReport(us | uint64(min(max(blocks, 0), math.MaxUint32))<<32)
}

func (r fetchReport) overheadUs() uint64 { return uint64(r) & math.MaxUint32 }
func (r fetchReport) blocks() uint32     { return uint32(r >> 32) }

// callOverhead returns what a Fetch call that took call cost beyond the
// node's longest fetch among its results, and false when the node pulled
// nothing (every block was local or failed), which says nothing of it.
func callOverhead(call time.Duration, res []FetchResult) (time.Duration, bool) {
	var took time.Duration
	for _, r := range res {
		took = max(took, r.Took)
	}
	if took <= 0 || call <= took {
		return 0, false
	}
	return call - took, true
}

// Locate returns how many leading keys of chain the node holds.
func (c *Client) Locate(ctx context.Context, tenant, namespace string, chain [][]byte) (int, error) {
	resp, err := c.rpc.Locate(ctx, &kvpoolv1.LocateRequest{Tenant: tenant, Namespace: namespace, Keys: chain})
	if err != nil {
		return 0, FromStatus(err)
	}
	return int(resp.GetPrefixBlocks()), nil
}

// LocateTiers is Locate that also says how many of the leading blocks
// are in the node's host memory; the rest of the prefix is on its disk
// tier (memory = total on a node without one).
func (c *Client) LocateTiers(ctx context.Context, tenant, namespace string, chain [][]byte) (total, memory int, err error) {
	resp, err := c.rpc.Locate(ctx, &kvpoolv1.LocateRequest{Tenant: tenant, Namespace: namespace, Keys: chain})
	if err != nil {
		return 0, 0, FromStatus(err)
	}
	return int(resp.GetPrefixBlocks()), int(resp.GetMemoryPrefixBlocks()), nil
}

// LocateLease is Locate that also takes a read lease of d on the prefix
// the node holds: until it ends those blocks are not evicted and Remove
// fails unless forced. d ≤ 0 takes the node's default (10 s unless
// configured); the node caps d at its maximum. It returns the prefix
// length and when the lease ends.
func (c *Client) LocateLease(ctx context.Context, tenant, namespace string, chain [][]byte, d time.Duration) (int, time.Time, error) {
	resp, err := c.rpc.Locate(ctx, &kvpoolv1.LocateRequest{Tenant: tenant, Namespace: namespace, Keys: chain, LeaseMs: leaseMs(d), Lease: true})
	if err != nil {
		return 0, time.Time{}, FromStatus(err)
	}
	var until time.Time
	if ms := resp.GetLeaseUntilUnixMs(); ms > 0 {
		until = time.UnixMilli(ms)
	}
	return int(resp.GetPrefixBlocks()), until, nil
}

// Exists reports for each key whether the node holds it.
func (c *Client) Exists(ctx context.Context, tenant, namespace string, keys [][]byte) ([]bool, error) {
	resp, err := c.rpc.Exists(ctx, &kvpoolv1.ExistsRequest{Tenant: tenant, Namespace: namespace, Keys: keys})
	if err != nil {
		return nil, FromStatus(err)
	}
	return resp.GetExists(), nil
}

// HostID identifies this machine: the Linux boot id, which differs between
// hosts and changes on reboot. A node reports its own in Info; a client
// tries shared memory only when they match.
func HostID() string {
	b, err := os.ReadFile("/proc/sys/kernel/random/boot_id")
	if err != nil {
		h, _ := os.Hostname()
		return "host:" + h
	}
	return strings.TrimSpace(string(b))
}
