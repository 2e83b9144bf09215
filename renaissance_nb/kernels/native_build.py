"""Building and loading the C kernels: the system C compiler, the cache, and the library's two parts.

Why cc: numba compiles each kernel on a first run, 10 to 14 s of CPU after an install for the MLP alone
(benchmarks/cold_start.py), while PyTorch's whole first job takes about 5 s. ``cc`` builds the C sources
once per machine: each part is cached under RNB_CACHE_DIR (default ~/.cache/renaissance_nb) named by a hash
of its sources, the flags, the compiler and the CPU, so a later process only loads it. PyTorch's inductor
does the same for its CPU kernels.

Why parts: the sources take about 3.5 s of CPU to compile (2-core AMD EPYC), and a float32 MLP or conv net
needs 2.1 s of it. The core part (the MLP's and conv nets' passes, the optimizers, the thread pool and the
native program) is built when the package is imported (native.prepare); the GPT's and mixed precision's
kernels (PARTS[1]) when a plan with their ops is about to bind (native.chosen_for), or the first time one of
their entries is looked up (``Library.__getattr__``). That part runs on the core's thread pool: part.c binds it
by address at load.
"""
from __future__ import annotations

import ctypes
import hashlib
import os
import platform
import shutil
import subprocess
import tempfile
import threading
import time
import weakref
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Mapping

from .operands import PAR_CHUNKS
from .signatures import CORE, GPT_LOWP, Signature
from .thunks import PREFIX, thunk_source

HERE = Path(__file__).parent
HEADER = HERE / "native.h"
ABI = 7
"""native.c's rnb_abi(): a cached library from another version of the source is never called."""
FLAGS = ("-O2", "-ftree-vectorize", "-fvect-cost-model=dynamic", "-march=native", "-fPIC", "-fopenmp-simd", "-pthread",
         "-ffp-contract=off", "-fno-math-errno", "-fno-trapping-math", "-fno-strict-aliasing")
"""-O2 with -O3's vectoriser and its cost model (-ftree-vectorize: GCC before 12 does not vectorise at -O2): the
loops vectorise as at -O3 and the sources compile in about 0.65x the time (a cold first run waits for them); the
values are the same at any level (no fast-math). -fno-trapping-math lets the vectoriser turn the selects and
conversions of GELU, exp and the softmax into vector code (no value changes: it drops only the FP exception flags).
-ffp-contract=off: no fused multiply-adds (numba without fastmath has none); -march=native is safe
because the library is built on the machine that runs it (the CPU is part of its name); -fopenmp-simd:
the ``omp simd`` reductions keep their vector order, with no OpenMP runtime (every pass runs on
pool_native.c's threads)."""
LINK_FLAGS = ("-shared", "-pthread")
"""The objects linked into each part (_compile)."""


@dataclass(frozen=True)
class Part:
    """One shared library of the C kernels: its sources and the entries they define."""
    name: str
    sources: tuple[Path, ...]
    signatures: Mapping[str, Signature]
    defines: tuple[str, ...] = ()

    @property
    def is_core(self) -> bool:
        return not self.defines


PARTS = (Part("core", tuple(HERE / f for f in ("native.c", "conv_native.c", "winograd_native.c", "winograd43_native.c",
                                               "pool_native.c", "program.c")), CORE),
         Part("gpt_lowp", tuple(HERE / f for f in ("lowp.c", "gelu_native.c", "gpt_native.c", "attention_native.c",
                                                   "part.c")), GPT_LOWP, ("-DRNB_PART",)))
"""The core first (native.h's RNB_PART marks the others' sources); each C file is in exactly one."""
PART_OF = {name: part for part in PARTS[1:] for name in part.signatures}
"""The part that defines each entry outside the core."""


