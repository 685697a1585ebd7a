// Package deptest pins kvpool's import graph. Graph holds one row per
// package of the module: what it may not depend on, directly or through
// anything it imports, or the only outside modules it may use.
// TestGraph checks every package against its row with one `go list`, and
// fails on a package without a row, so a new package must take its place
// in the graph before its tests pass: the rows are the proof of the
// package map in docs/architecture.md.
package deptest

import (
	"os/exec"
	"path/filepath"
	"runtime"
	"slices"
	"strings"
)

// Module is the import path of kvpool's module.
const Module = "github.com/kvpool/kvpool"

// Rules say what a package's dependencies may be. Patterns are import
// paths; one ending in "/..." also matches every path below it.
type Rules struct {
	// Forbidden may not appear among the package's dependencies, direct or
	// transitive.
	Forbidden []string
	// OnlyModules, when not nil, lists the only non-standard import paths
	// the package may depend on: for packages that must stay small, like
	// the wire protocol and the cost model. Empty means the standard
	// library only.
	OnlyModules []string
}

// Violations returns what is wrong, by r, with pkg depending on dep (a
// non-standard import path): nothing when the edge is allowed.
func (r Rules) Violations(pkg, dep string) []string {
	var out []string
	if slices.ContainsFunc(r.Forbidden, func(p string) bool { return Match(p, dep) }) {
		out = append(out, pkg+" depends on "+dep+", which its row of deptest.Graph forbids")
	}
	if r.OnlyModules != nil && !slices.ContainsFunc(r.OnlyModules, func(p string) bool { return Match(p, dep) }) {
		out = append(out, pkg+" depends on "+dep+", outside the modules its row of deptest.Graph allows ("+strings.Join(r.OnlyModules, ", ")+")")
	}
	return out
}

// Match reports whether import path p matches pattern: equal, or below it
// when pattern ends in "/...".
func Match(pattern, p string) bool {
	if prefix, ok := strings.CutSuffix(pattern, "/..."); ok {
		return p == prefix || strings.HasPrefix(p, prefix+"/")
	}
	return p == pattern
}

// Standard reports whether p is in the standard library: its first
// element has no dot (vendored copies, "vendor/...", included).
func Standard(p string) bool {
	first, _, _ := strings.Cut(p, "/")
	return !strings.Contains(first, ".")
}

// GoTool is the go command that runs the tests: the one in GOROOT, so a
// test run by any go finds the same toolchain.
func GoTool() string {
	if p := filepath.Join(runtime.GOROOT(), "bin", "go"); runtime.GOROOT() != "" {
		if _, err := exec.LookPath(p); err == nil {
			return p
		}
	}
	return "go"
}
