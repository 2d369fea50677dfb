// Package faultfs makes real I/O errors below a file system, on command:
// a FUSE file system (go-fuse, mounted with mount(2) as root) serves one
// file with FOPEN_DIRECT_IO whose reads, writes and fsyncs fail with EIO as
// an Injector's rules say (by request kind, byte range of the file, skip and
// count); Setup puts a loop device with direct I/O over that file and an
// ext4 without a journal on the loop device, so a store on Device.Dir gets
// the errors from the kernel exactly where a failing disk would return
// them: O_DIRECT reads and writes, the writeback of buffered files (at
// their fdatasync) and the flush of the device. Extents maps a file's bytes
// to device offsets, which rules name, so a fault can aim at one object.
//
// Nothing is mocked above the FUSE file; the page cache is kept out by
// direct I/O at both the loop and the FUSE level (Device.Remount drops what
// ext4 caches of buffered files). Everything is bounded in time: a watchdog
// aborts the FUSE connection of a Device that outlives Options.Timeout, and
// the tear-down unmounts lazily what does not go.
//
// Tests only; it must not be imported by package code.
package faultfs