@dataclass
class Build:
    """What happened to the C kernels in this process: the library, or why there is none."""
    lib: Any = None
    path: Path | None = None
    seconds: float = 0.0
    compiled: bool = False
    why_not: str = ""

    def how(self) -> str:
        return f"compiled by {compiler_name()} in {self.seconds:.1f} s" if self.compiled else "loaded from the cache"

    def describe(self) -> str:
        """One line for the compile notes and the CLI; with the parts loaded (or not) after the core so far."""
        if self.lib is None:
            return f"fused passes in numba ({self.why_not})"
        parts = "".join(f"; its {name} part " + (b.how() if b.lib is not None else f"could not be built: {b.why_not}")
                        for name, b in list(getattr(self.lib, "parts", {}).items()))
        return f"fused passes in C ({self.how()}: {self.path}{parts})"


def cache_dir() -> Path:
    """Where built libraries live: RNB_CACHE_DIR, else XDG_CACHE_HOME/renaissance_nb, else ~/.cache/renaissance_nb."""
    if os.environ.get("RNB_CACHE_DIR"):
        return Path(os.environ["RNB_CACHE_DIR"])
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return Path(base) / "renaissance_nb"


def compiler() -> str | None:
    """The C compiler: $CC, else cc, gcc or clang on the PATH."""
    for name in (os.environ.get("CC"), "cc", "gcc", "clang"):
        if name and shutil.which(name):
            return name
    return None


def compiler_name() -> str:
    cc = compiler()
    return os.path.basename(cc) if cc else "no compiler"


def _cpu_id() -> str:
    """The CPU model and feature flags (-march=native code runs only where they match)."""
    try:
        text = Path("/proc/cpuinfo").read_text()
    except OSError:
        return platform.processor() or platform.machine()
    keep = [ln for ln in text.splitlines() if ln.startswith(("model name", "flags", "Features", "CPU part"))]
    return "\n".join(sorted(set(keep)))


def library_name(cc: str, part: Part = PARTS[0], flags: tuple[str, ...] = FLAGS, core_name: str = "") -> str:
    """The file name of ``part``'s library for its sources, flags, compiler and CPU; past the core, for the core
    library (``core_name``) it binds to, too."""
    try:
        version = subprocess.run([cc, "--version"], capture_output=True, text=True, timeout=30).stdout
    except (OSError, subprocess.SubprocessError):
        version = cc
    sources = [p.read_text() for p in (*part.sources, HEADER)] + [thunk_source(part.signatures)]
    key = "\0".join([*sources, " ".join((*flags, *part.defines)), " ".join(LINK_FLAGS), version, _cpu_id(),
                     platform.machine(), core_name])
    stem = "rnb_native" if part.is_core else f"rnb_native_{part.name}"
    return f"{stem}-{hashlib.sha256(key.encode()).hexdigest()[:20]}.so"


TEMP_PREFIX = "rnb_building-"
"""Names of libraries being built; one older than an hour was left by a process that ended mid-build."""


def _clear_stale(folder: Path) -> None:
    for old in folder.glob(TEMP_PREFIX + "*"):
        try:
            if time.time() - old.stat().st_mtime > 3600:
                shutil.rmtree(old) if old.is_dir() else old.unlink()
        except OSError:
            pass


def _compile(cc: str, target: Path, part: Part = PARTS[0], flags: tuple[str, ...] = FLAGS) -> None:
    """cc part's sources -> target, atomically: a process that finds the file finds it whole. Readable by all
    (a shared RNB_CACHE_DIR serves every user, as numba's cache does). The sources compile side by side, one
    cc per core, then link: a conv net's first run waits for the slowest file, not for all of them."""
    target.parent.mkdir(parents=True, exist_ok=True)
    _clear_stale(target.parent)
    work = Path(tempfile.mkdtemp(prefix=TEMP_PREFIX, dir=target.parent))
    try:
        thunks = work / "thunks.c"
        thunks.write_text(thunk_source(part.signatures))
        objects = _compile_objects(cc, [*part.sources, thunks], work, (*flags, *part.defines))
        tmp = work / "lib.so"
        out = subprocess.run([cc, *LINK_FLAGS, *map(str, objects), "-o", str(tmp), "-lm"],
                             capture_output=True, text=True, errors="replace", timeout=300)
        if out.returncode:
            raise OSError(f"{cc} failed to link: {(out.stderr or out.stdout).strip()[:400]}")
        umask = os.umask(0)
        os.umask(umask)
        os.chmod(tmp, 0o755 & ~umask)
        os.replace(tmp, target)
    finally:
        shutil.rmtree(work, ignore_errors=True)


