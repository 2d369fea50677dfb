package runtime

import (
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/tutti-io/tutti/kvshape"
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
	if p := st.Devices.Probes; st.Devices.ProbeFailures != 0 || len(p) != 1 || p[0].State != ProbeMeasured ||
		p[0].WriteBytesPerSec != 16*defaultDevice.WriteBytesPerSec || p[0].ProbeBytes != probeMaxBytes || p[0].ProbeNs != time.Millisecond.Nanoseconds() {
		t.Fatalf("%+v: want dir 0 measured", st.Devices)
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
	if p := st.Devices.Probes; st.Devices.ProbeFailures != 1 || len(p) != 1 || p[0].State != ProbeSeeded ||
		p[0].Reason != "probe refused by the test" || p[0].WriteBytesPerSec != defaultDevice.WriteBytesPerSec {
		t.Fatalf("%+v: want one failure naming the error, on the seed", st.Devices)
	}
}

// TestProbeDevicesRejectsNonsense: rates that cannot predict times (zero,
// NaN) are a failure, not a seed.
func TestProbeDevicesRejectsNonsense(t *testing.T) {
	profiles, report := probeDevices([]string{"a", "b"}, defaultDevice, func(dir string, _ time.Duration) (probeRates, error) {
		if dir == "a" {
			return probeRates{WriteBytesPerSec: 0, ReadBytesPerSec: 1e9}, nil
		}
		return probeRates{WriteBytesPerSec: 3e9, ReadBytesPerSec: 6e9}, nil
	})
	if profiles[0] != defaultDevice || report[0].State != ProbeSeeded || !strings.Contains(report[0].Reason, "rates must be finite") {
		t.Fatalf("profile 0 %+v, report %+v: want dir 0 on the seed", profiles[0], report[0])
	}
	want := defaultDevice
	want.WriteBytesPerSec, want.ReadBytesPerSec = 3e9, 6e9
	if profiles[1] != want || report[1].State != ProbeMeasured || report[1].Reason != "" {
		t.Fatalf("profile 1 %+v, report %+v: want %+v measured", profiles[1], report[1], want)
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
	cfg := testConfig(t, g, kvshape.LayoutPerLayer, 64)
	cfg.probe = nil
	s, kv := openKV(t, cfg)
	st := s.Stats()
	closeKV(t, s, kv)
	t.Logf("%+v", st.Devices)
	measured, seeded := 0, 0
	for _, p := range st.Devices.Probes {
		switch {
		case p.State == ProbeMeasured && p.Reason == "" && p.ProbeBytes > 0:
			measured++
		case p.State == ProbeSeeded && p.Reason != "":
			seeded++
		}
	}
	if len(st.Devices.Probes) != len(cfg.Dirs) || measured+seeded != len(cfg.Dirs) || int64(seeded) != st.Devices.ProbeFailures {
		t.Fatalf("%+v: want each of %d dirs measured or seeded (counted, with why)", st.Devices, len(cfg.Dirs))
	}
	for _, dir := range cfg.Dirs {
		if _, err := os.Stat(filepath.Join(dir, probeFile)); !os.IsNotExist(err) {
			t.Fatalf("scratch file left in %s: %v", dir, err)
		}
	}

	cfg = testConfig(t, g, kvshape.LayoutPerLayer, 64)
	cfg.probe, cfg.Device = nil, defaultDevice
	s, kv = openKV(t, cfg)
	if st := s.Stats(); st.Devices.ProbeFailures != 0 || len(st.Devices.Probes) != len(cfg.Dirs) || st.Devices.Probes[0].State != ProbeConfigured {
		t.Errorf("with Config.Device: %+v", st.Devices)
	}
	closeKV(t, s, kv)
}
