package pool

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"time"

	"google.golang.org/grpc/codes"

	"github.com/kvpool/kvpool/api"
	"github.com/kvpool/kvpool/api/wire"
)

// recvChunkBytes is how much of a value is read from the socket before it
// is checksummed; see api.RecvChunkBytes.
const recvChunkBytes = api.RecvChunkBytes

// sourceBuf is what OpSource sends: the link baseline does not care about
// the bytes, only that they are not copied from anywhere first.
var sourceBuf = make([]byte, 4<<20)

// dataConn is the server side of one data connection. sess holds the
// pins and reservations the connection takes (view, reserve): a same-host
// client's over the unix socket, a peer node's over TCP.
type dataConn struct {
	ctx  context.Context
	n    *Node
	c    net.Conn
	br   *bufio.Reader
	req  wire.Request
	rbuf [wire.RequestBufferBytes]byte
	hdr  []byte
	sess *shmSession
	junk []byte // scratch for discarded bytes, allocated on first use
}

// discard reads and drops n bytes in large reads.
func (d *dataConn) discard(n uint64) error {
	if d.junk == nil {
		d.junk = make([]byte, 256<<10)
	}
	for n > 0 {
		k, err := d.br.Read(d.junk[:min(n, uint64(len(d.junk)))])
		n -= uint64(k)
		if err != nil {
			if err == io.EOF && n > 0 {
				err = io.ErrUnexpectedEOF
			}
			if n > 0 {
				return err
			}
		}
	}
	return nil
}

// serveData runs one data connection until the peer closes it, a frame is
// malformed, or the node shuts down.
func (n *Node) serveData(ctx context.Context, c net.Conn, sess *shmSession) {
	d := &dataConn{ctx: ctx, n: n, c: c, br: bufio.NewReaderSize(c, 64<<10), hdr: make([]byte, 0, wire.ResponseHeaderBytes+wire.MaxMessageBytes), sess: sess}
	if sess != nil {
		defer sess.end(n.store)
	}
	for ctx.Err() == nil {
		c.SetReadDeadline(time.Now().Add(n.cfg.IdleTimeout))
		err := wire.ReadRequest(d.br, d.rbuf[:], &d.req)
		if err != nil {
			if errors.Is(err, wire.ErrProtocol) {
				n.metrics.dataOp(wire.Op(0), codes.InvalidArgument)
				d.respondClose(api.Errorf(api.ErrInvalidArgument, "%v", err))
				n.log.Warn("closing data connection after a malformed frame", "remote", remote(c), "err", err)
			} else if !errors.Is(err, io.EOF) && !errors.Is(err, net.ErrClosed) && !errors.Is(err, os.ErrDeadlineExceeded) {
				n.log.Debug("data connection ended", "remote", remote(c), "err", err)
			}
			return
		}
		c.SetDeadline(time.Now().Add(n.cfg.IOTimeout))
		if err := d.handle(); err != nil {
			// The stream is out of step (bad trailer, short read, failed
			// write): it cannot carry another frame.
			if !errors.Is(err, io.ErrUnexpectedEOF) && !errors.Is(err, net.ErrClosed) {
				n.log.Warn("closing data connection", "remote", remote(c), "op", d.req.Op.String(), "err", err)
			}
			return
		}
	}
}

func remote(c net.Conn) string {
	if a := c.RemoteAddr(); a != nil && a.String() != "" {
		return a.String()
	}
	return "unix"
}

// handle serves d.req. A returned error means the connection must close.
func (d *dataConn) handle() error {
	r := &d.req
	switch r.Op {
	case wire.OpGet:
		return d.get()
	case wire.OpPut:
		return d.put()
	case wire.OpRemove:
		err := d.n.store.Remove(r.Tenant, r.Namespace, r.Key)
		d.n.metrics.dataOp(r.Op, api.Code(err))
		return d.respond(err, &wire.Response{})
	case wire.OpSource:
		return d.source()
	case wire.OpSink:
		return d.sink()
	default:
		return d.shmOp()
	}
}

func (d *dataConn) respond(err error, resp *wire.Response) error {
	if err != nil {
		return d.respondErr(err)
	}
	d.hdr = wire.AppendResponse(d.hdr[:0], resp)
	_, werr := d.c.Write(d.hdr)
	return werr
}

func (d *dataConn) respondErr(err error) error {
	return d.respondErrFlags(err, 0)
}

// respondClose reports err and tells the client the connection ends here.
func (d *dataConn) respondClose(err error) {
	d.respondErrFlags(err, wire.FlagClose)
}

func (d *dataConn) respondErrFlags(err error, flags uint8) error {
	d.hdr = wire.AppendResponse(d.hdr[:0], &wire.Response{Status: uint8(api.Code(err)), Flags: flags, Message: err.Error()})
	_, werr := d.c.Write(d.hdr)
	return werr
}

