package blockstat

import (
	"bufio"
	"errors"
	"fmt"
	"math/bits"
	"os"
	"path/filepath"
	"strconv"
	"strings"

	"github.com/cilium/ebpf"
	"github.com/cilium/ebpf/asm"
	"github.com/cilium/ebpf/link"
	"golang.org/x/sys/unix"
)

// ErrNoEBPF is wrapped when the block tracepoints cannot be traced with eBPF
// here (not root, no tracefs, verifier or attach refused). The caller falls
// back to /proc/diskstats and prints the reason.
var ErrNoEBPF = errors.New("blockstat: eBPF block tracing unavailable")

// Buckets is the number of log2 latency buckets: bucket b counts I/Os with
// 2^b ≤ latency ns < 2^(b+1) (bucket 0 also holds 0 and 1 ns).
const Buckets = 64

// Histogram counts I/O latencies in log2 nanosecond buckets.
type Histogram [Buckets]uint64

// Count is the number of I/Os in the histogram.
func (h *Histogram) Count() uint64 {
	var n uint64
	for _, c := range h {
		n += c
	}
	return n
}

// Quantile returns the upper bound in ns of the bucket holding quantile q
// (0..1), 0 for an empty histogram.
func (h *Histogram) Quantile(q float64) uint64 {
	total := h.Count()
	if total == 0 {
		return 0
	}
	want := uint64(q * float64(total))
	if want >= total {
		want = total - 1
	}
	var seen uint64
	for b, c := range h {
		seen += c
		if seen > want {
			return 1 << (b + 1)
		}
	}
	return 1<<Buckets - 1
}

// Sub returns h − prev bucket by bucket.
func (h Histogram) Sub(prev Histogram) Histogram {
	for i := range h {
		h[i] -= prev[i]
	}
	return h
}

// devFromKdev decodes the kernel dev_t the block tracepoints record: major<<20 | minor.
func devFromKdev(k uint32) Dev { return Dev{Major: k >> 20, Minor: k & (1<<20 - 1)} }

// DevCounts is what the tracer counted for one device at request completion.
type DevCounts struct {
	ReadBytes, ReadIOs   uint64
	WriteBytes, WriteIOs uint64
}

// Snapshot is the tracer's counters at one moment (cumulative since Start).
type Snapshot struct {
	Devices      map[Dev]DevCounts
	ReadLatency  Histogram // issue → complete of read requests
	WriteLatency Histogram // and of writes
	Unmatched    uint64    // completions whose issue was not seen (started before, or start map full)
	// Missed counts completion-program runs the kernel skipped because
	// another BPF program was running on that CPU (a completion interrupting
	// an issue): the byte counts are then a lower bound. MissedIssue counts
	// skipped issue-program runs (they only cost latency samples).
	Missed, MissedIssue uint64
}

// Sub returns s − prev (counters since prev).
func (s Snapshot) Sub(prev Snapshot) Snapshot {
	out := Snapshot{Devices: map[Dev]DevCounts{}, ReadLatency: s.ReadLatency.Sub(prev.ReadLatency),
		WriteLatency: s.WriteLatency.Sub(prev.WriteLatency), Unmatched: s.Unmatched - prev.Unmatched,
		Missed: s.Missed - prev.Missed, MissedIssue: s.MissedIssue - prev.MissedIssue}
	for d, c := range s.Devices {
		p := prev.Devices[d]
		out.Devices[d] = DevCounts{ReadBytes: c.ReadBytes - p.ReadBytes, ReadIOs: c.ReadIOs - p.ReadIOs,
			WriteBytes: c.WriteBytes - p.WriteBytes, WriteIOs: c.WriteIOs - p.WriteIOs}
	}
	return out
}

// Tracer counts block requests per device and their latency with two eBPF
// programs on the block_rq_issue and block_rq_complete tracepoints. The
// programs are assembled here (no clang needed); field offsets are read from
// the tracepoints' format files, so they follow the running kernel.
// Close must be called exactly once.
type Tracer struct {
	stats, start, hist *ebpf.Map
	progs              []*ebpf.Program
	links              []link.Link
}

