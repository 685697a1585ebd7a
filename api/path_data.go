package api

import (
	"context"
	"errors"
	"fmt"
	"io"
	"math"
	"time"

	"google.golang.org/grpc/codes"

	"github.com/kvpool/kvpool/api/wire"
)

// dataPath moves bytes over the framed TCP data channel (api/wire): each
// call takes a pooled connection, so calls run in parallel up to the pool's
// size, and the value is written from the caller's memory and read into
// it, one copy per side, as raw TCP.
type dataPath struct {
	server string
	conns  *wire.Pool
}

// newDataPath dials connections with wc (errors, spinning) and cfg's
// credentials.
func newDataPath(cfg ClientConfig, wc wire.ConnConfig) *dataPath {
	return &dataPath{server: cfg.Server, conns: &wire.Pool{
		MaxIdle: cfg.MaxIdleConns,
		Dial: func(ctx context.Context, addr string) (*wire.Conn, error) {
			ctx, cancel := context.WithTimeout(ctx, cfg.DialTimeout)
			defer cancel()
			wc := wc
			wc.TLS, wc.Token, wc.Congestion = cfg.TLS, cfg.Token, cfg.TCPCongestion
			c, err := wire.Dial(ctx, addr, wc)
			if err != nil {
				return nil, fmt.Errorf("%w: client: data channel to %s: %v", ErrUnavailable, addr, err)
			}
			return c, nil
		},
	}}
}

func (p *dataPath) close() error {
	p.conns.Close()
	return nil
}

// withConn runs op on a pooled connection. A connection that failed (an
// I/O error, or the node announced it closes it) is dropped. An I/O error
// on a reused idle connection is retried once on a fresh one: the node may
// have closed it while it sat idle, and every data op is idempotent
// (blocks are immutable, so a repeated put reports Existed).
func (p *dataPath) withConn(ctx context.Context, op func(*wire.Conn) error) error {
	for attempt := 0; ; attempt++ {
		c, reused, err := p.conns.Get(ctx, p.server)
		if errors.Is(err, wire.ErrPoolClosed) {
			return fmt.Errorf("%w: client is closed", ErrUnavailable)
		}
		if err != nil {
			return err
		}
		err = op(c)
		p.conns.Put(p.server, c)
		if err == nil || isRemote(err) || errors.Is(err, errShortBuffer) || !reused || attempt > 0 || ctx.Err() != nil {
			return err
		}
	}
}

func (p *dataPath) put(ctx context.Context, k BlockKey, value []byte, copies uint32) (PutResult, error) {
	var res PutResult
	err := p.withConn(ctx, func(c *wire.Conn) (err error) {
		res, err = putOver(ctx, c, k, value, copies)
		return err
	})
	return res, err
}

// putMany pipelines the puts on one connection, a window at a time: every
// frame of the window goes out back to back and the responses are read
// after, so the link never idles waiting for one block's commit before
// the next block's bytes. (The node reads and drops the value of a put it
// refuses, so the stream stays in step.)
func (p *dataPath) putMany(ctx context.Context, tenant, namespace string, keys, values [][]byte) ([]error, error) {
	errs := make([]error, len(keys))
	for off := 0; off < len(keys); off += putWindowBlocks {
		end := min(off+putWindowBlocks, len(keys))
		err := p.withConn(ctx, func(c *wire.Conn) error {
			return putManyOver(ctx, c, []byte(tenant), []byte(namespace), keys[off:end], values[off:end], errs[off:end])
		})
		if err != nil {
			return errs, err
		}
	}
	return errs, nil
}

func putManyOver(ctx context.Context, c *wire.Conn, tenant, namespace []byte, keys, values [][]byte, errs []error) error {
	defer c.Bind(ctx)()
	for i, k := range keys {
		c.Queue(&wire.Request{Op: wire.OpPut, Flags: wire.FlagChecksum, ValueLen: uint64(len(values[i])), Tenant: tenant, Namespace: namespace, Key: k})
		crc := checksumAsync(values[i]) // beside the socket copy, as putOver's
		if err := c.Flush(values[i]); err != nil {
			crc()
			return ioError(ctx, "put", err)
		}
		c.QueueTrailer(crc()) // goes out with the next frame
	}
	if err := c.Flush(nil); err != nil {
		return ioError(ctx, "put", err)
	}
	for i := range keys {
		_, err := recv(ctx, c, "put")
		if err != nil && !isRemote(err) {
			return err
		}
		errs[i] = err
	}
	return nil
}

