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
	return finish("tutti_save_tokens", func() error {
		e, ch, pg, err := requestArgs(store, chain, uint64(chainLen), pages, uint64(numPages), outSave, "out_save", false)
		if err != nil {
			return err
		}
		bt := uint64(e.cfg.Geometry.ChunkPages * e.cfg.Geometry.PageTokens)
		if uint64(numTokens) != uint64(len(ch))*bt {
			return errorf(errInvalidArgument, "num_tokens = %d, %d chain blocks of %d tokens need %d", numTokens, len(ch), bt, uint64(len(ch))*bt)
		}
		if tokens == nil {
			return errorf(errInvalidArgument, "tokens is NULL with num_tokens = %d", numTokens)
		}
		toks := append([]uint32(nil), unsafe.Slice((*uint32)(unsafe.Pointer(tokens)), uint64(numTokens))...)
		meta := make([]runtime.BlockMeta, len(ch))
		for i := range meta {
			meta[i].Tokens = toks[uint64(i)*bt : uint64(i+1)*bt : uint64(i+1)*bt]
		}
		sv, err := e.s.SaveWithMeta(ch, pg, meta)
		if err != nil {
			return err
		}
		se := &saveEntry{owner: e, s: sv}
		return publish(e, kindSave, se, func() error { return releaseSave(se) }, "save", outSave)
	}())
}
