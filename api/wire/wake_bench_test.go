package wire

import (
	"fmt"
	"io"
	"net"
	"os"
	"os/exec"
	"syscall"
	"testing"
)

// BenchmarkWakeUp measures what a round trip of one byte costs over a
// socket, the medium every same-host call and every transfer's request
// rides on, between two goroutines of this process ("goroutine") and
// between this process and another ("process", the test binary run again
// as the echo, as a client and its node are): with each reader parked in
// the netpoller until the byte comes (across processes, two threads woken
// a round trip, each on a processor of its own), and with both ends
// polling the socket with non-blocking reads (no wake-up, a system call a
// look). Across processes, the difference is what two wake-ups cost on
// this host; the README's explanations of the same-host paths and of a
// single block's fetch rest on it.
//
//	go test -run '^$' -bench WakeUp ./api/wire
func BenchmarkWakeUp(b *testing.B) {
	for _, peer := range []string{"goroutine", "process"} {
		for _, network := range []string{"unix", "tcp"} {
			for _, mode := range []string{"park", "poll"} {
				b.Run(peer+"/"+network+"/"+mode, func(b *testing.B) {
					c, wait := echoPeer(b, peer, network, mode == "poll")
					if err := pingPong(c, mode == "poll", b.N); err != nil {
						b.Fatal(err)
					}
					c.Close()
					if err := wait(); err != nil {
						b.Fatal(err)
					}
				})
			}
		}
	}
}

// wakeEchoEnv, set, makes TestWakeEcho the echo of a BenchmarkWakeUp in
// another process: "network address poll".
const wakeEchoEnv = "KVPOOL_WIRE_WAKE_ECHO"

// TestWakeEcho is BenchmarkWakeUp's echo in another process; without
// wakeEchoEnv it does nothing.
func TestWakeEcho(t *testing.T) {
	spec := os.Getenv(wakeEchoEnv)
	if spec == "" {
		t.Skip("the echo of BenchmarkWakeUp, run by it")
	}
	var network, addr, poll string
	if _, err := fmt.Sscan(spec, &network, &addr, &poll); err != nil {
		t.Fatalf("%s=%q: %v", wakeEchoEnv, spec, err)
	}
	c, err := net.Dial(network, addr)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	if err := pingPong(c, poll == "poll", -1); err != nil && err != io.EOF {
		t.Fatal(err)
	}
}

// echoPeer returns this end of a connection over network (unix or tcp on
// loopback) whose other end echoes every byte, in a goroutine or in a
// process of its own, and a wait for the echo to end once this end
// closes.
func echoPeer(b *testing.B, peer, network string, poll bool) (net.Conn, func() error) {
	b.Helper()
	addr := "127.0.0.1:0"
	if network == "unix" {
		addr = b.TempDir() + "/wake.sock"
	}
	ln, err := net.Listen(network, addr)
	if err != nil {
		b.Fatal(err)
	}
	defer ln.Close()
	mode := "park"
	if poll {
		mode = "poll"
	}
	if peer == "process" {
		cmd := exec.Command(os.Args[0], "-test.run=^TestWakeEcho$", "-test.count=1")
		cmd.Env = append(os.Environ(), wakeEchoEnv+"="+network+" "+ln.Addr().String()+" "+mode)
		cmd.Stderr = os.Stderr // its verdict on stdout would cut into the benchmark's line
		if err := cmd.Start(); err != nil {
			b.Fatal(err)
		}
		c, err := ln.Accept()
		if err != nil {
			cmd.Process.Kill()
			cmd.Wait()
			b.Fatal(err)
		}
		b.ResetTimer()
		return c, cmd.Wait
	}
	echo := make(chan error, 1)
	go func() {
		c, err := net.Dial(network, ln.Addr().String())
		if err != nil {
			echo <- err
			return
		}
		defer c.Close()
		if err := pingPong(c, poll, -1); err != io.EOF {
			echo <- err
			return
		}
		echo <- nil
	}()
	c, err := ln.Accept()
	if err != nil {
		b.Fatal(err)
	}
	return c, func() error { return <-echo }
}

// pingPong sends a byte and waits for one, rounds times (the initiator),
// or, with rounds < 0, answers every byte it receives until the
// connection ends (the echo). poll reads with non-blocking system calls
// until the byte is there instead of parking.
func pingPong(c net.Conn, poll bool, rounds int) error {
	rc, err := c.(syscall.Conn).SyscallConn()
	if err != nil {
		return err
	}
	var buf [1]byte
	var n int
	var rerr error
	spin := func(fd uintptr) bool {
		for {
			n, rerr = syscall.Read(int(fd), buf[:])
			if rerr != syscall.EAGAIN {
				return true
			}
		}
	}
	read := func() error {
		if !poll {
			_, err := io.ReadFull(c, buf[:])
			return err
		}
		if err := rc.Read(spin); err != nil {
			return err
		}
		switch {
		case rerr != nil:
			return rerr
		case n == 0:
			return io.EOF
		}
		return nil
	}
	for i := 0; rounds < 0 || i < rounds; i++ {
		if rounds >= 0 {
			if _, err := c.Write(buf[:]); err != nil {
				return err
			}
		}
		if err := read(); err != nil {
			return err
		}
		if rounds < 0 {
			if _, err := c.Write(buf[:]); err != nil {
				return err
			}
		}
	}
	return nil
}
