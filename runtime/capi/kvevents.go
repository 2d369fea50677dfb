package main

// KV events (docs/routers.md): opening a store that publishes what it
// serves, and saving with the blocks' token ids.

/*
#include <string.h>
#include "tutti.h"
*/
import "C"

import (
	"unsafe"

	"github.com/tutti-io/tutti/kvevents"
	"github.com/tutti-io/tutti/runtime"
)

//export tutti_open_kv_events
func tutti_open_kv_events(cfg *C.tutti_config, spec *C.char, outStore *C.uint64_t) (rc C.int32_t) {
	defer guard("tutti_open_kv_events", &rc)
	return finish("tutti_open_kv_events", func() error {
		if spec == nil {
			return errorf(errInvalidArgument, "kv_events is NULL")
		}
		n := C.strnlen(spec, maxPathBytes)
		if n == maxPathBytes {
			return errorf(errInvalidArgument, "kv_events is not NUL-terminated within %d bytes", maxPathBytes)
		}
		ev, err := kvevents.ParseSpec(C.GoStringN(spec, C.int(n)))
		if err != nil {
			return errorf(errInvalidArgument, "kv_events: %v", err)
		}
		return openStore(cfg, outStore, func(rc *runtime.Config) { rc.KVEvents = &ev })
	}())
}

//export tutti_save_tokens
func tutti_save_tokens(store C.uint64_t, chain *C.uint64_t, chainLen C.uint32_t, pages *C.int32_t, numPages C.uint32_t,
	tokens *C.uint32_t, numTokens C.uint64_t, outSave *C.uint64_t) (rc C.int32_t) {
	defer guard("tutti_save_tokens", &rc)
	return finish("tutti_save_tokens", saveMeta(store, chain, chainLen, pages, numPages, tokens, numTokens, nil, 0, outSave, true))
}

//export tutti_save_meta
func tutti_save_meta(store C.uint64_t, chain *C.uint64_t, chainLen C.uint32_t, pages *C.int32_t, numPages C.uint32_t,
	tokens *C.uint32_t, numTokens C.uint64_t, hashes *C.uint8_t, hashBytes C.uint32_t, outSave *C.uint64_t) (rc C.int32_t) {
	defer guard("tutti_save_meta", &rc)
	return finish("tutti_save_meta", saveMeta(store, chain, chainLen, pages, numPages, tokens, numTokens, hashes, hashBytes, outSave, false))
}

// saveMeta is tutti_save with each block's BlockMeta: its token ids (tokens,
// num_tokens = chain_len * block tokens; required when needTokens) and the
// engine's own hash of it (hashes: chain_len hashes of hash_bytes each, at
// most kvevents.MaxHashBytes). Both are copied before it returns.
func saveMeta(store C.uint64_t, chain *C.uint64_t, chainLen C.uint32_t, pages *C.int32_t, numPages C.uint32_t,
	tokens *C.uint32_t, numTokens C.uint64_t, hashes *C.uint8_t, hashBytes C.uint32_t, outSave *C.uint64_t, needTokens bool) error {
	e, ch, pg, err := requestArgs(store, chain, uint64(chainLen), pages, uint64(numPages), outSave, "out_save", false)
	if err != nil {
		return err
	}
	meta := make([]runtime.BlockMeta, len(ch))
	bt := uint64(e.cfg.Geometry.ChunkPages * e.cfg.Geometry.PageTokens)
	if needTokens || numTokens != 0 || tokens != nil {
		if uint64(numTokens) != uint64(len(ch))*bt {
			return errorf(errInvalidArgument, "num_tokens = %d, %d chain blocks of %d tokens need %d", numTokens, len(ch), bt, uint64(len(ch))*bt)
		}
		if tokens == nil {
			return errorf(errInvalidArgument, "tokens is NULL with num_tokens = %d", numTokens)
		}
		toks := append([]uint32(nil), unsafe.Slice((*uint32)(unsafe.Pointer(tokens)), uint64(numTokens))...)
		for i := range meta {
			meta[i].Tokens = toks[uint64(i)*bt : uint64(i+1)*bt : uint64(i+1)*bt]
		}
	}
	if hashes != nil || hashBytes != 0 {
		if hashBytes == 0 || hashBytes > kvevents.MaxHashBytes {
			return errorf(errInvalidArgument, "hash_bytes = %d, want 1..%d", hashBytes, kvevents.MaxHashBytes)
		}
		if hashes == nil {
			return errorf(errInvalidArgument, "hashes is NULL with hash_bytes = %d", hashBytes)
		}
		hb := uint64(hashBytes)
		all := append([]byte(nil), unsafe.Slice((*byte)(unsafe.Pointer(hashes)), uint64(len(ch))*hb)...)
		for i := range meta {
			meta[i].Hash = all[uint64(i)*hb : uint64(i+1)*hb : uint64(i+1)*hb]
		}
	}
	sv, err := e.s.SaveWithMeta(ch, pg, meta)
	if err != nil {
		return err
	}
	se := &saveEntry{owner: e, s: sv}
	return publish(e, kindSave, se, func() error { return releaseSave(se) }, "save", outSave)
}