const (
	maxDevices  = 64    // per-device counter entries
	maxInFlight = 65536 // issue timestamps kept (requests in flight over all devices)
	histEntries = 2*Buckets + 1
	unmatchedIx = 2 * Buckets
	statsValue  = 32 // 4 × u64: read bytes, read ios, write bytes, write ios
)

// tracingDirs are where tracefs may be mounted.
var tracingDirs = []string{"/sys/kernel/tracing", "/sys/kernel/debug/tracing"}

// EnsureTracefs returns the tracefs directory, mounting it on
// /sys/kernel/tracing when no mount is found (needs root).
func EnsureTracefs() (string, error) {
	for _, d := range tracingDirs {
		if _, err := os.Stat(filepath.Join(d, "events")); err == nil {
			return d, nil
		}
	}
	if err := unix.Mount("nodev", tracingDirs[0], "tracefs", 0, ""); err != nil {
		return "", fmt.Errorf("mount -t tracefs nodev %s: %w", tracingDirs[0], err)
	}
	if _, err := os.Stat(filepath.Join(tracingDirs[0], "events")); err != nil {
		return "", fmt.Errorf("tracefs mounted but no events: %w", err)
	}
	return tracingDirs[0], nil
}

// fieldOffsets reads "field:<type> <name>;\toffset:N;\tsize:M;" lines of a
// tracepoint format file.
func fieldOffsets(path string) (map[string][2]int, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	m, err := parseFormat(bufio.NewScanner(f))
	if err != nil {
		return nil, fmt.Errorf("%s: %w", path, err)
	}
	return m, nil
}

// parseFormat parses a tracepoint format: field name → (offset, size).
func parseFormat(sc *bufio.Scanner) (map[string][2]int, error) {
	out := map[string][2]int{}
	for sc.Scan() {
		line := strings.TrimSpace(sc.Text())
		if !strings.HasPrefix(line, "field:") {
			continue
		}
		parts := strings.Split(line, ";")
		if len(parts) < 3 {
			continue
		}
		decl := strings.Fields(strings.TrimPrefix(parts[0], "field:"))
		if len(decl) == 0 {
			continue
		}
		name := decl[len(decl)-1]
		if i := strings.IndexByte(name, '['); i >= 0 {
			name = name[:i]
		}
		off, err1 := strconv.Atoi(strings.TrimPrefix(strings.TrimSpace(parts[1]), "offset:"))
		size, err2 := strconv.Atoi(strings.TrimPrefix(strings.TrimSpace(parts[2]), "size:"))
		if err1 != nil || err2 != nil || off < 0 || size < 0 || off >= 1<<15 || size >= 1<<15 {
			return nil, fmt.Errorf("bad field line %q", line)
		}
		out[name] = [2]int{off, size}
	}
	return out, sc.Err()
}

type tpFields struct{ dev, sector, nrSector, rwbs int16 }

func readFields(tracefs, event string) (tpFields, error) {
	path := filepath.Join(tracefs, "events", "block", event, "format")
	m, err := fieldOffsets(path)
	if err != nil {
		return tpFields{}, err
	}
	want := map[string]int{"dev": 4, "sector": 8, "nr_sector": 4, "rwbs": 0}
	for name, size := range want {
		f, ok := m[name]
		if !ok {
			return tpFields{}, fmt.Errorf("%s: no field %s", path, name)
		}
		if size != 0 && f[1] != size {
			return tpFields{}, fmt.Errorf("%s: field %s is %d bytes, want %d", path, name, f[1], size)
		}
	}
	return tpFields{dev: int16(m["dev"][0]), sector: int16(m["sector"][0]),
		nrSector: int16(m["nr_sector"][0]), rwbs: int16(m["rwbs"][0])}, nil
}

