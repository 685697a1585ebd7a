package test

import (
	"bytes"
	"context"
	"encoding/json"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"testing"

	"google.golang.org/grpc/codes"

	"github.com/kvpool/kvpool/api"
	"github.com/kvpool/kvpool/api/wire"
)

// python is Debian's interpreter: another python3 may come first on PATH
// and not see Debian's packages (grpcio, protobuf, numpy, torch, crc32c).
const python = "/usr/bin/python3"

// pythonDir is api/python, the Python client's root.
func pythonDir(t *testing.T) string {
	t.Helper()
	_, file, _, _ := runtime.Caller(0)
	return filepath.Join(filepath.Dir(file), "..", "api", "python")
}

// requirePython skips (or, under KVPOOL_REQUIRE_TOOLS, fails) without
// Debian's python3 and the packages the client and its tests import.
func requirePython(t *testing.T) {
	t.Helper()
	out, err := exec.Command(python, "-c", "import grpc, google.protobuf, numpy, torch, crc32c, pytest").CombinedOutput()
	if err == nil {
		return
	}
	if os.Getenv("KVPOOL_REQUIRE_TOOLS") != "" {
		t.Fatalf("%s cannot import the client's packages (KVPOOL_REQUIRE_TOOLS is set): %v\n%s", python, err, out)
	}
	t.Skipf("%s cannot import the client's packages: %s", python, out)
}

func pythonCmd(t *testing.T, args ...string) *exec.Cmd {
	cmd := exec.Command(python, args...)
	cmd.Dir = pythonDir(t)
	cmd.Env = append(os.Environ(), "PYTHONPATH="+pythonDir(t), "PYTHONDONTWRITEBYTECODE=1")
	return cmd
}

// The Python suite (api/python/tests), against daemons of this build: the
// client on every path, chain keys, the model, and the engines that reuse
// KV through two daemons. It is part of `go test ./...`, so the README's
// one test command runs both suites.
func TestPython(t *testing.T) {
	requirePython(t)
	cmd := pythonCmd(t, "-m", "pytest", "-q", "-rs", "tests")
	cmd.Env = append(cmd.Env, "KVPOOL_BIN="+kvpoolBin(t))
	out, err := cmd.CombinedOutput()
	t.Logf("pytest:\n%s", out)
	if err != nil {
		t.Fatalf("pytest: %v", err)
	}
}

// kvpool.errors.CODES must be api's table: the same code for every
// sentinel, so an error means the same thing in both clients.
func TestPythonErrorTable(t *testing.T) {
	requirePython(t)
	out, err := pythonCmd(t, "-c", "import json; from kvpool import errors; print(json.dumps([[c.__name__, code] for c, code in errors.CODES]))").Output()
	if err != nil {
		t.Fatal(err)
	}
	var table [][2]any
	if err := json.Unmarshal(out, &table); err != nil {
		t.Fatal(err)
	}
	sentinels := map[string]error{
		"NotFound": api.ErrNotFound, "AlreadyExists": api.ErrAlreadyExists, "ResourceExhausted": api.ErrResourceExhausted,
		"InvalidArgument": api.ErrInvalidArgument, "FailedPrecondition": api.ErrFailedPrecondition, "Unavailable": api.ErrUnavailable,
		"DataLoss": api.ErrDataLoss, "Internal": api.ErrInternal, "Unauthenticated": api.ErrUnauthenticated, "PermissionDenied": api.ErrPermissionDenied,
		"Cancelled": context.Canceled, "DeadlineExceeded": context.DeadlineExceeded,
	}
	if len(table) != len(sentinels) {
		t.Fatalf("Python's table has %d rows, Go's %d", len(table), len(sentinels))
	}
	for _, row := range table {
		name, code := row[0].(string), codes.Code(row[1].(float64))
		err, ok := sentinels[name]
		if !ok {
			t.Errorf("Python's %s has no Go sentinel", name)
			continue
		}
		if got := api.Code(err); got != code {
			t.Errorf("%s: Python maps it to %v, Go to %v", name, code, got)
		}
	}
}

