package harness

import (
	"fmt"
	"os"
	"slices"
	"strings"

	"github.com/tutti-io/tutti/eval/blockstat"
)

// Gain is what tutti gained against one backend, in words.
type Gain struct {
	Against, Text string
}

// Gains are the summary's first lines: what tutti (tutti-gpu where it ran,
// else tutti-cpu) gained in this run against recompute, each storage
// design that ran (lmcache-gds, lmcache-disk, vllm-fs) and the DRAM tier,
// from the run's own figures, under a heading that says what ran where. A
// loss is said as one, with what the run shows of why where it shows it
// (reads from the page cache). Empty when no tutti backend ran.
func Gains(res *Result) (heading string, gains []Gain) {
	ran := ranBackends(res)
	t := tuttiOf(ran)
	if t == nil {
		return "", nil
	}
	where := res.Storage
	if where == "" {
		where = "store on " + res.Disks
	}
	if res.CeilingBytesPS > 0 {
		where += fmt.Sprintf(", device ceiling %.2f GB/s", res.CeilingBytesPS/1e9)
	}
	rounds := "one round"
	if t.Rounds != nil {
		rounds = fmt.Sprintf("median of %d rounds", len(t.Rounds.MaxRateAtSLO))
	}
	workload := res.Workload
	if workload == "" {
		workload = "the requests"
	}
	heading = fmt.Sprintf("what %s gained on this machine (%s, %d requests, hit ratio %.2f; model %s; %s; %s)",
		t.Backend, workload, t.Requests, t.HitRatio, res.Model, where, rounds)
	line := func(name, format string, args ...any) {
		gains = append(gains, Gain{name, fmt.Sprintf(format, args...)})
	}
	if r := ran["recompute"]; r != nil {
		line(r.Backend, "p50 TTFT %s; rate at the SLO %s", ttftVs(t, r), rateVs(t, r))
	}
	for _, n := range []string{"lmcache-gds", "lmcache-disk", "vllm-fs"} {
		b := ran[n]
		if b == nil {
			continue
		}
		s := fmt.Sprintf("restores %s; p50 TTFT %s; rate at the SLO %s",
			times(t.BytesPerS, b.BytesPerS, "as fast", fmt.Sprintf("%.2f vs %.2f GB/s, %.0f vs %.0f I/Os per request",
				t.BytesPerS/1e9, b.BytesPerS/1e9, t.IOsPerRequestMean, b.IOsPerRequestMean)),
			ttftVs(t, b), rateVs(t, b))
		if pc := fromPageCache(b); pc != "" && b.BytesPerS > t.BytesPerS {
			s += "; " + pc
		}
		line(b.Backend, "%s", s)
	}
	if d := ran["dram"]; d != nil {
		line(d.Backend, "p50 TTFT %s (the bound: no device)", ttftVs(t, d))
	}
	return heading, gains
}

// times says a against b as "2.61× <what> (detail)": how many times b's
// figure a is.
func times(a, b float64, what, detail string) string {
	if a <= 0 || b <= 0 {
		return "— (" + detail + ")"
	}
	return fmt.Sprintf("%.2f× %s (%s)", a/b, what, detail)
}

// ttftVs says t's p50 TTFT against b's: so many times lower, or higher.
func ttftVs(t, b *BackendResult) string {
	detail := fmt.Sprintf("%.1f vs %.1f ms", t.TTFTmsP50, b.TTFTmsP50)
	switch {
	case t.TTFTmsP50 <= 0 || b.TTFTmsP50 <= 0:
		return "— (" + detail + ")"
	case t.TTFTmsP50 <= b.TTFTmsP50:
		return fmt.Sprintf("%.2f× lower (%s)", b.TTFTmsP50/t.TTFTmsP50, detail)
	default:
		return fmt.Sprintf("%.2f× higher (%s)", t.TTFTmsP50/b.TTFTmsP50, detail)
	}
}

// rateVs says t's highest rate at the SLO against b's.
func rateVs(t, b *BackendResult) string {
	detail := fmt.Sprintf("%.2f vs %.2f req/s", t.MaxRateAtSLO, b.MaxRateAtSLO)
	if t.MaxRateIsLowerBound || b.MaxRateIsLowerBound {
		detail += ", " + strings.Join(lowerBounds(t, b), " and ") + " a lower bound"
	}
	if b.MaxRateAtSLO <= 0 {
		return fmt.Sprintf("%s never meets it (%s)", b.Backend, detail)
	}
	return times(t.MaxRateAtSLO, b.MaxRateAtSLO, b.Backend+"'s", detail)
}

// lowerBounds names those of t and b whose rate at the SLO met it at every
// rate tried.
func lowerBounds(t, b *BackendResult) []string {
	var out []string
	for _, x := range []*BackendResult{t, b} {
		if x.MaxRateIsLowerBound {
			out = append(out, x.Backend+"'s")
		}
	}
	return out
}

// disksOf names the disks under dirs (sysfs's DEVNAME, "?" where a dir is
// on none), each once, in the dirs' order.
func disksOf(dirs []string) string {
	var names []string
	for _, d := range dirs {
		n := "?"
		if dev, err := blockstat.DiskOf(d); err == nil {
			if b, err := os.ReadFile(fmt.Sprintf("/sys/dev/block/%s/uevent", dev)); err == nil {
				for _, l := range strings.Split(string(b), "\n") {
					if v, ok := strings.CutPrefix(l, "DEVNAME="); ok {
						n = v
					}
				}
			}
		}
		if !slices.Contains(names, n) {
			names = append(names, n)
		}
	}
	return strings.Join(names, ", ")
}
