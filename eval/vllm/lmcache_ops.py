"""Whether the LMCache imported here runs its compiled CUDA ops (eval/vllm/headline.sh
lmcache, after building them on the GPU machine): LMCache 0.5's ``lmcache.c_ops`` is a
shim over the ops object resolved for the device (``lmcache.v1.platform.resolve_device_ops``),
which binds the compiled extension's functions when it imports and otherwise stays on
pure-PyTorch ops, with a warning only. Prints the extension and how many of its
functions are bound and exits 0, or prints why not and exits 1."""

from __future__ import annotations

import glob
import os
import sys

MIN_NATIVE = 10  # LMCache 0.5.3's c_ops has 38


def main() -> int:
    import torch
    import lmcache
    from lmcache.v1.platform import resolve_device_ops

    dev = lmcache.torch_device_type
    if dev != "cuda":
        print(f"lmcache ops: LMCache resolved device type {dev!r}, not 'cuda' "
              f"(torch.cuda.is_available() = {torch.cuda.is_available()})")
        return 1
    ops = resolve_device_ops(dev)
    native = sorted(n for n in dir(ops)
                    if not n.startswith("_") and type(getattr(ops, n, None)).__name__ == "builtin_function_or_method")
    so = glob.glob(os.path.join(os.path.dirname(lmcache.__file__), "c_ops.cpython-*.so"))
    if len(native) < MIN_NATIVE or not so:
        print(f"lmcache ops: {type(ops).__name__} has {len(native)} compiled functions bound (want >= {MIN_NATIVE}); "
              f"extension files: {so or 'none'}: LMCache would run pure-PyTorch ops")
        return 1
    import lmcache.native_storage_ops as nso
    print(f"lmcache ops: {type(ops).__name__}, {len(native)} compiled functions of {so[0]}; {nso.__file__}; "
          f"torch {torch.__version__}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
