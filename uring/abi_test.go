package uring

import (
	"testing"
	"unsafe"
)

func TestABISizes(t *testing.T) {
	for _, tc := range []struct {
		name      string
		got, want uintptr
	}{
		{"io_uring_params", unsafe.Sizeof(params{}), 120},
		{"io_sqring_offsets", unsafe.Sizeof(sqringOffsets{}), 40},
		{"io_cqring_offsets", unsafe.Sizeof(cqringOffsets{}), 40},
		{"io_uring_sqe", unsafe.Sizeof(sqe{}), 64},
		{"io_uring_cqe", unsafe.Sizeof(cqe{}), 16},
		{"io_uring_probe", unsafe.Sizeof(probeHeader{}), 16},
		{"io_uring_probe_op", unsafe.Sizeof(probeOp{}), 8},
		{"iovec", unsafe.Sizeof(iovec{}), 16},
		{"sqe.user_data offset", unsafe.Offsetof(sqe{}.UserData), 32},
		{"sqe.buf_index offset", unsafe.Offsetof(sqe{}.BufIndex), 40},
		{"sqe.len offset", unsafe.Offsetof(sqe{}.Len), 24},
		{"params.sq_off offset", unsafe.Offsetof(params{}.SQOff), 40},
		{"params.cq_off offset", unsafe.Offsetof(params{}.CQOff), 80},
	} {
		if tc.got != tc.want {
			t.Errorf("%s: %d, want %d", tc.name, tc.got, tc.want)
		}
	}
}
