package devprobe

import (
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/tutti-io/tutti/sched"
	"golang.org/x/sys/unix"
)

// seed is a conservative SSD, as a store seeds its models.
var seed = sched.DeviceProfile{ReadBytesPerSec: 2e9, WriteBytesPerSec: 1e9, ReadIOPS: 2e5, WriteIOPS: 1e5,
	ReadLatencyNs: 1e5, ReadShareUnderWrites: 0.5, WriteShareUnderReads: 0.5}

// TestDevicesRejectNonsense: rates that cannot predict times (zero, NaN)
// are a failure, not a seed; measured rates replace the seed's bandwidths.
func TestDevicesRejectNonsense(t *testing.T) {
	out := Devices([]string{"a", "b", "c"}, seed, func(dir string, _ time.Duration) (Rates, error) {
		switch dir {
		case "a":
			return Rates{WriteBytesPerSec: 0, ReadBytesPerSec: 1e9}, nil
		case "b":
			return Rates{WriteBytesPerSec: 3e9, ReadBytesPerSec: 6e9, Bytes: 1 << 20, Took: time.Millisecond}, nil
		}
		return Rates{}, errors.New("refused")
	})
	if out[0].Profile != seed || out[0].Err == nil || !strings.Contains(out[0].Err.Error(), "rates must be finite") {
		t.Fatalf("dir a: %+v: want the seed, with why", out[0])
	}
	want := seed
	want.WriteBytesPerSec, want.ReadBytesPerSec = 3e9, 6e9
	if out[1].Profile != want || out[1].Err != nil || out[1].Rates.Bytes != 1<<20 {
		t.Fatalf("dir b: %+v: want %+v measured", out[1], want)
	}
	if err := out[1].Profile.Validate(); err != nil {
		t.Fatal(err)
	}
	if out[2].Profile != seed || out[2].Err == nil || out[2].Err.Error() != "refused" {
		t.Fatalf("dir c: %+v: want the seed and the probe's error", out[2])
	}
}

// TestProbeDir runs the real probe on a temporary directory: it finishes
// within its budget (plus scheduling slack), measures positive rates and
// leaves no scratch file. File systems without O_DIRECT (tmpfs) are skipped.
func TestProbeDir(t *testing.T) {
	dir := t.TempDir()
	start := time.Now()
	r, err := Dir(dir, probeBudget)
	took := time.Since(start)
	if errors.Is(err, unix.EINVAL) {
		t.Skipf("no O_DIRECT here: %v", err)
	}
	if err != nil {
		if errors.Is(err, errProbeShort) {
			t.Skipf("device too slow for the budget: %v", err)
		}
		t.Fatalf("Dir: %v", err)
	}
	t.Logf("write %.3g B/s, read %.3g B/s, %d MiB in %v (call %v)", r.WriteBytesPerSec, r.ReadBytesPerSec, r.Bytes>>20, r.Took, took)
	if !(r.WriteBytesPerSec > 0 && r.ReadBytesPerSec > 0) || r.Bytes <= 0 || r.Bytes > probeMaxBytes {
		t.Fatalf("rates %+v", r)
	}
	if took > probeBudget+time.Second {
		t.Fatalf("probe took %v: budget %v", took, probeBudget)
	}
	if _, err := os.Stat(filepath.Join(dir, ScratchFile)); !os.IsNotExist(err) {
		t.Fatalf("scratch file left: %v", err)
	}
}
