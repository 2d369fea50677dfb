package nodewire

import (
	"errors"
	"fmt"
	"math"

	"github.com/tutti-io/tutti/objmap"
	"github.com/tutti-io/tutti/prefix"
	"golang.org/x/sys/unix"
)

// Msg is a request or a response payload.
type Msg interface{ Encode(e *Enc) }

// Requests, one per op.
type (
	Hello struct {
		Version     uint16
		Fingerprint string // objmap.Fingerprint of the engine's geometry
	}
	Lookup struct{ Chain []uint64 }
	Pin    struct {
		Chain []uint64
		Skip  int
	}
	Unpin   struct{ ID uint64 }
	Corrupt struct {
		ID  uint64
		Run int
	}
	Discard  struct{ Block uint64 }
	Resident struct{}
	// Reserve reserves the blocks of Chain after its cached prefix.
	Reserve struct {
		Chain []uint64
		Meta  []Meta // empty, or one per chain block
	}
	Allocate struct{ N, Ways int }
	// AllocateOne reserves one run of K blocks.
	AllocateOne  struct{ K int }
	Abort        struct{ Res objmap.Reservation }
	Unreserve    struct{ IDs []uint64 }
	Commit       struct{ Reqs []objmap.CommitRequest }
	JournalReady struct{}
)

// Meta is a block's KV-event metadata.
type Meta struct {
	Tokens []uint32
	Hash   []byte
}

// Responses' payloads.
type (
	// HelloResp: the store's placement is objmap.NewLayout(the geometry,
	// len(Dirs), FilesPerDir, RunWidth), the service's own; an engine
	// builds it from these and never derives a run width itself.
	HelloResp struct {
		Dirs, Files   []string // the store's directories (its device order) and pool files (objmap.Map.Files' order)
		FilesPerDir   int
		RunWidth      int
		Buffered      bool // the pool is opened without O_DIRECT (tests)
		KeepsMeta     bool // the service publishes KV events: saves send their metadata
		CapacityBytes int64
	}
	Count   struct{ N int }
	PinResp struct {
		ID          uint64 // the pin's handle (0: nothing pinned)
		N, NotFound int
		Spans       []Span
	}
	Span struct {
		Info               objmap.RunInfo
		First, K, ChainPos int
	}
	Flag         struct{ V bool }
	Empty        struct{}
	ResidentResp struct{ Blocks []Block }
	Block        struct {
		ID, Parent uint64
		HasParent  bool
	}
	// ReserveResp: Chain[From:From+N] are reserved (From: the cached
	// prefix, sent with an error too).
	ReserveResp struct {
		From, N int
		Stop    prefix.StopReason
	}
	Reservations struct{ Res []objmap.Reservation }
)

// maxInt bounds the ints on the wire (chain positions, counts).
const maxInt = math.MaxInt32

func (m *Hello) Encode(e *Enc)  { e.U16(m.Version); e.Str(m.Fingerprint) }
func (m *Lookup) Encode(e *Enc) { e.U64s(m.Chain) }
func (m *Pin) Encode(e *Enc)    { e.U64s(m.Chain); e.Int(m.Skip) }
func (m *Unpin) Encode(e *Enc)  { e.U64(m.ID) }
func (m *Corrupt) Encode(e *Enc) {
	e.U64(m.ID)
	e.Int(m.Run)
}
func (m *Discard) Encode(e *Enc)  { e.U64(m.Block) }
func (m *Resident) Encode(*Enc)   {}
func (m *Allocate) Encode(e *Enc) { e.Int(m.N); e.Int(m.Ways) }
func (m *AllocateOne) Encode(e *Enc) {
	e.Int(m.K)
}
func (m *Abort) Encode(e *Enc)      { encodeRes(e, m.Res) }
func (m *Unreserve) Encode(e *Enc)  { e.U64s(m.IDs) }
func (m *JournalReady) Encode(*Enc) {}
func (m *Reserve) Encode(e *Enc) {
	e.U64s(m.Chain)
	e.U32(uint32(len(m.Meta)))
	for _, x := range m.Meta {
		e.U32s(x.Tokens)
		e.Bytes(x.Hash)
	}
}
func (m *Commit) Encode(e *Enc) {
	e.U32(uint32(len(m.Reqs)))
	for _, r := range m.Reqs {
		encodeRes(e, r.Res)
		e.U64s(r.Chain)
		e.U64(r.Parent)
		e.Bool(r.HasParent)
		e.U32s(r.ChunkCRCs)
	}
}

