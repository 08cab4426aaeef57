"""Modules imported in name only wherever the training stack is imported before a job: their code
runs at their first use, in a job's child, and only if the job uses them.

Two kinds. `CUDA_AT_IMPORT`: bitsandbytes picks its native library when it is imported, and to
choose it asks torch for every GPU's compute capability, which initialises CUDA (seen on an H200:
every fork server then refused to fork, and every job started cold). A CUDA context cannot cross a
fork, so the fork server must never make one. `ONLY_SOME_JOBS`: mlflow, which TRL imports whenever it
is installed (`trl.extras.profiling`), and boto3 (accelerate's SageMaker config): seconds of imports
(`python -X importtime`, issue 52: mlflow 4.3 s, boto3 1.6 s of a loaded 2-core host's 38) that only
a job reporting to MLflow uses. (trackio is not one: TRL's model card, written at every checkpoint,
imports it for real in every job.) peft,
transformers, TRL and accelerate import each at module level and use it only inside functions;
they ask whether it is installed with `importlib.util.find_spec`. While deferring, each is a
`DeferredModule`: its `__spec__` is real, so `find_spec` answers without running it, and any other
attribute runs its code first. That happens in a job's child, where CUDA is the job's own, so the
child gets the native library bitsandbytes chooses there (the CUDA one on a GPU host).

The fork server's `main` (handlers/child/forkserver.py) calls `defer_in_fork_server()` first,
before anything imports torch: importing the methods (handlers/methods/) imports the training
stack, so it cannot be done later. Elsewhere (a spawned child, a test) importing the methods defers
them while it runs (`deferring`), since importing them costs seconds even where CUDA is not at stake.

Once the child has read its job, `settle` decides for `CUDA_AT_IMPORT`: a module the job needs
(`needed_by`: bitsandbytes for a quantized model or one of its optimizers) stays deferred and runs at
its first use; any other is made absent for the job (`None` in `sys.modules`, Python's own way to
say a module cannot be imported), so `importlib.util.find_spec` answers None and every library's
availability check (peft's `is_bnb_available`, transformers' and accelerate's) says it is not
installed. Without that, `peft.get_peft_model` on a model nothing quantized runs bitsandbytes anyway:
its LoRA dispatch asks `is_bnb_4bit_available()`, which reads `bnb.nn` (1.6 s with the tiny model on
2 cores, issue 52). mlflow and boto3 stay deferred: a job that uses them runs them at their first use.
"""

from __future__ import annotations

import importlib.abc
import importlib.machinery
import importlib.util
import os
import sys
import types
from collections.abc import Collection, Iterator, Sequence
from contextlib import contextmanager
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from schemas.request import RequestBase

# Import-time CUDA users the lock installs. The fork server checks itself before it says ready, so a
# new one shows up as a server that refuses to serve (and the daemon says so), not as a silent cold start.
CUDA_AT_IMPORT = ("bitsandbytes",)
# Imported by the training stack whenever installed, used by some jobs only (the module docstring says which and why).
ONLY_SOME_JOBS = ("mlflow", "boto3")
DEFERRED = CUDA_AT_IMPORT + ONLY_SOME_JOBS
# What the import system asks a new module for while it sets it up (it sets each that is missing).
IMPORT_SYSTEM = frozenset({"__loader__", "__package__", "__spec__", "__file__", "__cached__", "__builtins__"})
# Set by the daemon in the fork server's environment only (the socket it serves on).
FORK_SERVER_VARIABLE = "ADAPTERD_FORK_FD"
# transformers' optimizers that import bitsandbytes (`optim`): its bitsandbytes ones, and GaLore's
# 8-bit ones (galore_torch builds on bitsandbytes). Drift-tested against transformers' own list.
BITSANDBYTES_OPTIMIZERS = frozenset(
    {
        "adamw_bnb_8bit",
        "adamw_8bit",
        "paged_adamw_32bit",
        "paged_adamw_8bit",
        "ademamix",
        "ademamix_8bit",
        "paged_ademamix_32bit",
        "paged_ademamix_8bit",
        "lion_32bit",
        "lion_8bit",
        "paged_lion_32bit",
        "paged_lion_8bit",
        "rmsprop_bnb",
        "rmsprop_bnb_8bit",
        "rmsprop_bnb_32bit",
        "galore_adamw_8bit",
        "galore_adamw_8bit_layerwise",
    }
)


class DeferredModule(types.ModuleType):
    """A module imported in name only: its code runs at the first attribute it is asked for that
    the import system did not set (and `__path__`, so a submodule import runs the package first)."""

    def __getattr__(self, name: str) -> Any:
        if name in IMPORT_SYSTEM or (name == "__path__" and self.__dict__.get("__deferred_setup__")):
            raise AttributeError(name)  # asked while the import system sets the module up: not a use of it
        return getattr(load(self), name)


class DeferringLoader(importlib.abc.Loader):
    """Makes a `DeferredModule` and runs nothing; `load` runs the real loader later."""

    def __init__(self, real: importlib.abc.Loader) -> None:
        self.real = real

    def create_module(self, spec: importlib.machinery.ModuleSpec) -> types.ModuleType:
        module = DeferredModule(spec.name)
        module.__dict__["__deferred_setup__"] = True  # until exec_module: the import system is setting it up
        return module

    def exec_module(self, module: types.ModuleType) -> None:
        # The import system set __path__ for a package; without it, `import pkg.sub` asks the module
        # for it, which runs the package's own code before its submodule's, as a normal import does.
        module.__dict__.pop("__path__", None)
        module.__dict__.pop("__deferred_setup__", None)


