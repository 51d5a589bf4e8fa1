"""Chat templates compile and render in worker processes, so that no template can hurt the process that serves
the model: a memory bomb, a C-level call that runs for minutes or a crash ends in one worker, which is killed and
replaced, and becomes a ChatTemplateError in the caller.

Each worker is a fresh interpreter (`python -c`, started with subprocess, never a fork of this process: forking a
process that runs OpenMP/Numba threads is unsafe). It imports only the sandbox (not NumPy, Numba or the model
code), and talks JSON lines over its stdin/stdout: data only, nothing a compromised worker could make this
process execute. Limits:
    - memory: RLIMIT_AS of the worker (Linux; its own size after start-up plus 512 MiB plus 16x the request);
    - time: the sandbox's own time limit, and a wall-clock deadline in this process (the limit + 0.25 s) after which
      the worker is killed; compiling has its own deadline (compile_timeout_s);
    - concurrency: a pool of up to MAX_WORKERS workers; a render that is stuck in one worker never blocks a render
      in another, and the waiting thread holds no lock and no GIL.
A worker compiles each template once (a small LRU), and this process remembers the templates that failed to
compile, so that a bad template fails at once the second time (ChatTemplate does that).

Why a worker and not only the sandbox's size caps: caps at the operations that build values catch most bombs in
a fraction of a second (they stay, inside the worker), but not one long C-level call (`|sort` over 8 million
strings: 100 s holding the GIL, the whole server stalls), nor every way to fill memory, nor a compiler that takes
27 s on 20 000 macros; only a separate process can be stopped from outside. The price, measured on SmolLM2's own
template (4 messages, 2-core machine under load): render 0.18 ms in-process vs 0.36 ms in the worker (median),
render_with_spans 0.69 ms (two renders); a 500 000-character conversation 0.3 ms vs 16 ms (JSON through the pipe);
the first render in a process waits for the worker's start-up (0.4-0.8 s; ChatTemplate() starts one early).
"""

from __future__ import annotations

import atexit
import json
import os
import queue
import subprocess
import sys
import threading
import time
from collections import OrderedDict

from ..errors import ChatTemplateError
from ..runtime import signals_to_main_thread

MAX_WORKERS = 4
STARTUP_TIMEOUT_S = 60.0  # a cold start on a busy machine imports Jinja2 from disk
DEADLINE_SLACK_S = 0.25
MEMORY_BUDGET = 512 << 20
_CACHED_TEMPLATES = 16


# ---- the worker process -------------------------------------------------------------------------------------------
def _set_memory_limit(extra_bytes: int) -> None:
    try:
        import resource

        with open("/proc/self/statm") as f:
            vm_size = int(f.read().split()[0]) * os.sysconf("SC_PAGE_SIZE")
        _, hard = resource.getrlimit(resource.RLIMIT_AS)
        soft = vm_size + MEMORY_BUDGET + 16 * extra_bytes
        resource.setrlimit(resource.RLIMIT_AS, (soft if hard == resource.RLIM_INFINITY else min(soft, hard), hard))
    except (ImportError, OSError, ValueError):
        pass  # not Linux: the wall-clock deadline and the sandbox's size checks still apply


