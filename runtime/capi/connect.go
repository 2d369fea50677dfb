package main

/*
#include <stdlib.h>
#include <string.h>
#include "tutti.h"
*/
import "C"

import (
	"github.com/tutti-io/tutti/runtime"
)

// serviceDirPlaceholder stands for a connected store's directories while
// its config is checked: runtime.Connect replaces it (and the capacity)
// with the service's.
const serviceDirPlaceholder = "(the service's)"

//export tutti_connect
func tutti_connect(socket *C.char, cfg *C.tutti_config, outStore *C.uint64_t) (rc C.int32_t) {
	defer guard("tutti_connect", &rc)
	return finish("tutti_connect", connectStore(socket, cfg, outStore))
}

// connectStore is tutti_open for an engine of a node whose store a
// service holds (tutti serve): cfg's dirs and capacity_bytes are ignored
// (dirs may be NULL with num_dirs 0), the rest is checked as tutti_open
// checks it.
func connectStore(socket *C.char, p *C.tutti_config, out *C.uint64_t) error {
	if out == nil {
		return errorf(errInvalidArgument, "out_store is NULL")
	}
	*out = 0
	if socket == nil {
		return errorf(errInvalidArgument, "socket is NULL")
	}
	n := C.strnlen(socket, maxPathBytes)
	if n == maxPathBytes || n == 0 {
		return errorf(errInvalidArgument, "socket is empty or not NUL-terminated within %d bytes", maxPathBytes)
	}
	path := C.GoStringN(socket, C.int(n))
	c, err := readConfigFor(p, true)
	if err != nil {
		return err
	}
	if c.tpSize > 1 {
		return errorf(errInvalidArgument, "tutti_config.tp_size = %d: a connected store holds one shard; connect each rank to its own service", c.tpSize)
	}
	rc, err := c.runtimeConfig()
	if err != nil {
		return err
	}
	rc.Dirs, rc.CapacityBytes = nil, 0
	s, err := runtime.Connect(path, rc)
	if err != nil {
		return err
	}
	e := &storeEntry{s: s, cfg: s.Config(), children: make(map[uint64]struct{})}
	h, err := handles.add(kindStore, e)
	if err != nil {
		s.Close()
		return err
	}
	*out = C.uint64_t(h)
	return nil
}
