package main

import (
	"github.com/tutti-io/tutti/kernels"
	"github.com/tutti-io/tutti/kvshape"
	"github.com/tutti-io/tutti/objmap"
	"github.com/tutti-io/tutti/prefix"
	"github.com/tutti-io/tutti/runtime"
	"github.com/tutti-io/tutti/sched"
	"github.com/tutti-io/tutti/uring"
)

// sentinelStatus maps the sentinel errors of the packages under runtime to
// the status a C caller sees. First match wins, so the more specific come
// first (a locked directory is TUTTI_ERR_LOCKED even when wrapped in an
// open error).
var sentinelStatus = []struct {
	err  error
	code status
}{
	{objmap.ErrLocked, errLocked},
	{objmap.ErrGeometryMismatch, errGeometry},
	{objmap.ErrSettingsMismatch, errSettings},
	{objmap.ErrMissingDir, errSettings},
	{objmap.ErrNoSpace, errNoSpace},
	{objmap.ErrCorruptStore, errCorrupt},
	{objmap.ErrBadHeader, errCorrupt},
	{objmap.ErrChunkCRC, errCorrupt}, // a restored chunk failed its CRC32C: the load lost blocks
	{objmap.ErrClosed, errClosed},
	{kvshape.ErrGeometry, errGeometry},
	{kvshape.ErrOutOfRange, errOutOfRange},
	{runtime.ErrGPUUnavailable, errNoGPU},
	{runtime.ErrNotGPU, errNotSupported},
	{runtime.ErrClosed, errClosed},
	{runtime.ErrNoKV, errNotRegistered},
	{runtime.ErrBusy, errBusy},
	{runtime.ErrBadRequest, errInvalidArgument},
	{runtime.ErrKV, errGeometry},
	{runtime.ErrConfig, errInvalidArgument},
	{prefix.ErrBadArg, errInvalidArgument},
	{sched.ErrBadProfile, errInvalidArgument},
	{sched.ErrConfig, errInvalidArgument},
	{kernels.ErrNoGPU, errNoGPU},
	{kernels.ErrNotLoaded, errNoGPU},
	{kernels.ErrABI, errVersion},
	{kernels.ErrNotSupported, errNotSupported},
	{kernels.ErrBusy, errBusy},
	{kernels.ErrIO, errIO},
	{kernels.ErrRingBroken, errIO},
	{uring.ErrNotSupported, errNotSupported},
	{uring.ErrClosed, errClosed},
	{uring.ErrCrashed, errIO},
	{uring.ErrMisaligned, errInvalidArgument},
}

// releaseLoad ends the caller's use of a load: it waits for the restore to
// finish (a load never writes into KV memory after its handle is gone), which
// also unpins its blocks.
func releaseLoad(le *loadEntry) error { return le.l.Wait() }

// releaseSave waits until the save no longer reads the engine's pages; the
// write itself continues (tutti_wait_saves waits for it).
func releaseSave(se *saveEntry) error { return waitGathered(se) }

func waitGathered(se *saveEntry) error {
	<-se.s.Gathered()
	return nil
}
