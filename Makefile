# tutti — build, test, benchmark, and the GPU pieces.
# The Go side needs no CUDA: kernels are built by nvcc on the GPU machine and
# loaded at run time (dlopen), so `make build test` work everywhere.

GO        ?= go
NVCC      ?= nvcc
BIN       := bin
KBUILD    := kernels/build
# Debian's python3 sees python3-torch (installed by test-deps): the torch tests run on real tensors.
PY        ?= $(if $(wildcard /usr/bin/python3),/usr/bin/python3,python3)
STATICCHECK_VERSION := v0.8.2
# Where `go install` puts staticcheck: GOBIN when set, else the first GOPATH
# entry's bin; test-deps installs it into exactly this directory.
GOBIN_DIR   := $(or $(shell $(GO) env GOBIN),$(firstword $(subst :, ,$(shell $(GO) env GOPATH)))/bin)
STATICCHECK := $(GOBIN_DIR)/staticcheck

.PHONY: all build test test-deps test-go vet lint cuda-check bench kernels gpu-bins gpu-pack device-test python-test clean

all: build

build:
	$(GO) build -o $(BIN)/tutti ./cmd/tutti

vet:
	$(GO) vet ./...

# What the tests need on a fresh machine (Go, gcc and python3 given): see
# scripts/test-deps.sh (staticcheck, tracefs, fuse/loop, Debian packages) and
# scripts/vllm-venv.sh (vLLM 0.26.0 and torch 2.11.0 in .venv-vllm, for the
# tests under vLLM's own scheduler).
test-deps:
	@STATICCHECK=$(STATICCHECK) STATICCHECK_VERSION=$(STATICCHECK_VERSION) GO=$(GO) bash scripts/test-deps.sh
	@bash scripts/vllm-venv.sh

lint: vet test-deps cuda-check
	$(STATICCHECK) ./...
	@test -z "$$(gofmt -l .)" || { echo "gofmt needed:"; gofmt -l .; exit 1; }

# The CUDA sources built by nvcc 13 from NVIDIA's wheels where there is no GPU
# (kernels/build-check.sh: the product library linked, the testkit compiled).
cuda-check:
	@bash kernels/build-check.sh

test-go:
	$(GO) test -race -count=1 ./...

# The test command of the README: installs what it needs (test-deps), then
# lint, Go tests under the race detector, Python tests.
test: lint test-go python-test
test-go python-test: test-deps

bench:
	$(GO) test -run '^$$' -bench . -benchmem ./...

# libtutti.so + tutti.h (C ABI), then the stdlib-only Python tests against the CPU path.
python-test:
	$(GO) build -buildmode=c-shared -o $(BIN)/libtutti.so ./runtime/capi
	$(GO) build -o $(BIN)/tutti ./cmd/tutti
	TUTTI_LIB=$(CURDIR)/$(BIN)/libtutti.so TUTTI_BIN=$(CURDIR)/$(BIN)/tutti PYTHONPATH=$(CURDIR)/python $(PY) -m unittest discover -s python/tests -v

# CUDA kernels → the product library (package kernels) and the test kit
# (package kernels/testkit), loaded at run time (GPU machine).
kernels:
	$(MAKE) -C kernels NVCC=$(NVCC)

# The Go side of a GPU run, built here (the GPU machine has no Go): carry bin/.
# Stripped (-s -w): the device tool carries at most 64 MiB with the tree.
GPU_LDFLAGS ?= -s -w
gpu-bins:
	$(GO) build -ldflags='$(GPU_LDFLAGS)' -o $(BIN)/gpu/tutti ./cmd/tutti
	$(GO) test -c -ldflags='$(GPU_LDFLAGS)' -o $(BIN)/gpu/kernels.test ./kernels
	$(GO) test -c -ldflags='$(GPU_LDFLAGS)' -o $(BIN)/gpu/testkit.test ./kernels/testkit
	$(GO) test -c -ldflags='$(GPU_LDFLAGS)' -o $(BIN)/gpu/runtime.test ./runtime
	$(GO) test -c -ldflags='$(GPU_LDFLAGS)' -o $(BIN)/gpu/tp.test ./runtime/tp
	$(GO) test -c -ldflags='$(GPU_LDFLAGS)' -o $(BIN)/gpu/harness.test ./eval/harness
	$(GO) build -ldflags='$(GPU_LDFLAGS)' -buildmode=c-shared -o $(BIN)/libtutti.so ./runtime/capi

# bin/gpu.tar.xz: bin/gpu and bin/libtutti.so packed (about 17 of their 61 MB)
# to fit a device call's 64 MiB carry; unpack there with
# `tar xJf bin/gpu.tar.xz -C bin`.
gpu-pack: gpu-bins
	tar cf - -C $(BIN) gpu libtutti.so | xz -T2 -6 >$(BIN)/gpu.tar.xz

# Everything the GPU machine runs in one call (build, every GPU test,
# gpubench, the pool): see kernels/device-test.sh. Needs `make gpu-bins` first.
device-test:
	bash kernels/device-test.sh

clean:
	rm -rf $(BIN) $(KBUILD)
