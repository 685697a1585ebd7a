package wire

import (
	"sync/atomic"
	"testing"
)

type countingServer struct{ served atomic.Int64 }

func (s *countingServer) ServePost() { s.served.Add(1) }

// Tokens name the sessions registered in this process, one each and
// never 0, until they are unregistered; a socket's peer is this process
// when both ends are here.
func TestLocalRegistry(t *testing.T) {
	if LookupLocal(0) != nil {
		t.Fatal("token 0 names a session")
	}
	a, b := &countingServer{}, &countingServer{}
	ta, unregisterA := RegisterLocal(a)
	tb, unregisterB := RegisterLocal(b)
	defer unregisterB()
	if ta == 0 || tb == 0 || ta == tb {
		t.Fatalf("tokens %#x and %#x: want two distinct, non-zero", ta, tb)
	}
	LookupLocal(ta).ServePost()
	LookupLocal(tb).ServePost()
	LookupLocal(tb).ServePost()
	if a.served.Load() != 1 || b.served.Load() != 2 {
		t.Fatalf("served %d and %d, want 1 and 2", a.served.Load(), b.served.Load())
	}
	unregisterA()
	unregisterA() // twice is harmless
	if LookupLocal(ta) != nil || LookupLocal(tb) == nil {
		t.Fatal("unregistering one session forgot the wrong one")
	}

	cu, su := unixPair(t)
	if !PeerIsThisProcess(cu) || !PeerIsThisProcess(su) {
		t.Fatal("a socket pair of this process is not this process's")
	}
}