// StartTracer loads and attaches the programs. Errors wrap ErrNoEBPF.
func StartTracer() (*Tracer, error) {
	fail := func(what string, err error) (*Tracer, error) {
		return nil, fmt.Errorf("%w: %s: %v", ErrNoEBPF, what, err)
	}
	tfs, err := EnsureTracefs()
	if err != nil {
		return fail("tracefs", err)
	}
	issueF, err := readFields(tfs, "block_rq_issue")
	if err != nil {
		return fail("block_rq_issue format", err)
	}
	complF, err := readFields(tfs, "block_rq_complete")
	if err != nil {
		return fail("block_rq_complete format", err)
	}
	t := &Tracer{}
	ok := false
	defer func() {
		if !ok {
			t.Close()
		}
	}()
	if t.stats, err = ebpf.NewMap(&ebpf.MapSpec{Name: "tutti_bstats", Type: ebpf.Hash, KeySize: 4, ValueSize: statsValue, MaxEntries: maxDevices}); err != nil {
		return fail("creating map", err)
	}
	if t.start, err = ebpf.NewMap(&ebpf.MapSpec{Name: "tutti_bstart", Type: ebpf.Hash, KeySize: 16, ValueSize: 8, MaxEntries: maxInFlight}); err != nil {
		return fail("creating map", err)
	}
	if t.hist, err = ebpf.NewMap(&ebpf.MapSpec{Name: "tutti_bhist", Type: ebpf.Array, KeySize: 4, ValueSize: 8, MaxEntries: histEntries}); err != nil {
		return fail("creating map", err)
	}
	for _, p := range []struct {
		event string
		insns asm.Instructions
	}{
		{"block_rq_issue", issueProgram(issueF, t.start)},
		{"block_rq_complete", completeProgram(complF, t.start, t.stats, t.hist)},
	} {
		prog, err := ebpf.NewProgram(&ebpf.ProgramSpec{Name: "tutti_" + p.event[6:], Type: ebpf.TracePoint,
			Instructions: p.insns, License: "GPL"})
		if err != nil {
			return fail("loading "+p.event+" program", err)
		}
		t.progs = append(t.progs, prog)
		l, err := link.Tracepoint("block", p.event, prog, nil)
		if err != nil {
			return fail("attaching to "+p.event, err)
		}
		t.links = append(t.links, l)
	}
	ok = true
	return t, nil
}

// Stack layout shared by both programs: the start-map key (dev, sector) at
// fp-16 (dev zero-extended into 8 bytes, then sector).
const (
	keyOff    = -16
	sectorOff = -8
	scratch   = -24 // 4-byte key for stats/hist lookups, 8-byte zero value init
	zeroVal   = -56 // 32 bytes of zeros to insert a new stats entry
)

func storeStartKey(f tpFields) asm.Instructions {
	return asm.Instructions{
		asm.LoadMem(asm.R7, asm.R6, f.dev, asm.Word),
		asm.StoreMem(asm.RFP, keyOff, asm.R7, asm.DWord),
		asm.LoadMem(asm.R1, asm.R6, f.sector, asm.DWord),
		asm.StoreMem(asm.RFP, sectorOff, asm.R1, asm.DWord),
	}
}

// issueProgram: start[(dev, sector)] = ktime_get_ns().
func issueProgram(f tpFields, start *ebpf.Map) asm.Instructions {
	insns := asm.Instructions{asm.Mov.Reg(asm.R6, asm.R1)}
	insns = append(insns, storeStartKey(f)...)
	return append(insns,
		asm.FnKtimeGetNs.Call(),
		asm.StoreMem(asm.RFP, scratch, asm.R0, asm.DWord),
		asm.LoadMapPtr(asm.R1, start.FD()),
		asm.Mov.Reg(asm.R2, asm.RFP),
		asm.Add.Imm(asm.R2, keyOff),
		asm.Mov.Reg(asm.R3, asm.RFP),
		asm.Add.Imm(asm.R3, scratch),
		asm.Mov.Imm(asm.R4, 0), // BPF_ANY
		asm.FnMapUpdateElem.Call(),
		asm.Mov.Imm(asm.R0, 0),
		asm.Return(),
	)
}

