// Package archtest holds the repository's import rules and size limits and
// the tests that enforce them. The rules have one home, layers, testSupport and leaves in
// rules.go; docs/architecture.md draws them, and a test checks that its
// table says the same.
//
// A package belongs to the component whose path is the longest prefix of its
// own (runtime/tp belongs to runtime; runtime's internal packages are listed
// as components of their own, below runtime). Rules:
//   - A library package imports, inside the module, only packages of its own
//     component or of a lower layer; its tests follow the same rule.
//   - A command (package main) outside cmd/ may import any layer but eval.
//   - Test-support packages are imported by non-test code only in eval/,
//     cmd/ and other test-support packages, so they never ship in the
//     product (bin/libtutti.so, the runtime an engine links).
//   - A leaf (leaves in rules.go: the KV shape) imports nothing of the
//     module in its non-test code, so engines and kernels take it alone.
//   - Every package of the module belongs to a component: a new top-level
//     package is placed in the table before it is used.
//
// The check parses import blocks with go/parser (no build, no go list), so
// it covers every file whatever its build tags, test files included.
//
// Size limits (size.go): no source file (.go, .cu, .cuh, .h, .c, .py, .sh)
// over MaxFileLines lines and no Go function over MaxFuncLines, tests and
// generated files aside; oversized in rules.go allows an exception, with why.
package archtest
