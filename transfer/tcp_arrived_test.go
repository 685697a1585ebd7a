package transfer

import (
	"net"
	"testing"
	"time"

	"github.com/kvpool/kvpool/internal/eventually"
)

// A reader counts as arrived what waits in its buffer and in the
// kernel's receive queue: what a link's bandwidth sample must not count
// as delivered after the first response, however late the reader came.
func TestTCPReadingCountsWhatHasArrived(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	accepted := make(chan net.Conn, 1)
	go func() {
		c, err := ln.Accept()
		if err != nil {
			close(accepted)
			return
		}
		accepted <- c
	}()
	sender, err := net.Dial("tcp", ln.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	defer sender.Close()
	receiver, ok := <-accepted
	if !ok {
		t.Fatal("no connection accepted")
	}
	defer receiver.Close()
	r := newTCPReading(receiver)
	if got := r.arrived(); got != 0 {
		t.Fatalf("%d bytes arrived before any was sent", got)
	}
	const sent = 100_000
	if _, err := sender.Write(make([]byte, sent)); err != nil {
		t.Fatal(err)
	}
	eventually.True(t, "the bytes to arrive", 10*time.Second, func() bool { return r.arrived() == sent })
	// A header's read fills the buffer: the rest still counts.
	var hdr [tcpRespBytes]byte
	r.src.wait = true
	if _, err := r.br.Read(hdr[:]); err != nil {
		t.Fatal(err)
	}
	if r.br.Buffered() == 0 {
		t.Fatal("the header's read buffered nothing beyond it")
	}
	if got, want := r.arrived(), uint64(sent-len(hdr)); got != want {
		t.Fatalf("after the header, %d bytes arrived, want %d", got, want)
	}
}
