package bench

import (
	"strings"
	"testing"
)

// soakSamples builds load samples with the given RSS (MiB) and goroutines,
// between an idle sample before and after.
func soakSamples(rssMiB []int64, goroutines []int, idleBefore, idleAfter int) []SoakSample {
	s := []SoakSample{{Phase: "idle-before", Goroutines: idleBefore, FDs: 10, RSSBytes: 10 << 20, AnonBytes: 5 << 20, HeapBytes: 4 << 20}}
	for i := range rssMiB {
		s = append(s, SoakSample{Phase: "load", AtS: float64(i + 1), RSSBytes: rssMiB[i] << 20, AnonBytes: 20 << 20,
			HeapBytes: 16 << 20, Goroutines: goroutines[i], FDs: 20})
	}
	return append(s, SoakSample{Phase: "idle-after", Goroutines: idleAfter, FDs: 10, RSSBytes: 10 << 20, AnonBytes: 5 << 20, HeapBytes: 4 << 20})
}

func TestCheckSoak(t *testing.T) {
	flat := []int64{100, 100, 100, 100, 100, 100, 100, 100}
	g := []int{25, 25, 25, 25, 25, 25, 25, 25}
	for _, tc := range []struct {
		name    string
		samples []SoakSample
		want    []string // substrings of the failures, in order; nil: pass
	}{
		{"steady", soakSamples(flat, g, 14, 14), nil},
		// Warm is the median of load samples 2 and 3 (the upper one, 160),
		// end that of 6 and 7 (214): 160 × 1.1 + 48 = 224 MiB holds it.
		{"growth within the bound", soakSamples([]int64{100, 150, 158, 160, 170, 180, 200, 214}, g, 14, 14), nil},
		{"RSS past the bound", soakSamples([]int64{100, 150, 158, 160, 170, 180, 230, 240}, g, 14, 14),
			[]string{"RSS grew from 160.0 MiB (warm) to 240.0 MiB (end), past the bound of 224.0 MiB"}},
		{"goroutines leak under load", soakSamples(flat, []int{25, 25, 25, 25, 40, 50, 60, 70}, 14, 14),
			[]string{"goroutines grew from 25 (warm) to 70, past the bound of 45 (+20)"}},
		{"goroutines left behind when idle", soakSamples(flat, g, 14, 35),
			[]string{"idle goroutines grew from 14 (before the load) to 35, past the bound of 34 (+20)"}},
		{"no load samples", soakSamples(nil, nil, 14, 14), []string{"no samples were taken under load"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got := CheckSoak(tc.samples, DefaultSoakBounds)
			if len(got) != len(tc.want) {
				t.Fatalf("failures %q, want %d matching %q", got, len(tc.want), tc.want)
			}
			for i := range got {
				if !strings.Contains(got[i], tc.want[i]) {
					t.Errorf("failure %d: %q, want it to contain %q", i, got[i], tc.want[i])
				}
			}
		})
	}
}
