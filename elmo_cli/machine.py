"""What this process computes with: reproducible matrix products (set once, before torch does any arithmetic) and
whether bf16 products are native here.

torch's CPU build multiplies fp32 matrices with Intel oneMKL (``SGEMM`` and ``SGEMM_BATCH``: every product of the
char CNN, the highways, the LSTMs and the softmax). By default oneMKL runs with Conditional Numerical
Reproducibility off and its dynamic thread count on (``MKL_VERBOSE=1`` prints ``CNR:OFF Dyn:1`` on every call), and
its documentation then promises no bitwise repeatability from run to run: on Intel AVX-512 CPUs the same dump in
fresh processes differed in a few runs out of 30 when only the memory layout moved (a different hash seed or
environment size). oneMKL's strict CNR mode (``MKL_CBWR=AUTO,STRICT``) makes ``?gemm`` bitwise reproducible on one
CPU and build whatever the alignment of the buffers and the thread count, and ``MKL_DYNAMIC=FALSE`` keeps the
thread count fixed for the other calls. oneMKL reads both when it first computes, so they are set when `elmo_cli` is
imported (every command and the Python API import it first). A variable the user already set is left alone;
``ELMO_CLI_BLAS=fast`` sets neither (oneMKL's default: possibly faster, not repeatable bit for bit).

docs/design.md, "Same input, same vectors", has the measurements.
"""
from __future__ import annotations

import os
from pathlib import Path

REPRODUCIBLE_BLAS = {"MKL_CBWR": "AUTO,STRICT", "MKL_DYNAMIC": "FALSE"}
FAST_SWITCH = "ELMO_CLI_BLAS"  # =fast: leave oneMKL at its defaults


def use_reproducible_blas(environ=os.environ) -> dict[str, str]:
    """Set `REPRODUCIBLE_BLAS` in `environ` where not already set (unless ``ELMO_CLI_BLAS=fast``); returns what was
    set. Effective only before the process's first oneMKL call."""
    if environ.get(FAST_SWITCH, "").lower() == "fast":
        return {}
    added = {k: v for k, v in REPRODUCIBLE_BLAS.items() if k not in environ}
    environ.update(added)
    return added


def cxx_compiler(environ=os.environ) -> str | None:
    """The C++ compiler `torch.compile`'s Inductor would call on a CPU: ``$CXX``, else g++, c++ or clang++ on the
    PATH; None where there is none (then `--compile` runs the eager step)."""
    import shutil

    for name in (environ.get("CXX"), "g++", "c++", "clang++"):
        if name and shutil.which(name):
            return shutil.which(name)
    return None


# ---- bf16: the one place that says whether this machine multiplies bf16 natively ---------------------------------
BF16_CPU_FLAGS = ("avx512_bf16", "amx_bf16")  # x86 instructions that multiply bf16 matrices natively
# torch's bf16 products on a CPU are oneDNN's, and oneDNN uses no instruction above the cap its variable names (the
# older name second). The caps below AVX512_CORE_BF16 leave it no bf16 dot product: on 2 Zen 5 cores held to AVX2,
# `auto`'s bf16 probes trained 512/128 at 484 tokens/s against fp32's 6,153 (docs/auto.md, the WEB held to AVX2).
ONEDNN_ISA_VARS = ("ONEDNN_MAX_CPU_ISA", "DNNL_MAX_CPU_ISA")
ONEDNN_ISAS_WITHOUT_BF16 = ("SSE41", "AVX", "AVX2", "AVX2_VNNI", "AVX2_VNNI_2", "AVX512_CORE", "AVX512_CORE_VNNI")


def onednn_bf16_cap(environ=None) -> str | None:
    """``VARIABLE=VALUE`` where the environment caps oneDNN's instructions below bf16 ones (e.g.
    ``ONEDNN_MAX_CPU_ISA=AVX2``), so that a CPU with them emulates bf16 products; None where nothing does."""
    environ = os.environ if environ is None else environ
    for name in ONEDNN_ISA_VARS:
        value = environ.get(name, "").strip()
        if value:  # oneDNN reads the first one set
            return f"{name}={value}" if value.upper() in ONEDNN_ISAS_WITHOUT_BF16 else None
    return None


def cpu_has_bf16(cpuinfo: str | None = None, environ=None) -> bool | None:
    """Whether this process multiplies bf16 natively on the CPU: an x86 ``flags`` line of /proc/cpuinfo naming
    AVX512-BF16 or AMX-BF16, and no `onednn_bf16_cap` in `environ` (default: this process's); None where the flags
    cannot be read (not Linux, or no flags line). ``cpuinfo``: that file's text."""
    if cpuinfo is None:
        try:
            cpuinfo = Path("/proc/cpuinfo").read_text(errors="replace")
        except OSError:
            return None
    flags = next((line.split(":", 1)[1].split() for line in cpuinfo.splitlines()
                  if line.startswith("flags") and ":" in line), None)
    if flags is None:
        return None
    return any(f in flags for f in BF16_CPU_FLAGS) and onednn_bf16_cap(environ) is None


def cpu_bf16() -> bool:
    """`cpu_has_bf16`, and where the flags cannot be read, oneDNN's own answer (which also says yes for AVX-512
    CPUs that only emulate bf16, hence second)."""
    known = cpu_has_bf16()
    if known is not None:
        return known
    import torch

    try:
        return bool(torch.ops.mkldnn._is_mkldnn_bf16_supported())
    except (AttributeError, RuntimeError):
        return False


def bf16_problem(device) -> str | None:
    """Why bf16 products would be slow on `device` (a torch.device; a sentence), or None when the hardware has them
    (or for a CPU whose flags cannot be read: then the caller only warns)."""
    import torch

    if device.type == "cuda":
        return None if torch.cuda.is_bf16_supported() else f"{device} has no bf16 support"
    if cpu_has_bf16() is False:
        cap = onednn_bf16_cap()
        if cap and cpu_has_bf16(None, {}):  # the CPU has them; the environment holds oneDNN below them
            return (f"{cap} holds oneDNN below this CPU's bf16 matrix instructions, so torch emulates them, "
                    "slower than fp32")
        return ("this CPU has no bf16 matrix instructions (AVX512-BF16 or AMX in /proc/cpuinfo), so torch emulates "
                "them, slower than fp32")
    return None