def _first_done(running: list[tuple[int, subprocess.Popen]], timeout: float = 300.0) -> int:
    """The index in ``running`` of a compiler that has exited (waiting up to ``timeout``; then the oldest), so a
    free core takes the next source at once rather than after the oldest one."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        for k, (_, proc) in enumerate(running):
            if proc.poll() is not None:
                return k
        time.sleep(0.005)
    return 0


def _compile_objects(cc: str, sources: list[Path], work: Path, flags: tuple[str, ...] = FLAGS) -> list[Path]:
    """Each source to an object file in ``work``, at most one cc per core at a time, the largest first."""
    objects = [work / f"{i}.o" for i in range(len(sources))]
    queue = sorted(range(len(sources)), key=lambda i: -sources[i].stat().st_size)
    running: list[tuple[int, subprocess.Popen]] = []
    failed: list[str] = []
    try:
        while queue or running:
            while queue and len(running) < max(1, os.cpu_count() or 1):
                i = queue.pop(0)
                cmd = [cc, *flags, "-c", str(sources[i]), "-o", str(objects[i])]
                with open(work / f"{i}.log", "wb") as log:  # a file, not a pipe: a long error cannot block cc
                    running.append((i, subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT)))
            i, proc = running.pop(_first_done(running))
            proc.wait(timeout=300)
            if proc.returncode:
                text = (work / f"{i}.log").read_text(errors="replace")
                failed.append(f"{sources[i].name}: {text.strip()[:400]}")
    finally:  # a hung or failed start: no compiler left running
        for _, proc in running:
            proc.kill()
            proc.wait()
    if failed:
        raise OSError(f"{cc} failed: {'; '.join(failed)}")
    return objects


def _declare(lib: Any, part: Part) -> Any:
    for name, (res, args) in part.signatures.items():
        f = getattr(lib, name)
        f.restype, f.argtypes = res, list(args)
    return lib


def _load_core(path: Path) -> Any:
    lib = _declare(ctypes.CDLL(str(path)), PARTS[0])
    if lib.rnb_abi() != ABI:
        raise OSError(f"{path} has ABI {lib.rnb_abi()}, expected {ABI}")
    if lib.rnb_chunks() != PAR_CHUNKS:  # the C passes' blocks must be the numba twins' (native.h RNB_CHUNKS)
        raise OSError(f"{path} cuts ranges into {lib.rnb_chunks()} blocks, operands.PAR_CHUNKS is {PAR_CHUNKS}")
    return lib


def _load_part(path: Path, part: Part, core: Any) -> Any:
    """The part's library, bound to the core's thread pool and fork flag."""
    lib = _declare(ctypes.CDLL(str(path)), part)
    link = lib.rnb_part_link
    link.restype, link.argtypes = ctypes.c_int, [ctypes.c_void_p, ctypes.c_void_p]
    pool = ctypes.cast(core.rnb_parallel, ctypes.c_void_p).value
    forked = ctypes.addressof(ctypes.c_int.in_dll(core, "rnb_forked"))
    if link(pool, forked) != PAR_CHUNKS:
        raise OSError(f"{path} cuts ranges into other blocks than the core library's")
    return lib


def _user_folder() -> Path:
    """A folder of this user's for parts a shared cache holds no copy of and this user cannot write into it."""
    who = str(os.getuid()) if hasattr(os, "getuid") else "user"
    return Path(tempfile.gettempdir()) / f"renaissance_nb-{who}"


