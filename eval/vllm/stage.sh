#!/usr/bin/env bash
# eval/vllm/stage.sh: stage vLLM 0.26.0 for the GPU machine, on the dev machine.
#
# The GPU machine has torch 2.11.0+cu130 and Python 3.12 but no network, and a
# device call carries at most 64 MiB of the working tree. vLLM 0.26.0 is the
# newest release built on that torch; its wheel is about 300 MB. This script
# fetches the wheel and what its offline LLM path imports that the GPU image
# lacks (requirements-0.26.0.txt), installs them into one site directory for
# cp312 (pip --target --platform, nothing runs), drops what a dense or MLA
# model on Hopper never loads, packs the rest as one xz tarball and cuts it into
# pieces that fit a device call beside the tree:
#
#   dropped: vllm_flash_attn/_vllm_fa2_C (305 MB; Hopper runs FlashAttention 3,
#            which stays), (_moe_C, the MoE kernels, stays: the Qwen3-Next-shaped
#            hybrid, eval/vllm/models/qwen3-next-tiny, has MoE layers),
#            vllm-rs (the Rust front end), third_party/fmha_sm100 and
#            deep_gemm's headers and other Pythons' builds (JIT for FP8 / SM100),
#            the OpenAPI UI's static files.
#
# Output, all under .vllm-stage/ (ignored by git; nothing of vLLM is committed):
#   piece-00, piece-01, ...   the tarball in pieces of PIECE_MB (default 48)
#   MANIFEST                  one line per piece: name, bytes, sha256; then the
#                             tarball's sha256 and what was staged
# and a summary on stdout: bytes downloaded, site size, tarball size, pieces,
# and the device calls that move them (eval/vllm/run.sh's header).
#
#   bash eval/vllm/stage.sh            # stage (most of the time is xz)
#   bash eval/vllm/stage.sh --check    # also import vLLM's LLM path here, in .venv-vllm
#                                      # (scripts/vllm-venv.sh: the same pins beside torch 2.11)
#   bash eval/vllm/stage.sh --lmcache  # only LMCache, for eval/vllm/headline.sh (opt-in):
#       .vllm-stage/lmcache.tar.xz (about 7 MiB): LMCache 0.5.3's sdist, less its docs,
#       tests and examples, and the wheels of requirements-lmcache.txt (cp312) and
#       requirements-lmcache-build.txt. Nothing is built here: `headline.sh lmcache`
#       builds its CUDA ops on the GPU machine against torch 2.11+cu130 and checks
#       they load. pip prepares an sdist's metadata by running its setup.py, which
#       imports torch and needs setuptools >= 77: a throwaway venv over the system
#       Python (it has torch) with those setuptools does the download.
set -euo pipefail
cd "$(dirname "$0")/../.."
ROOT=$PWD
ST=$ROOT/.vllm-stage
PIECE_MB=${PIECE_MB:-48}
REQ=$ROOT/eval/vllm/requirements-0.26.0.txt
PY=${PYTHON:-python3}
t0=$SECONDS
mkdir -p "$ST/cache"

# 1. Download (the cache is kept between runs: a re-stage downloads nothing).
plat=(--only-binary=:all: --python-version 3.12 --implementation cp --platform manylinux_2_28_x86_64
	--platform manylinux_2_27_x86_64 --platform manylinux_2_26_x86_64 --platform manylinux_2_24_x86_64
	--platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64 --platform manylinux_2_31_x86_64
	--platform manylinux_2_5_x86_64 --platform manylinux1_x86_64)
