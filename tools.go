//go:build tools

// Package tools pins the modules that packages of this repository are about to use,
// so go.mod stays stable while they are written. Remove once each is imported.
package tools

import (
	_ "github.com/cilium/ebpf"
	_ "github.com/cockroachdb/datadriven"
	_ "github.com/google/btree"
	_ "golang.org/x/sys/unix"
	_ "golang.org/x/term"
	_ "gonum.org/v1/plot"
)
