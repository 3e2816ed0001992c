"""Test set-up: 8 fake CPU devices for sharding tests, fail-fast collectives, shared tiny-model helpers."""

import os

# Must happen before jax is imported anywhere.
_flags = os.environ.get("XLA_FLAGS", "")
if "xla_force_host_platform_device_count" not in _flags:
    _flags += " --xla_force_host_platform_device_count=8"
if "xla_cpu_collective_call_terminate_timeout_seconds" not in _flags:
    _flags += " --xla_cpu_collective_call_terminate_timeout_seconds=15"
os.environ["XLA_FLAGS"] = _flags.strip()
os.environ.setdefault("JAX_PLATFORMS", "cpu")
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
# Tests check results, not LLVM's code quality: with jax_disable_most_optimizations JAX compiles the same HLO
# programs (same fusions, buffers, memory_analysis and cost_analysis) at XLA's backend optimization level 0, with
# far less LLVM time, which is most of a tiny-model test's cost. Measured per module (scripts/test_costs.py):
# test_agent_rl_step 101 -> 72, test_engine 191 -> 120, test_sampler 93 -> 53 CPU seconds. Modules whose cost is
# running programs rather than compiling them, or whose checks sit at the summation noise of optimized code, are
# marked `optimized` and compile as users do (the fixture below; subprocesses inherit the variable).
# MIMESIS_TEST_XLA_OPT=full compiles everything as users do.
_FAST_COMPILE = os.environ.get("MIMESIS_TEST_XLA_OPT", "") != "full"
os.environ["JAX_DISABLE_MOST_OPTIMIZATIONS"] = "1" if _FAST_COMPILE else "0"
# The same modules also compile with the CPU backend's older (non-MLIR) fusion emitters: the same fused HLO in about
# half the compile time (the planner's QUICK options, mimesis_jax/plan/compiled.py), the same operations, buffer
# sizes within 1%. Measured on a whole -n 3 run: 2,505 -> ~2,000 CPU seconds; with -n 0, test_sampler +
# test_train_loop 135 -> 72. It is a per-compile option (the hook below) rather than an XLA_FLAGS entry so that
# `optimized` modules, and tests marked `user_emitters` (comparisons of two summation orders at fp32 noise, which
# the other emitters' fusions move), compile exactly as users do; CLI subprocesses get it in XLA_FLAGS
# (tests/helpers.py subprocess_env reads MIMESIS_TEST_QUICK_EMITTERS).
_QUICK_EMITTERS = [_FAST_COMPILE]
os.environ["MIMESIS_TEST_QUICK_EMITTERS"] = "1" if _FAST_COMPILE else "0"

# One persistent XLA compilation cache per test run, shared by the xdist workers and the subprocesses tests start
# (they inherit the variable): the same tiny programs recur across modules (jax.clear_caches() below drops the
# in-memory copies) and across CLI subprocesses. Measured on test_agent_rl_loop + agent_rl_step + csd with -n 0:
# 450 -> 393 CPU seconds. MIMESIS_TEST_XLA_CACHE=off turns it off; the process that made the folder removes it.
if os.environ.get("MIMESIS_TEST_XLA_CACHE", "") != "off" and "JAX_COMPILATION_CACHE_DIR" not in os.environ:
    import atexit
    import shutil
    import tempfile

    if not os.environ.get("MIMESIS_TEST_XLA_CACHE"):
        os.environ["MIMESIS_TEST_XLA_CACHE"] = tempfile.mkdtemp(prefix="mimesis-xla-cache-")
        atexit.register(shutil.rmtree, os.environ["MIMESIS_TEST_XLA_CACHE"], True)
    os.environ["JAX_COMPILATION_CACHE_DIR"] = os.environ["MIMESIS_TEST_XLA_CACHE"]
    os.environ.setdefault("JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS", "0")
    os.environ.setdefault("JAX_PERSISTENT_CACHE_MIN_ENTRY_SIZE_BYTES", "0")

import sys  # noqa: E402

sys.path.insert(0, os.path.dirname(__file__))


import gc  # noqa: E402
import time  # noqa: E402

import pytest  # noqa: E402


@pytest.fixture(autouse=True, scope="module")
def _release_compiled_programs():
    """After each test module, drop jax's compiled-program caches and collect garbage.

    The default pass runs ~1,300 tests in one process; without this every module's executables (8-device sharded
    programs included) stay alive to the end. XLA's CPU compiler crashed (SIGSEGV / SIGABRT, no message) and a
    thread could not be started late in such long runs, never when the same tests ran in a shorter process.
    """
    yield
    import jax

    jax.clear_caches()
    gc.collect()


