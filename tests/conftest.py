import os
import re
import signal

import pytest
import torch

import eagle3_ext  # noqa: F401  (registers torch.ops.eagle3)
from eagle3_ext import CompileOptions

# compile=True (CompileOptions()) autotunes the GEMMs of every graph on CPU (tens of seconds a
# graph), builds a C++ wrapper for it (more seconds) and builds a float32 verify as an
# AOTInductor package (a C++ build of its own, per model and shape). The tests compile graphs
# for many tiny models, so they pass compile=FAST_COMPILE (weights still frozen);
# test_compiled_verify's autotuned test runs the default, test_packaged_verify turns packages on.
FAST_COMPILE = CompileOptions(autotune=False, cpp_wrapper=False, packages=False)

# `make test` runs two pytest-xdist workers (a file each at a time): most tests here are bound by
# Python and by compiling, one core each. Each worker computes on one thread, as two workers of
# two threads would oversubscribe a 2-core machine; tests of the kernels' thread splits set their
# own count.
if os.environ.get("PYTEST_XDIST_WORKER"):
    torch.set_num_threads(1)

HAS_CUDA = torch.cuda.is_available() and eagle3_ext.build_info()["cuda_compiled"]

DEVICES = [
    pytest.param("cpu", id="cpu"),
    pytest.param(
        "cuda",
        id="cuda",
        marks=[
            pytest.mark.cuda,
            pytest.mark.skipif(not HAS_CUDA, reason="needs a CUDA GPU and the CUDA kernels"),
        ],
    ),
]

DTYPES = [
    pytest.param(torch.float32, id="fp32"),
    pytest.param(torch.float16, id="fp16"),
    pytest.param(torch.bfloat16, id="bf16"),
]

# Tolerances against an fp32 reference for outputs of magnitude ~1.
TOLERANCES = {
    torch.float32: dict(atol=1e-4, rtol=1e-4),
    torch.float16: dict(atol=4e-3, rtol=4e-3),
    torch.bfloat16: dict(atol=3e-2, rtol=2e-2),
}


def cpu_flags():
    try:
        with open("/proc/cpuinfo") as f:
            return next((line.split(":", 1)[1].split() for line in f if line.startswith("flags")), [])
    except OSError:
        return []


# CPU kernels built for several ISAs (tree_attention: AVX-512, AVX2 + FMA, portable;
# fused_aux_fc's streaming kernel: AVX-512, AVX2, none) run the widest the CPU has;
# eagle3_ext.ops.set_cpu_isa("avx2") or ("generic") caps the choice (the fixture cpu_isa), so every
# build this machine runs is tested.
CAPPED_BUILDS = [pytest.param("generic", id="generic"),
                 pytest.param("avx2", id="avx2", marks=pytest.mark.skipif(
                     not {"avx2", "fma", "f16c"} <= set(cpu_flags()), reason="this CPU has no AVX2 + FMA + F16C"))]


@pytest.fixture
def cpu_isa():
    """``eagle3_ext.ops.set_cpu_isa``, for this test: the cap before it comes back after it."""
    previous = eagle3_ext.ops.get_cpu_isa()
    yield eagle3_ext.ops.set_cpu_isa
    eagle3_ext.ops.set_cpu_isa(previous)


def calls_after_a_first(fn, args, names):
    """``fn(*args)`` run a second time (the first compiles, if it does) and how many calls of the
    ops named ``names`` (profiler keys, e.g. "eagle3::fused_aux_fc") that second run made."""
    fn(*args)
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU]) as prof:
        out = fn(*args)
    return out, sum(e.count for e in prof.key_averages() if e.key in names)


def op_error(pattern: str) -> type:
    """The exception an eagle3 op raises for a message: TypeError for a wrong dtype, ValueError
    for any other bad argument (a shape, size, value or device)."""
    dtype_fault = r"dtype|must be (bool|int32|int64|float32|an integer tensor)"
    return TypeError if re.search(dtype_fault, pattern) else ValueError


@pytest.fixture(scope="session")
def bad_paths(tmp_path_factory):
    """Damaged files and directories and a mismatched pair (tests/bad_inputs.py), made once."""
    import bad_inputs
    return bad_inputs.make(str(tmp_path_factory.mktemp("bad")))


@pytest.fixture
def deadline():
    """A bad value must fail fast; one taken as valid could start a long run: stop it at 120 s."""
    def expire(signum, frame):
        raise TimeoutError("still running after 120 s: a bad value was taken as valid")

    previous = signal.signal(signal.SIGALRM, expire)
    signal.alarm(120)
    yield
    signal.alarm(0)
    signal.signal(signal.SIGALRM, previous)
