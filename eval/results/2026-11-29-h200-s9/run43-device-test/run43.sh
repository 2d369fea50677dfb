#!/usr/bin/env bash
# run 43 (Session 9): the rewritten kernels/device-test.sh, both bench modes. First the default (build, self-test,
# every GPU test, the pool set) at 2 rounds; then the every-path comparison at 8,192 tokens, one round.
TK_WORK=/tmp/dt-pool TK_ROUNDS=2 bash kernels/device-test.sh
TK_WORK=/tmp/dt-paths TK_STEPS=bench TK_BENCH=paths TK_TOKENS=8192 bash kernels/device-test.sh
