package pool

import (
	"errors"
	"fmt"
	"net"
	"time"

	"golang.org/x/sys/unix"

	"github.com/kvpool/kvpool/api"
	"github.com/kvpool/kvpool/api/wire"
)

// openMailbox maps the mailbox a same-host client sent with OpMailbox
// (see wire.Mailbox) and has the session's reader watch it. The memfd
// must be exactly wire.MailboxBytes and sealed against shrinking: a
// client that truncated it under the node's mapping would make the
// node's next look at it fault. When the client is this process, the
// session is registered for it to serve its own posts (wire.LocalServer),
// and token, the answer's Handle, finds it; 0 otherwise.
func (d *dataConn) openMailbox() (token uint64, err error) {
	if d.sr == nil {
		return 0, api.Errorf(api.ErrInvalidArgument, "pool: a mailbox is for same-host sessions on the shm socket")
	}
	fds := d.sr.TakeDescriptors()
	defer func() {
		for _, fd := range fds {
			unix.Close(fd)
		}
	}()
	switch {
	case len(fds) != 1:
		return 0, api.Errorf(api.ErrInvalidArgument, "pool: a mailbox frame must carry one descriptor, it carried %d", len(fds))
	case d.mbox != nil:
		return 0, api.Errorf(api.ErrFailedPrecondition, "pool: this session has a mailbox already")
	case d.req.Flags&wire.FlagServeLocally != 0 && !wire.PeerIsThisProcess(d.c.(*net.UnixConn)):
		return 0, api.Errorf(api.ErrInvalidArgument, "pool: only a client in the node's own process may serve its mailbox's posts")
	}
	mem, err := mapMailbox(fds[0])
	if err != nil {
		return 0, api.Errorf(api.ErrInvalidArgument, "pool: mailbox: %v", err)
	}
	mb, err := wire.NewMailbox(mem)
	if err != nil {
		unix.Munmap(mem)
		return 0, api.Errorf(api.ErrInvalidArgument, "pool: mailbox: %v", err)
	}
	d.mbox, d.mboxMem, d.mreq = mb, mem, make([]byte, wire.MailboxRequestBytes)
	d.sr.Watch(mb)
	if d.req.Flags&wire.FlagServeLocally != 0 {
		token, d.unregister = wire.RegisterLocal(localSession{d})
		d.sr.ServeLocally()
	} else if d.s.sweeper != nil {
		d.swept = true
		d.s.sweeper.add(d)
	}
	return token, nil
}

// postServer is who serves a mailbox's post, as the metrics count it.
type postServer int

const (
	servedByReader  postServer = iota // the session's goroutine in the node
	servedByClient                    // a client in the node's process (localSession)
	servedBySweeper                   // the node's mailboxSweeper
)

// postServerNames are the metric's label values, by postServer.
var postServerNames = [...]string{servedByReader: "node", servedByClient: "client", servedBySweeper: "sweeper"}

// localSession is a same-process session's node side, as its client
// calls it (wire.LocalServer).
type localSession struct{ d *dataConn }

// ServePost serves the mailbox's pending post in the client's goroutine
// (servePostAside).
func (l localSession) ServePost() { l.d.servePostAside(servedByClient) }

// servePostAside serves the mailbox's pending post outside the serve
// loop, in the goroutine of by (a client in this process, or the node's
// sweeper), under the session's lock, unless the session ended or the
// session's goroutine served it already. The answer's writes to the
// socket, when there are any (an answer too long for the mailbox, a wake
// for a parked client), take the io timeout, except to a client in this
// process, which reads them next. A post that must close the connection
// closes it: the serve loop then ends the session.
func (d *dataConn) servePostAside(by postServer) {
	d.mu.Lock()
	defer d.mu.Unlock()
	if d.ended || !d.mbox.Pending() {
		return
	}
	d.localPosts.Add(1)
	if by != servedByClient {
		d.c.SetWriteDeadline(time.Now().Add(d.s.ioTimeout))
	}
	if err := d.serveMailbox(by); err != nil {
		d.logMailboxClose(err)
		d.ended = true
		d.c.Close()
	}
}

