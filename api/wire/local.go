package wire

import (
	"crypto/rand"
	"encoding/binary"
	"net"
	"os"
	"sync"
	"syscall"
)

// Same-process sessions. A client whose node runs in its own process (a
// Go program that embeds its node, the bench, the test clusters) talks to
// it through the session's socket and mailbox as any same-host client
// does, but waiting for the node's goroutine there costs more than it
// does between two processes: a poll holds one of the Go runtime's
// processors, which the copies of the process's other clients need, and a
// sleep on the socket wakes a thread that the kernel may queue behind a
// busy one while another core idles (measured here: 17 % of two cores
// idle in spells of 2–17 ms while four clients put). So in one process
// the client serves its own posts: it calls the session's node side
// directly, in its own goroutine, under the session's lock, and nobody
// waits for anybody.
//
// The rendezvous: a client that finds its node is its own process
// (SO_PEERCRED) hands over its mailbox with FlagServeLocally; the node,
// having checked the same, registers the session here, stops watching
// the mailbox (its goroutine still reads the socket) and answers with the
// token in Handle; the client looks the token up and from then on serves
// each post it makes (Conn.ServeLocally). Tokens are random and the table
// is this process's, so N nodes and their clients share it.

// LocalServer is the node's side of a same-process session.
type LocalServer interface {
	// ServePost serves the post waiting in the mailbox, in the caller's
	// goroutine, unless the node's goroutine served it already; it
	// returns when the post is answered or the session has ended.
	ServePost()
}

var localServers sync.Map // uint64 token -> LocalServer

// RegisterLocal registers s under a new token, never 0, for the client to
// look up; unregister removes it (the session ended).
func RegisterLocal(s LocalServer) (token uint64, unregister func()) {
	for {
		var b [8]byte
		rand.Read(b[:])
		token = binary.LittleEndian.Uint64(b[:])
		if token == 0 {
			continue
		}
		if _, taken := localServers.LoadOrStore(token, s); !taken {
			return token, func() { localServers.CompareAndDelete(token, s) }
		}
	}
}

// LookupLocal returns the server registered under token in this process,
// or nil: the node is in another process (or the session ended).
func LookupLocal(token uint64) LocalServer {
	if token == 0 {
		return nil
	}
	if s, ok := localServers.Load(token); ok {
		return s.(LocalServer)
	}
	return nil
}

// PeerIsThisProcess reports whether the other end of c is this process
// (SO_PEERCRED): the only case in which a session may be served locally.
func PeerIsThisProcess(c *net.UnixConn) bool {
	raw, err := c.SyscallConn()
	if err != nil {
		return false
	}
	var cred *syscall.Ucred
	var cerr error
	raw.Control(func(fd uintptr) {
		cred, cerr = syscall.GetsockoptUcred(int(fd), syscall.SOL_SOCKET, syscall.SO_PEERCRED)
	})
	return cerr == nil && int(cred.Pid) == os.Getpid()
}
