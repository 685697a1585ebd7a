package main

import (
	"cmp"
	"errors"
	"fmt"
	"math"
	"os"
	"path/filepath"
	"slices"

	"gonum.org/v1/plot"
	"gonum.org/v1/plot/plotter"
	"gonum.org/v1/plot/plotutil"
	"gonum.org/v1/plot/vg"
)

// noPool are the policies that never fetch from another node; the best
// of them is what the pool must beat.
var noPool = []string{"round-robin", "least-loaded", "affinity", "cost"}

// poolPolicies are the ones whose results depend on the link.
var poolPolicies = []string{"pool", "pool-split"}

// bestNoPool is the lowest TTFT p90 among the no-pool policies of rows
// at one grid point; ok is false when none ran.
func bestNoPool(rows []simRow) (p90 float64, ok bool) {
	p90 = math.Inf(1)
	for _, r := range rows {
		if slices.Contains(noPool, r.Policy) && r.TTFTP90 < p90 {
			p90, ok = r.TTFTP90, true
		}
	}
	return p90, ok
}

// writeSimPlots writes, into dir, TTFT p90 against link bandwidth per
// policy (one plot per model, time scale, node count and host tier; runs
// that differ by seed averaged), and,
// when the grid spans several models, each pool policy's TTFT p90
// relative to the best no-pool policy against the model's KV bytes per
// token, one line per link bandwidth.
func writeSimPlots(dir string, rows []simRow) error {
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return err
	}
	type group struct {
		model string
		scale float64
		nodes int
		host  float64
	}
	groups := map[group][]simRow{}
	var order []group
	for _, r := range rows {
		g := group{r.Model, r.TimeScale, r.Nodes, r.HostGB}
		if _, ok := groups[g]; !ok {
			order = append(order, g)
		}
		groups[g] = append(groups[g], r)
	}
	var errs []error
	for _, g := range order {
		p := plot.New()
		p.Title.Text = fmt.Sprintf("%s, %d nodes, time scale %g, %g GB host tiers", g.model, g.nodes, g.scale, g.host)
		p.X.Label.Text = "network into each node, Gbit/s"
		p.Y.Label.Text = "TTFT p90, s (log scale)"
		p.X.Scale, p.X.Tick.Marker = plot.LogScale{}, plot.LogTicks{Prec: -1}
		// Round-robin can be 20× the rest: a log scale keeps them apart.
		p.Y.Scale, p.Y.Tick.Marker = plot.LogScale{}, plot.LogTicks{Prec: -1}
		var links []float64
		for _, r := range groups[g] {
			if !slices.Contains(links, r.LinkGbps) && r.LinkGbps > 0 {
				links = append(links, r.LinkGbps)
			}
		}
		var lines []any
		for _, pol := range policiesIn(groups[g]) {
			var xys plotter.XYs
			for _, r := range groups[g] {
				if r.Policy == pol && r.LinkGbps > 0 {
					xys = append(xys, plotter.XY{X: r.LinkGbps, Y: r.TTFTP90})
				}
			}
			xys = meanByX(xys)
			if len(xys) == 1 && len(links) > 1 && !slices.Contains(poolPolicies, pol) {
				// Run at one link: a policy that never fetches does not
				// depend on it, so it is drawn across the grid.
				y := xys[0].Y
				xys = nil
				for _, l := range links {
					xys = append(xys, plotter.XY{X: l, Y: y})
				}
				xys = meanByX(xys)
			}
			lines = append(lines, pol, xys)
		}
		if err := plotutil.AddLinePoints(p, lines...); err != nil {
			errs = append(errs, err)
			continue
		}
		// Below round-robin's line, above the rest.
		p.Legend.Top, p.Legend.YOffs = true, -1.2*vg.Centimeter
		logRange(&p.X)
		logRange(&p.Y)
		name := fmt.Sprintf("ttft-p90-vs-link-%s-x%g-n%d-h%g.png", g.model, g.scale, g.nodes, g.host)
		errs = append(errs, p.Save(8*vg.Inch, 5*vg.Inch, filepath.Join(dir, name)))
	}
	errs = append(errs, plotKVBytes(dir, rows))
	return errors.Join(errs...)
}

