package seqlock

import (
	"bytes"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strings"
	"testing"
)

func TestRead(t *testing.T) {
	src := []byte("block bytes")
	dst := make([]byte, len(src))
	word := uint64(7)
	if !Read(&word, 7, func() { copy(dst, src) }) || !bytes.Equal(dst, src) {
		t.Fatalf("Read with the right version: %q", dst)
	}
	ran := false
	if Read(&word, 8, func() { ran = true }) || ran {
		t.Fatal("Read with a stale version ran or reported success")
	}
	if Read(&word, 7, func() { word = 9 }) {
		t.Fatal("Read reported success although the version changed during the read")
	}
}

// TestArm64ReadFencesBeforeRecheck compiles Read for arm64, where loads
// may complete out of order, and checks the code it makes: the read runs,
// then the fence, and only then is the version word loaded again. Without the fence a copy torn by a concurrent replacement
// could pass the second check.
func TestArm64ReadFencesBeforeRecheck(t *testing.T) {
	goTool := filepath.Join(runtime.GOROOT(), "bin", "go")
	cmd := exec.Command(goTool, "build", "-o", os.DevNull, "-gcflags=-S", ".")
	cmd.Env = append(os.Environ(), "GOARCH=arm64", "GOOS=linux", "CGO_ENABLED=0")
	out, err := cmd.CombinedOutput()
	if err != nil {
		t.Fatalf("go build for arm64: %v\n%s", err, out)
	}
	var body []string
	in := false
	for _, line := range strings.Split(string(out), "\n") {
		if strings.Contains(line, "seqlock.Read STEXT") {
			in = true
			continue
		}
		if in && strings.Contains(line, " STEXT") {
			break
		}
		if in {
			body = append(body, line)
		}
	}
	want := []string{"LDAR", "CALL\t(R", "CALL\tgithub.com/kvpool/kvpool/api/internal/seqlock.loadFence", "LDAR"}
	next := 0
	for _, line := range body {
		if next < len(want) && strings.Contains(line, want[next]) {
			next++
		}
	}
	if next < len(want) {
		t.Fatalf("arm64 Read lacks %q in order (load, read, fence, load); its code:\n%s", want[next], strings.Join(body, "\n"))
	}
	asm, err := os.ReadFile("fence_arm64.s")
	if err != nil || !strings.Contains(string(asm), "DMB\t$0x9") {
		t.Fatalf("fence_arm64.s does not issue DMB ISHLD: %v", err)
	}
}
