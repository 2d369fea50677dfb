package runtime

import (
	"errors"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/tutti-io/tutti/kvshape"
	"github.com/tutti-io/tutti/runtime/internal/devprobe"
)

// fixedProbeBytes is what fixedProbe says it wrote.
const fixedProbeBytes = 64 << 20

// fixedProbe is a prober that measures the given rates.
func fixedProbe(writeBps, readBps float64) devprobe.Prober {
	return func(string, time.Duration) (devprobe.Rates, error) {
		return devprobe.Rates{WriteBytesPerSec: writeBps, ReadBytesPerSec: readBps, Bytes: fixedProbeBytes, Took: time.Millisecond}, nil
	}
}

// TestProbedFastDeviceAdmitsWholeSave is the fast device's case: on a fresh store
// whose device writes far faster than the seed profile, a save that the
// seed says takes two bounds, but the device writes in a fraction of one,
// is admitted whole instead of cut at its first Save.
func TestProbedFastDeviceAdmitsWholeSave(t *testing.T) {
	st := checkFreshSave(t, 2, true, fixedProbe(16*defaultDevice.WriteBytesPerSec, 16*defaultDevice.ReadBytesPerSec))
	if p := st.Devices.Probes; st.Devices.ProbeFailures != 0 || len(p) != 1 || p[0].State != ProbeMeasured ||
		p[0].WriteBytesPerSec != 16*defaultDevice.WriteBytesPerSec || p[0].ProbeBytes != fixedProbeBytes || p[0].ProbeNs != time.Millisecond.Nanoseconds() {
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
	failing := func(dir string, _ time.Duration) (devprobe.Rates, error) {
		return devprobe.Rates{}, errors.New("probe refused by the test")
	}
	st := checkFreshSave(t, 2, false, failing)
	if p := st.Devices.Probes; st.Devices.ProbeFailures != 1 || len(p) != 1 || p[0].State != ProbeSeeded ||
		p[0].Reason != "probe refused by the test" || p[0].WriteBytesPerSec != defaultDevice.WriteBytesPerSec {
		t.Fatalf("%+v: want one failure naming the error, on the seed", st.Devices)
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
		if _, err := os.Stat(filepath.Join(dir, devprobe.ScratchFile)); !os.IsNotExist(err) {
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
