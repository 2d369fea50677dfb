"""PEP 517 backend for the tutti Python package (stdlib only, so it builds
offline and without setuptools or wheel): the wheel holds python/tutti/*.py
and libtutti.so, built from the Go module this directory sits in with
`go build -buildmode=c-shared ./runtime/capi`. The wheel is tagged for this
platform (the library is native code)."""

import base64
import hashlib
import os
import subprocess
import sys
import sysconfig
import tempfile
import zipfile

NAME, VERSION = "tutti", "0.1.0"
HERE = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))  # python/
GO_ROOT = os.path.dirname(HERE)  # the checkout (go.mod)
GO_BUILD_TIMEOUT_S = 900


def _tag():
    plat = sysconfig.get_platform().replace("-", "_").replace(".", "_")
    return f"py3-none-{plat}"


def _build_lib(out_dir):
    if not os.path.exists(os.path.join(GO_ROOT, "go.mod")):
        raise RuntimeError(f"tutti: {GO_ROOT} is not the tutti checkout (no go.mod): build from a checkout with Go, "
                           "`pip install ./python` from its root")
    go = os.environ.get("GO", "go")
    lib = os.path.join(out_dir, "libtutti.so")
    cmd = [go, "build", "-trimpath", "-buildmode=c-shared", "-o", lib, "./runtime/capi"]
    try:
        subprocess.run(cmd, cwd=GO_ROOT, check=True, timeout=GO_BUILD_TIMEOUT_S)
    except FileNotFoundError:
        raise RuntimeError(f"tutti: {go!r} not found: the package's library is built with Go (set GO=/path/to/go)") from None
    except subprocess.CalledProcessError as e:
        raise RuntimeError(f"tutti: `{' '.join(cmd)}` in {GO_ROOT} failed with status {e.returncode}") from None
    os.remove(os.path.join(out_dir, "libtutti.h"))  # the checked-in runtime/capi/tutti.h is the contract
    return lib


def _files():
    pkg = os.path.join(HERE, NAME)
    for name in sorted(os.listdir(pkg)):
        if name.endswith(".py"):
            yield os.path.join(pkg, name), f"{NAME}/{name}"


def _record_line(arc, data):
    digest = base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=").decode()
    return f"{arc},sha256={digest},{len(data)}"


def _metadata():
    return (f"Metadata-Version: 2.1\nName: {NAME}\nVersion: {VERSION}\n"
            "Summary: SSD-backed KV cache for LLM serving: Python binding and vLLM connector (tutti.vllm)\n"
            "Requires-Python: >=3.9\n")


def get_requires_for_build_wheel(config_settings=None):
    return []


def get_requires_for_build_sdist(config_settings=None):
    return []


def prepare_metadata_for_build_wheel(metadata_directory, config_settings=None):
    d = os.path.join(metadata_directory, f"{NAME}-{VERSION}.dist-info")
    os.makedirs(d, exist_ok=True)
    with open(os.path.join(d, "METADATA"), "w") as f:
        f.write(_metadata())
    return os.path.basename(d)


def build_wheel(wheel_directory, config_settings=None, metadata_directory=None):
    tag = _tag()
    wheel = f"{NAME}-{VERSION}-{tag}.whl"
    info = f"{NAME}-{VERSION}.dist-info"
    with tempfile.TemporaryDirectory() as tmp:
        lib = _build_lib(tmp)
        entries = [(arc, open(src, "rb").read()) for src, arc in _files()]
        entries.append((f"{NAME}/libtutti.so", open(lib, "rb").read()))
        entries.append((f"{info}/METADATA", _metadata().encode()))
        entries.append((f"{info}/WHEEL", f"Wheel-Version: 1.0\nGenerator: tutti_build\nRoot-Is-Purelib: false\nTag: {tag}\n".encode()))
        record = [_record_line(a, d) for a, d in entries] + [f"{info}/RECORD,,"]
        path = os.path.join(wheel_directory, wheel)
        with zipfile.ZipFile(path, "w", zipfile.ZIP_DEFLATED) as z:
            for arc, data in entries:
                zi = zipfile.ZipInfo(arc, date_time=(2020, 1, 1, 0, 0, 0))
                zi.external_attr = (0o755 if arc.endswith(".so") else 0o644) << 16
                z.writestr(zi, data, zipfile.ZIP_DEFLATED)
            z.writestr(f"{info}/RECORD", "\n".join(record) + "\n")
    return wheel


if __name__ == "__main__":  # `python python/_build/tutti_build.py DIR`: a wheel without pip
    print(build_wheel(sys.argv[1] if len(sys.argv) > 1 else "."))