if [ "${1:-}" = "--lmcache" ]; then
	L=$ST/lmcache
	LV=$(grep '^lmcache==' "$ROOT/eval/vllm/requirements-lmcache.txt" | cut -d= -f3)
	rm -rf "$L" "$ST/lmcache.tar.xz" && mkdir -p "$L/wheels/run" "$L/wheels/build" "$ST/cache-lmcache"
	for kind in run build; do
		f=$ROOT/eval/vllm/requirements-lmcache.txt
		[ $kind = build ] && f=$ROOT/eval/vllm/requirements-lmcache-build.txt
		grep -v '^#' "$f" | grep -v '^lmcache==' | grep . >"$L/req-$kind.txt"
		$PY -m pip download -q --no-deps "${plat[@]}" -d "$L/wheels/$kind" -r "$L/req-$kind.txt"
	done
	if [ ! -x "$ST/lmcache-venv/bin/pip" ]; then
		/usr/bin/python3 -c 'import torch' || { echo "stage.sh --lmcache: /usr/bin/python3 has no torch (pip needs it to read LMCache's sdist)" >&2; exit 1; }
		/usr/bin/python3 -m venv --system-site-packages "$ST/lmcache-venv"
		"$ST/lmcache-venv/bin/pip" install -q "setuptools>=77.0.3,<81" "setuptools_scm>=8"
	fi
	[ -f "$ST/cache-lmcache/lmcache-$LV.tar.gz" ] || "$ST/lmcache-venv/bin/pip" download -q --no-deps \
		--no-build-isolation --no-binary :all: "lmcache==$LV" -d "$ST/cache-lmcache"
	tar -xzf "$ST/cache-lmcache/lmcache-$LV.tar.gz" -C "$L"
	rm -rf "$L/lmcache-$LV"/{docs,tests,examples,asset,operator,benchmarks}
	tar -C "$L" -cf - . | xz -T0 -6 >"$ST/lmcache.tar.xz"
	echo "staged LMCache $LV (sdist, less docs/tests/examples) + $(cat "$L"/req-*.txt | grep -c .) wheels:" \
		".vllm-stage/lmcache.tar.xz, $(($(stat -c %s "$ST/lmcache.tar.xz") >> 20)) MiB, in $((SECONDS - t0)) s"
	echo "device: carry .vllm-stage/lmcache.tar.xz in a call before the run: 'bash eval/vllm/headline.sh lmcache' (eval/vllm/headline.sh's header)"
	exit 0
fi
rm -f "$ST"/piece-* "$ST/MANIFEST"
grep -v '^#' "$REQ" | grep . >"$ST/req.txt"
$PY -m pip download -q --no-deps "${plat[@]}" -d "$ST/cache" -r "$ST/req.txt"
dl_bytes=$(du -cb "$ST"/cache/*.whl | tail -1 | cut -f1)

# 2. Install into one site directory for cp312 (no code runs: wheels only).
rm -rf "$ST/site"
$PY -m pip install -q --no-deps --no-compile --no-index --find-links "$ST/cache" "${plat[@]}" \
	--target "$ST/site" -r "$ST/req.txt"
V=$ST/site/vllm
rm -rf "$V/vllm_flash_attn/_vllm_fa2_C.abi3.so" "$V/vllm-rs" \
	"$V/third_party/fmha_sm100" "$V/third_party/deep_gemm/include" \
	"$V/entrypoints/serve/instrumentator/static"
find "$V/third_party/deep_gemm" -name '_C.cpython-3*' ! -name '_C.cpython-312-*' -delete
rm -rf "$ST/site/bin"
site_bytes=$(du -sb "$ST/site" | cut -f1)

# 3. Pack and cut.
tar -C "$ST/site" -cf - . | xz -T0 -6 >"$ST/vllm-site.tar.xz"
tar_bytes=$(stat -c %s "$ST/vllm-site.tar.xz")
(cd "$ST" && split -b "${PIECE_MB}M" -d -a 2 vllm-site.tar.xz piece-)
{
	for p in "$ST"/piece-*; do echo "$(basename "$p") $(stat -c %s "$p") $(sha256sum "$p" | cut -d' ' -f1)"; done
	echo "tarball $tar_bytes $(sha256sum "$ST/vllm-site.tar.xz" | cut -d' ' -f1)"
	echo "staged $(grep -c . "$ST/req.txt") distributions: $(tr '\n' ' ' <"$ST/req.txt")"
} >"$ST/MANIFEST"
rm -f "$ST/vllm-site.tar.xz"
n=$(ls "$ST"/piece-* | wc -l)

if [ "${1:-}" = "--check" ]; then
	# The same pins on this machine, beside torch 2.11 (CPU): every module of
	# the LLM path the GPU run uses imports (scripts/vllm-venv.sh checks it).
	bash "$ROOT/scripts/vllm-venv.sh"
fi

echo "staged vLLM 0.26.0 + $(($(grep -c . "$ST/req.txt") - 1)) dependencies (requirements-0.26.0.txt)"
echo "  downloaded   $((dl_bytes >> 20)) MiB of wheels (cached in .vllm-stage/cache)"
echo "  site         $((site_bytes >> 20)) MiB after dropping what Hopper and a dense/MLA model never load"
echo "  tarball      $((tar_bytes >> 20)) MiB (xz), $n pieces of <= $PIECE_MB MiB: .vllm-stage/piece-*"
echo "  took         $((SECONDS - t0)) s here"
echo "device calls (back to back, each within 30 s of the last; eval/vllm/run.sh's header):"
for p in "$ST"/piece-*; do
	echo "  run carry=[\".vllm-stage/$(basename "$p")\", \".vllm-stage/MANIFEST\"] command='bash eval/vllm/run.sh recv'"
done
echo "  then: run carry=[\".vllm-stage/MANIFEST\", \"bin/libtutti.so\"] command='bash eval/vllm/run.sh check'"
