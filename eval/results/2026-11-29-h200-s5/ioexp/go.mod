module ioexp

go 1.26.0

require (
	github.com/tutti-io/tutti v0.0.0
	golang.org/x/sys v0.50.0
)

replace github.com/tutti-io/tutti => ../../../..