// logMailboxClose logs why a post closes its session, unless the client
// was refused (and told why).
func (d *dataConn) logMailboxClose(err error) {
	if !errors.Is(err, errRefused) {
		d.s.log.Warn("closing a same-host session after its mailbox's post", "err", err)
	}
}

// mapMailbox checks fd's size and seals and maps it.
func mapMailbox(fd int) ([]byte, error) {
	var st unix.Stat_t
	if err := unix.Fstat(fd, &st); err != nil {
		return nil, err
	}
	if st.Size != wire.MailboxBytes {
		return nil, fmt.Errorf("%d bytes, want %d", st.Size, wire.MailboxBytes)
	}
	seals, err := unix.FcntlInt(uintptr(fd), unix.F_GET_SEALS, 0)
	if err != nil || seals&unix.F_SEAL_SHRINK == 0 {
		return nil, errors.New("not a memfd sealed against shrinking (F_SEAL_SHRINK)")
	}
	return unix.Mmap(fd, 0, wire.MailboxBytes, unix.PROT_READ|unix.PROT_WRITE, unix.MAP_SHARED)
}

// closeMailbox unmaps the mailbox and closes descriptors nobody took, as
// the session ends.
func (d *dataConn) closeMailbox() {
	if d.mboxMem != nil {
		d.sr.Watch(nil)
		unix.Munmap(d.mboxMem)
		d.mbox, d.mboxMem = nil, nil
	}
	d.sr.Close()
}

// arm turns the mailbox watch of a same-host session's reader on or off.
func (d *dataConn) arm(on bool) {
	if d.sr != nil {
		d.sr.Arm(on)
	}
}

// serveMailbox serves the post waiting in the mailbox: its frames are
// copied out of the shared memory, decoded and served one by one as the
// socket's are, and their answers published in the mailbox instead of
// written; a client parked for them is woken. by says who serves it.
// REQUIRES: d.mu, a post pending. A returned error means the connection
// must close (the client was told why in the answer).
func (d *dataConn) serveMailbox(by postServer) error {
	if err := d.flush(); err != nil {
		return err
	}
	d.s.metrics.postsServedBy[by].Inc()
	seq, frames, terr := d.mbox.Take(d.mreq)
	d.inMailbox = true
	var serr error
	if terr != nil {
		serr = d.refuseInMailbox(terr)
	}
	d.mrd.Reset(frames)
	for serr == nil && d.mrd.Len() > 0 {
		if err := wire.ReadRequest(&d.mrd, d.rbuf[:], &d.req); err != nil {
			serr = d.refuseInMailbox(err)
		} else if !wire.MailboxOp(d.req.Op) {
			serr = d.refuseInMailbox(fmt.Errorf("%w: op %s cannot come through the mailbox", wire.ErrProtocol, d.req.Op))
		} else {
			serr = d.handle()
		}
	}
	d.inMailbox = false
	onSocket, clientParked := d.mbox.Respond(seq, d.out)
	var err error
	switch {
	case onSocket:
		// Published first: the client, seeing it, reads the socket.
		err = d.flush()
	case clientParked:
		var wake [wire.ResponseHeaderBytes]byte
		_, err = d.c.Write(wire.AppendResponse(wake[:0], &wire.Response{Flags: wire.FlagWake}))
	}
	d.out = d.out[:0]
	if err != nil {
		return errors.Join(serr, err)
	}
	return serr
}

// refuseInMailbox answers a malformed post: the connection closes.
func (d *dataConn) refuseInMailbox(err error) error {
	d.s.metrics.dataOp(wire.Op(0), api.Code(api.ErrInvalidArgument))
	d.respondErrFlags(api.Errorf(api.ErrInvalidArgument, "%v", err), wire.FlagClose)
	return err
}
