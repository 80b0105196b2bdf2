"""What this process computes with: reproducible matrix products, set once before torch does any arithmetic.

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
