package uring

import (
	"fmt"
	"unsafe"

	"golang.org/x/sys/unix"
)

// Registered files and buffers, and enabling a ring created disabled.

// RegisterFiles implements Engine.
func (r *Ring) RegisterFiles(files []*File) error {
	if r.closed {
		return fmt.Errorf("uring: register files: %w", ErrClosed)
	}
	if r.InFlight() > 0 {
		return fmt.Errorf("uring: register files: %w: %d I/O in flight", ErrInvalid, r.InFlight())
	}
	if r.files != nil {
		if _, err := sysRegister(r.fd, unregisterFiles, nil, 0); err != nil {
			return fmt.Errorf("uring: unregister files: %w", err)
		}
		r.forgetFiles()
	}
	if len(files) == 0 {
		return nil
	}
	fds := make([]int32, len(files))
	for i, f := range files {
		fds[i] = f.FD
	}
	if _, err := sysRegister(r.fd, registerFiles, unsafe.Pointer(&fds[0]), uint32(len(fds))); err != nil {
		return fmt.Errorf("uring: register %d files: %w", len(files), err)
	}
	for i, f := range files {
		f.Index = int32(i)
	}
	r.files = append([]*File(nil), files...)
	return nil
}

// forgetFiles resets the Index of the files this ring registered.
func (r *Ring) forgetFiles() {
	for i, f := range r.files {
		if f.Index == int32(i) {
			f.Index = -1
		}
	}
	r.files = nil
}

// Enable enables a ring created with Config.Disabled
// (IORING_REGISTER_ENABLE_RINGS). With SingleIssuer or DeferTaskrun the
// calling OS thread becomes the only one that may submit to, wait on or
// register with the ring from then on: lock the goroutine to its thread
// first (runtime.LockOSThread) and keep it locked. Enabling a ring that is
// not disabled fails (EBADFD from the kernel).
func (r *Ring) Enable() error {
	if r.closed {
		return fmt.Errorf("uring: enable ring: %w", ErrClosed)
	}
	if _, err := sysRegister(r.fd, registerEnable, nil, 0); err != nil {
		return fmt.Errorf("uring: enable ring: %w", err)
	}
	return nil
}

// RegisterBuffers implements Engine. The buffers must stay allocated until
// the ring is closed or RegisterBuffers(nil) unregisters them.
func (r *Ring) RegisterBuffers(bufs []*Buffer) error {
	if r.closed {
		return fmt.Errorf("uring: register buffers: %w", ErrClosed)
	}
	if r.InFlight() > 0 {
		return fmt.Errorf("uring: register buffers: %w: %d I/O in flight", ErrInvalid, r.InFlight())
	}
	if r.bufs != nil {
		if _, err := sysRegister(r.fd, unregisterBuffers, nil, 0); err != nil {
			return fmt.Errorf("uring: unregister buffers: %w", err)
		}
		r.bufs = nil
	}
	if len(bufs) == 0 {
		return nil
	}
	iov := make([]iovec, len(bufs))
	for i, b := range bufs {
		if b == nil || b.mem == nil {
			return fmt.Errorf("uring: register buffers: %w: buffer %d is freed", ErrInvalid, i)
		}
		iov[i] = iovec{Base: uint64(b.Addr()), Len: uint64(b.Len())}
	}
	if _, err := sysRegister(r.fd, registerBuffers, unsafe.Pointer(&iov[0]), uint32(len(iov))); err != nil {
		if err == unix.ENOMEM {
			return fmt.Errorf("uring: register %d buffers: %w (RLIMIT_MEMLOCK too low?)", len(bufs), err)
		}
		return fmt.Errorf("uring: register %d buffers: %w", len(bufs), err)
	}
	r.bufs = append([]*Buffer(nil), bufs...)
	return nil
}
