package cost

import (
	"bytes"
	"errors"
	"math"
	"os"
	"strings"
	"testing"
)

func TestKVBytesPerToken(t *testing.T) {
	p := NewProfiles()
	for _, tc := range []struct {
		model string
		want  float64
	}{
		{"llama3-8b", 131072},  // 32 × 2 × 8 × 128 × 2
		{"llama3-70b", 327680}, // 80 × 2 × 8 × 128 × 2
		{"deepseek-v3", 70272}, // 61 × (512 + 64) × 2
		{"qwen2.5-7b", 57344},  // 28 × 2 × 4 × 128 × 2
	} {
		m, err := p.Model(tc.model)
		if err != nil {
			t.Fatal(err)
		}
		if got := m.KVBytesPerToken(); got != tc.want {
			t.Errorf("%s: %v B/token, want %v", tc.model, got, tc.want)
		}
	}
	for _, tc := range []struct {
		name string
		m    Model
		want float64
	}{
		{"sparse keeps a quarter", Model{Name: "s", Layers: 32, KVHeads: 8, HeadDim: 128, KeptFraction: 0.25}, 32768},
		{"fp8 cache", Model{Name: "f", Layers: 32, KVHeads: 8, HeadDim: 128, DTypeBytes: 1}, 65536},
		{"explicit", Model{Name: "e", KVBytes: 1000}, 1000},
		{"explicit sparse", Model{Name: "e", KVBytes: 1000, KeptFraction: 0.5}, 500},
	} {
		if err := tc.m.Validate(); err != nil {
			t.Errorf("%s: %v", tc.name, err)
		}
		if got := tc.m.KVBytesPerToken(); got != tc.want {
			t.Errorf("%s: %v, want %v", tc.name, got, tc.want)
		}
	}
}

func TestModelValidate(t *testing.T) {
	for name, tc := range map[string]struct {
		m     Model
		wants []string // every problem is reported
	}{
		"no shape":      {Model{Name: "x", Layers: 4}, []string{"no KV shape"}},
		"both shapes":   {Model{Name: "x", Layers: 4, KVHeads: 1, HeadDim: 1, LatentDim: 1}, []string{"not both"}},
		"bad name":      {Model{Name: "X Y", KVBytes: 1}, []string{"name must be"}},
		"many problems": {Model{Name: "x", Layers: -1, KVHeads: 8, DTypeBytes: 3, KeptFraction: 2}, []string{"layers -1", "head_dim 0", "dtype_bytes 3", "kept_fraction 2"}},
		"nan bytes":     {Model{Name: "x", KVBytes: math.NaN()}, []string{"kv_bytes_per_token NaN"}},
	} {
		t.Run(name, func(t *testing.T) {
			err := tc.m.Validate()
			if err == nil {
				t.Fatal("accepted")
			}
			for _, w := range tc.wants {
				if !strings.Contains(err.Error(), w) {
					t.Errorf("%q does not mention %q", err, w)
				}
			}
		})
	}
}

func TestCurveSeconds(t *testing.T) {
	// 1000 tokens in 1 s, 2000 in 3 s, 4000 in 10 s.
	c, err := NewCurve("m", "a", []Point{{4000, 400}, {1000, 1000}, {2000, 2000.0 / 3}})
	if err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct{ tokens, want float64 }{
		{0, 0}, {-5, 0}, {500, 0.5}, {1000, 1}, {1500, 2}, {2000, 3}, {3000, 6.5}, {4000, 10},
		{6000, 17}, // beyond the last point at the last segment's 3.5 ms/token
	} {
		if got := c.Seconds(tc.tokens); math.Abs(got-tc.want) > 1e-12 {
			t.Errorf("Seconds(%v) = %v, want %v", tc.tokens, got, tc.want)
		}
	}
	if got := TokensPerSecond(&c, 3000); math.Abs(got-3000/6.5) > 1e-9 {
		t.Errorf("c(3000) = %v", got)
	}
	if f := ReportedFactor(&c, 2000, 1000, 0); f != 2 {
		t.Errorf("an engine reporting 2000 tokens/s at 1000 tokens runs %v× the curve, want 2", f)
	}
	if f := ReportedFactor(&c, 500, 0, 4000); f != 1.25 {
		t.Errorf("factor at the request's length: %v, want 1.25", f)
	}
	if f := ReportedFactor(&c, math.NaN(), 0, 4000); f != 1 {
		t.Errorf("a NaN report: %v, want 1", f)
	}
	if s := (Scaled{Base: &c, Factor: 2}).Seconds(2000); s != 1.5 {
		t.Errorf("scaled: %v", s)
	}
}

