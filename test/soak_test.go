package test

import (
	"encoding/json"
	"testing"

	"github.com/kvpool/kvpool/pool/bench"
)

// A 60 s soak of a daemon process: mixed put, reserve, get, view, remove
// and reconnects on the shm, data and grpc paths, every byte read back
// checked, and the daemon's memory, goroutines and descriptors within
// their bounds. The 30-minute run in the README is the same command.
func TestSoak(t *testing.T) {
	if testing.Short() {
		t.Skip("a 60 s soak")
	}
	r := kv(t, nil, "node", "bench", "--soak", "60s", "--json")
	var res bench.SoakResult
	if err := json.Unmarshal([]byte(r.stdout), &res); err != nil {
		t.Fatalf("soak exit %d, output not JSON: %v\nstdout: %s\nstderr: %s", r.code, err, r.stdout, r.stderr)
	}
	for _, f := range res.Failures {
		t.Error(f)
	}
	if r.code != 0 {
		t.Fatalf("soak exit %d: %s", r.code, r.stderr)
	}
	for _, p := range []string{"shm", "data", "grpc"} {
		st := res.Paths[p]
		if st.Puts == 0 || st.Gets+st.Views == 0 || st.CheckedB == 0 || st.Removes == 0 {
			t.Errorf("path %s did too little: %+v", p, st)
		}
	}
	t.Logf("warm %+v", res.Warm)
	t.Logf("end  %+v", res.End)
}
