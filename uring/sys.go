package uring

import (
	"unsafe"

	"golang.org/x/sys/unix"
)

func sysSetup(entries uint32, p *params) (int, error) {
	fd, _, errno := unix.Syscall(unix.SYS_IO_URING_SETUP, uintptr(entries), uintptr(unsafe.Pointer(p)), 0)
	if errno != 0 {
		return -1, errno
	}
	return int(fd), nil
}

// sysEnter is io_uring_enter without the extended argument. It returns the
// number of SQEs consumed.
func sysEnter(fd int, toSubmit, minComplete, flags uint32) (int, error) {
	n, _, errno := unix.Syscall6(unix.SYS_IO_URING_ENTER, uintptr(fd), uintptr(toSubmit), uintptr(minComplete), uintptr(flags), 0, 0)
	if errno != 0 {
		return int(n), errno
	}
	return int(n), nil
}

func sysRegister(fd int, opcode uint32, arg unsafe.Pointer, nrArgs uint32) (int, error) {
	n, _, errno := unix.Syscall6(unix.SYS_IO_URING_REGISTER, uintptr(fd), uintptr(opcode), uintptr(arg), uintptr(nrArgs), 0, 0)
	if errno != 0 {
		return int(n), errno
	}
	return int(n), nil
}

// sysPread and sysPwrite take the buffer as an address: the memory is
// off-heap (Buffer), so no Go slice needs to be made over it.
func sysPread(fd int32, addr uintptr, lenBytes uint32, off uint64) (int, error) {
	n, _, errno := unix.Syscall6(unix.SYS_PREAD64, uintptr(fd), addr, uintptr(lenBytes), uintptr(off), 0, 0)
	if errno != 0 {
		return 0, errno
	}
	return int(n), nil
}

func sysPwrite(fd int32, addr uintptr, lenBytes uint32, off uint64) (int, error) {
	n, _, errno := unix.Syscall6(unix.SYS_PWRITE64, uintptr(fd), addr, uintptr(lenBytes), uintptr(off), 0, 0)
	if errno != 0 {
		return 0, errno
	}
	return int(n), nil
}

// Pread reads into off-heap memory at addr with pread(2); it is the baseline
// engine of devbench. It returns the bytes read.
func Pread(f *File, addr uintptr, lenBytes uint32, offset uint64) (int, error) {
	return sysPread(f.FD, addr, lenBytes, offset)
}

// Pwrite writes from off-heap memory at addr with pwrite(2).
func Pwrite(f *File, addr uintptr, lenBytes uint32, offset uint64) (int, error) {
	return sysPwrite(f.FD, addr, lenBytes, offset)
}