// kvpool.wire's constants must be api/wire's.
func TestPythonWireConstants(t *testing.T) {
	requirePython(t)
	out, err := pythonCmd(t, "-c", `import json; from kvpool import wire as w
print(json.dumps({"preamble": list(w.PREAMBLE), "version": w.VERSION, "trailer": w.TRAILER_MAGIC,
  "req": w.REQUEST_HEADER_BYTES, "resp": w.RESPONSE_HEADER_BYTES, "name": w.MAX_NAME_BYTES, "key": w.MAX_KEY_BYTES, "msg": w.MAX_MESSAGE_BYTES,
  "ops": [w.OP_GET, w.OP_PUT, w.OP_REMOVE, w.OP_SOURCE, w.OP_SINK, w.OP_VIEW, w.OP_RELEASE, w.OP_RESERVE, w.OP_COMMIT, w.OP_ABORT, w.OP_EXISTS],
  "flags": [w.FLAG_CHECKSUM, w.FLAG_LEASE, w.FLAG_FORCE, w.FLAG_WRITER_CHECKSUM, w.FLAG_RESERVE_NEXT, w.FLAG_EXISTED, w.FLAG_CLOSE, w.FLAG_RESERVED],
  "version_segment": w.version_segment_bytes(1000)}))`).Output()
	if err != nil {
		t.Fatal(err)
	}
	want := map[string]any{
		"preamble": ints(wire.Preamble[:]), "version": wire.Version, "trailer": wire.TrailerMagic,
		"req": wire.RequestHeaderBytes, "resp": wire.ResponseHeaderBytes, "name": wire.MaxNameBytes, "key": wire.MaxKeyBytes, "msg": wire.MaxMessageBytes,
		"ops":             ints([]wire.Op{wire.OpGet, wire.OpPut, wire.OpRemove, wire.OpSource, wire.OpSink, wire.OpView, wire.OpRelease, wire.OpReserve, wire.OpCommit, wire.OpAbort, wire.OpExists}),
		"flags":           []int{wire.FlagChecksum, wire.FlagLease, wire.FlagForce, wire.FlagWriterChecksum, wire.FlagReserveNext, wire.FlagExisted, wire.FlagClose, wire.FlagReserved},
		"version_segment": wire.VersionSegmentBytes(1000),
	}
	wantJSON, _ := json.Marshal(want)
	var got, wantNorm map[string]any
	json.Unmarshal(out, &got)
	json.Unmarshal(wantJSON, &wantNorm)
	g, _ := json.Marshal(got)
	w, _ := json.Marshal(wantNorm)
	if !bytes.Equal(g, w) {
		t.Fatalf("kvpool.wire differs from api/wire:\npython %s\ngo     %s", g, w)
	}
}

// ints widens bytes so they marshal as JSON numbers, as Python's do.
func ints[T ~uint8](b []T) []int {
	out := make([]int, len(b))
	for i, v := range b {
		out[i] = int(v)
	}
	return out
}

// The committed Python stubs are what protoc and grpc_python_plugin make
// of proto/ today (CI also regenerates them and diffs).
func TestPythonStubsFresh(t *testing.T) {
	protoc := requireTool(t, "protoc")
	plugin := requireTool(t, "grpc_python_plugin")
	out := t.TempDir()
	root := filepath.Join(pythonDir(t), "..", "..")
	cmd := exec.Command(protoc, "-I", "proto", "--python_out="+out, "--grpc_python_out="+out, "--plugin=protoc-gen-grpc_python="+plugin,
		"proto/kvpool/v1/kvpool.proto", "proto/kvpool/v1/admin.proto")
	cmd.Dir = root
	if b, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("protoc: %v\n%s", err, b)
	}
	for _, f := range []string{"kvpool_pb2.py", "kvpool_pb2_grpc.py", "admin_pb2.py", "admin_pb2_grpc.py"} {
		fresh, err := os.ReadFile(filepath.Join(out, "kvpool", "v1", f))
		if err != nil {
			t.Fatal(err)
		}
		committed, err := os.ReadFile(filepath.Join(pythonDir(t), "kvpool", "v1", f))
		if err != nil {
			t.Fatal(err)
		}
		if !bytes.Equal(fresh, committed) {
			t.Errorf("api/python/kvpool/v1/%s is stale: run api/python/generate.sh", f)
		}
	}
}
