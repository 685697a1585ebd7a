package cost

import (
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"math"
	"slices"
	"strings"
)

// Prefill is an engine's prefill cost: Seconds(T) is how long a prompt of
// T tokens takes from an empty cache. Implementations are non-decreasing
// in T and 0 at 0, so Seconds(n) − Seconds(h) is the cost of prefilling
// tokens h..n on top of a cached prefix of h.
type Prefill interface {
	Seconds(tokens float64) float64
}

// Point is one measurement: a prompt of Tokens took Tokens/TokensPerSecond
// seconds.
type Point struct {
	Tokens          int     `json:"tokens"`
	TokensPerSecond float64 `json:"tokens_per_s"`
}

// Curve is a measured prefill-speed curve c(T) for one model on one
// accelerator. Between measured prompt lengths the prefill time is
// linear; below the first it is proportional to T; beyond the last it
// grows at the last segment's rate, so long prompts keep their
// attention-bound cost per token.
type Curve struct {
	Model       string  `json:"model"`
	Accelerator string  `json:"accelerator"`
	Points      []Point `json:"points"`

	secs []float64 // Seconds at Points[i]; filled by Validate
}

// NewCurve sorts points by length and validates the curve.
func NewCurve(model, accelerator string, points []Point) (Curve, error) {
	c := Curve{Model: model, Accelerator: accelerator, Points: slices.Clone(points)}
	slices.SortFunc(c.Points, func(a, b Point) int { return a.Tokens - b.Tokens })
	return c, c.init()
}

// init validates the curve and precomputes the time at every point.
func (c *Curve) init() error {
	var errs []error
	bad := func(format string, args ...any) {
		errs = append(errs, fmt.Errorf("curve %s/%s: "+format, append([]any{c.Model, c.Accelerator}, args...)...))
	}
	if !profileName.MatchString(c.Model) || !profileName.MatchString(c.Accelerator) {
		bad("model and accelerator must be 1-64 of [a-z0-9._-]")
	}
	if len(c.Points) == 0 {
		bad("no points")
	}
	c.secs = make([]float64, len(c.Points))
	for i, p := range c.Points {
		if p.Tokens <= 0 || !(p.TokensPerSecond > 0) || math.IsInf(p.TokensPerSecond, 0) {
			bad("point %d: tokens %d and tokens_per_s %v must be positive", i, p.Tokens, p.TokensPerSecond)
			continue
		}
		c.secs[i] = float64(p.Tokens) / p.TokensPerSecond
		if math.IsInf(c.secs[i], 0) {
			bad("point %d: %d tokens at %v tokens/s take forever", i, p.Tokens, p.TokensPerSecond)
			continue
		}
		if i > 0 && (p.Tokens <= c.Points[i-1].Tokens || c.secs[i] <= c.secs[i-1]) {
			bad("point %d (%d tokens, %.6g s): prompt lengths must be distinct and a longer prompt must take longer", i, p.Tokens, c.secs[i])
		}
	}
	return errors.Join(errs...)
}

// Seconds implements Prefill.
func (c *Curve) Seconds(tokens float64) float64 {
	pts, secs := c.Points, c.secs
	if tokens <= 0 || len(pts) == 0 {
		return 0
	}
	if x0 := float64(pts[0].Tokens); tokens <= x0 || len(pts) == 1 {
		return tokens * secs[0] / x0
	}
	i := 1
	for i < len(pts)-1 && float64(pts[i].Tokens) < tokens {
		i++
	}
	xa, xb := float64(pts[i-1].Tokens), float64(pts[i].Tokens)
	return secs[i-1] + (tokens-xa)*(secs[i]-secs[i-1])/(xb-xa)
}

// TokensPerSecond is c(T) = T / Seconds(T).
func TokensPerSecond(p Prefill, tokens float64) float64 {
	s := p.Seconds(tokens)
	if s <= 0 {
		return 0
	}
	return tokens / s
}

// FLOPsCurve is an analytic prefill cost, Mooncake's (FAST'25) Eq. 1:
// FLOPs(T) = Layers · (Attn·T²·Hidden + Linear·T·Hidden²), run at FLOPS
// floating-point operations per second. Use it where no measured curve
// exists.
type FLOPsCurve struct {
	Layers, Hidden int
	// Attn and Linear are the equation's a and b.
	Attn, Linear float64
	// FLOPS is the engine's sustained rate (peak × utilisation × GPUs).
	FLOPS float64
}

// Seconds implements Prefill.
func (f FLOPsCurve) Seconds(tokens float64) float64 {
	if tokens <= 0 {
		return 0
	}
	d := float64(f.Hidden)
	return float64(f.Layers) * (f.Attn*tokens*tokens*d + f.Linear*tokens*d*d) / f.FLOPS
}

// Scaled runs Base Factor times faster: an engine's reported speed
// applied to its nominal curve.
type Scaled struct {
	Base   Prefill
	Factor float64
}

// Seconds implements Prefill.
func (s Scaled) Seconds(tokens float64) float64 { return s.Base.Seconds(tokens) / s.Factor }

// ReportedFactor is how much faster than c an engine runs that reported
// tokensPerSecond at a prompt of atTokens (atTokens 0: at the request's
// own length, requestTokens). It is 1 when the report is unusable.
func ReportedFactor(c Prefill, tokensPerSecond float64, atTokens, requestTokens int) float64 {
	at := atTokens
	if at <= 0 {
		at = requestTokens
	}
	nominal := TokensPerSecond(c, float64(at))
	if !(tokensPerSecond > 0) || math.IsInf(tokensPerSecond, 0) || nominal <= 0 {
		return 1
	}
	return tokensPerSecond / nominal
}

// anchorFile is the format of ../shared/anchors/gpu-anchor-*.json, written
// by gpu_anchor.py.
type anchorFile struct {
	GPU     string `json:"gpu"`
	Prefill []struct {
		Model           string  `json:"model"`
		PromptTokens    int     `json:"prompt_tokens"`
		TokensPerSecond float64 `json:"tokens_per_s"`
	} `json:"prefill"`
}

// AcceleratorName turns a device name ("NVIDIA H200") into a profile name
// ("h200").
func AcceleratorName(device string) string {
	s := strings.ToLower(strings.TrimSpace(device))
	s = strings.TrimPrefix(s, "nvidia ")
	return strings.Join(strings.Fields(s), "-")
}

// ReadAnchorCurves parses a GPU anchor document (gpu_anchor.py's output):
// one curve per model. accelerator names them; empty takes it from the
// document's "gpu".
func ReadAnchorCurves(r io.Reader, accelerator string) ([]Curve, error) {
	var doc anchorFile
	dec := json.NewDecoder(r)
	if err := dec.Decode(&doc); err != nil {
		return nil, fmt.Errorf("cost: anchor document: %w", err)
	}
	if accelerator == "" {
		accelerator = AcceleratorName(doc.GPU)
	}
	byModel := map[string][]Point{}
	var order []string
	for _, p := range doc.Prefill {
		if _, ok := byModel[p.Model]; !ok {
			order = append(order, p.Model)
		}
		byModel[p.Model] = append(byModel[p.Model], Point{Tokens: p.PromptTokens, TokensPerSecond: p.TokensPerSecond})
	}
	if len(order) == 0 {
		return nil, errors.New("cost: anchor document has no prefill measurements")
	}
	var curves []Curve
	var errs []error
	for _, m := range order {
		c, err := NewCurve(m, accelerator, byModel[m])
		if err != nil {
			errs = append(errs, err)
			continue
		}
		curves = append(curves, c)
	}
	return curves, errors.Join(errs...)
}