def serve() -> None:
    """The worker's loop: one JSON request per line on stdin, one JSON answer per line on the saved stdout."""
    from .sandbox import compile_template, render_template

    out = os.fdopen(os.dup(1), "wb", buffering=0)
    os.dup2(os.open(os.devnull, os.O_WRONLY), 1)  # nothing else may write into the answer channel
    templates: OrderedDict[str, object] = OrderedDict()
    base = None

    def template(source: str, name: str):
        if source not in templates:
            templates[source] = compile_template(source, name)
            if len(templates) > _CACHED_TEMPLATES:
                templates.popitem(last=False)
        templates.move_to_end(source)
        return templates[source]

    out.write(b'{"ready": true}\n')
    for line in sys.stdin.buffer:
        fatal = False
        try:
            request = json.loads(line)
            if base is None:
                _set_memory_limit(0)
                base = True
            name = request["name"]
            if request["op"] == "compile":
                template(request["source"], name)
                answer = {"ok": True}
            else:
                t = template(request["source"], name)
                deadline = time.perf_counter() + request["timeout_s"]
                texts, errors = [], []
                for variables in request["runs"]:
                    try:
                        texts.append(render_template(t, variables, name=name, max_chars=request["max_chars"],
                                                     timeout_s=max(0.0, deadline - time.perf_counter())))  # fmt: skip
                        errors.append(None)
                    except ChatTemplateError as e:
                        texts.append(None)
                        errors.append(str(e))
                answer = {"texts": texts, "errors": errors}
        except ChatTemplateError as e:
            answer = {"error": str(e)}
        except MemoryError:
            what = "compiling" if request.get("op") == "compile" else "rendering"
            answer = {"error": f"{what} the chat template ({request.get('name')}) ran out of memory"}
            fatal = True
        except Exception as e:  # a bug or a broken request: say so, never hang the caller
            answer = {"error": f"chat template worker failed: {type(e).__name__}: {e}"}
            fatal = True
        answer["fatal"] = fatal  # the caller then replaces this worker, whose state may be damaged
        out.write(json.dumps(answer).encode("ascii") + b"\n")
        if fatal:
            return


# ---- this process's side ------------------------------------------------------------------------------------------
_BOOT = (
    "import sys, types\n"
    "sys.path[:0] = {path!r}\n"
    # a bare package object: the worker needs the sandbox, not ggufrun/__init__ (NumPy and the model code)
    "pkg = types.ModuleType('ggufrun'); pkg.__path__ = [{package!r}]; sys.modules['ggufrun'] = pkg\n"
    "from ggufrun.chat_template.worker import serve\n"
    "serve()\n"
)


