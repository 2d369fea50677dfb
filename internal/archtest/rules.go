package archtest

// module is the import path every rule is relative to.
const module = "github.com/tutti-io/tutti"

// layers lists the components from the bottom up: a library package may
// import its own component and any component of a lower layer. Layers 4 to
// 7 are runtime's internal packages, one job each, below the runtime that
// orchestrates them: the movers' seam below its two implementations, which
// cannot import each other, and the save pipeline above the admission it
// settles.
var layers = [][]string{
	0:  {"internal/kvdata", "internal/trace", "internal/crashtest", "internal/archtest", "internal/abicheck", "internal/fusefile"},
	1:  {"kvshape", "uring", "prefix", "sched", "kvevents", "internal/faultfs"},
	2:  {"objmap", "devbench"},
	3:  {"kernels", "internal/benchenv"},
	4:  {"runtime/internal/ring", "runtime/internal/iosched", "runtime/internal/workpool", "runtime/internal/devprobe", "runtime/internal/prewrite", "runtime/internal/kvmeta", "runtime/internal/lrufile", "runtime/internal/nodewire"},
	5:  {"runtime/internal/staging", "runtime/internal/catalog", "runtime/internal/mover"},
	6:  {"runtime/internal/mover/cpu", "runtime/internal/mover/gpu", "runtime/internal/admission"},
	7:  {"runtime/internal/savewrite", "runtime/internal/mover/gpu/gputest"},
	8:  {"runtime", "membership"},
	9:  {"eval"},
	10: {"cmd"},
}

// testSupport are the packages (and their subpackages) that only tests, the
// harness (eval/) and the CLI (cmd/) may import from non-test code: no
// product package (runtime's internal ones included) imports them.
var testSupport = []string{"internal/kvdata", "internal/crashtest", "internal/benchenv", "internal/abicheck", "uring/uringsim", "membership/etcdtest", "internal/faultfs", "internal/fusefile", "kvevents/kvindex", "kernels/testkit", "runtime/internal/mover/gpu/gputest"}

// leaves are the packages (and their subpackages) whose non-test code
// imports nothing of the module, so that whoever needs only them (an engine
// for the KV shape, the kernels) gets nothing else with them.
var leaves = []string{"kvshape"}

// pending are the known violations that work in progress removes, each
// "importer -> imported" with why; the test fails once one is gone, so the
// list cannot go stale.
var pending = map[string]string{}

// oversized are the files and Go functions allowed over the size limits of
// size.go (MaxFileLines, MaxFuncLines), each as Oversize.Key with why; like
// pending, an entry that no longer applies fails the test.
var oversized = map[string]string{}
