package main

// Lookup and chain ids: read-only questions about the prefix index.

/*
#include "tutti.h"
*/
import "C"

import (
	"unsafe"

	"github.com/tutti-io/tutti/prefix"
)

//export tutti_lookup
func tutti_lookup(store C.uint64_t, chain *C.uint64_t, n C.uint32_t, outBlocks *C.uint32_t) (rc C.int32_t) {
	defer guard("tutti_lookup", &rc)
	return finish("tutti_lookup", lookup(store, chain, uint64(n), outBlocks))
}

func lookup(store C.uint64_t, chainP *C.uint64_t, n uint64, out *C.uint32_t) error {
	if out == nil {
		return errorf(errInvalidArgument, "out_blocks is NULL")
	}
	*out = 0
	e, err := storeArg(uint64(store))
	if err != nil {
		return err
	}
	if err := countArg("chain length", n, maxChainBlocks); err != nil {
		return err
	}
	if chainP == nil {
		return errorf(errInvalidArgument, "chain is NULL with length %d", n)
	}
	// Lookup only reads the chain during the call and keeps nothing, so it
	// gets a view of the caller's array instead of a copy.
	*out = C.uint32_t(e.s.Lookup(unsafe.Slice((*uint64)(unsafe.Pointer(chainP)), n)))
	return nil
}

//export tutti_chain_from_tokens
func tutti_chain_from_tokens(tokens *C.uint32_t, numTokens C.uint64_t, blockTokens C.uint32_t, seed C.uint64_t, outChain *C.uint64_t, capacity C.uint32_t, outLen *C.uint32_t) (rc C.int32_t) {
	defer guard("tutti_chain_from_tokens", &rc)
	return finish("tutti_chain_from_tokens", func() error {
		if outLen == nil {
			return errorf(errInvalidArgument, "out_len is NULL")
		}
		*outLen = 0
		if blockTokens == 0 || blockTokens > 1<<20 {
			return errorf(errInvalidArgument, "block_tokens = %d, want 1..%d", blockTokens, 1<<20)
		}
		n := uint64(numTokens) / uint64(blockTokens)
		if n > maxChainBlocks {
			return errorf(errInvalidArgument, "%d tokens in blocks of %d give %d ids, more than the limit %d", numTokens, blockTokens, n, maxChainBlocks)
		}
		*outLen = C.uint32_t(n)
		if n > uint64(capacity) {
			return errorf(errBufferTooSmall, "cap = %d, %d tokens in blocks of %d give %d ids", capacity, numTokens, blockTokens, n)
		}
		if n == 0 {
			return nil
		}
		if tokens == nil {
			return errorf(errInvalidArgument, "tokens is NULL with num_tokens = %d", numTokens)
		}
		if outChain == nil {
			return errorf(errInvalidArgument, "out_chain is NULL with cap = %d", capacity)
		}
		// Only the full blocks are read; the C array is hashed in place (the
		// hash keeps no reference to it).
		toks := unsafe.Slice((*uint32)(unsafe.Pointer(tokens)), n*uint64(blockTokens))
		out := unsafe.Slice((*uint64)(unsafe.Pointer(outChain)), n)
		chain, err := prefix.ChainFromTokens(out[:0], toks, int(blockTokens), uint64(seed))
		if err != nil {
			return err
		}
		if len(chain) != int(n) || (n > 0 && &chain[0] != &out[0]) {
			return errorf(errInternal, "ChainFromTokens gave %d ids (want %d) or reallocated", len(chain), n)
		}
		return nil
	}())
}