class _Worker:
    def __init__(self):
        package = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
        boot = _BOOT.format(path=[os.path.dirname(package)], package=package)
        # its own session: Ctrl-C typed in the user's terminal (SIGINT to the foreground process group) is for the
        # program, not its template workers; a worker ends when its stdin closes or the pool kills it
        self.proc = subprocess.Popen(
            [sys.executable, "-c", boot],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.DEVNULL,
            start_new_session=True,
        )
        self.answers: queue.Queue = queue.Queue()
        self.compiled: set[str] = set()
        self.ready = False
        self.busy = False
        with signals_to_main_thread():  # Ctrl-C must reach the main thread (see ggufrun.runtime)
            threading.Thread(target=self._read, daemon=True, name="chat-template-worker-reader").start()

    def _read(self) -> None:
        for line in self.proc.stdout:
            self.answers.put(line)
        self.answers.put(None)

    def _answer(self, timeout: float, what: str) -> dict:
        """The next answer; on a timeout or the worker's death, an error answer (and the worker is killed)."""
        try:
            line = self.answers.get(timeout=timeout)
        except queue.Empty:
            self.kill()
            return {"error": f"{what} took longer than {timeout:.1f} s; stopped", "fatal": True}
        if line is None:
            self.kill()
            code = self.proc.returncode
            return {"error": f"{what} ended the template worker (exit status {code}: out of memory or crashed)",
                    "fatal": True}  # fmt: skip
        return json.loads(line)

    def request(self, request: dict, timeout: float, what: str) -> dict:
        """Send one request and wait for its answer: {"error": ...} or the operation's own fields."""
        if not self.ready:
            answer = self._answer(STARTUP_TIMEOUT_S, "starting the chat template worker")
            if "error" in answer:  # not the template's fault: not an answer about it
                raise ChatTemplateError(answer["error"])
            self.ready = True
        data = json.dumps(request).encode("ascii") + b"\n"
        self.busy = True  # until the answer is in: a worker given back busy (an interrupt) is killed
        try:
            self.proc.stdin.write(data)
            self.proc.stdin.flush()
        except OSError:
            self.kill()
            return {"error": f"{what}: the template worker has stopped", "fatal": True}
        # moving a big request through the pipe and JSON takes time too
        answer = self._answer(timeout + DEADLINE_SLACK_S + len(data) / 50e6, what)
        self.busy = False
        if answer.get("fatal"):
            self.kill()
        return answer

    @property
    def alive(self) -> bool:
        return self.proc.poll() is None

    def kill(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
        self.proc.wait()
        for f in (self.proc.stdin, self.proc.stdout):
            try:
                f.close()
            except OSError:
                pass


class WorkerPool:
    """Up to `size` workers; a caller takes an idle one (or starts one), or waits for one to come back."""

    def __init__(self, size: int = MAX_WORKERS):
        self.pid = os.getpid()  # a forked child must not share this process's workers
        self.size = size
        self.idle: list[_Worker] = []
        self.count = 0
        self.cond = threading.Condition()

    def _take(self) -> _Worker:
        with self.cond:
            while True:
                while self.idle:
                    worker = self.idle.pop()
                    if worker.alive:
                        return worker
                    worker.kill()
                    self.count -= 1
                if self.count < self.size:
                    self.count += 1
                    break
                self.cond.wait()
        try:
            return _Worker()
        except OSError as e:
            with self.cond:
                self.count -= 1
                self.cond.notify()
            raise ChatTemplateError(f"cannot start the chat template worker: {e}") from None

    def prestart(self) -> None:
        """Start one worker in the background if none exists, so that the first render does not wait for it."""
        with self.cond:
            if self.count == 0:
                try:
                    self.idle.append(_Worker())
                    self.count += 1
                except OSError:
                    pass  # the first render reports it

    def _give(self, worker: _Worker) -> None:
        with self.cond:
            if worker.alive and not worker.busy:
                self.idle.append(worker)
            else:
                worker.kill()
                if not self.idle:
                    # start the replacement now, so that the next render does not wait for its start-up
                    try:
                        self.idle.append(_Worker())
                    except OSError:
                        self.count -= 1
                else:
                    self.count -= 1
            self.cond.notify()

    def run(self, source: str, name: str, runs: list[dict], *, timeout_s: float, compile_timeout_s: float,
            max_chars: int) -> tuple[str | None, list[str | None], list[str | None]]:  # fmt: skip
        """Compile `source` (once per worker), then render it with each variable set in `runs`. Returns
        (compile error or None, per run the text or None, per run the error or None); ChatTemplateError when
        rendering as a whole failed (a time or memory limit)."""
        worker = self._take()
        try:
            if source not in worker.compiled:
                request = {"op": "compile", "source": source, "name": name}
                answer = worker.request(request, compile_timeout_s, f"compiling the chat template ({name})")
                if "error" in answer:
                    return answer["error"], [], []
                worker.compiled.add(source)
            if not runs:
                return None, [], []
            request = {"op": "render", "source": source, "name": name, "runs": runs, "timeout_s": timeout_s,
                       "max_chars": max_chars}  # fmt: skip
            answer = worker.request(request, timeout_s, f"rendering the chat template ({name})")
            if "error" in answer:
                raise ChatTemplateError(answer["error"])
            return None, answer["texts"], answer["errors"]
        finally:
            self._give(worker)

    def close(self) -> None:
        with self.cond:
            idle, self.idle = self.idle, []
            self.count -= len(idle)
        for worker in idle:
            worker.kill()


_pool: WorkerPool | None = None
_pool_lock = threading.Lock()


def pool() -> WorkerPool:
    global _pool
    with _pool_lock:
        if _pool is None or _pool.pid != os.getpid():
            _pool = WorkerPool()
            atexit.register(_pool.close)
        return _pool
