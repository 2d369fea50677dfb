package emudev

import (
	"bytes"
	"os"
	"path/filepath"
	"testing"
)

// needFUSE skips where FUSE devices cannot be mounted (not root, no
// /dev/fuse): the emulator runs on the GPU machine and the dev VM, as root.
func needFUSE(t *testing.T) {
	t.Helper()
	if os.Geteuid() != 0 {
		t.Skip("emudev: needs root to mount FUSE with mount(2)")
	}
	if _, err := os.Stat("/dev/fuse"); err != nil {
		t.Skipf("emudev: no /dev/fuse: %v", err)
	}
}

func backing(t *testing.T, n int, size int64) []string {
	t.Helper()
	var out []string
	for i := 0; i < n; i++ {
		p := filepath.Join(t.TempDir(), "b")
		if err := os.WriteFile(p, make([]byte, size), 0o600); err != nil {
			t.Fatal(err)
		}
		out = append(out, p)
	}
	return out
}

func TestServesBytesAtItsPace(t *testing.T) {
	needFUSE(t)
	files := backing(t, 2, 8<<20)
	e, err := Start(Config{Backing: files, MountDir: t.TempDir(), ReadBytesPerSec: 64 << 20, WriteBytesPerSec: 64 << 20})
	if err != nil {
		t.Fatal(err)
	}
	closed := false
	defer func() {
		if !closed {
			_ = e.Close()
		}
	}()
	paths := e.Paths()
	if len(paths) != 2 {
		t.Fatalf("paths %v, want 2", paths)
	}
	pat := bytes.Repeat([]byte("tutti-emudev 123"), 1<<16) // 1 MiB
	for i, p := range paths {
		f, err := os.OpenFile(p, os.O_RDWR, 0)
		if err != nil {
			t.Fatal(err)
		}
		for k := int64(0); k < 4; k++ {
			if _, err := f.WriteAt(pat, k<<20+int64(i)*4096); err != nil {
				t.Fatalf("write %s: %v", p, err)
			}
		}
		got := make([]byte, len(pat))
		if _, err := f.ReadAt(got, 2<<20+int64(i)*4096); err != nil || !bytes.Equal(got, pat) {
			t.Fatalf("read back %s: %v, equal %v", p, err, bytes.Equal(got, pat))
		}
		if _, err := f.WriteAt(pat, 8<<20-4096); err == nil {
			t.Fatalf("a write past the device's end succeeded")
		}
		if err := f.Sync(); err != nil {
			t.Fatalf("sync: %v", err)
		}
		_ = f.Close()
	}
	st := e.Stats()
	for i, s := range st {
		if s.WriteBytes != 4<<20 || s.ReadBytes < 1<<20 || s.Syncs < 1 || s.PacedWaitNs <= 0 || s.OutOfRangeRW != 0 {
			t.Fatalf("device %d stats %+v: want 4 MiB written, 1 MiB read, a sync, paced waits", i, s)
		}
	}
	if err := e.Close(); err != nil {
		t.Fatal(err)
	}
	closed = true
	// the bytes are the backing file's
	b, err := os.ReadFile(files[1])
	if err != nil || !bytes.Equal(b[3<<20+4096:3<<20+4096+len(pat)], pat) {
		t.Fatalf("backing file after Close: %v, holds the written bytes %v", err, err == nil && bytes.Equal(b[3<<20+4096:3<<20+4096+len(pat)], pat))
	}
}

func TestStartRefuses(t *testing.T) {
	good := []string{"x"}
	for _, tc := range []struct {
		name string
		cfg  Config
	}{
		{"no devices", Config{MountDir: "/tmp"}},
		{"too many", Config{Backing: make([]string, MaxDevices+1), MountDir: "/tmp"}},
		{"slow rate", Config{Backing: good, MountDir: "/tmp", ReadBytesPerSec: 1000}},
		{"no mount dir", Config{Backing: good}},
		{"missing backing", Config{Backing: []string{filepath.Join(t.TempDir(), "none")}, MountDir: t.TempDir()}},
		{"odd size", Config{Backing: func() []string {
			p := filepath.Join(t.TempDir(), "odd")
			_ = os.WriteFile(p, make([]byte, 5000), 0o600)
			return []string{p}
		}(), MountDir: t.TempDir()}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if e, err := Start(tc.cfg); err == nil {
				_ = e.Close()
				t.Fatalf("Start(%+v) succeeded", tc.cfg)
			}
		})
	}
}