def _load_or_build_part(cc: str, part: Part, flags: tuple[str, ...], core_path: Path,
                        core: Any) -> tuple[Any, Path, bool]:
    """(library, path, compiled) of a part past the core: a copy beside the core (or in this user's folder) that
    loads, else one compiled into the first of those folders this user can write. An OSError says why not."""
    name = library_name(cc, part, flags, core_path.name)
    folders = [core_path.parent, _user_folder()]
    why = []
    for folder in folders:
        if (folder / name).exists():
            try:
                return _load_part(folder / name, part, core), folder / name, False
            except OSError as e:  # unreadable (another user's umask), or a stale file: build one of our own
                why.append(f"{folder / name}: {e}")
    for folder in folders:
        try:
            folder.mkdir(parents=True, exist_ok=True)
        except OSError as e:
            why.append(f"{folder}: {e}")
            continue
        if not os.access(folder, os.W_OK | os.X_OK):  # a read-only shared cache: this user's own folder next
            why.append(f"{folder} is not writable")
            continue
        _compile(cc, folder / name, part, flags)
        return _load_part(folder / name, part, core), folder / name, True
    raise OSError("; ".join(why))


_LIBRARIES: "weakref.WeakSet[Library]" = weakref.WeakSet()
"""Every Library of this process: a forked child gets fresh locks (a parent's thread may hold one mid-build)."""


class Library:
    """The loaded C kernels as one object: an entry's attribute is its ctypes function, from the core, or from
    the part that defines it, which is loaded (built first where needed) the first time one of its entries is
    looked up. ``parts`` records how each later part came (a Build each, with why_not where it could not)."""

    def __init__(self, core: Any, core_path: Path, cc: str, flags: tuple[str, ...]) -> None:
        self.core, self.core_path, self.cc, self.flags = core, core_path, cc, flags
        self.parts: dict[str, Build] = {}
        self._lock = threading.Lock()
        _LIBRARIES.add(self)

    def __getattr__(self, name: str) -> Any:
        if name.startswith("_"):  # copy, pickle and the like probe these before __init__ ran
            raise AttributeError(name)
        part = PART_OF.get(name.removeprefix(PREFIX))
        f = getattr(self.core if part is None else self.part(part), name)
        self.__dict__[name] = f  # later lookups find it without __getattr__
        return f

    def part(self, part: Part) -> Any:
        """The part's library, loaded (and built) on first use; an OSError says why it could not be."""
        with self._lock:
            built = self.parts.get(part.name)
            if built is None:
                t0 = time.perf_counter()
                try:
                    lib, path, compiled = _load_or_build_part(self.cc, part, self.flags, self.core_path, self.core)
                except Exception as e:  # noqa: BLE001 - kept, said below and in the compile notes
                    built = Build(why_not=f"{type(e).__name__}: {e}")
                else:
                    built = Build(lib=lib, path=path, seconds=time.perf_counter() - t0, compiled=compiled)
                self.parts[part.name] = built
        if built.lib is None:
            raise OSError(f"the C kernels' {part.name} part could not be built ({built.why_not})")
        return built.lib

    def has(self, name: str) -> bool:
        """Whether the part ``name`` loads (building it first where needed)."""
        try:
            self.part(next(p for p in PARTS if p.name == name))
        except OSError:
            return False
        return True

    def _after_fork(self) -> None:
        self._lock = threading.Lock()


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=lambda: [lib._after_fork() for lib in list(_LIBRARIES)])


def build(flags: tuple[str, ...] = FLAGS) -> Build:
    """Load the cached core library, or compile it first; a Build without lib says why. The other parts
    follow on first use (Library)."""
    if os.environ.get("RNB_NATIVE", "1") == "0":
        return Build(why_not="RNB_NATIVE=0")
    cc = compiler()
    if cc is None:
        return Build(why_not="no C compiler on the PATH: install gcc for a fast first run")
    t0 = time.perf_counter()
    try:
        path = cache_dir() / library_name(cc, PARTS[0], flags)
        compiled = not path.exists()
        if compiled:
            _compile(cc, path, PARTS[0], flags)
        lib = Library(_load_core(path), path, cc, flags)
    except Exception as e:  # noqa: BLE001 - a failed, hung or odd build or load: the numba kernels serve
        return Build(why_not=f"the C kernels could not be built: {type(e).__name__}: {e}")
    return Build(lib=lib, path=path, seconds=time.perf_counter() - t0, compiled=compiled)