func (m *HelloResp) Encode(e *Enc) {
	e.U32(uint32(len(m.Dirs)))
	for _, s := range m.Dirs {
		e.Str(s)
	}
	e.U32(uint32(len(m.Files)))
	for _, s := range m.Files {
		e.Str(s)
	}
	e.Int(m.FilesPerDir)
	e.Int(m.RunWidth)
	e.Bool(m.Buffered)
	e.Bool(m.KeepsMeta)
	e.Int(int(m.CapacityBytes))
}
func (m *Count) Encode(e *Enc) { e.Int(m.N) }
func (m *PinResp) Encode(e *Enc) {
	e.U64(m.ID)
	e.Int(m.N)
	e.Int(m.NotFound)
	e.U32(uint32(len(m.Spans)))
	for i := range m.Spans {
		sp := &m.Spans[i]
		encodeRunInfo(e, &sp.Info)
		e.Int(sp.First)
		e.Int(sp.K)
		e.Int(sp.ChainPos)
	}
}
func (m *Flag) Encode(e *Enc) { e.Bool(m.V) }
func (m *Empty) Encode(*Enc)  {}
func (m *ResidentResp) Encode(e *Enc) {
	e.U32(uint32(len(m.Blocks)))
	for _, b := range m.Blocks {
		e.U64(b.ID)
		e.U64(b.Parent)
		e.Bool(b.HasParent)
	}
}
func (m *ReserveResp) Encode(e *Enc) { e.Int(m.From); e.Int(m.N); e.U8(uint8(m.Stop)) }
func (m *Reservations) Encode(e *Enc) {
	e.U32(uint32(len(m.Res)))
	for _, r := range m.Res {
		encodeRes(e, r)
	}
}

func encodeRes(e *Enc, r objmap.Reservation) {
	e.U64(uint64(r.ID))
	e.U64(r.Generation)
	e.Int(r.File)
	e.Int(int(r.Offset))
	e.Int(int(r.Length))
	e.Int(r.Chunks)
}

func decodeRes(d *Dec) objmap.Reservation {
	return objmap.Reservation{ID: objmap.RunID(d.U64()), Generation: d.U64(), File: d.Int(maxInt), Offset: d.I64(),
		Length: d.I64(), Chunks: d.Int(maxInt)}
}

func encodeRunInfo(e *Enc, r *objmap.RunInfo) {
	e.U64(uint64(r.ID))
	e.U64(r.Generation)
	e.Int(r.File)
	e.Int(int(r.Offset))
	e.Int(int(r.Length))
	e.U64s(r.Chain)
	e.U64(r.Parent)
	e.Bool(r.HasParent)
	e.Int(r.Kept)
	e.U32s(r.ChunkCRCs)
	e.U32s(r.LayerCRCs)
}

func decodeRunInfo(d *Dec) objmap.RunInfo {
	return objmap.RunInfo{ID: objmap.RunID(d.U64()), Generation: d.U64(), File: d.Int(maxInt), Offset: d.I64(), Length: d.I64(),
		Chain: d.U64s(), Parent: d.U64(), HasParent: d.Bool(), Kept: d.Int(maxInt), ChunkCRCs: d.U32s(), LayerCRCs: d.U32s()}
}

func decodeStrs(d *Dec) []string {
	out := make([]string, d.Count(4))
	for i := range out {
		out[i] = d.Str()
	}
	return out
}

// DecodeRequest decodes the payload of a request frame.
func DecodeRequest(f Frame) (Msg, error) {
	d := &Dec{B: f.Payload}
	var m Msg
	switch f.Op {
	case OpHello:
		m = &Hello{Version: d.U16(), Fingerprint: d.Str()}
	case OpLookup:
		m = &Lookup{Chain: d.U64s()}
	case OpPin:
		m = &Pin{Chain: d.U64s(), Skip: d.Int(maxInt)}
	case OpUnpin:
		m = &Unpin{ID: d.U64()}
	case OpCorrupt:
		m = &Corrupt{ID: d.U64(), Run: d.Int(maxInt)}
	case OpDiscard:
		m = &Discard{Block: d.U64()}
	case OpResident:
		m = &Resident{}
	case OpReserve:
		r := &Reserve{Chain: d.U64s()}
		r.Meta = make([]Meta, d.Count(8))
		for i := range r.Meta {
			r.Meta[i] = Meta{Tokens: d.U32s(), Hash: d.Bytes()}
		}
		m = r
	case OpAllocate:
		m = &Allocate{N: d.Int(maxInt), Ways: d.Int(maxInt)}
	case OpAllocateOne:
		m = &AllocateOne{K: d.Int(maxInt)}
	case OpAbort:
		m = &Abort{Res: decodeRes(d)}
	case OpUnreserve:
		m = &Unreserve{IDs: d.U64s()}
	case OpCommit:
		c := &Commit{Reqs: make([]objmap.CommitRequest, d.Count(64))}
		for i := range c.Reqs {
			c.Reqs[i] = objmap.CommitRequest{Res: decodeRes(d), Chain: d.U64s(), Parent: d.U64(), HasParent: d.Bool(), ChunkCRCs: d.U32s()}
		}
		m = c
	case OpJournalReady:
		m = &JournalReady{}
	default:
		return nil, fmt.Errorf("%w: unknown op %d", ErrProtocol, f.Op)
	}
	if err := d.Done(); err != nil {
		return nil, fmt.Errorf("decoding op %d: %w", f.Op, err)
	}
	return m, nil
}

