package nodewire

import (
	"bytes"
	"errors"
	"io"
	"reflect"
	"testing"

	"github.com/tutti-io/tutti/objmap"
	"github.com/tutti-io/tutti/prefix"
)

var res = objmap.Reservation{ID: 7, Generation: 2, File: 3, Offset: 1 << 20, Length: 4 << 20, Chunks: 2}

// requests is one request of every op.
var requests = map[Op]Msg{
	OpHello:       &Hello{Version: Version, Fingerprint: "fp"},
	OpLookup:      &Lookup{Chain: []uint64{1, 2, 3}},
	OpPin:         &Pin{Chain: []uint64{1, 2}, Skip: 1},
	OpUnpin:       &Unpin{ID: 9},
	OpCorrupt:     &Corrupt{ID: 9, Run: 2},
	OpDiscard:     &Discard{Block: 5},
	OpResident:    &Resident{},
	OpReserve:     &Reserve{Chain: []uint64{1, 2}, Meta: []Meta{{Tokens: []uint32{1}, Hash: []byte{2}}, {}}},
	OpAllocate:    &Allocate{N: 4, Ways: 2},
	OpAllocateOne: &AllocateOne{K: 3},
	OpAbort:       &Abort{Res: res},
	OpUnreserve:   &Unreserve{IDs: []uint64{4}},
	OpCommit: &Commit{Reqs: []objmap.CommitRequest{{Res: res, Chain: []uint64{1, 2}, Parent: 9, HasParent: true,
		ChunkCRCs: []uint32{1, 2, 3, 4}}}},
	OpJournalReady: &JournalReady{},
}

// responses is one response payload of every op.
var responses = map[Op]Msg{
	OpHello:       &HelloResp{Dirs: []string{"/a", "/b"}, Files: []string{"/a/p0", "/b/p1"}, FilesPerDir: 1, RunWidth: 2, KeepsMeta: true, CapacityBytes: 1 << 30},
	OpLookup:      &Count{N: 3},
	OpPin:         &PinResp{ID: 1, N: 2, Spans: []Span{{Info: objmap.RunInfo{ID: 1, File: 1, Offset: 8192, Length: 1 << 20, Chain: []uint64{1, 2}, Kept: 2, ChunkCRCs: []uint32{5, 6}}, K: 2}}},
	OpUnpin:       &Empty{},
	OpCorrupt:     &Flag{V: true},
	OpDiscard:     &Count{N: 1},
	OpResident:    &ResidentResp{Blocks: []Block{{ID: 1}, {ID: 2, Parent: 1, HasParent: true}}},
	OpReserve:     &ReserveResp{From: 1, N: 1, Stop: prefix.StopCapacity},
	OpAllocate:    &Reservations{Res: []objmap.Reservation{res, res}},
	OpAllocateOne: &Reservations{Res: []objmap.Reservation{res}},
	OpAbort:       &Empty{}, OpUnreserve: &Empty{}, OpCommit: &Empty{}, OpJournalReady: &Empty{},
}

func TestRoundTrip(t *testing.T) {
	for op := OpHello; op < opEnd; op++ {
		req, resp := requests[op], responses[op]
		if req == nil || resp == nil {
			t.Fatalf("op %d has no test message", op)
		}
		var e Enc
		req.Encode(&e)
		f, _, err := ReadFrame(bytes.NewReader(AppendFrame(nil, op, 42, e.B)), nil)
		if err != nil || f.Op != op || f.ID != 42 {
			t.Fatalf("op %d: frame %+v, %v", op, f, err)
		}
		got, err := DecodeRequest(f)
		if err != nil || !reflect.DeepEqual(got, req) {
			t.Errorf("op %d: request %+v, %v; want %+v", op, got, err, req)
		}
		b := AppendResponse(nil, op, 42, resp, objmap.ErrNoSpace)
		f, _, err = ReadFrame(bytes.NewReader(b), nil)
		if err != nil {
			t.Fatal(err)
		}
		m, rerr, err := DecodeResponse(op, f.Payload)
		want := resp
		var payload Enc
		if resp.Encode(&payload); len(payload.B) == 0 {
			want = nil // an error with an empty payload comes back alone
		}
		if err != nil || !reflect.DeepEqual(m, want) || !errors.Is(rerr, objmap.ErrNoSpace) || !errors.Is(rerr, ErrService) {
			t.Errorf("op %d: response %+v, %v, %v; want %+v", op, m, rerr, err, resp)
		}
	}
}

func TestBadFrames(t *testing.T) {
	for name, b := range map[string][]byte{
		"too long":   {0xff, 0xff, 0xff, 0xff},
		"too short":  {1, 0, 0, 0, 1},
		"unknown op": AppendFrame(nil, opEnd, 1, nil),
	} {
		if _, _, err := ReadFrame(bytes.NewReader(b), nil); !errors.Is(err, ErrProtocol) {
			t.Errorf("%s: %v, want ErrProtocol", name, err)
		}
	}
	if _, _, err := ReadFrame(bytes.NewReader(AppendFrame(nil, OpPin, 1, []byte{1, 2, 3})[:8]), nil); !errors.Is(err, io.ErrUnexpectedEOF) {
		t.Errorf("torn frame: %v", err)
	}
	// A list longer than its frame is refused before it is allocated.
	e := Enc{}
	e.U32(MaxItems)
	if _, err := DecodeRequest(Frame{Op: OpLookup, Payload: e.B}); !errors.Is(err, ErrProtocol) {
		t.Errorf("long list: %v", err)
	}
	if _, err := DecodeRequest(Frame{Op: OpUnpin, Payload: make([]byte, 9)}); !errors.Is(err, ErrProtocol) {
		t.Errorf("trailing bytes: %v", err)
	}
}

// FuzzDecode: no frame or payload panics or allocates past its length; a
// request that decodes re-encodes to the same bytes.
func FuzzDecode(f *testing.F) {
	for op, m := range requests {
		var e Enc
		m.Encode(&e)
		f.Add(AppendFrame(nil, op, 1, e.B))
	}
	for op, m := range responses {
		f.Add(AppendResponse(nil, op, 1, m, nil))
	}
	f.Fuzz(func(t *testing.T, b []byte) {
		fr, _, err := ReadFrame(bytes.NewReader(b), nil)
		if err != nil {
			return
		}
		_, _, _ = DecodeResponse(fr.Op, fr.Payload)
		m, err := DecodeRequest(fr)
		if err != nil {
			return
		}
		var e Enc
		m.Encode(&e)
		if !bytes.Equal(e.B, fr.Payload) {
			t.Fatalf("op %d: %x re-encodes to %x", fr.Op, fr.Payload, e.B)
		}
	})
}