class DeferringFinder(importlib.abc.MetaPathFinder):
    """Finds the named modules as the path finder does, with a `DeferringLoader` in front."""

    def __init__(self, names: Sequence[str]) -> None:
        self.names = frozenset(names)

    def find_spec(
        self, fullname: str, path: Sequence[str] | None, target: types.ModuleType | None = None
    ) -> importlib.machinery.ModuleSpec | None:
        if fullname not in self.names:
            return None
        spec = importlib.machinery.PathFinder.find_spec(fullname, path)
        if spec is None or spec.loader is None:
            return spec  # not installed: the import fails as it would anyway
        spec.loader = DeferringLoader(spec.loader)
        return spec


_finder: DeferringFinder | None = None


def defer() -> None:
    """From now on, import `DEFERRED` in name only (until `stop_deferring` or `settle`)."""
    global _finder
    if _finder is None:
        _finder = DeferringFinder(DEFERRED)
        sys.meta_path.insert(0, _finder)


def defer_in_fork_server(environ: os._Environ[str] | dict[str, str] = os.environ) -> None:
    """In the fork server (its socket in the environment), import `DEFERRED` in name only."""
    if FORK_SERVER_VARIABLE in environ:
        defer()


@contextmanager
def deferring() -> Iterator[None]:
    """`DEFERRED` imported in name only inside the block (what handlers/methods/ imports); after it,
    imports are normal again unless deferring was on before it (the fork server's)."""
    if _finder is not None:
        yield
        return
    defer()
    try:
        yield
    finally:
        stop_deferring()


def stop_deferring() -> None:
    """In a forked child: later imports are normal ones; a module still deferred runs at its first use."""
    global _finder
    if _finder is not None:
        sys.meta_path.remove(_finder)
        _finder = None


def needed_by(request: RequestBase) -> frozenset[str]:
    """The modules of `CUDA_AT_IMPORT` a job runs: bitsandbytes when it loads a model quantized (the
    base, and a reference or teacher loaded like it) or trains with one of its optimizers."""
    quantized = request.model.quantization != "none"
    return (
        frozenset({"bitsandbytes"}) if quantized or request.training.optim in BITSANDBYTES_OPTIMIZERS else frozenset()
    )


def settle(needed: Collection[str], withheld: Collection[str] = CUDA_AT_IMPORT) -> list[str]:
    """In a child, once its job is known: later imports are normal ones; a module of `withheld`
    still deferred that the job does not need is made absent for the job (the module docstring says
    why); any other runs at its first use. Returns the modules made absent."""
    stop_deferring()
    absent = [name for name in pending() if name in withheld and name not in needed]
    for name in absent:
        sys.modules[name] = None  # type: ignore[assignment]  # the import system's "not importable"
    return absent


def load(module: types.ModuleType) -> types.ModuleType:
    """Run a deferred module's code now (once), as a normal import of it would have."""
    name = module.__name__
    current = sys.modules.get(name)
    if current is not None and not isinstance(current, DeferredModule):
        return current  # already run: through another holder of the deferred module
    spec = module.__spec__
    assert spec is not None and isinstance(spec.loader, DeferringLoader)
    real_spec = importlib.util.spec_from_file_location(
        name, spec.origin, loader=spec.loader.real, submodule_search_locations=spec.submodule_search_locations
    )
    assert real_spec is not None and real_spec.loader is not None
    real = importlib.util.module_from_spec(real_spec)
    sys.modules[name] = real
    try:
        with hub_kernels_withheld():
            real_spec.loader.exec_module(real)
    except BaseException:
        sys.modules[name] = module
        raise
    # Whoever holds the deferred module (peft's `bnb`) now reads the real one's names directly.
    module.__dict__.update(real.__dict__)
    return real


@contextmanager
def hub_kernels_withheld() -> Iterator[None]:
    """The Hub offline, for the `kernels` package, while a deferred module runs, unless the operator allows hub kernels
    (USE_HUB_KERNELS=YES in the job's environment, the variable transformers reads for its own). bitsandbytes' CPU
    backend fetches a kernel from the Hub when it is imported (kernels-community/quantization-bitsandbytes, on a CPU
    with AVX512-BF16) wherever `kernels` is installed, which transformers requires from 5.25: code from the Hub, run
    in the job, by no rule of the operator's, and a call to the Hub from a job whose model and data are local. Offline,
    `kernels` looks in the local cache only, finds nothing, and bitsandbytes runs its own CPU code (it logs that it
    could not load the kernel). `huggingface_hub.constants.HF_HUB_OFFLINE` is what `kernels.get_kernel` reads at each
    call; it is set back after."""
    if os.environ.get("USE_HUB_KERNELS", "").strip().upper() in {"1", "Y", "YES", "TRUE", "ON"}:
        yield
        return
    from huggingface_hub import constants

    before = constants.HF_HUB_OFFLINE
    constants.HF_HUB_OFFLINE = True
    try:
        yield
    finally:
        constants.HF_HUB_OFFLINE = before


def pending() -> list[str]:
    """The modules imported in name only whose code has not run (what the server's self-check reports)."""
    return sorted(
        name
        for name, module in list(sys.modules.items())
        if isinstance(module, DeferredModule) and sys.modules.get(name) is module
    )