// completeProgram classifies the request by rwbs ('R' read, 'W' write, after
// an optional 'F' flush prefix; others ignored), adds nr_sector*512 bytes and
// one I/O to the device's counters, and when the issue time is known adds the
// latency to the log2 histogram (reads at 0..63, writes at 64..127).
//
// Registers: R6 ctx, R7 dev, R8 bytes, R9 0 for read / 1 for write.
func completeProgram(f tpFields, start, stats, hist *ebpf.Map) asm.Instructions {
	const (
		exit     = "exit"
		classify = "classify"
		sized    = "sized"
		counted  = "counted"
		haveVal  = "have_val"
	)
	insns := asm.Instructions{
		asm.Mov.Reg(asm.R6, asm.R1),
		asm.LoadMem(asm.R2, asm.R6, f.rwbs, asm.Byte),
		asm.JNE.Imm(asm.R2, 'F', classify),
		asm.LoadMem(asm.R2, asm.R6, f.rwbs+1, asm.Byte),
		asm.Mov.Imm(asm.R9, 0).WithSymbol(classify),
		asm.JEq.Imm(asm.R2, 'R', sized),
		asm.JNE.Imm(asm.R2, 'W', exit),
		asm.Mov.Imm(asm.R9, 1),
		asm.LoadMem(asm.R8, asm.R6, f.nrSector, asm.Word).WithSymbol(sized),
		asm.LSh.Imm(asm.R8, 9),
	}
	insns = append(insns, storeStartKey(f)...)
	insns = append(insns,
		// stats[dev] (create zeroed if absent)
		asm.StoreMem(asm.RFP, scratch, asm.R7, asm.Word),
		asm.LoadMapPtr(asm.R1, stats.FD()),
		asm.Mov.Reg(asm.R2, asm.RFP),
		asm.Add.Imm(asm.R2, scratch),
		asm.FnMapLookupElem.Call(),
		asm.JNE.Imm(asm.R0, 0, haveVal),
		asm.Mov.Imm(asm.R1, 0), // StoreImm has no 64-bit form
		asm.StoreMem(asm.RFP, zeroVal, asm.R1, asm.DWord),
		asm.StoreMem(asm.RFP, zeroVal+8, asm.R1, asm.DWord),
		asm.StoreMem(asm.RFP, zeroVal+16, asm.R1, asm.DWord),
		asm.StoreMem(asm.RFP, zeroVal+24, asm.R1, asm.DWord),
		asm.LoadMapPtr(asm.R1, stats.FD()),
		asm.Mov.Reg(asm.R2, asm.RFP),
		asm.Add.Imm(asm.R2, scratch),
		asm.Mov.Reg(asm.R3, asm.RFP),
		asm.Add.Imm(asm.R3, zeroVal),
		asm.Mov.Imm(asm.R4, 1), // BPF_NOEXIST: a racing CPU may have inserted it
		asm.FnMapUpdateElem.Call(),
		asm.LoadMapPtr(asm.R1, stats.FD()),
		asm.Mov.Reg(asm.R2, asm.RFP),
		asm.Add.Imm(asm.R2, scratch),
		asm.FnMapLookupElem.Call(),
		asm.JEq.Imm(asm.R0, 0, counted),
		// R0 += 16 for writes: the write pair follows the read pair.
		asm.Mov.Reg(asm.R1, asm.R9).WithSymbol(haveVal),
		asm.LSh.Imm(asm.R1, 4),
		asm.Add.Reg(asm.R0, asm.R1),
		asm.StoreXAdd(asm.R0, asm.R8, asm.DWord),
		asm.Mov.Imm(asm.R1, 1),
		asm.AddAtomic.Mem(asm.R0, asm.R1, asm.DWord, 8),

		// Latency: start[(dev, sector)].
		asm.LoadMapPtr(asm.R1, start.FD()).WithSymbol(counted),
		asm.Mov.Reg(asm.R2, asm.RFP),
		asm.Add.Imm(asm.R2, keyOff),
		asm.FnMapLookupElem.Call(),
		asm.Mov.Imm(asm.R7, unmatchedIx),
		asm.JEq.Imm(asm.R0, 0, "bump"),
		asm.LoadMem(asm.R7, asm.R0, 0, asm.DWord),
		asm.FnKtimeGetNs.Call(),
		asm.Sub.Reg(asm.R0, asm.R7),
		asm.Mov.Reg(asm.R8, asm.R0), // latency ns
		asm.LoadMapPtr(asm.R1, start.FD()),
		asm.Mov.Reg(asm.R2, asm.RFP),
		asm.Add.Imm(asm.R2, keyOff),
		asm.FnMapDeleteElem.Call(),
		// R7 = floor(log2(R8)), unrolled binary search.
		asm.Mov.Imm(asm.R7, 0),
	)
	for _, shift := range []int32{32, 16, 8, 4, 2, 1} {
		skip := fmt.Sprintf("log2_%d", shift)
		insns = append(insns,
			asm.Mov.Reg(asm.R1, asm.R8),
			asm.RSh.Imm(asm.R1, shift),
			asm.JEq.Imm(asm.R1, 0, skip),
			asm.Mov.Reg(asm.R8, asm.R1),
			asm.Add.Imm(asm.R7, shift),
			asm.Mov.Imm(asm.R0, 0).WithSymbol(skip), // landing pad
		)
	}
	insns = append(insns,
		asm.Mov.Reg(asm.R1, asm.R9),
		asm.LSh.Imm(asm.R1, 6),
		asm.Add.Reg(asm.R7, asm.R1),
		// hist[R7] += 1
		asm.StoreMem(asm.RFP, scratch, asm.R7, asm.Word).WithSymbol("bump"),
		asm.LoadMapPtr(asm.R1, hist.FD()),
		asm.Mov.Reg(asm.R2, asm.RFP),
		asm.Add.Imm(asm.R2, scratch),
		asm.FnMapLookupElem.Call(),
		asm.JEq.Imm(asm.R0, 0, exit),
		asm.Mov.Imm(asm.R1, 1),
		asm.StoreXAdd(asm.R0, asm.R1, asm.DWord),
		asm.Mov.Imm(asm.R0, 0).WithSymbol(exit),
		asm.Return(),
	)
	return insns
}