// putOver sends a Put frame on c: header and value in one write, then the
// trailer with the value's checksum.
func putOver(ctx context.Context, c *wire.Conn, k BlockKey, value []byte, copies uint32) (PutResult, error) {
	defer c.Bind(ctx)()
	r := keyRequest(wire.OpPut, k)
	r.Replicas, r.Flags, r.ValueLen = copies, wire.FlagChecksum, uint64(len(value))
	c.Queue(&r)
	// The checksum is needed only in the trailer, so for large values it
	// runs on another core while this one copies the value into the
	// socket: both read the value from cache at once instead of one after
	// the other (2 MiB puts, one client: +6-10% throughput).
	crc := checksumAsync(value)
	if err := c.Flush(value); err != nil {
		crc()
		return PutResult{}, ioError(ctx, "put", err)
	}
	c.QueueTrailer(crc())
	if err := c.Flush(nil); err != nil {
		return PutResult{}, ioError(ctx, "put", err)
	}
	resp, err := recv(ctx, c, "put")
	if err != nil {
		return PutResult{}, err
	}
	return PutResult{Existed: resp.Flags&wire.FlagExisted != 0, CRC: resp.CRC}, nil
}

// recv reads a response, classifying a broken stream as an I/O error.
func recv(ctx context.Context, c *wire.Conn, what string) (*wire.Response, error) {
	resp, err := c.Recv()
	if err != nil && resp == nil {
		return nil, ioError(ctx, what, err)
	}
	return resp, err
}

func (p *dataPath) get(ctx context.Context, k BlockKey, dst []byte, l lease) ([]byte, error) {
	v, _, err := p.read(ctx, k, dst, l)
	return v, err
}

// read is get that also returns the value's checksum, verified against
// the node's.
func (p *dataPath) read(ctx context.Context, k BlockKey, dst []byte, l lease) ([]byte, uint32, error) {
	var v []byte
	var crc uint32
	err := p.withConn(ctx, func(c *wire.Conn) (err error) {
		defer c.Bind(ctx)()
		r := keyRequest(wire.OpGet, k)
		if l.on {
			r.Flags, r.LeaseMs = wire.FlagLease, l.ms
		}
		c.Queue(&r)
		if err := c.Flush(nil); err != nil {
			return ioError(ctx, "get", err)
		}
		resp, err := recv(ctx, c, "get")
		if err != nil {
			return err
		}
		n := resp.ValueLen
		want := resp.CRC
		if dst == nil {
			if n > 1<<32 {
				c.Break()
				return ioError(ctx, "get", fmt.Errorf("node announced a %d-byte value", n))
			}
			dst = make([]byte, n)
		}
		if uint64(len(dst)) < n {
			// Keep the connection in step before reporting.
			if err := c.Discard(n); err != nil {
				return ioError(ctx, "get", err)
			}
			return shortBuffer(len(dst), n)
		}
		if crc, err = ReadChecksummed(c, dst[:n]); err != nil {
			return ioError(ctx, "get", err)
		}
		if crc != want {
			return fmt.Errorf("%w: client: %s: received bytes have CRC %08x, the node stored %08x", ErrDataLoss, k, crc, want)
		}
		v = dst[:n]
		return nil
	})
	return v, crc, err
}

func (p *dataPath) view(ctx context.Context, k BlockKey, l lease) (*View, error) {
	return copyView(p.read(ctx, k, nil, l))
}

// copyView is a View of a copy, for paths without shared memory; crc was
// verified while the copy was received.
func copyView(v []byte, crc uint32, err error) (*View, error) {
	if err != nil {
		return nil, err
	}
	return &View{mem: v, crc: crc}, nil
}

func (p *dataPath) reserve(_ context.Context, k BlockKey, size int) (*Reservation, error) {
	return &Reservation{path: p, k: k, mem: make([]byte, size)}, nil
}

func (p *dataPath) remove(ctx context.Context, tenant, namespace string, keys [][]byte, force bool) ([]error, error) {
	errs := make([]error, len(keys))
	for off := 0; off < len(keys); off += removeWindow {
		end := min(off+removeWindow, len(keys))
		if err := p.withConn(ctx, func(c *wire.Conn) error {
			return removeOver(ctx, c, tenant, namespace, keys[off:end], force, errs[off:end])
		}); err != nil {
			return errs, err
		}
	}
	return errs, nil
}

