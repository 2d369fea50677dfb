package runtime

// The enums of Stats: each state is one of these, its reason a string
// field beside it. In JSON each is its String (MarshalText), the cause
// counts objects keyed by cause.

import (
	"encoding/json"
	"fmt"
	"strings"
)

// StageCause says why a PathCPU I/O went through staging with a copy
// instead of the engine's pages (the CPU mover's direct I/O rule, runtime/internal/mover/cpu).
type StageCause uint8

const (
	StageNone      StageCause = iota // none was staged
	StageNoIovecs                    // the iovecs for a direct I/O could not be allocated
	StageUnaligned                   // a page plane's address or length is not a multiple of the pool file's O_DIRECT alignment
	StageIovecCap                    // an I/O needs more page planes than one I/O's iovecs hold
	numStageCauses
)

func (c StageCause) String() string {
	switch c {
	case StageNone:
		return "none"
	case StageNoIovecs:
		return "no-iovecs"
	case StageUnaligned:
		return "unaligned"
	case StageIovecCap:
		return "iovec-cap"
	}
	return fmt.Sprintf("StageCause(%d)", uint8(c))
}

// GPUReadMode is where the GPU path's reads land.
type GPUReadMode uint8

const (
	GPUReadsUnbound GPUReadMode = iota // no GPU path bound (PathCPU, or before RegisterKV)
	GPUReadsFixed                      // READ_FIXED into staging registered with the ring
	GPUReadsPlain                      // plain reads: the registration was refused or not asked for
	numGPUReadModes
)

func (m GPUReadMode) String() string {
	switch m {
	case GPUReadsUnbound:
		return "unbound"
	case GPUReadsFixed:
		return "fixed"
	case GPUReadsPlain:
		return "plain"
	}
	return fmt.Sprintf("GPUReadMode(%d)", uint8(m))
}

// GPURing is how the GPU path's ring is driven.
type GPURing uint8

const (
	GPURingUnbound     GPURing = iota // no GPU path bound (PathCPU, or before RegisterKV)
	GPURingSQPoll                     // a kernel SQPOLL thread submits (GPUConfig.SQPoll)
	GPURingKickBatched                // the helper enters the kernel once per batch (DEFER_TASKRUN)
	GPURingKickEach                   // the helper is woken by every completion: the kernel refused DEFER_TASKRUN
	numGPURings
)

func (r GPURing) String() string {
	switch r {
	case GPURingUnbound:
		return "unbound"
	case GPURingSQPoll:
		return "sqpoll"
	case GPURingKickBatched:
		return "kick-batched"
	case GPURingKickEach:
		return "kick-each"
	}
	return fmt.Sprintf("GPURing(%d)", uint8(r))
}

// ProbeState is where a directory's device model seed came from.
type ProbeState uint8

const (
	ProbeConfigured ProbeState = iota // Config.Device is set: not probed
	ProbeMeasured                     // probed at Open
	ProbeSeeded                       // not measured (DeviceProbe.Reason): the seed profile
	numProbeStates
)

func (p ProbeState) String() string {
	switch p {
	case ProbeConfigured:
		return "configured"
	case ProbeMeasured:
		return "measured"
	case ProbeSeeded:
		return "seeded"
	}
	return fmt.Sprintf("ProbeState(%d)", uint8(p))
}

// PrewriteState is the background prewrite's.
type PrewriteState uint8

const (
	PrewriteOff     PrewriteState = iota // never started (Config.NoPrewrite, or the pool cannot be prewritten)
	PrewriteRunning                      // writing while no load or save runs
	PrewriteDone                         // nothing unwritten is left
	PrewriteStopped                      // stopped after too many failed writes
	numPrewriteStates
)

func (p PrewriteState) String() string {
	switch p {
	case PrewriteOff:
		return "off"
	case PrewriteRunning:
		return "running"
	case PrewriteDone:
		return "done"
	case PrewriteStopped:
		return "stopped"
	}
	return fmt.Sprintf("PrewriteState(%d)", uint8(p))
}

// enum is what the text forms below work on.
type enum interface {
	~uint8
	String() string
}

// parseEnum is the value of E below n whose String is text.
func parseEnum[E enum](text []byte, n E) (E, error) {
	for e := E(0); e < n; e++ {
		if e.String() == string(text) {
			return e, nil
		}
	}
	return 0, fmt.Errorf("runtime: %T has no value %q", E(0), text)
}

func (p Path) MarshalText() ([]byte, error)          { return []byte(p.String()), nil }
func (c StageCause) MarshalText() ([]byte, error)    { return []byte(c.String()), nil }
func (m GPUReadMode) MarshalText() ([]byte, error)   { return []byte(m.String()), nil }
func (r GPURing) MarshalText() ([]byte, error)       { return []byte(r.String()), nil }
func (p ProbeState) MarshalText() ([]byte, error)    { return []byte(p.String()), nil }
func (p PrewriteState) MarshalText() ([]byte, error) { return []byte(p.String()), nil }

func (p *Path) UnmarshalText(b []byte) (err error) {
	*p, err = parseEnum(b, PathGPU+1)
	return err
}

func (c *StageCause) UnmarshalText(b []byte) (err error) {
	*c, err = parseEnum(b, numStageCauses)
	return err
}

func (m *GPUReadMode) UnmarshalText(b []byte) (err error) {
	*m, err = parseEnum(b, numGPUReadModes)
	return err
}

func (r *GPURing) UnmarshalText(b []byte) (err error) {
	*r, err = parseEnum(b, numGPURings)
	return err
}

func (p *ProbeState) UnmarshalText(b []byte) (err error) {
	*p, err = parseEnum(b, numProbeStates)
	return err
}

func (p *PrewriteState) UnmarshalText(b []byte) (err error) {
	*p, err = parseEnum(b, numPrewriteStates)
	return err
}

// causeKey is a cause's JSON key: its String, an identifier.
func causeKey(s fmt.Stringer) string { return strings.ReplaceAll(s.String(), "-", "_") }

func (c MissCounts) MarshalJSON() ([]byte, error)  { return countsJSON(c[:], MissCauses()) }
func (c SkipCounts) MarshalJSON() ([]byte, error)  { return countsJSON(c[:], SkipCauses()) }
func (c *MissCounts) UnmarshalJSON(b []byte) error { return countsFromJSON(b, c[:], MissCauses()) }
func (c *SkipCounts) UnmarshalJSON(b []byte) error { return countsFromJSON(b, c[:], SkipCauses()) }

func countsJSON[C fmt.Stringer](v []int64, causes []C) ([]byte, error) {
	b := []byte{'{'}
	for i, c := range causes {
		if i > 0 {
			b = append(b, ',')
		}
		b = fmt.Appendf(b, "%q:%d", causeKey(c), v[i])
	}
	return append(b, '}'), nil
}

// countsFromJSON reads countsJSON's object; a key that names no cause is
// an error, a cause left out counts 0.
func countsFromJSON[C fmt.Stringer](b []byte, v []int64, causes []C) error {
	var m map[string]int64
	if err := json.Unmarshal(b, &m); err != nil {
		return err
	}
	clear(v)
	for k, n := range m {
		i := 0
		for i < len(causes) && causeKey(causes[i]) != k {
			i++
		}
		if i == len(causes) {
			return fmt.Errorf("runtime: %T has no cause %q", causes[0], k)
		}
		v[i] = n
	}
	return nil
}
