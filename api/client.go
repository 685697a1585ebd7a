package api

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"os"
	"strings"
	"sync"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
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
	// VerifySharedReads makes Get over shared memory check the CRC of the
	// bytes it copies. Bytes that cross a socket are always verified;
	// shared-memory bytes never leave this host's RAM, were verified by the
	// node at commit, and checking them costs about a third of the copy.
	// Default false.
	VerifySharedReads bool
	// NoLocationCache turns off the shared-memory location cache, so every
	// Get asks the node (one round trip) instead of copying a block this
	// client read before straight from the segment.
	NoLocationCache bool
	// Logger receives the client's logs. Default: discard.
	Logger *slog.Logger
	// DialOptions are extra gRPC dial options.
	DialOptions []grpc.DialOption
}

// Client talks to one kvpool node. It is safe for concurrent use.
type Client struct {
	cfg  ClientConfig
	log  *slog.Logger
	cc   *grpc.ClientConn
	rpc  kvpoolv1.KVPoolServiceClient
	info *kvpoolv1.InfoResponse
	path Path
	data *connPool
	shm  *shmClient

	// Clients of other nodes GetDirect reads from, by address.
	hmu     sync.Mutex
	holders map[string]*Client
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
	if cfg.Logger == nil {
		cfg.Logger = slog.New(slog.DiscardHandler)
	}
	if cfg.Path < PathAuto || cfg.Path > PathGRPC {
		return nil, fmt.Errorf("%w: client: path %v", ErrInvalidArgument, cfg.Path)
	}
	opts := append([]grpc.DialOption{
		grpc.WithTransportCredentials(insecure.NewCredentials()),
		grpc.WithDefaultCallOptions(grpc.MaxCallRecvMsgSize(80<<20), grpc.MaxCallSendMsgSize(80<<20)),
	}, cfg.DialOptions...)
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
	if c.path == PathAuto || c.path == PathShm {
		c.shm, err = c.attachShm(ictx)
		switch {
		case err == nil:
			c.path = PathShm
			c.shm.noCache = cfg.NoLocationCache
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
	c.data = &connPool{max: cfg.MaxIdleConns, dial: c.dialData}
	return c, nil
}

// Path reports the path the client chose.
func (c *Client) Path() Path { return c.path }

// Info returns what the node reported at Dial.
func (c *Client) Info() *kvpoolv1.InfoResponse { return c.info }

// RPC returns the generated gRPC client on the same connection, for calls
// this package does not wrap.
func (c *Client) RPC() kvpoolv1.KVPoolServiceClient { return c.rpc }

// Conn returns the client's gRPC connection, for other services of the
// node (kvpoolv1.NewAdminServiceClient).
func (c *Client) Conn() *grpc.ClientConn { return c.cc }

// Close releases the client's connections and its shared-memory mapping.
// Views and reservations still open become invalid.
func (c *Client) Close() error {
	errs := []error{c.closeHolders()}
	if c.data != nil {
		c.data.close()
	}
	if c.shm != nil {
		errs = append(errs, c.shm.close())
	}
	errs = append(errs, c.cc.Close())
	return errors.Join(errs...)
}

func (c *Client) dialData(ctx context.Context) (*dataConn, error) {
	d := net.Dialer{Timeout: c.cfg.DialTimeout}
	nc, err := d.DialContext(ctx, "tcp", c.cfg.Server)
	if err != nil {
		return nil, fmt.Errorf("%w: client: data channel to %s: %v", ErrUnavailable, c.cfg.Server, err)
	}
	if _, err := nc.Write(wire.Preamble[:]); err != nil {
		nc.Close()
		return nil, fmt.Errorf("%w: client: data channel to %s: %v", ErrUnavailable, c.cfg.Server, err)
	}
	return newDataConn(nc), nil
}

// dataConn is the client side of one data connection.
type dataConn struct {
	c    net.Conn
	br   *bufio.Reader
	buf  []byte
	resp wire.Response
	// trailer is scratch for a Put's trailer.
	trailer [wire.TrailerBytes]byte
	// closing is set when the node announced it closes the connection.
	closing bool
}

// readResponse reads a response header and notes FlagClose.
func (d *dataConn) readResponse(ctx context.Context, what string) error {
	if err := wire.ReadResponse(d.br, &d.resp); err != nil {
		return ioError(ctx, what, err)
	}
	d.closing = d.resp.Flags&wire.FlagClose != 0
	return FromCode(codes.Code(d.resp.Status), d.resp.Message)
}

func newDataConn(c net.Conn) *dataConn {
	return &dataConn{c: c, br: bufio.NewReaderSize(c, 4<<10), buf: make([]byte, 0, wire.RequestBufferBytes+wire.TrailerBytes)}
}

// bind applies ctx's deadline and cancellation to the connection until the
// returned func is called.
func (d *dataConn) bind(ctx context.Context) func() {
	if dl, ok := ctx.Deadline(); ok {
		d.c.SetDeadline(dl)
	} else {
		d.c.SetDeadline(time.Time{})
	}
	if ctx.Done() == nil {
		return func() {}
	}
	stop := context.AfterFunc(ctx, func() { d.c.SetDeadline(time.Unix(1, 0)) })
	return func() { stop() }
}

func (d *dataConn) request(r *wire.Request) error {
	d.buf = wire.AppendRequest(d.buf[:0], r)
	_, err := d.c.Write(d.buf)
	return err
}

// connPool keeps idle data connections.
type connPool struct {
	mu     sync.Mutex
	idle   []*dataConn
	max    int
	closed bool
	dial   func(context.Context) (*dataConn, error)
}

// get returns an idle connection (reused) or dials a new one.
func (p *connPool) get(ctx context.Context) (d *dataConn, reused bool, err error) {
	p.mu.Lock()
	if p.closed {
		p.mu.Unlock()
		return nil, false, fmt.Errorf("%w: client is closed", ErrUnavailable)
	}
	if k := len(p.idle); k > 0 {
		d := p.idle[k-1]
		p.idle = p.idle[:k-1]
		p.mu.Unlock()
		return d, true, nil
	}
	p.mu.Unlock()
	d, err = p.dial(ctx)
	return d, false, err
}

// withConn runs op on a pooled data connection. A connection that failed
// (an I/O error, or the node announced it closes it) is dropped. An I/O
// error on a reused idle connection is retried once on a fresh one: the
// node may have closed it while it sat idle, and every data op is
// idempotent (blocks are immutable, so a repeated put reports Existed).
func (c *Client) withConn(ctx context.Context, op func(*dataConn) error) error {
	for attempt := 0; ; attempt++ {
		d, reused, err := c.data.get(ctx)
		if err != nil {
			return err
		}
		d.closing = false
		err = op(d)
		remote := err == nil || isRemote(err) || errors.Is(err, errShortBuffer)
		if remote && !d.closing {
			c.data.put(d)
			return err
		}
		d.c.Close()
		if remote || !reused || attempt > 0 || ctx.Err() != nil {
			return err
		}
	}
}

// put returns a healthy connection; callers close broken ones instead.
func (p *connPool) put(d *dataConn) {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.closed || len(p.idle) >= p.max {
		d.c.Close()
		return
	}
	p.idle = append(p.idle, d)
}

func (p *connPool) close() {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.closed = true
	for _, d := range p.idle {
		d.c.Close()
	}
	p.idle = nil
}

// ioError classifies a failed socket operation: the caller's context
// error when it ended, else Unavailable.
func ioError(ctx context.Context, what string, err error) error {
	if cerr := ctx.Err(); cerr != nil {
		return fmt.Errorf("client: %s: %w", what, cerr)
	}
	return fmt.Errorf("%w: client: %s: %v", ErrUnavailable, what, err)
}

func keyRequest(op wire.Op, k BlockKey) wire.Request {
	return wire.Request{Op: op, Tenant: []byte(k.Tenant), Namespace: []byte(k.Namespace), Key: k.Key}
}

// Put stores value under k. Putting equal bytes again succeeds; different
// bytes fail with ErrAlreadyExists. Other errors: ErrInvalidArgument,
// ErrResourceExhausted, ErrDataLoss (bytes damaged on the way),
// ErrUnavailable.
func (c *Client) Put(ctx context.Context, k BlockKey, value []byte) error {
	_, err := c.put(ctx, k, value)
	return err
}

// PutResult says what a Put did.
type PutResult struct {
	Existed bool   // an identical block was already stored
	CRC     uint32 // the stored checksum
}

// PutResult is Put that also reports whether the block existed.
func (c *Client) PutResult(ctx context.Context, k BlockKey, value []byte) (PutResult, error) {
	return c.put(ctx, k, value)
}

// PutReplicas stores value under k on the client's node and has that node
// place copies on other nodes until `copies` distinct nodes hold it
// (nodes that already do count). It returns once every copy is committed,
// or an error saying how many were placed (the local copy stays).
func (c *Client) PutReplicas(ctx context.Context, k BlockKey, value []byte, copies int) error {
	if copies < 1 || copies > 1<<16 {
		return fmt.Errorf("%w: %d copies", ErrInvalidArgument, copies)
	}
	if err := k.Validate(); err != nil {
		return err
	}
	if c.path == PathGRPC {
		_, err := c.putGRPCReplicas(ctx, k, value, uint32(copies))
		return err
	}
	// The data channel carries the copy count (shared memory has no room
	// for it), so same-host clients use it here too.
	return c.withConn(ctx, func(d *dataConn) error {
		_, err := d.putReplicas(ctx, k, value, uint32(copies))
		return err
	})
}

func (c *Client) put(ctx context.Context, k BlockKey, value []byte) (PutResult, error) {
	if err := k.Validate(); err != nil {
		return PutResult{}, err
	}
	if len(value) == 0 {
		return PutResult{}, fmt.Errorf("%w: empty value", ErrInvalidArgument)
	}
	if max := c.info.GetMaxBlockBytes(); uint64(len(value)) > max {
		return PutResult{}, fmt.Errorf("%w: value of %d bytes exceeds the node's max block size of %d bytes", ErrInvalidArgument, len(value), max)
	}
	switch c.path {
	case PathShm:
		return c.shm.put(ctx, k, value)
	case PathGRPC:
		return c.putGRPC(ctx, k, value)
	}
	var res PutResult
	err := c.withConn(ctx, func(d *dataConn) (err error) {
		res, err = d.put(ctx, k, value)
		return err
	})
	return res, err
}

// isRemote reports whether err came from the node (the connection is
// fine) rather than from the connection.
func isRemote(err error) bool {
	var re *RemoteError
	return errors.As(err, &re)
}

// RecvChunkBytes is how much of a value a receiver (client Get, node Put)
// reads from the socket before checksumming it: small enough that the CRC
// finds the bytes in L1/L2 right after the kernel wrote them. Measured on
// 2 MiB values with one client (bench --rounds 3): 64 KiB gives 0.95× the
// raw-TCP baseline for Get and 1.07× for Put; 256 KiB gives 0.86–0.90×
// and 0.95×; 32 KiB costs too many syscalls (0.78–0.82× for Get).
const RecvChunkBytes = 64 << 10

func (d *dataConn) put(ctx context.Context, k BlockKey, value []byte) (PutResult, error) {
	return d.putReplicas(ctx, k, value, 0)
}

func (d *dataConn) putReplicas(ctx context.Context, k BlockKey, value []byte, replicas uint32) (PutResult, error) {
	defer d.bind(ctx)()
	r := keyRequest(wire.OpPut, k)
	r.Replicas = replicas
	r.Flags = wire.FlagChecksum
	r.ValueLen = uint64(len(value))
	d.buf = wire.AppendRequest(d.buf[:0], &r)
	// The checksum is needed only in the trailer, so for large values it
	// runs on another core while this one copies the value into the
	// socket: both read the value from cache at once instead of one after
	// the other (2 MiB puts, one client: +6-10% throughput).
	crc := checksumAsync(value)
	bufs := net.Buffers{d.buf, value}
	if _, err := bufs.WriteTo(d.c); err != nil {
		crc()
		return PutResult{}, ioError(ctx, "put", err)
	}
	if _, err := d.c.Write(wire.AppendTrailer(d.trailer[:0], crc())); err != nil {
		return PutResult{}, ioError(ctx, "put", err)
	}
	if err := d.readResponse(ctx, "put"); err != nil {
		return PutResult{}, err
	}
	return PutResult{Existed: d.resp.Flags&wire.FlagExisted != 0, CRC: d.resp.CRC}, nil
}

// asyncChecksumBytes is the size from which checksumAsync uses a helper
// goroutine: below it the handoff costs more than it hides.
const asyncChecksumBytes = 256 << 10

// checksumAsync starts the CRC-32C of b and returns a func that waits for
// it. b MUST NOT change until then.
func checksumAsync(b []byte) func() uint32 {
	if len(b) < asyncChecksumBytes {
		crc := Checksum(b)
		return func() uint32 { return crc }
	}
	ch := make(chan uint32, 1)
	go func() { ch <- Checksum(b) }()
	return func() uint32 { return <-ch }
}

// Get copies the block under k into dst and returns its length. The bytes
// are verified against the block's checksum (ErrDataLoss when they do not
// match). A dst shorter than the block gives ErrInvalidArgument and leaves
// dst unspecified. Other errors: ErrNotFound, ErrUnavailable.
func (c *Client) Get(ctx context.Context, k BlockKey, dst []byte) (int, error) {
	v, err := c.get(ctx, k, dst, false)
	return len(v), err
}

// GetValue returns the block under k in a new slice.
func (c *Client) GetValue(ctx context.Context, k BlockKey) ([]byte, error) {
	return c.get(ctx, k, nil, true)
}

func (c *Client) get(ctx context.Context, k BlockKey, dst []byte, alloc bool) ([]byte, error) {
	if err := k.Validate(); err != nil {
		return nil, err
	}
	switch c.path {
	case PathShm:
		return c.shm.get(ctx, k, dst, alloc, c.cfg.VerifySharedReads)
	case PathGRPC:
		return c.getGRPC(ctx, k, dst, alloc)
	}
	var v []byte
	err := c.withConn(ctx, func(d *dataConn) (err error) {
		v, err = d.get(ctx, k, dst, alloc)
		return err
	})
	return v, err
}

var errShortBuffer = fmt.Errorf("%w: buffer too small", ErrInvalidArgument)

func (d *dataConn) get(ctx context.Context, k BlockKey, dst []byte, alloc bool) ([]byte, error) {
	defer d.bind(ctx)()
	r := keyRequest(wire.OpGet, k)
	if err := d.request(&r); err != nil {
		return nil, ioError(ctx, "get", err)
	}
	if err := d.readResponse(ctx, "get"); err != nil {
		return nil, err
	}
	n := d.resp.ValueLen
	if alloc {
		if n > 1<<32 {
			return nil, ioError(ctx, "get", fmt.Errorf("node announced a %d-byte value", n))
		}
		dst = make([]byte, n)
	}
	if uint64(len(dst)) < n {
		// Keep the connection in step before reporting.
		if _, err := io.CopyN(io.Discard, d.br, int64(n)); err != nil {
			return nil, ioError(ctx, "get", err)
		}
		return nil, fmt.Errorf("%w: %d bytes for a %d-byte block", errShortBuffer, len(dst), n)
	}
	dst = dst[:n]
	var crc uint32
	for off := 0; off < len(dst); {
		k, err := d.br.Read(dst[off:min(off+RecvChunkBytes, len(dst))])
		crc = UpdateChecksum(crc, dst[off:off+k])
		off += k
		if err != nil && off < len(dst) {
			return nil, ioError(ctx, "get", err)
		}
	}
	if crc != d.resp.CRC {
		return nil, fmt.Errorf("%w: client: %s: received bytes have CRC %08x, the node stored %08x", ErrDataLoss, k, crc, d.resp.CRC)
	}
	return dst, nil
}

func (c *Client) putGRPC(ctx context.Context, k BlockKey, value []byte) (PutResult, error) {
	return c.putGRPCReplicas(ctx, k, value, 0)
}

func (c *Client) putGRPCReplicas(ctx context.Context, k BlockKey, value []byte, replicas uint32) (PutResult, error) {
	stream, err := c.rpc.Put(ctx)
	if err != nil {
		return PutResult{}, FromStatus(err)
	}
	crc := Checksum(value)
	hdr := &kvpoolv1.PutHeader{Key: &kvpoolv1.BlockKey{Tenant: k.Tenant, Namespace: k.Namespace, Key: k.Key}, SizeBytes: uint64(len(value)), Crc32C: &crc, Replicas: replicas}
	if err := stream.Send(&kvpoolv1.PutRequest{Msg: &kvpoolv1.PutRequest_Header{Header: hdr}}); err != nil {
		_, err = stream.CloseAndRecv()
		return PutResult{}, FromStatus(err)
	}
	for off := 0; off < len(value); off += 1 << 20 {
		chunk := value[off:min(off+1<<20, len(value))]
		if err := stream.Send(&kvpoolv1.PutRequest{Msg: &kvpoolv1.PutRequest_Chunk{Chunk: chunk}}); err != nil {
			break // the real error comes from CloseAndRecv
		}
	}
	resp, err := stream.CloseAndRecv()
	if err != nil {
		return PutResult{}, FromStatus(err)
	}
	return PutResult{Existed: resp.GetExisted(), CRC: resp.GetCrc32C()}, nil
}

func (c *Client) getGRPC(ctx context.Context, k BlockKey, dst []byte, alloc bool) ([]byte, error) {
	return c.getGRPCLease(ctx, k, dst, alloc, 0, false)
}

// getGRPCLease is getGRPC that also asks for a read lease of leaseMs
// (the node's default when 0 and lease is set).
func (c *Client) getGRPCLease(ctx context.Context, k BlockKey, dst []byte, alloc bool, leaseMs uint32, lease bool) ([]byte, error) {
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	stream, err := c.rpc.Get(ctx, &kvpoolv1.GetRequest{Key: &kvpoolv1.BlockKey{Tenant: k.Tenant, Namespace: k.Namespace, Key: k.Key}, LeaseMs: leaseMs, Lease: lease})
	if err != nil {
		return nil, FromStatus(err)
	}
	first, err := stream.Recv()
	if err != nil {
		return nil, FromStatus(err)
	}
	info := first.GetInfo()
	if info == nil {
		return nil, fmt.Errorf("%w: client: get stream did not start with block info", ErrInternal)
	}
	n := info.GetSizeBytes()
	if alloc {
		dst = make([]byte, n)
	}
	if uint64(len(dst)) < n {
		return nil, fmt.Errorf("%w: %d bytes for a %d-byte block", errShortBuffer, len(dst), n)
	}
	dst = dst[:n]
	off := 0
	for {
		m, err := stream.Recv()
		if err == io.EOF {
			break
		}
		if err != nil {
			return nil, FromStatus(err)
		}
		chunk := m.GetChunk()
		if len(chunk) > len(dst)-off {
			return nil, fmt.Errorf("%w: client: get stream longer than its %d-byte block", ErrDataLoss, n)
		}
		off += copy(dst[off:], chunk)
	}
	if off != len(dst) {
		return nil, fmt.Errorf("%w: client: get stream carried %d of %d bytes", ErrDataLoss, off, n)
	}
	if crc := Checksum(dst); crc != info.GetCrc32C() {
		return nil, fmt.Errorf("%w: client: %s: received bytes have CRC %08x, the node stored %08x", ErrDataLoss, k, crc, info.GetCrc32C())
	}
	return dst, nil
}

// Remove deletes the block under k. Errors: ErrNotFound,
// ErrInvalidArgument, ErrUnavailable.
func (c *Client) Remove(ctx context.Context, k BlockKey) error {
	if err := k.Validate(); err != nil {
		return err
	}
	if c.path == PathGRPC {
		_, err := c.rpc.Remove(ctx, &kvpoolv1.RemoveRequest{Key: &kvpoolv1.BlockKey{Tenant: k.Tenant, Namespace: k.Namespace, Key: k.Key}})
		return FromStatus(err)
	}
	return c.withConn(ctx, func(d *dataConn) error { return d.simple(ctx, keyRequest(wire.OpRemove, k)) })
}

// RemoveMany deletes the blocks under keys and returns how many it
// removed; keys the node does not hold are skipped. On the data channel
// the removals are pipelined: one round trip per 256 keys.
func (c *Client) RemoveMany(ctx context.Context, tenant, namespace string, keys [][]byte) (int, error) {
	removed := 0
	for _, k := range keys {
		if err := (BlockKey{Tenant: tenant, Namespace: namespace, Key: k}).Validate(); err != nil {
			return 0, err
		}
	}
	if c.path == PathGRPC {
		for _, k := range keys {
			err := c.Remove(ctx, BlockKey{Tenant: tenant, Namespace: namespace, Key: k})
			switch {
			case err == nil:
				removed++
			case !errors.Is(err, ErrNotFound):
				return removed, err
			}
		}
		return removed, nil
	}
	const window = 256
	for len(keys) > 0 {
		batch := keys[:min(window, len(keys))]
		keys = keys[len(batch):]
		err := c.withConn(ctx, func(d *dataConn) error {
			defer d.bind(ctx)()
			d.buf = d.buf[:0]
			for _, k := range batch {
				r := wire.Request{Op: wire.OpRemove, Tenant: []byte(tenant), Namespace: []byte(namespace), Key: k}
				d.buf = wire.AppendRequest(d.buf, &r)
			}
			if _, err := d.c.Write(d.buf); err != nil {
				return ioError(ctx, "remove", err)
			}
			var first error
			for range batch {
				err := d.readResponse(ctx, "remove")
				switch {
				case err == nil:
					removed++
				case isRemote(err):
					if !errors.Is(err, ErrNotFound) && first == nil {
						first = err
					}
				default:
					return err // the connection is broken
				}
			}
			return first
		})
		if err != nil {
			return removed, err
		}
	}
	return removed, nil
}

// simple sends a request without a value and reads a response without one.
func (d *dataConn) simple(ctx context.Context, r wire.Request) error {
	defer d.bind(ctx)()
	if err := d.request(&r); err != nil {
		return ioError(ctx, r.Op.String(), err)
	}
	return d.readResponse(ctx, r.Op.String())
}

// FetchResult says where one block of a Fetch came from.
type FetchResult struct {
	// Source is the node the block was pulled from; "" if it was local.
	Source string
	Size   int64
	Err    error
}

// Fetch asks the node to make the blocks under keys local, pulling each
// one it lacks from the best node holding it; then Get serves them from
// here. timeout bounds one holder's transfer (0: the node's default). The
// error is for the whole call; per-key outcomes are in the results.
func (c *Client) Fetch(ctx context.Context, tenant, namespace string, keys [][]byte, timeout time.Duration) ([]FetchResult, error) {
	resp, err := c.rpc.Fetch(ctx, &kvpoolv1.FetchRequest{Tenant: tenant, Namespace: namespace, Keys: keys, TimeoutMs: uint32(timeout / time.Millisecond)})
	if err != nil {
		return nil, FromStatus(err)
	}
	out := make([]FetchResult, len(resp.GetResults()))
	for i, r := range resp.GetResults() {
		out[i] = FetchResult{Source: r.GetSourceNode(), Size: int64(r.GetSizeBytes()), Err: FromCode(codes.Code(r.GetStatus().GetCode()), r.GetStatus().GetMessage())}
	}
	return out, nil
}

// Locate returns how many leading keys of chain the node holds.
func (c *Client) Locate(ctx context.Context, tenant, namespace string, chain [][]byte) (int, error) {
	resp, err := c.rpc.Locate(ctx, &kvpoolv1.LocateRequest{Tenant: tenant, Namespace: namespace, Keys: chain})
	if err != nil {
		return 0, FromStatus(err)
	}
	return int(resp.GetPrefixBlocks()), nil
}

// Exists reports for each key whether the node holds it.
func (c *Client) Exists(ctx context.Context, tenant, namespace string, keys [][]byte) ([]bool, error) {
	resp, err := c.rpc.Exists(ctx, &kvpoolv1.ExistsRequest{Tenant: tenant, Namespace: namespace, Keys: keys})
	if err != nil {
		return nil, FromStatus(err)
	}
	return resp.GetExists(), nil
}

// Stats returns the node's usage.
func (c *Client) Stats(ctx context.Context) (*kvpoolv1.StatsResponse, error) {
	resp, err := c.rpc.Stats(ctx, &kvpoolv1.StatsRequest{})
	return resp, FromStatus(err)
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
