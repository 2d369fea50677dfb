package runtime

// Group bookkeeping for package runtime/tp (tensor-parallel ranks, one Store
// each): a quiet lookup, discarding blocks one rank committed that another
// rank failed, and listing what is resident after recovery. Kept in its own
// file; it uses only the index and run table the rest of the package keeps.

import (
	"fmt"
)

// Resident returns how many leading blocks of chain are hits, like Lookup,
// but does not count the call in Stats (a group's bookkeeping is not an
// engine lookup). It marks the hit blocks used, as Lookup does.
func (s *Store) Resident(chain []uint64) int { return s.idx.Lookup(chain) }

// Discard takes block id and every block cached below it (unreachable
// without it) out of service: from the return on, no Lookup or Load finds
// them. Blocks no load pins leave at once and their runs are freed once no
// block of theirs is indexed (a run of which only a tail was discarded stays
// on disk, serving its head; after a restart its tail is indexed again, which
// is correct data, so a group must re-check it: see runtime/tp). Pinned or
// pending blocks drain and are freed by the Unpin or Commit that releases
// them last. It returns the blocks that left at once; an error wrapping
// prefix.ErrNotFound when id is not in the index, ErrClosed after Close.
func (s *Store) Discard(id uint64) (int, error) {
	if err := s.begin(); err != nil {
		return 0, err
	}
	defer s.endOp()
	dropped, err := s.idx.Remove(id)
	if err != nil {
		return 0, fmt.Errorf("runtime: discarding block %#x: %w", id, err)
	}
	s.cat.Release(dropped)
	return len(dropped), nil
}

// ResidentBlock is one block that is a hit, with its parent in the chain.
type ResidentBlock struct {
	ID        uint64
	Parent    uint64 // valid when HasParent
	HasParent bool
}

// ResidentBlocks lists every block that is a hit now (committed, not
// draining), each once, in no particular order. O(blocks); meant for
// recovery-time reconciliation, not for the request path.
func (s *Store) ResidentBlocks() []ResidentBlock {
	blocks := s.cat.Resident()
	out := make([]ResidentBlock, len(blocks))
	for i, b := range blocks {
		out[i] = ResidentBlock(b)
	}
	return out
}
