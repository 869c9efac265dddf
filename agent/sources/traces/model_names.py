"""The program a traced command line names: the model label of a trace without one of its own."""

from __future__ import annotations

import re

_RUNNERS = re.compile(
    r"^(python[\d.]*m?|pypy[\d.]*|bash|sh|zsh|dash|perl|ruby|node|julia|Rscript|lua[\d.]*|env|"
    r"torchrun|deepspeed|accelerate|mpirun|mpiexec|srun|numactl|taskset|nohup|time|uv|rocprofv3)$"
)
_SUBCOMMANDS = frozenset({"launch", "run", "exec"})  # accelerate launch x.py, uv run x.py
_SCRIPT_SUFFIXES = (".py", ".sh", ".pl", ".rb", ".js", ".jl", ".R", ".lua")
MAX_MODEL_CHARS = 128


def model_from_command(argv: list[str] | str | None) -> str | None:
    """The model a traced command line names: the script of an interpreter or launcher, else the program.

    ``python3 train.py --x`` -> ``train``; ``torchrun --nproc_per_node=8 train.py`` -> ``train``;
    ``python -m pkg.train`` -> ``train``; ``/opt/app/bench -n 3`` -> ``bench``. Options, numbers
    (``mpirun -np 8 ...``), ``NAME=value`` settings and launcher subcommands are passed over;
    ``python -c ...`` names the interpreter. A string is split on whitespace. None if it names nothing.
    """
    if isinstance(argv, str):
        argv = argv.split()
    if not argv:
        return None
    words = [a for a in argv[:256] if isinstance(a, str)]
    first: str | None = None
    runner = False
    i = 0
    while i < len(words):
        word = words[i].strip()
        i += 1
        base = word.replace("\\", "/").rsplit("/", 1)[-1]
        if not base or base.isdigit() or (runner and (word.startswith("-") or base in _SUBCOMMANDS)):
            if word in ("-m", "--module") and i < len(words):
                return _model_name(words[i].rsplit(".", 1)[-1])
            if word == "-c":
                break
            i += word in ("-W", "-X")  # python options that take a value
            continue
        if "=" in base and not word.startswith("-"):
            continue  # env NAME=value
        if _RUNNERS.match(base):
            first = first or base
            runner = True
            continue
        return _model_name(base)
    return _model_name(first) if first else None


def _model_name(base: str) -> str | None:
    for suffix in _SCRIPT_SUFFIXES:
        if base.endswith(suffix) and len(base) > len(suffix):
            base = base[: -len(suffix)]
            break
    base = "".join(ch for ch in base if ch.isprintable()).strip()[:MAX_MODEL_CHARS]
    return base or None
