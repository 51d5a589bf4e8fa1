"""Machine code of the product kernels, for proving that a change to ggufrun/quants/dot.py leaves them alone.

Compiles every kernel of ggufrun.quants.dot (dot products, their serial row workers, the activation quantizers) for
the argument types the forward pass uses (`quants.warmup`: read-only weights), in a fresh Numba cache, and writes
each compiled function's assembly to OUT/<kernel>.s with Numba's symbol names (which carry module paths and unique
ids) replaced by SYM, plus OUT/SUMMARY with one sha256 per kernel (also printed). Run it in two checkouts and diff:

    PYTHONPATH=. python dev/kernel_asm.py --out /tmp/asm-after
    (cd ../before && PYTHONPATH=. python dev/kernel_asm.py --out /tmp/asm-before)
    diff -r /tmp/asm-before /tmp/asm-after

--quick: only Q8_0 (tests/test_dev_scripts.py). --types Q4_0,Q6_K: the given types (default: all).
--model PATH: also run a short generation with that GGUF model and include the forward-pass kernels of
ggufrun.model.kernels (norms, RoPE, attention, activations), compiled for the types that model uses.
"""

from __future__ import annotations

import argparse
import hashlib
import os
import re
import sys
import tempfile

_SYMBOL = re.compile(r"_ZN[\w$.]+|\b[\w.$]*ggufrun[\w.$]*|\bcfunc\.[\w.$]+|__numba_parfor_gufunc[\w.$]*")
_SKIP = ("\t.file", "\t.ident", "\t.loc", "\t.cfi_", "#", "\t#", "\t.section\t.note", "\t.addrsig")


def normalise(asm: str) -> str:
    """Assembly without comments, debug directives and the run-specific parts of symbol names."""
    lines = []
    for line in asm.splitlines():
        if not line.strip() or line.startswith(_SKIP):
            continue
        line = _SYMBOL.sub("SYM", line.split(" #")[0].rstrip())
        if line.startswith('\t.size\t"') and "SYM" in line:  # an error message naming a symbol: its length varies
            line = line.rsplit(",", 1)[0]
        lines.append(line)
    return "\n".join(lines) + "\n"


def kernel_asm(type_names: list[str], model: str | None = None) -> dict[str, str]:
    """{kernel name (module.function, with a signature index when it has several): normalised assembly}."""
    from gguf import GGMLQuantizationType as T
    from numba.core.registry import CPUDispatcher

    from ggufrun import quants
    from ggufrun.model import kernels
    from ggufrun.quants import dot

    quants.warmup([T[n] for n in type_names], dequant=False)
    modules = [dot]
    if model:
        import ggufrun

        m = ggufrun.load(model, n_threads=2, n_ctx=64)
        m.complete("The capital of France is", max_tokens=3)  # prefill, then single-token decode steps
        modules.append(kernels)
    out = {}
    for module in modules:
        for name, obj in sorted(vars(module).items()):
            if not isinstance(obj, CPUDispatcher) or not obj.signatures:
                continue
            for i, sig in enumerate(obj.signatures):
                key = f"{module.__name__.rsplit('.', 1)[1]}.{name}" + ("" if len(obj.signatures) == 1 else f".{i}")
                out[key] = normalise(obj.inspect_asm(sig))
    return out


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--out", help="folder for <kernel>.s and SUMMARY (default: print the summary only)")
    p.add_argument("--quick", action="store_true", help="Q8_0 only")
    p.add_argument("--types", help="comma-separated GGML type names (default: every supported type)")
    p.add_argument("--model", help="a GGUF model whose forward pass compiles ggufrun.model.kernels too")
    args = p.parse_args(argv)
    if "ggufrun" in sys.modules:
        raise SystemExit("kernel_asm needs a fresh process: ggufrun is already imported")
    os.environ["NUMBA_CACHE_DIR"] = tempfile.mkdtemp(prefix="kernel-asm-")  # compile, never load: asm needs LLVM
    from ggufrun.quants import SUPPORTED_TYPES

    if args.types:
        names = args.types.split(",")
    elif args.quick:
        names = ["Q8_0"]
    else:
        names = sorted(t.name for t in SUPPORTED_TYPES)
    asm = kernel_asm(names, args.model)
    if not any(key.startswith("dot.dot_") for key in asm):
        raise SystemExit(f"no dot kernel was compiled for {names}")
    summary = [
        f"{hashlib.sha256(t.encode()).hexdigest()[:16]}  {len(t.splitlines()):6d} lines  {k}" for k, t in asm.items()
    ]
    if args.out:
        os.makedirs(args.out, exist_ok=True)
        for key, text in asm.items():
            with open(os.path.join(args.out, key + ".s"), "w") as f:
                f.write(text)
        with open(os.path.join(args.out, "SUMMARY"), "w") as f:
            f.write("\n".join(summary) + "\n")
    print("\n".join(summary))
    return 0


if __name__ == "__main__":
    sys.exit(main())