func (d *dataConn) get() error {
	pin, err := d.n.store.Acquire(d.req.Tenant, d.req.Namespace, d.req.Key)
	d.n.metrics.dataOp(wire.OpGet, api.Code(err))
	if err != nil {
		return d.respondErr(err)
	}
	defer d.n.store.Release(pin)
	d.hdr = wire.AppendResponse(d.hdr[:0], &wire.Response{CRC: pin.CRC, ValueLen: uint64(len(pin.Mem))})
	// One writev: header and value straight from the arena.
	bufs := net.Buffers{d.hdr, pin.Mem}
	_, err = bufs.WriteTo(d.c)
	d.n.metrics.bytesSent.Add(float64(len(pin.Mem)))
	return err
}

// put reads a value into a reservation, checksumming each chunk while it is
// still in cache, checks the trailer and commits.
func (d *dataConn) put() error {
	r := &d.req
	size := r.ValueLen
	if err := d.n.store.ValidateSize(int64(min(size, 1<<62))); err != nil {
		// A size we refuse: we cannot skip a body we will not read.
		d.n.metrics.dataOp(wire.OpPut, codes.InvalidArgument)
		d.respondClose(err)
		return fmt.Errorf("refused a %d-byte put: %w", size, err)
	}
	res, err := d.n.store.Reserve(r.Tenant, r.Namespace, r.Key, int64(size), true)
	if err != nil {
		// Keep the stream in step: read and drop the value and trailer.
		if derr := d.discard(size + wire.TrailerBytes); derr != nil {
			return derr
		}
		d.n.metrics.dataOp(wire.OpPut, api.Code(err))
		return d.respondErr(err)
	}
	committed := false
	defer func() {
		if !committed {
			d.n.store.Abort(res)
		}
	}()
	crc, err := readCRC(d.br, res.Bytes())
	if err != nil {
		d.n.metrics.dataOp(wire.OpPut, codes.Canceled)
		return fmt.Errorf("value ended early: %w", err)
	}
	d.n.metrics.bytesReceived.Add(float64(size))
	var t [wire.TrailerBytes]byte
	if _, err := io.ReadFull(d.br, t[:]); err != nil {
		return fmt.Errorf("trailer: %w", err)
	}
	want, err := wire.DecodeTrailer(t[:])
	if err != nil {
		d.n.metrics.dataOp(wire.OpPut, codes.InvalidArgument)
		d.respondClose(api.Errorf(api.ErrInvalidArgument, "%v", err))
		return err
	}
	committed = true
	cr, err := d.n.store.Commit(res, crc, true, want, r.Flags&wire.FlagChecksum != 0)
	if err == nil && r.Replicas > 1 {
		// Placing copies can take a while; the connection's I/O deadline
		// must not cut the response short.
		d.c.SetDeadline(time.Time{})
		_, err = d.n.replicate(d.ctx, r.Tenant, r.Namespace, r.Key, int(r.Replicas))
	}
	d.n.metrics.dataOp(wire.OpPut, api.Code(err))
	resp := &wire.Response{CRC: cr.CRC}
	if cr.Existed {
		resp.Flags = wire.FlagExisted
	}
	return d.respond(err, resp)
}

// readCRC fills dst from r and returns the CRC-32C of what it read.
func readCRC(r io.Reader, dst []byte) (uint32, error) {
	var crc uint32
	for off := 0; off < len(dst); {
		end := min(off+recvChunkBytes, len(dst))
		k, err := r.Read(dst[off:end])
		crc = api.UpdateChecksum(crc, dst[off:off+k])
		off += k
		if err != nil {
			if off == len(dst) && err == io.EOF {
				break
			}
			if err == io.EOF {
				err = io.ErrUnexpectedEOF
			}
			return 0, err
		}
	}
	return crc, nil
}

func (d *dataConn) source() error {
	size := d.req.ValueLen
	if size > 1<<40 {
		d.respondClose(api.Errorf(api.ErrInvalidArgument, "pool: source of %d bytes", size))
		return errors.New("oversized source")
	}
	d.n.metrics.dataOp(wire.OpSource, codes.OK)
	d.hdr = wire.AppendResponse(d.hdr[:0], &wire.Response{ValueLen: size})
	if _, err := d.c.Write(d.hdr); err != nil {
		return err
	}
	for size > 0 {
		k := min(size, uint64(len(sourceBuf)))
		if _, err := d.c.Write(sourceBuf[:k]); err != nil {
			return err
		}
		size -= k
	}
	return nil
}

func (d *dataConn) sink() error {
	if err := d.discard(d.req.ValueLen); err != nil {
		return err
	}
	d.n.metrics.dataOp(wire.OpSink, codes.OK)
	return d.respond(nil, &wire.Response{})
}
