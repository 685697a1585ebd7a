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
// prefixConn, in TLS, or bare.
func TestAcceptedConnectionsAreTuned(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	read := func(c net.Conn) (algo string, noDelay int) {
		rc, err := c.(syscall.Conn).SyscallConn()
		if err != nil {
			t.Fatal(err)
		}
		var e1, e2 error
		rc.Control(func(fd uintptr) {
			algo, e1 = unix.GetsockoptString(int(fd), unix.IPPROTO_TCP, unix.TCP_CONGESTION)
			noDelay, e2 = unix.GetsockoptInt(int(fd), unix.IPPROTO_TCP, unix.TCP_NODELAY)
		})
		if e1 != nil || e2 != nil {
			t.Fatal(e1, e2)
		}
		return strings.TrimRight(algo, "\x00"), noDelay
	}
	for _, wrap := range []struct {
		name string
		wrap func(net.Conn) net.Conn
	}{
		{"bare", func(c net.Conn) net.Conn { return c }},
		{"prefixed", func(c net.Conn) net.Conn { return &prefixConn{Conn: c} }},
		{"tls", func(c net.Conn) net.Conn { return tls.Server(&prefixConn{Conn: c}, &tls.Config{}) }},
	} {
		t.Run(wrap.name, func(t *testing.T) {
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
			host, _ := read(server)
			want := "reno"
			if host == want {
				want = "cubic"
			}
			d := &doors{congestion: want, log: slog.New(slog.DiscardHandler)}
			d.tuneTCP(wrap.wrap(server))
			if algo, noDelay := read(server); algo != want || noDelay == 0 {
				t.Errorf("tuned: congestion %q, TCP_NODELAY %d; want %q, 1", algo, noDelay, want)
			}
		})
	}
}