def pytest_configure(config):
    """Every compilation goes through jax's compiler.get_compile_options (one call site, interpreters/pxla.py, in
    the pinned jax): the hook adds the quick-emitter option unless the caller set it, and the persistent cache keys
    on these options, so programs of the two settings never share an entry."""
    if not _FAST_COMPILE:
        return
    import functools

    from jax._src import compiler

    original = compiler.get_compile_options

    @functools.wraps(original)
    def get_compile_options(*args, env_options_overrides=None, **kwargs):
        if _QUICK_EMITTERS[0]:
            env_options_overrides = {"xla_cpu_use_fusion_emitters": False, **(env_options_overrides or {})}
        return original(*args, env_options_overrides=env_options_overrides, **kwargs)

    compiler.get_compile_options = get_compile_options


def _set_quick_emitters(on: bool) -> None:
    _QUICK_EMITTERS[0] = on
    os.environ["MIMESIS_TEST_QUICK_EMITTERS"] = "1" if on else "0"


@pytest.fixture(autouse=True)
def _user_emitters(request):
    """A test marked `user_emitters` compiles with XLA's default fusion emitters (its programs are compiled afresh:
    the in-memory caches are dropped before and after it)."""
    if not (_QUICK_EMITTERS[0] and request.node.get_closest_marker("user_emitters")):
        yield
        return
    import jax

    jax.clear_caches()
    _set_quick_emitters(False)
    try:
        yield
    finally:
        jax.clear_caches()
        _set_quick_emitters(True)


@pytest.fixture(autouse=True, scope="module")
def _compile_optimized(request):
    """A module marked `optimized` compiles with XLA's full optimization and default emitters, in process and in
    the subprocesses it starts. The flag is read at every compilation; the in-memory caches were emptied when the previous module ended
    (above), and the persistent cache keys on the compile options, so no program crosses over."""
    if not (_FAST_COMPILE and request.node.get_closest_marker("optimized")):
        yield
        return
    import jax

    jax.config.update("jax_disable_most_optimizations", False)
    os.environ["JAX_DISABLE_MOST_OPTIMIZATIONS"] = "0"
    _set_quick_emitters(False)
    try:
        yield
    finally:
        jax.clear_caches()
        jax.config.update("jax_disable_most_optimizations", True)
        os.environ["JAX_DISABLE_MOST_OPTIMIZATIONS"] = "1"
        _set_quick_emitters(True)


def _status_kib(*keys):
    """VmRSS (resident now) and VmHWM (the process's peak so far: a test that raises it spiked inside) in KiB."""
    out = dict.fromkeys(keys, 0)
    with open("/proc/self/status") as f:
        for line in f:
            key = line.split(":")[0]
            if key in out:
                out[key] = int(line.split()[1])
    return [out[k] for k in keys]


_RSS_LOG = os.environ.get("MIMESIS_TEST_RSS_LOG")


@pytest.hookimpl(trylast=True)
def pytest_runtest_teardown(item, nextitem):
    """With MIMESIS_TEST_RSS_LOG=DIR, append each test's RSS, end time, peak RSS and CPU seconds to DIR/<worker>.tsv.

    Columns: nodeid, VmRSS KiB, end time, VmHWM KiB, cumulative user+sys CPU seconds of this process plus its
    waited-for children (subprocess tests). Per-test CPU cost is the difference between consecutive rows of one
    worker; wall time on a shared machine is noisy, CPU seconds are not.
    """
    if not _RSS_LOG:
        return
    worker = os.environ.get("PYTEST_XDIST_WORKER", "main")
    os.makedirs(_RSS_LOG, exist_ok=True)
    with open(os.path.join(_RSS_LOG, f"{worker}.tsv"), "a") as f:
        rss, hwm = _status_kib("VmRSS", "VmHWM")
        f.write(f"{item.nodeid}\t{rss}\t{time.time():.1f}\t{hwm}\t{_cpu_seconds():.1f}\n")


def _cpu_seconds():
    """User+sys CPU seconds of this process and of its children that have been waited for."""
    import resource

    own = resource.getrusage(resource.RUSAGE_SELF)
    kids = resource.getrusage(resource.RUSAGE_CHILDREN)
    return own.ru_utime + own.ru_stime + kids.ru_utime + kids.ru_stime


def _module_costs() -> dict:
    """tests/module_costs.tsv: measured CPU seconds per test module (scripts/test_costs.py writes it)."""
    path = os.path.join(os.path.dirname(__file__), "module_costs.tsv")
    out = {}
    with open(path) as f:
        for n, line in enumerate(f, 1):
            if line.startswith("#") or not line.strip():
                continue
            module, cost = line.rstrip("\n").split("\t")
            out[os.path.basename(module)] = float(cost)
    return out


def pytest_collection_modifyitems(session, config, items):
    """Dearest modules first. xdist's loadfile hands whole modules to workers in collection order (pyproject's
    --no-loadscope-reorder keeps it), so this is longest-first scheduling: the run ends on small modules instead of
    one worker finishing a 5-minute module while the other idles. A module not in the table costs 0 and keeps its
    place among the others; tests keep their order inside a module (module fixtures are built once)."""
    costs = _module_costs()
    first_seen = {}
    for item in items:
        first_seen.setdefault(item.path.name, len(first_seen))
    items.sort(key=lambda item: (-costs.get(item.path.name, 0.0), first_seen[item.path.name]))
