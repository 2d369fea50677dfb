// Package eval holds what the evaluation ships inside the binary: the default
// trace window that `tutti replay` runs with no flags. The evaluation itself
// lives in the subpackages (model, blockstat, metrics,
// harness, report).
package eval

import _ "embed"

// DefaultWindow is 200 consecutive requests (lines 5276–5475) of the Mooncake
// FAST'25 conversation trace (kvcache-ai/Mooncake FAST25-release/traces,
// Apache-2.0): a window with high prefix reuse for its size, so the
// default replay is short and still has prefix reuse (433 of its 4,444 block
// references are prefix hits within the window).
//
//go:embed testdata/window.jsonl
var DefaultWindow []byte

// DefaultWindowName describes DefaultWindow in reports.
const DefaultWindowName = "embedded window: eval/testdata/window.jsonl (Mooncake conversation trace, lines 5276–5475)"
