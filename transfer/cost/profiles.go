package cost

import (
	"bytes"
	"errors"
	"fmt"
	"slices"
	"strings"

	"sigs.k8s.io/yaml"
)

// DefaultAccelerator is the accelerator assumed when none is named.
const DefaultAccelerator = "h200"

// BuiltinCurves are the prefill speeds measured on one NVIDIA H200 (bf16,
// SDPA flash attention; ../shared/anchors/gpu-anchor-h200.json).
func BuiltinCurves() []Curve {
	mk := func(model string, pts ...Point) Curve {
		c, err := NewCurve(model, "h200", pts)
		if err != nil {
			panic(err) // INVARIANT: the built-in numbers are valid.
		}
		return c
	}
	return []Curve{
		mk("llama3-8b", Point{1024, 34156}, Point{4096, 35739}, Point{16384, 30302}, Point{32768, 24200}),
		mk("llama3-70b", Point{1024, 4494}, Point{4096, 4252}, Point{16384, 3696}, Point{32768, 3254}),
	}
}

// Profiles is a set of models and prefill curves: the built-in ones plus
// what the operator loaded. A Profiles is not safe for concurrent
// mutation; build it, then share it read-only.
type Profiles struct {
	models map[string]Model
	curves map[[2]string]*Curve // (model, accelerator)
}

// NewProfiles returns the built-in models and curves.
func NewProfiles() *Profiles {
	p := &Profiles{models: map[string]Model{}, curves: map[[2]string]*Curve{}}
	for _, m := range BuiltinModels() {
		p.models[m.Name] = m
	}
	for _, c := range BuiltinCurves() {
		p.curves[[2]string{c.Model, c.Accelerator}] = &c
	}
	return p
}

// AddModel adds or replaces a model profile.
func (p *Profiles) AddModel(m Model) error {
	if err := m.Validate(); err != nil {
		return err
	}
	p.models[m.Name] = m
	return nil
}

// AddCurve adds or replaces the curve of (c.Model, c.Accelerator). The
// model need not be known yet.
func (p *Profiles) AddCurve(c Curve) error {
	c.Points = slices.Clone(c.Points)
	slices.SortFunc(c.Points, func(a, b Point) int { return a.Tokens - b.Tokens })
	if err := c.init(); err != nil {
		return err
	}
	p.curves[[2]string{c.Model, c.Accelerator}] = &c
	return nil
}

// Model returns the named profile.
func (p *Profiles) Model(name string) (Model, error) {
	m, ok := p.models[name]
	if !ok {
		return Model{}, fmt.Errorf("%w: unknown model %q (known: %s)", ErrNoProfile, name, strings.Join(p.ModelNames(), ", "))
	}
	return m, nil
}

// Curve returns the prefill curve of model on accelerator.
func (p *Profiles) Curve(model, accelerator string) (*Curve, error) {
	if accelerator == "" {
		accelerator = DefaultAccelerator
	}
	c, ok := p.curves[[2]string{model, accelerator}]
	if !ok {
		var have []string
		for k := range p.curves {
			if k[0] == model {
				have = append(have, k[1])
			}
		}
		slices.Sort(have)
		hint := "none"
		if len(have) > 0 {
			hint = strings.Join(have, ", ")
		}
		return nil, fmt.Errorf("%w: no prefill curve for model %q on accelerator %q (curves for this model: %s); load a measured one", ErrNoProfile, model, accelerator, hint)
	}
	return c, nil
}

// ModelNames lists the known models, sorted.
func (p *Profiles) ModelNames() []string {
	var out []string
	for n := range p.models {
		out = append(out, n)
	}
	slices.Sort(out)
	return out
}

// ErrNoProfile marks a model or curve that is not known.
var ErrNoProfile = errors.New("cost: no such profile")

// Document is a profiles file: model profiles and measured prefill curves,
// in YAML or JSON ("models:" and "curves:" lists).
type Document struct {
	Models []Model `json:"models"`
	Curves []Curve `json:"curves"`
}

// ParseDocument reads a profiles document. A GPU anchor document (the
// JSON gpu_anchor.py writes, with "gpu" and "prefill") is read as the
// curves it measured. name labels errors (a file name, say).
func ParseDocument(name string, b []byte) (Document, error) {
	var probe map[string]any
	if err := yaml.Unmarshal(b, &probe); err != nil {
		return Document{}, fmt.Errorf("profiles %s: %w", name, err)
	}
	if _, ok := probe["prefill"]; ok {
		cs, err := ReadAnchorCurves(bytes.NewReader(b), "")
		if err != nil {
			return Document{}, fmt.Errorf("profiles %s: %w", name, err)
		}
		return Document{Curves: cs}, nil
	}
	var doc Document
	if err := yaml.UnmarshalStrict(b, &doc); err != nil {
		return Document{}, fmt.Errorf("profiles %s: %w", name, err)
	}
	return doc, nil
}

// Add adds or replaces every model and curve of d, reporting every
// problem.
func (p *Profiles) Add(d Document) error {
	var errs []error
	for _, m := range d.Models {
		errs = append(errs, p.AddModel(m))
	}
	for _, c := range d.Curves {
		errs = append(errs, p.AddCurve(c))
	}
	return errors.Join(errs...)
}