// DecodeResponse decodes the payload of op's response into its error (nil:
// none; it wraps the sentinel of its Code) and its message, which some ops
// carry beside an error (Allocate: what fit); an error's message is nil
// when the service sent none.
func DecodeResponse(op Op, payload []byte) (Msg, error, error) {
	d := &Dec{B: payload}
	code, text := Code(d.U8()), d.Str()
	if d.Err() == nil && code != CodeOK && len(d.B) == 0 {
		return nil, code.Err(text), nil // an error with no payload
	}
	var m Msg
	switch op {
	case OpHello:
		h := &HelloResp{Dirs: decodeStrs(d)}
		h.Files = decodeStrs(d)
		h.FilesPerDir, h.RunWidth = d.Int(maxInt), d.Int(maxInt)
		h.Buffered, h.KeepsMeta, h.CapacityBytes = d.Bool(), d.Bool(), d.I64()
		m = h
	case OpLookup, OpDiscard:
		m = &Count{N: d.Int(maxInt)}
	case OpPin:
		p := &PinResp{ID: d.U64(), N: d.Int(maxInt), NotFound: d.Int(maxInt)}
		p.Spans = make([]Span, d.Count(64))
		for i := range p.Spans {
			p.Spans[i] = Span{Info: decodeRunInfo(d), First: d.Int(maxInt), K: d.Int(maxInt), ChainPos: d.Int(maxInt)}
		}
		m = p
	case OpCorrupt:
		m = &Flag{V: d.Bool()}
	case OpResident:
		r := &ResidentResp{Blocks: make([]Block, d.Count(17))}
		for i := range r.Blocks {
			r.Blocks[i] = Block{ID: d.U64(), Parent: d.U64(), HasParent: d.Bool()}
		}
		m = r
	case OpReserve:
		m = &ReserveResp{From: d.Int(maxInt), N: d.Int(maxInt), Stop: prefix.StopReason(d.U8())}
	case OpAllocate, OpAllocateOne:
		r := &Reservations{Res: make([]objmap.Reservation, d.Count(48))}
		for i := range r.Res {
			r.Res[i] = decodeRes(d)
		}
		m = r
	case OpUnpin, OpAbort, OpUnreserve, OpCommit, OpJournalReady:
		m = &Empty{}
	default:
		return nil, nil, fmt.Errorf("%w: unknown op %d", ErrProtocol, op)
	}
	if err := d.Done(); err != nil {
		return nil, nil, fmt.Errorf("decoding the response of op %d: %w", op, err)
	}
	return m, code.Err(text), nil
}

// AppendResponse appends op's response frame for request id: err's code
// and text, then m's payload (nil: none).
func AppendResponse(dst []byte, op Op, id uint64, m Msg, err error) []byte {
	e := Enc{}
	if err != nil {
		e.U8(uint8(CodeOf(err)))
		e.Str(err.Error())
	} else {
		e.U8(uint8(CodeOK))
		e.Str("")
	}
	if m != nil {
		m.Encode(&e)
	}
	return AppendFrame(dst, op, id, e.B)
}

// Code is a response's error kind: the sentinels an engine branches on
// survive the wire.
type Code uint8

const (
	CodeOK Code = iota
	CodeOther
	CodeNoSpace  // objmap.ErrNoSpace
	CodeENOSPC   // unix.ENOSPC
	CodeClosed   // objmap.ErrClosed: the service is closing
	CodeNotFound // prefix.ErrNotFound
	CodeProtocol // ErrProtocol: the service refused the request
	CodeGeometry // objmap.ErrGeometryMismatch: the engine's KV shape is not the store's
)

// ErrService is wrapped by every error a service returned.
var ErrService = errors.New("node service")

// CodeOf is err's code.
func CodeOf(err error) Code {
	switch {
	case err == nil:
		return CodeOK
	case errors.Is(err, objmap.ErrNoSpace):
		return CodeNoSpace
	case errors.Is(err, unix.ENOSPC):
		return CodeENOSPC
	case errors.Is(err, objmap.ErrClosed):
		return CodeClosed
	case errors.Is(err, prefix.ErrNotFound):
		return CodeNotFound
	case errors.Is(err, ErrProtocol):
		return CodeProtocol
	case errors.Is(err, objmap.ErrGeometryMismatch):
		return CodeGeometry
	}
	return CodeOther
}

// Err is the error of code with the service's text (nil for CodeOK).
func (c Code) Err(text string) error {
	var s error
	switch c {
	case CodeOK:
		return nil
	case CodeNoSpace:
		s = objmap.ErrNoSpace
	case CodeENOSPC:
		s = unix.ENOSPC
	case CodeClosed:
		s = objmap.ErrClosed
	case CodeNotFound:
		s = prefix.ErrNotFound
	case CodeProtocol:
		s = ErrProtocol
	case CodeGeometry:
		s = objmap.ErrGeometryMismatch
	default:
		return fmt.Errorf("%w: %s", ErrService, text)
	}
	return fmt.Errorf("%w: %s: %w", ErrService, text, s)
}
