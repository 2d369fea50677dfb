package main

// KV events (docs/routers.md): opening a store that publishes what it
// serves, saving with the blocks' token ids, and taking the events where
// the engine publishes them itself.

/*
#include <string.h>
#include "tutti.h"
*/
import "C"

import (
	"errors"
	"math"
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
	return finish("tutti_save_tokens", saveMeta(store, chain, chainLen, pages, numPages, tokens, numTokens, nil, 0, 0, outSave, true))
}

//export tutti_save_meta
func tutti_save_meta(store C.uint64_t, chain *C.uint64_t, chainLen C.uint32_t, pages *C.int32_t, numPages C.uint32_t,
	tokens *C.uint32_t, numTokens C.uint64_t, hashes *C.uint8_t, hashBytes C.uint32_t, outSave *C.uint64_t) (rc C.int32_t) {
	defer guard("tutti_save_meta", &rc)
	return finish("tutti_save_meta", saveMeta(store, chain, chainLen, pages, numPages, tokens, numTokens, hashes, hashBytes, 0, outSave, false))
}

//export tutti_save_after
func tutti_save_after(store C.uint64_t, chain *C.uint64_t, chainLen C.uint32_t, pages *C.int32_t, numPages C.uint32_t,
	tokens *C.uint32_t, numTokens C.uint64_t, hashes *C.uint8_t, hashBytes C.uint32_t, afterEvent C.uint64_t, outSave *C.uint64_t) (rc C.int32_t) {
	defer guard("tutti_save_after", &rc)
	return finish("tutti_save_after", saveMeta(store, chain, chainLen, pages, numPages, tokens, numTokens, hashes, hashBytes, uintptr(afterEvent), outSave, false))
}

// saveMeta is tutti_save with each block's BlockMeta: its token ids (tokens,
// num_tokens = chain_len * block tokens; required when needTokens) and the
// engine's own hash of it (hashes: chain_len hashes of hash_bytes each, at
// most kvevents.MaxHashBytes), both copied before it returns; and the
// engine's CUDA event the gathers wait for (SaveOptions.AfterEvent; 0: none).
func saveMeta(store C.uint64_t, chain *C.uint64_t, chainLen C.uint32_t, pages *C.int32_t, numPages C.uint32_t,
	tokens *C.uint32_t, numTokens C.uint64_t, hashes *C.uint8_t, hashBytes C.uint32_t, afterEvent uintptr, outSave *C.uint64_t, needTokens bool) error {
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
	sv, err := e.s.SaveWith(ch, pg, runtime.SaveOptions{Meta: meta, AfterEvent: afterEvent})
	if err != nil {
		return err
	}
	se := &saveEntry{owner: e, s: sv}
	return publish(e, kindSave, se, func() error { return releaseSave(se) }, "save", outSave)
}

// maxTakeBytes bounds one tutti_take_kv_events answer.
const maxTakeBytes = 1 << 30

//export tutti_take_kv_events
func tutti_take_kv_events(store C.uint64_t, buf *C.uint8_t, capacity C.uint64_t, outLen *C.uint64_t, outEvents *C.uint32_t,
	outMore *C.uint32_t) (rc C.int32_t) {
	defer guard("tutti_take_kv_events", &rc)
	return finish("tutti_take_kv_events", func() error {
		if outLen == nil || outEvents == nil || outMore == nil {
			return errorf(errInvalidArgument, "out_len, out_events or out_more is NULL")
		}
		*outLen, *outEvents, *outMore = 0, 0, 0
		if buf == nil && capacity != 0 {
			return errorf(errInvalidArgument, "buf is NULL with cap = %d", capacity)
		}
		e, err := storeArg(uint64(store))
		if err != nil {
			return err
		}
		out, n, more, err := e.s.TakeKVEvents(nil, int(min(uint64(capacity), maxTakeBytes)))
		var small *kvevents.TooSmallError
		if errors.As(err, &small) {
			*outLen = C.uint64_t(small.Need)
			*outMore = 1
			return errorf(errBufferTooSmall, "cap = %d, the next event takes %d bytes", capacity, small.Need)
		}
		if err != nil {
			return err
		}
		copy(unsafe.Slice((*byte)(unsafe.Pointer(buf)), len(out)), out)
		*outLen, *outEvents = C.uint64_t(len(out)), C.uint32_t(min(n, math.MaxUint32))
		if more {
			*outMore = 1
		}
		return nil
	}())
}
