// Package deptest pins the import graph in tests. Each package's TestDeps
// names what it may not depend on, directly or through anything it
// imports, and Check fails the test on every edge that breaks the rule:
// the dependency tests together are the proof of the package map in
// docs/architecture.md.
//
//	func TestDeps(t *testing.T) {
//		deptest.Check(t, deptest.Rules{Forbidden: []string{"github.com/kvpool/kvpool/pool/..."}})
//	}
package deptest

import (
	"bytes"
	"os/exec"
	"path/filepath"
	"runtime"
	"slices"
	"strings"
	"testing"
)

// Rules say what a package's dependencies may be. Patterns are import
// paths; one ending in "/..." also matches every path below it.
type Rules struct {
	// Package is the import path to check; "." (the default) is the
	// package of the test that calls Check.
	Package string
	// Forbidden may not appear among the package's dependencies, direct or
	// transitive.
	Forbidden []string
	// OnlyModules, when set, lists the only non-standard import paths the
	// package may depend on (the module itself needs listing too): for
	// packages that must stay small, like the pure policy and cost code.
	OnlyModules []string
}

// Check lists the dependencies of r.Package with `go list -deps` and
// reports every one that breaks r.
func Check(t testing.TB, r Rules) {
	t.Helper()
	if r.Package == "" {
		r.Package = "."
	}
	out, err := exec.Command(goTool(), "list", "-deps", "-f", "{{if not .Standard}}{{.ImportPath}}{{end}}", r.Package).Output()
	if err != nil {
		var stderr []byte
		if ee, ok := err.(*exec.ExitError); ok {
			stderr = ee.Stderr
		}
		t.Fatalf("go list -deps %s: %v\n%s", r.Package, err, stderr)
	}
	deps := strings.Fields(string(bytes.TrimSpace(out)))
	if len(deps) == 0 {
		t.Fatalf("go list -deps %s listed nothing", r.Package)
	}
	self := deps[len(deps)-1] // go list prints the package itself last
	for _, d := range deps[:len(deps)-1] {
		if slices.ContainsFunc(r.Forbidden, func(p string) bool { return Match(p, d) }) {
			t.Errorf("%s depends on %s, which its rules forbid", self, d)
		}
		if r.OnlyModules != nil && !slices.ContainsFunc(r.OnlyModules, func(p string) bool { return Match(p, d) }) {
			t.Errorf("%s depends on %s, outside the modules it may use (%s)", self, d, strings.Join(r.OnlyModules, ", "))
		}
	}
}

// Match reports whether import path p matches pattern: equal, or below it
// when pattern ends in "/...".
func Match(pattern, p string) bool {
	if prefix, ok := strings.CutSuffix(pattern, "/..."); ok {
		return p == prefix || strings.HasPrefix(p, prefix+"/")
	}
	return p == pattern
}

// goTool is the go command that runs the tests: the one in GOROOT, so a
// test run by any go finds the same toolchain.
func goTool() string {
	if p := filepath.Join(runtime.GOROOT(), "bin", "go"); runtime.GOROOT() != "" {
		if _, err := exec.LookPath(p); err == nil {
			return p
		}
	}
	return "go"
}
