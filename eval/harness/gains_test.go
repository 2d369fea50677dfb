package harness

import (
	"strings"
	"testing"
)

// TestGains: the summary's first lines say, under a heading naming tutti's
// backend, the workload and the machine's storage, what tutti gained against
// recompute, each storage design and the DRAM tier; a loss reads as one,
// with the page cache named where the design read from it.
func TestGains(t *testing.T) {
	row := func(name string, p50, rate, bps, ios float64) BackendResult {
		b := claimBackend(name, 10, 60)
		b.TTFTmsP50, b.MaxRateAtSLO, b.BytesPerS, b.IOsPerRequestMean, b.HitRatio = p50, rate, bps, ios, 0.86
		b.DirectIO, b.RestoredBytes, b.DeviceReadBytes = true, 1<<30, 1<<30
		return b
	}
	disk := row("lmcache-disk", 4, 30, 4e9, 150)
	disk.DirectIO, disk.DeviceReadBytes = false, 28<<20
	res := &Result{Model: "tiny", Workload: WorkloadDocQA, Disks: "vda", CeilingBytesPS: 6.7e9, Backends: []BackendResult{
		row("tutti-cpu", 8, 20, 2.5e9, 4),
		row("lmcache-gds", 10, 10, 1.9e9, 156),
		disk,
		row("vllm-fs", 43, 0, 0.37e9, 2500),
		row("dram", 2, 40, 9e9, 156),
		row("recompute", 16, 2, 0, 0),
		{Backend: "tutti-gpu", Skipped: "no GPU"},
	}}
	heading, gains := Gains(res)
	for _, want := range []string{"what tutti-cpu gained", "docqa", "hit ratio 0.86", "model tiny", "store on vda", "6.70 GB/s", "one round"} {
		if !strings.Contains(heading, want) {
			t.Errorf("heading %q lacks %q", heading, want)
		}
	}
	got := map[string]string{}
	var order []string
	for _, g := range gains {
		got[g.Against] = g.Text
		order = append(order, g.Against)
	}
	if strings.Join(order, ",") != "recompute,lmcache-gds,lmcache-disk,vllm-fs,dram" {
		t.Fatalf("gains against %v", order)
	}
	for name, wants := range map[string][]string{
		"recompute":    {"p50 TTFT 2.00× lower (8.0 vs 16.0 ms)", "rate at the SLO 10.00× recompute's"},
		"lmcache-gds":  {"restores 1.32× as fast (2.50 vs 1.90 GB/s, 4 vs 156 I/Os per request)", "p50 TTFT 1.25× lower", "2.00× lmcache-gds's"},
		"lmcache-disk": {"restores 0.62× as fast", "p50 TTFT 2.00× higher", "0.67× lmcache-disk's", "from the page cache (device reads 28 MiB of 1024 MiB"},
		"vllm-fs":      {"vllm-fs never meets it"},
		"dram":         {"p50 TTFT 4.00× higher", "the bound"},
	} {
		for _, w := range wants {
			if !strings.Contains(got[name], w) {
				t.Errorf("against %s: %q lacks %q", name, got[name], w)
			}
		}
	}
	if strings.Contains(got["lmcache-gds"], "page cache") {
		t.Errorf("an O_DIRECT design credited to the page cache: %s", got["lmcache-gds"])
	}

	res.Backends[0].Skipped = "broke"
	if h, g := Gains(res); h != "" || g != nil {
		t.Errorf("no tutti backend ran: %q %v", h, g)
	}
}

// TestClaimsNameTheWorkload: a missed p99 claim explains its cold requests
// by the workload that ran: docqa's first questions only for docqa.
func TestClaimsNameTheWorkload(t *testing.T) {
	const slo = 60.0
	for _, c := range []struct{ workload, want, not string }{
		{WorkloadDocQA, "in docqa, each document's first question", ""},
		{"the Mooncake conversation trace's embedded window", "in this window", "docqa"},
	} {
		res := &Result{SLOms: slo, Workload: c.workload, Backends: []BackendResult{
			claimBackend("tutti-cpu", 10, slo), claimBackend("lmcache-gds", 10, slo)}}
		var p99 *Claim
		for _, cl := range Claims(res) {
			if strings.HasPrefix(cl.Name, "p99") {
				p99 = &cl
			}
		}
		if p99 == nil || p99.Met {
			t.Fatalf("%s: p99 claim %+v, want one missed (equal backends)", c.workload, p99)
		}
		if !strings.Contains(p99.Detail, c.want) || c.not != "" && strings.Contains(p99.Detail, c.not) {
			t.Errorf("%s: %q, want %q and not %q", c.workload, p99.Detail, c.want, c.not)
		}
	}
}