// Snapshot reads the counters (cumulative since StartTracer).
func (t *Tracer) Snapshot() (Snapshot, error) {
	s := Snapshot{Devices: map[Dev]DevCounts{}}
	var k uint32
	var v [4]uint64
	it := t.stats.Iterate()
	for it.Next(&k, &v) {
		s.Devices[devFromKdev(k)] = DevCounts{ReadBytes: v[0], ReadIOs: v[1], WriteBytes: v[2], WriteIOs: v[3]}
	}
	if err := it.Err(); err != nil {
		return Snapshot{}, fmt.Errorf("reading block stats map: %w", err)
	}
	for i, p := range t.progs { // issue, then complete
		st, err := p.Stats()
		if err != nil {
			return Snapshot{}, fmt.Errorf("reading program stats: %w", err)
		}
		if i == 0 {
			s.MissedIssue = st.RecursionMisses
		} else {
			s.Missed = st.RecursionMisses
		}
	}
	for i := uint32(0); i < histEntries; i++ {
		var c uint64
		if err := t.hist.Lookup(i, &c); err != nil {
			return Snapshot{}, fmt.Errorf("reading latency histogram %d: %w", i, err)
		}
		switch {
		case i < Buckets:
			s.ReadLatency[i] = c
		case i < 2*Buckets:
			s.WriteLatency[i-Buckets] = c
		default:
			s.Unmatched = c
		}
	}
	return s, nil
}

// Close detaches the programs and frees the maps.
func (t *Tracer) Close() error {
	var errs []error
	for _, l := range t.links {
		errs = append(errs, l.Close())
	}
	for _, p := range t.progs {
		errs = append(errs, p.Close())
	}
	for _, m := range []*ebpf.Map{t.stats, t.start, t.hist} {
		if m != nil {
			errs = append(errs, m.Close())
		}
	}
	t.links, t.progs, t.stats, t.start, t.hist = nil, nil, nil, nil, nil
	return errors.Join(errs...)
}

// log2 of the bucket a latency falls in (for tests and for turning measured
// latencies into the same buckets).
func bucketOf(ns uint64) int {
	if ns == 0 {
		return 0
	}
	return bits.Len64(ns) - 1
}
