package pool

import (
	"context"
	"errors"
	"fmt"
	"net"
	"time"

	"golang.org/x/sys/unix"
	"google.golang.org/grpc/codes"

	"github.com/kvpool/kvpool/api"
	"github.com/kvpool/kvpool/api/wire"
)

// Same-host clients connect to the node's unix socket, receive the segment's
// file descriptor with the Hello, map it, and from then on move block bytes
// themselves: only metadata (view, release, reserve, commit) goes over the
// socket. The socket also serves the ordinary Get and Put frames.
//
// Trust: a client that maps the segment can write anywhere in it, as with
// any shared-memory cache (CUDA IPC, Mooncake, LMCache). The socket's file
// permissions decide who may connect. What a session holds (pins and
// reservations) is released when its connection closes, so a client that
// dies leaks nothing.

func newSession() *shmSession {
	return &shmSession{pins: map[uint64]int{}, res: map[uint64]*Reservation{}}
}

// shmSession is what one connection holds: pins and reservations taken
// by a same-host client over the unix socket, or by a peer node pulling or
// pushing blocks over TCP.
type shmSession struct {
	pins map[uint64]int          // pin handle -> times held
	res  map[uint64]*Reservation // open reservations by handle
}

func (s *shmSession) end(st *Store) {
	for h, k := range s.pins {
		for range k {
			st.ReleaseHandle(h)
		}
	}
	for _, r := range s.res {
		st.Abort(r)
	}
	s.pins, s.res = nil, nil
}

func (n *Node) acceptShm(ctx context.Context) error {
	for {
		c, err := n.shmLis.AcceptUnix()
		if err != nil {
			if ctx.Err() != nil || errors.Is(err, net.ErrClosed) {
				return nil
			}
			return err
		}
		if !n.track(c) {
			c.Close()
			return nil
		}
		n.wg.Go(func() {
			defer n.untrack(c)
			defer c.Close()
			if err := n.sendHello(c); err != nil {
				n.log.Warn("shm hello failed", "err", err)
				return
			}
			n.serveData(ctx, c, newSession())
		})
	}
}

func (n *Node) sendHello(c *net.UnixConn) error {
	hello := wire.AppendHello(nil, &wire.Hello{SegmentBytes: uint64(len(n.seg.mem)), PageBytes: uint32(n.cfg.PageBytes),
		VersionWords: uint64(len(n.store.versions)), NodeID: n.cfg.NodeID})
	c.SetWriteDeadline(time.Now().Add(n.cfg.IOTimeout))
	_, _, err := c.WriteMsgUnix(hello, unix.UnixRights(int(n.seg.file.Fd()), int(n.versions.file.Fd())), nil)
	c.SetWriteDeadline(time.Time{})
	return err
}

// shmOp serves the shared-memory ops of a unix-socket session.
func (d *dataConn) shmOp() error {
	r, st, sess := &d.req, d.n.store, d.sess
	switch r.Op {
	case wire.OpView:
		pin, err := st.Acquire(r.Tenant, r.Namespace, r.Key)
		d.n.metrics.dataOp(r.Op, api.Code(err))
		if err != nil {
			return d.respondErr(err)
		}
		sess.pins[pin.Handle()]++
		return d.respond(nil, &wire.Response{CRC: pin.CRC, ValueLen: uint64(len(pin.Mem)), Offset: uint64(pin.Offset), Handle: pin.Handle()})
	case wire.OpRelease:
		if sess.pins[r.Handle] == 0 {
			d.n.metrics.dataOp(r.Op, codes.InvalidArgument)
			return fmt.Errorf("release of pin %#x that this session does not hold", r.Handle)
		}
		if sess.pins[r.Handle]--; sess.pins[r.Handle] == 0 {
			delete(sess.pins, r.Handle)
		}
		err := st.ReleaseHandle(r.Handle)
		d.n.metrics.dataOp(r.Op, api.Code(err))
		return err
	case wire.OpReserve:
		res, err := st.Reserve(r.Tenant, r.Namespace, r.Key, int64(min(r.ValueLen, 1<<62)), false)
		d.n.metrics.dataOp(r.Op, api.Code(err))
		if err != nil {
			return d.respondErr(err)
		}
		sess.res[res.Handle()] = res
		return d.respond(nil, &wire.Response{ValueLen: r.ValueLen, Offset: uint64(res.Offset(st.pageShift)), Handle: res.Handle()})
	case wire.OpCommit:
		res, ok := sess.res[r.Handle]
		if !ok {
			d.n.metrics.dataOp(r.Op, codes.FailedPrecondition)
			return d.respondErr(api.Errorf(api.ErrFailedPrecondition, "pool: no open reservation %d in this session", r.Handle))
		}
		delete(sess.res, r.Handle)
		cr, err := st.Commit(res, 0, false, r.CRC, r.Flags&wire.FlagChecksum != 0)
		d.n.metrics.dataOp(r.Op, api.Code(err))
		resp := &wire.Response{CRC: cr.CRC, ValueLen: uint64(res.Size())}
		if cr.Existed {
			resp.Flags = wire.FlagExisted
		}
		return d.respond(err, resp)
	case wire.OpAbort:
		if res, ok := sess.res[r.Handle]; ok {
			delete(sess.res, r.Handle)
			st.Abort(res)
		}
		d.n.metrics.dataOp(r.Op, codes.OK)
		return nil
	}
	return fmt.Errorf("unhandled op %v", r.Op)
}
