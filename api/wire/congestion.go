package wire

import (
	"crypto/tls"
	"errors"
	"fmt"
	"net"
	"os"
	"strings"
	"syscall"
)

// CongestionHost, as a congestion control, leaves a connection with the
// host's default (net.ipv4.tcp_congestion_control).
const CongestionHost = "host"

// DefaultCongestion is the TCP congestion control kvpool's data and
// transfer connections use unless configured otherwise. They carry
// blocks in bursts after idle time, over low-latency links, and are timed
// by the cost model. BBR, the default of many hosts, paces each
// connection at its model of the path's rate, and on such bursts that
// model can fall far below the link: measured on loopback, up to four of
// forty fetches of a single 2 MiB block stalled 15-75 ms, the sender
// pacing 64 KiB segments tens of milliseconds apart with the window open.
// CUBIC does not pace and did not stall (docs/benchmarks-history.md).
const DefaultCongestion = "cubic"

// CongestionOrDefault returns algo, or for "" DefaultCongestion where
// this process may set it and CongestionHost where it may not (a kernel
// without it, or a process that may only choose among
// net.ipv4.tcp_allowed_congestion_control): a default never stops a node
// or a client from starting. An algorithm asked for by name is returned
// as it is, for ValidateCongestion to judge.
func CongestionOrDefault(algo string) string {
	if algo != "" {
		return algo
	}
	if ValidateCongestion(DefaultCongestion) != nil {
		return CongestionHost
	}
	return DefaultCongestion
}

// EffectiveCongestion is the algorithm connections configured with algo
// run: algo itself, or for "" and CongestionHost the host's default
// (net.ipv4.tcp_congestion_control; "" if it cannot be read).
func EffectiveCongestion(algo string) string {
	if algo != "" && algo != CongestionHost {
		return algo
	}
	if line := procLine("/proc/sys/net/ipv4/tcp_congestion_control"); line != "unknown" {
		return line
	}
	return ""
}

// ValidateCongestion reports whether algo can be set on this host's TCP
// connections: CongestionHost and "" always can; any other name must be
// one the kernel offers and lets this process choose
// (net.ipv4.tcp_allowed_congestion_control, unless the process may
// administer the network). It opens, and closes, one socket to try.
func ValidateCongestion(algo string) error {
	if algo == "" || algo == CongestionHost {
		return nil
	}
	if len(algo) > 15 || strings.ContainsFunc(algo, func(r rune) bool {
		return !(r >= 'a' && r <= 'z' || r >= '0' && r <= '9' || r == '_' || r == '-')
	}) {
		return fmt.Errorf("TCP congestion control %q: want a kernel algorithm's name (up to 15 of [a-z0-9_-]), or %q", algo, CongestionHost)
	}
	fd, err := syscall.Socket(syscall.AF_INET, syscall.SOCK_STREAM|syscall.SOCK_CLOEXEC, 0)
	if err != nil {
		return fmt.Errorf("TCP congestion control %q: open a socket to try it: %w", algo, err)
	}
	defer syscall.Close(fd)
	if err := syscall.SetsockoptString(fd, syscall.IPPROTO_TCP, syscall.TCP_CONGESTION, algo); err != nil {
		return congestionError(algo, err)
	}
	return nil
}

// congestionError explains a refused TCP_CONGESTION: what the kernel has,
// and what this process may choose.
func congestionError(algo string, err error) error {
	available := procLine("/proc/sys/net/ipv4/tcp_available_congestion_control")
	allowed := procLine("/proc/sys/net/ipv4/tcp_allowed_congestion_control")
	switch {
	case errors.Is(err, syscall.ENOENT):
		return fmt.Errorf("TCP congestion control %q: the kernel has no such algorithm (it has: %s; a module may add one, e.g. tcp_%s), or use %q: %w", algo, available, algo, CongestionHost, err)
	case errors.Is(err, syscall.EPERM):
		return fmt.Errorf("TCP congestion control %q: not allowed to this process (allowed: %s; see net.ipv4.tcp_allowed_congestion_control), or use %q: %w", algo, allowed, CongestionHost, err)
	}
	return fmt.Errorf("TCP congestion control %q: %w", algo, err)
}

func procLine(path string) string {
	b, err := os.ReadFile(path)
	if err != nil {
		return "unknown"
	}
	return strings.TrimSpace(string(b))
}

// CongestionControl returns a net.Dialer's or net.ListenConfig's Control
// that gives the socket congestion control algo before it connects or
// listens (a listener's connections inherit it). That is the time to set
// it: a connection that starts under BBR keeps BBR's pacing after it
// changes algorithm (the kernel never turns the socket's pacing off
// again), and paced, CUBIC scattered fetch times as much as BBR did. ""
// and CongestionHost return nil: no Control.
func CongestionControl(algo string) func(network, address string, c syscall.RawConn) error {
	if algo == "" || algo == CongestionHost {
		return nil
	}
	return func(network, _ string, c syscall.RawConn) error {
		if !strings.HasPrefix(network, "tcp") {
			return nil
		}
		return setOn(c, algo)
	}
}

// SetCongestion sets the TCP congestion control of c, a TCP connection
// or a TLS connection over one, to algo (Linux's TCP_CONGESTION). ""
// and CongestionHost leave it as it is, and so does a c with no TCP
// socket under it (a unix socket, an in-memory pipe). Prefer
// CongestionControl, before the connection starts: one that started
// under BBR stays paced.
func SetCongestion(c net.Conn, algo string) error {
	if algo == "" || algo == CongestionHost {
		return nil
	}
	if tc, ok := c.(*tls.Conn); ok {
		c = tc.NetConn()
	}
	if _, ok := c.(*net.TCPConn); !ok {
		return nil
	}
	rc, err := c.(syscall.Conn).SyscallConn()
	if err != nil {
		return err
	}
	return setOn(rc, algo)
}

// setOn sets the congestion control of rc's socket to algo.
func setOn(rc syscall.RawConn, algo string) error {
	var serr error
	if err := rc.Control(func(fd uintptr) {
		serr = syscall.SetsockoptString(int(fd), syscall.IPPROTO_TCP, syscall.TCP_CONGESTION, algo)
	}); err != nil {
		return err
	}
	if serr != nil {
		return congestionError(algo, serr)
	}
	return nil
}