// fetch makes the chain's blocks local on the node with one Fetch frame
// (see wire/fetch.go): what Client.Fetch does over gRPC, without a
// call's overhead.
// overhead is what the client's previous Fetch cost beyond the node's
// fetch (0: unknown), which the frame reports to the node.
func (p *dataPath) fetch(ctx context.Context, tenant, namespace string, keys [][]byte, timeout time.Duration, report fetchReport) ([]FetchResult, error) {
	if err := ValidateChain(tenant, namespace, keys); err != nil {
		return nil, err
	}
	var out []FetchResult
	err := p.withConn(ctx, func(c *wire.Conn) (err error) {
		out, err = fetchOver(ctx, c, tenant, namespace, keys, timeout, report)
		return err
	})
	return out, err
}

// FetchOver sends one Fetch frame on c, a data-channel connection to a
// node, and reads the node's result for each key; timeout bounds the
// node's pulls (0: its default). It is the data path's Client.Fetch, for
// callers that hold their own connections: a draining node asks its
// peers to pull its blocks with it. The error is the connection's (c is
// then broken) or a malformed answer's; each key's outcome is its
// result's Err.
func FetchOver(ctx context.Context, c *wire.Conn, tenant, namespace string, keys [][]byte, timeout time.Duration) ([]FetchResult, error) {
	return fetchOver(ctx, c, tenant, namespace, keys, timeout, 0)
}

// fetchOver is FetchOver reporting what the caller's previous Fetch cost
// beyond the node's fetch, and its length (0: unknown).
func fetchOver(ctx context.Context, c *wire.Conn, tenant, namespace string, keys [][]byte, timeout time.Duration, report fetchReport) ([]FetchResult, error) {
	chain := wire.AppendChain(nil, keys)
	defer c.Bind(ctx)()
	c.Queue(&wire.Request{Op: wire.OpFetch, Tenant: []byte(tenant), Namespace: []byte(namespace),
		ValueLen: uint64(len(chain)), TimeoutMs: uint32(min(timeout/time.Millisecond, math.MaxUint32)),
		CallOverheadUs: report.overheadUs(), PreviousCallBlocks: report.blocks()})
	if err := c.Flush(chain); err != nil {
		return nil, ioError(ctx, "fetch", err)
	}
	resp, err := recv(ctx, c, "fetch")
	if err != nil {
		return nil, err
	}
	if limit := wire.MaxFetchResultsBytes(len(keys)); resp.ValueLen > limit {
		c.Break()
		return nil, ioError(ctx, "fetch", fmt.Errorf("node announced %d bytes of results for %d keys, more than %d", resp.ValueLen, len(keys), limit))
	}
	body := make([]byte, resp.ValueLen)
	if _, err := io.ReadFull(c, body); err != nil {
		return nil, ioError(ctx, "fetch", err)
	}
	rs, err := wire.DecodeFetchResults(body, len(keys))
	if err != nil {
		return nil, fmt.Errorf("%w: client: fetch: %v", ErrInternal, err)
	}
	out := make([]FetchResult, len(rs))
	for i, r := range rs {
		out[i] = FetchResult{Source: r.Source, Size: int64(min(r.Size, math.MaxInt64)), Took: r.Took,
			Err: FromCode(codes.Code(r.Status), r.Message)}
	}
	return out, nil
}

// removeWindow is how many removals one write pipelines.
const removeWindow = 256

// removeOver pipelines removals of keys on c and stores each key's outcome
// in errs. The error is the connection's.
func removeOver(ctx context.Context, c *wire.Conn, tenant, namespace string, keys [][]byte, force bool, errs []error) error {
	defer c.Bind(ctx)()
	for _, k := range keys {
		r := wire.Request{Op: wire.OpRemove, Tenant: []byte(tenant), Namespace: []byte(namespace), Key: k}
		if force {
			r.Flags = wire.FlagForce
		}
		c.Queue(&r)
	}
	if err := c.Flush(nil); err != nil {
		return ioError(ctx, "remove", err)
	}
	for i := range keys {
		_, err := recv(ctx, c, "remove")
		if err != nil && !isRemote(err) {
			return err
		}
		errs[i] = err
	}
	return nil
}