func TestCurveValidate(t *testing.T) {
	for name, pts := range map[string][]Point{
		"no points":       nil,
		"zero tokens":     {{0, 100}},
		"negative speed":  {{100, -1}},
		"infinite speed":  {{100, math.Inf(1)}},
		"duplicate":       {{100, 10}, {100, 20}},
		"faster is worse": {{1000, 1000}, {3000, 4000}}, // 3000 tokens in 0.75 s < 1 s
	} {
		if _, err := NewCurve("m", "a", pts); err == nil {
			t.Errorf("%s: accepted", name)
		}
	}
	if _, err := NewProfiles().Curve("deepseek-v3", "h200"); !errors.Is(err, ErrNoProfile) || !strings.Contains(err.Error(), "load a measured one") {
		t.Errorf("missing curve: %v", err)
	}
	if _, err := NewProfiles().Model("gpt-9"); !errors.Is(err, ErrNoProfile) || !strings.Contains(err.Error(), "llama3-8b") {
		t.Errorf("unknown model: %v", err)
	}
}

// The built-in curves are the anchor document's numbers.
func TestBuiltinCurvesMatchAnchors(t *testing.T) {
	b, err := os.ReadFile("testdata/gpu-anchor-h200.json")
	if err != nil {
		t.Fatal(err)
	}
	curves, err := ReadAnchorCurves(bytes.NewReader(b), "")
	if err != nil {
		t.Fatal(err)
	}
	builtin := BuiltinCurves()
	if len(curves) != len(builtin) {
		t.Fatalf("%d curves, want %d", len(curves), len(builtin))
	}
	for i, c := range curves {
		bc := builtin[i]
		if c.Model != bc.Model || c.Accelerator != "h200" || len(c.Points) != len(bc.Points) {
			t.Fatalf("curve %d: %s/%s, want %s/h200", i, c.Model, c.Accelerator, bc.Model)
		}
		for j := range c.Points {
			if c.Points[j] != bc.Points[j] {
				t.Errorf("%s point %d: %+v, want %+v", c.Model, j, c.Points[j], bc.Points[j])
			}
		}
	}
}

func FuzzReadAnchorCurves(f *testing.F) {
	b, err := os.ReadFile("testdata/gpu-anchor-h200.json")
	if err != nil {
		f.Fatal(err)
	}
	f.Add(b)
	f.Add([]byte(`{"gpu":"x","prefill":[{"model":"m","prompt_tokens":10,"tokens_per_s":5}]}`))
	f.Fuzz(func(t *testing.T, b []byte) {
		curves, err := ReadAnchorCurves(bytes.NewReader(b), "")
		if err != nil {
			return
		}
		for _, c := range curves {
			// An accepted curve is increasing and finite everywhere.
			prev := 0.0
			for _, tok := range []float64{1, 10, 100, 1e3, 1e4, 1e5, 1e6} {
				s := c.Seconds(tok)
				if !(s >= prev) || math.IsInf(s, 0) {
					t.Fatalf("%s: Seconds(%v) = %v after %v", c.Model, tok, s, prev)
				}
				prev = s
			}
		}
	})
}
