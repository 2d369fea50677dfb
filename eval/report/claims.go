package report

import (
	"fmt"

	"github.com/tutti-io/tutti/eval/harness"
)

// writeClaims is the paper's figures as this run measured them
// (harness.Claims), goal met or not, with the reason where missed.
func writeClaims(p func(string, ...any), res *harness.Result) {
	claims := harness.Claims(res)
	if len(claims) == 0 {
		return
	}
	p("\n**The paper's figures, measured here** (goals from the Tutti paper: p99 TTFT −78.3%% against LMCache-GDS under a strict SLO, 2× its rate at that SLO, p50 TTFT nearly a DRAM tier's; on this run's storage, model and SLO):\n\n")
	p("| figure | %s against | at req/s | measured | goal | met | detail |\n| --- | --- | ---: | ---: | --- | --- | --- |\n", claims[0].Backend)
	for _, c := range claims {
		op, rate := "≤", "—"
		if c.AtLeast {
			op = "≥"
		}
		if c.RatePerS > 0 {
			rate = fmt.Sprintf("%.2f", c.RatePerS)
		}
		measured := fmt.Sprintf("%.2f×", c.Measured)
		if c.NoRatio {
			measured = "no ratio (" + c.Against + " never meets the SLO)"
		}
		p("| %s | %s | %s | %s | %s %.1f× | %v | %s |\n", c.Name, c.Against, rate, measured, op, c.Goal, c.Met, c.Detail)
	}
}
