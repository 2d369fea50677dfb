package main

import (
	"errors"
	"fmt"
	"syscall"
)

// status mirrors enum tutti_status in tutti.h (TestHeaderEnums keeps them equal).
type status int32

const (
	statusOK           status = 0
	errInvalidArgument status = 1
	errBadHandle       status = 2
	errVersion         status = 3
	errGeometry        status = 4
	errOutOfRange      status = 5
	errNotRegistered   status = 6
	errBufferTooSmall  status = 7
	errNoGPU           status = 8
	errNotSupported    status = 9
	errLocked          status = 10
	errClosed          status = 11
	errNoSpace         status = 12
	errIO              status = 13
	errCorrupt         status = 14
	errBusy            status = 15
	errInternal        status = 16
	errSettings        status = 17 // ABI 1.4
	statusCount               = 18 // one past the last code
)

var statusNames = [statusCount]string{
	"TUTTI_OK", "TUTTI_ERR_INVALID_ARGUMENT", "TUTTI_ERR_BAD_HANDLE", "TUTTI_ERR_VERSION",
	"TUTTI_ERR_GEOMETRY", "TUTTI_ERR_OUT_OF_RANGE", "TUTTI_ERR_NOT_REGISTERED",
	"TUTTI_ERR_BUFFER_TOO_SMALL", "TUTTI_ERR_NO_GPU", "TUTTI_ERR_NOT_SUPPORTED",
	"TUTTI_ERR_LOCKED", "TUTTI_ERR_CLOSED", "TUTTI_ERR_NO_SPACE", "TUTTI_ERR_IO",
	"TUTTI_ERR_CORRUPT", "TUTTI_ERR_BUSY", "TUTTI_ERR_INTERNAL", "TUTTI_ERR_SETTINGS_MISMATCH",
}

func (s status) String() string {
	if s >= 0 && s < statusCount {
		return statusNames[s]
	}
	return fmt.Sprintf("tutti_status(%d)", int32(s))
}

// abiError is an error with the status the C caller sees. The ABI layer
// builds them for argument checks; errors from the runtime are classified by
// classify.
type abiError struct {
	code status
	msg  string
	err  error // wrapped cause, if any
}

func (e *abiError) Error() string {
	if e.err != nil {
		return e.msg + ": " + e.err.Error()
	}
	return e.msg
}

func (e *abiError) Unwrap() error { return e.err }

func errorf(code status, format string, args ...any) error {
	return &abiError{code: code, msg: fmt.Sprintf(format, args...)}
}

// classify maps an error to the status a C caller branches on. Errors that
// match no known sentinel are TUTTI_ERR_IO when they carry an errno and TUTTI_ERR_INTERNAL otherwise, so an unexpected error is never
// reported as success or as a caller mistake.
func classify(err error) status {
	if err == nil {
		return statusOK
	}
	var ae *abiError
	if errors.As(err, &ae) {
		return ae.code
	}
	for _, m := range sentinelStatus {
		if errors.Is(err, m.err) {
			return m.code
		}
	}
	var errno syscall.Errno
	if errors.As(err, &errno) {
		return errIO
	}
	return errInternal
}
