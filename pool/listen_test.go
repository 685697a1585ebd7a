package pool

import (
	"crypto/tls"
	"log/slog"
	"net"
	"strings"
	"syscall"
	"testing"

	"golang.org/x/sys/unix"
)

// The data and transfer connections the node accepts get its congestion
// control and no Nagle delay, whether sniffing left them wrapped in a
// prefixConn, in TLS, or bare; a transfer connection also gets its send
// buffer, and a data connection keeps the kernel's.
func TestAcceptedConnectionsAreTuned(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	read := func(c net.Conn) (algo string, noDelay, sendBuffer int) {
		rc, err := c.(syscall.Conn).SyscallConn()
		if err != nil {
			t.Fatal(err)
		}
		var e1, e2, e3 error
		rc.Control(func(fd uintptr) {
			algo, e1 = unix.GetsockoptString(int(fd), unix.IPPROTO_TCP, unix.TCP_CONGESTION)
			noDelay, e2 = unix.GetsockoptInt(int(fd), unix.IPPROTO_TCP, unix.TCP_NODELAY)
			sendBuffer, e3 = unix.GetsockoptInt(int(fd), unix.SOL_SOCKET, unix.SO_SNDBUF)
		})
		if e1 != nil || e2 != nil || e3 != nil {
			t.Fatal(e1, e2, e3)
		}
		return strings.TrimRight(algo, "\x00"), noDelay, sendBuffer
	}
	// Below any host's net.core.wmem_max (212992 by default), so the
	// kernel takes it whole, and doubles it.
	const sendBuffer = 64 << 10
	for _, wrap := range []struct {
		name string
		wrap func(net.Conn) net.Conn
	}{
		{"bare", func(c net.Conn) net.Conn { return c }},
		{"prefixed", func(c net.Conn) net.Conn { return &prefixConn{Conn: c} }},
		{"tls", func(c net.Conn) net.Conn { return tls.Server(&prefixConn{Conn: c}, &tls.Config{}) }},
	} {
		for _, door := range []struct {
			name       string
			sendBuffer int64
		}{{"data", 0}, {"transfer", sendBuffer}} {
			t.Run(wrap.name+"/"+door.name, func(t *testing.T) {
				client, err := net.Dial("tcp", ln.Addr().String())
				if err != nil {
					t.Fatal(err)
				}
				defer client.Close()
				server, err := ln.Accept()
				if err != nil {
					t.Fatal(err)
				}
				defer server.Close()
				server.(*net.TCPConn).SetNoDelay(false)
				host, _, before := read(server)
				want := "reno"
				if host == want {
					want = "cubic"
				}
				d := &doors{congestion: want, log: slog.New(slog.DiscardHandler)}
				d.tuneTCP(wrap.wrap(server), door.sendBuffer)
				wantBuffer := before
				if door.sendBuffer > 0 {
					wantBuffer = 2 * int(door.sendBuffer)
				}
				if algo, noDelay, buffer := read(server); algo != want || noDelay == 0 || buffer != wantBuffer {
					t.Errorf("tuned: congestion %q, TCP_NODELAY %d, SO_SNDBUF %d; want %q, 1, %d", algo, noDelay, buffer, want, wantBuffer)
				}
			})
		}
	}
}
