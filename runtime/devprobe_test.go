package runtime

import (
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/tutti-io/tutti/objmap"
	"github.com/tutti-io/tutti/sched"
	"golang.org/x/sys/unix"
)

// fixedProbe is a prober that measures the given rates.
func fixedProbe(writeBps, readBps float64) deviceProber {
	return func(string, time.Duration) (probeRates, error) {
		return probeRates{WriteBytesPerSec: writeBps, ReadBytesPerSec: readBps, Bytes: probeMaxBytes, Took: time.Millisecond}, nil
	}
}

// TestProbedFastDeviceAdmitsWholeSave is the fast device's case: on a fresh store
// whose device writes far faster than the seed profile, a save that the
// seed says takes two bounds, but the device writes in a fraction of one,
// is admitted whole instead of cut at its first Save.
func TestProbedFastDeviceAdmitsWholeSave(t *testing.T) {
	st := checkFreshSave(t, 2, true, fixedProbe(16*defaultDevice.WriteBytesPerSec, 16*defaultDevice.ReadBytesPerSec))
	if st.DeviceProbeFailures != 0 || !strings.Contains(st.DeviceProbe, "dir 0: probed write") {
		t.Fatalf("DeviceProbe %q, %d failures: want dir 0 probed", st.DeviceProbe, st.DeviceProbeFailures)
	}
}

// TestProbedSlowDeviceCuts: a device slower than the seed is cut to what it
// writes within the bound, counted as SkipBound, although the seed would
// have admitted the save whole.
func TestProbedSlowDeviceCuts(t *testing.T) {
	checkFreshSave(t, 0.8, false, fixedProbe(defaultDevice.WriteBytesPerSec/4, defaultDevice.ReadBytesPerSec/4))
}

// TestProbeFailureKeepsSeed: a device the probe cannot measure is seeded
// with the default profile (so the seed's cut applies), counted and
// reported with the probe's error.
func TestProbeFailureKeepsSeed(t *testing.T) {
	failing := func(dir string, _ time.Duration) (probeRates, error) {
		return probeRates{}, errors.New("probe refused by the test")
	}
	st := checkFreshSave(t, 2, false, failing)
	if st.DeviceProbeFailures != 1 || !strings.Contains(st.DeviceProbe, "probe refused by the test") || !strings.Contains(st.DeviceProbe, "seed write") {
		t.Fatalf("DeviceProbe %q, %d failures: want one failure naming the error and the seed", st.DeviceProbe, st.DeviceProbeFailures)
	}
}

// TestProbeDevicesRejectsNonsense: rates that cannot predict times (zero,
// NaN) are a failure, not a seed.
func TestProbeDevicesRejectsNonsense(t *testing.T) {
	profiles, report, failures := probeDevices([]string{"a", "b"}, defaultDevice, func(dir string, _ time.Duration) (probeRates, error) {
		if dir == "a" {
			return probeRates{WriteBytesPerSec: 0, ReadBytesPerSec: 1e9}, nil
		}
		return probeRates{WriteBytesPerSec: 3e9, ReadBytesPerSec: 6e9}, nil
	})
	if failures != 1 || profiles[0] != defaultDevice || !strings.Contains(report, "dir 0: not probed") {
		t.Fatalf("failures %d, profile 0 %+v, report %q: want dir 0 on the seed", failures, profiles[0], report)
	}
	want := defaultDevice
	want.WriteBytesPerSec, want.ReadBytesPerSec = 3e9, 6e9
	if profiles[1] != want {
		t.Fatalf("profile 1 %+v: want %+v", profiles[1], want)
	}
	if err := profiles[1].Validate(); err != nil {
		t.Fatal(err)
	}
	var _ sched.DeviceProfile = profiles[1]
}

// TestProbeDir runs the real probe on a temporary directory: it finishes
// within its budget (plus scheduling slack), measures positive rates and
// leaves no scratch file. File systems without O_DIRECT (tmpfs) are skipped.
func TestProbeDir(t *testing.T) {
	dir := t.TempDir()
	start := time.Now()
	r, err := probeDir(dir, probeBudget)
	took := time.Since(start)
	if errors.Is(err, unix.EINVAL) {
		t.Skipf("no O_DIRECT here: %v", err)
	}
	if err != nil {
		if errors.Is(err, errProbeShort) {
			t.Skipf("device too slow for the budget: %v", err)
		}
		t.Fatalf("probeDir: %v", err)
	}
	t.Logf("write %.3g B/s, read %.3g B/s, %d MiB in %v (call %v)", r.WriteBytesPerSec, r.ReadBytesPerSec, r.Bytes>>20, r.Took, took)
	if !(r.WriteBytesPerSec > 0 && r.ReadBytesPerSec > 0) || r.Bytes <= 0 || r.Bytes > probeMaxBytes {
		t.Fatalf("rates %+v", r)
	}
	if took > probeBudget+time.Second {
		t.Fatalf("probe took %v: budget %v", took, probeBudget)
	}
	if _, err := os.Stat(filepath.Join(dir, probeFile)); !os.IsNotExist(err) {
		t.Fatalf("scratch file left: %v", err)
	}
}

// TestOpenProbesDevices: Open with no device profile runs the real probe on
// every directory and reports each one, probed or on the seed (counted);
// with a profile or under a test engine it does not probe.
func TestOpenProbesDevices(t *testing.T) {
	g := tinyGeometry()
	cfg := testConfig(t, g, objmap.LayoutPerLayer, 64)
	cfg.probe = nil
	s, kv := openKV(t, cfg)
	st := s.Stats()
	closeKV(t, s, kv)
	t.Logf("%s (%d failures)", st.DeviceProbe, st.DeviceProbeFailures)
	probed := strings.Count(st.DeviceProbe, ": probed write")
	if probed+int(st.DeviceProbeFailures) != len(cfg.Dirs) || strings.Count(st.DeviceProbe, ": not probed (") != int(st.DeviceProbeFailures) {
		t.Fatalf("DeviceProbe %q, %d failures: want each of %d dirs probed or counted", st.DeviceProbe, st.DeviceProbeFailures, len(cfg.Dirs))
	}
	for _, dir := range cfg.Dirs {
		if _, err := os.Stat(filepath.Join(dir, probeFile)); !os.IsNotExist(err) {
			t.Fatalf("scratch file left in %s: %v", dir, err)
		}
	}

	cfg = testConfig(t, g, objmap.LayoutPerLayer, 64)
	cfg.probe, cfg.Device = nil, defaultDevice
	s, kv = openKV(t, cfg)
	if st := s.Stats(); st.DeviceProbeFailures != 0 || !strings.Contains(st.DeviceProbe, "Config.Device is set") {
		t.Errorf("with Config.Device: DeviceProbe %q, %d failures", st.DeviceProbe, st.DeviceProbeFailures)
	}
	closeKV(t, s, kv)
}