// logRange widens a log axis whose data span no range (one link, equal
// TTFTs), which would otherwise be padded below zero.
func logRange(a *plot.Axis) {
	if a.Min > 0 && a.Max > a.Min*1.01 {
		return
	}
	mid := math.Max(a.Max, 1e-9)
	a.Min, a.Max = mid/2, mid*2
}

// meanByX sorts xys by X and averages the Ys of equal Xs: runs that
// differ only by seed make one point.
func meanByX(xys plotter.XYs) plotter.XYs {
	slices.SortFunc(xys, func(a, b plotter.XY) int { return cmp.Compare(a.X, b.X) })
	var out plotter.XYs
	for i := 0; i < len(xys); {
		j, sum := i, 0.0
		for ; j < len(xys) && xys[j].X == xys[i].X; j++ {
			sum += xys[j].Y
		}
		out = append(out, plotter.XY{X: xys[i].X, Y: sum / float64(j-i)})
		i = j
	}
	return out
}

func policiesIn(rows []simRow) []string {
	var out []string
	for _, r := range rows {
		if !slices.Contains(out, r.Policy) {
			out = append(out, r.Policy)
		}
	}
	return out
}

// plotKVBytes plots the pool's TTFT p90 over the best no-pool policy's
// against KV bytes per token, one line per link bandwidth: below 1 the
// pool pays. The no-pool policies do not depend on the link, so one run of
// them per model (and load, nodes, host tier, seed) serves every link.
func plotKVBytes(dir string, rows []simRow) error {
	type point struct {
		model string
		scale float64
		nodes int
		host  float64
		seed  uint64
	}
	at := func(r simRow) point { return point{r.Model, r.TimeScale, r.Nodes, r.HostGB, r.Seed} }
	best := map[point]float64{}
	models := map[string]bool{}
	for _, r := range rows {
		models[r.Model] = true
		if !slices.Contains(noPool, r.Policy) {
			continue
		}
		if b, ok := best[at(r)]; !ok || r.TTFTP90 < b {
			best[at(r)] = r.TTFTP90
		}
	}
	if len(models) < 2 {
		return nil
	}
	pool := "pool-split"
	if !slices.ContainsFunc(rows, func(r simRow) bool { return r.Policy == pool }) {
		pool = "pool"
	}
	links := map[float64]plotter.XYs{}
	for _, r := range rows {
		if b, ok := best[at(r)]; ok && r.Policy == pool && b > 0 {
			links[r.LinkGbps] = append(links[r.LinkGbps], plotter.XY{X: r.KVBytesPerToken, Y: r.TTFTP90 / b})
		}
	}
	if len(links) == 0 {
		return nil
	}
	p := plot.New()
	p.Title.Text = pool + " TTFT p90 / best no-pool policy's"
	p.X.Label.Text = "KV bytes per token"
	p.Y.Label.Text = "ratio (below 1: the pool pays)"
	p.X.Scale, p.X.Tick.Marker = plot.LogScale{}, plot.LogTicks{Prec: -1}
	var keys []float64
	for k := range links {
		keys = append(keys, k)
	}
	slices.Sort(keys)
	var lines []any
	for _, k := range keys {
		lines = append(lines, fmt.Sprintf("%g Gbit/s", k), meanByX(links[k]))
	}
	if err := plotutil.AddLinePoints(p, lines...); err != nil {
		return err
	}
	logRange(&p.X)
	return p.Save(8*vg.Inch, 5*vg.Inch, filepath.Join(dir, "ttft-p90-ratio-vs-kv-bytes.png"))
}
