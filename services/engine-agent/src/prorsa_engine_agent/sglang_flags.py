"""SGLang's command-line flags read statically from its source, and a check of a launch
command against them.

SGLang 0.5.23 cannot import its argument parser without torch (``sglang/__init__.py`` and
the platform layer import it), so CI cannot call ``ServerArgs.add_cli_args``. This module
reads the same declarations without importing anything: SGLang builds its parser from
annotated fields (``arg_groups/fields/*.py``: ``name: A[type, "help" | Arg(...)] = default``,
turned into flags by ``arg_groups/arg_utils.add_cli_args_from_dataclass``) plus a few
``parser.add_argument`` calls in ``server_args.py``. We parse those files with ``ast`` and
apply the same mapping rules (flag = ``cli_name`` or ``--`` + field name with dashes, plus
``aliases``; ``bool`` -> store_true; ``Literal[...]`` -> choices; ``List[X]`` -> nargs "+";
``int``/``float`` -> typed value; ``choices=NAME`` resolved from ``arg_groups/choices.py``).

What :func:`check_args` verifies: every flag exists (exact name, no prefix abbreviation),
a store_true flag has no value, a valued flag has one (or the right number for nargs),
int/float values convert, values are in the declared choices, and required flags
(``--model-path``) are present. What it does not verify: values of flags with a custom
``type_parser`` (JSON, human-readable ints...) or a custom action, choices SGLang computes
at run time (``--sampling-backend``, ``--reasoning-parser``, ``--tool-call-parser``...),
choices plugins add through ``add_*_choices``, and SGLang's post-parse validation
(``resolve_once``: e.g. EP > 1 with ``--enable-pd-role-switch``).
"""

from __future__ import annotations

import ast
import os
import shutil
import subprocess
import sys
import tempfile
import zipfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any

SGLANG_VERSION = "0.5.23"
# The wheel is platform-tagged; the Python sources we read are the same in every build, so
# we ask for one fixed build and the download works on any CI host.
WHEEL_TARGET = ["--python-version", "3.11", "--platform", "manylinux_2_34_x86_64",
                "--only-binary=:all:"]
_SOURCES = ("sglang/srt/server_args.py", "sglang/srt/arg_groups/")


@dataclass(frozen=True)
class FlagSpec:
    """One command-line flag as SGLang's parser declares it."""

    names: tuple[str, ...]
    dest: str
    kind: str
    """``"bool"`` (store_true), ``"bool_optional"`` (``--x`` / ``--no-x``), ``"value"``,
    ``"custom"`` (custom action or type parser: a value is required, not checked)."""
    value_type: str = "str"
    """``"int"``, ``"float"`` or ``"str"``."""
    choices: tuple[Any, ...] | None = None
    nargs: str | None = None
    required: bool = False
    source: str = ""


class SglangSourceError(RuntimeError):
    """The SGLang source could not be obtained or read."""


# -- obtaining the source -----------------------------------------------------------------
def _pip_commands() -> list[list[str]]:
    cmds = []
    try:
        import pip  # noqa: F401

        cmds.append([sys.executable, "-m", "pip"])
    except ImportError:
        pass
    for exe in ("pip", "pip3"):
        if shutil.which(exe):
            cmds.append([exe])
    if shutil.which("uvx"):
        cmds.append(["uvx", "pip"])
    return cmds


def fetch_sglang_source(cache_dir: Path | None = None, version: str = SGLANG_VERSION,
                        timeout_s: float = 600.0) -> Path:
    """A folder holding ``sglang/srt/server_args.py`` and ``sglang/srt/arg_groups/`` of
    ``sglang==version``: from ``PRORSA_SGLANG_WHEEL`` (a wheel file) if set, else from the
    cache, else ``pip download --no-deps`` into the cache. Raises :class:`SglangSourceError`
    saying what failed."""
    cache = Path(cache_dir or os.environ.get("PRORSA_SGLANG_CACHE")
                 or Path.home() / ".cache" / "prorsa" / "sglang")
    out = cache / f"sglang-{version}-src"
    if (out / "sglang/srt/server_args.py").is_file():
        return out
    wheel = os.environ.get("PRORSA_SGLANG_WHEEL")
    if wheel:
        _extract(Path(wheel), out)
        return out
    cmds = _pip_commands()
    if not cmds:
        raise SglangSourceError("no pip found (tried python -m pip, pip, pip3, uvx pip)")
    errors = []
    with tempfile.TemporaryDirectory(prefix="sglang-dl-") as tmp:
        for cmd in cmds:
            full = cmd + ["download", "--no-deps", f"sglang=={version}", "-d", tmp, *WHEEL_TARGET]
            try:
                r = subprocess.run(full, capture_output=True, text=True, timeout=timeout_s)
            except (OSError, subprocess.TimeoutExpired) as exc:
                errors.append(f"{' '.join(cmd)}: {exc}")
                continue
            wheels = sorted(Path(tmp).glob(f"sglang-{version}-*.whl"))
            if r.returncode == 0 and wheels:
                _extract(wheels[0], out)
                return out
            errors.append(f"{' '.join(cmd)}: exit {r.returncode}: {(r.stderr or r.stdout)[-400:]}")
    raise SglangSourceError(f"pip download sglang=={version} failed: " + " | ".join(errors))


def _extract(wheel: Path, out: Path) -> None:
    if not wheel.is_file():
        raise SglangSourceError(f"{wheel} is not a file")
    tmp = out.with_name(out.name + ".part")
    shutil.rmtree(tmp, ignore_errors=True)
    try:
        with zipfile.ZipFile(wheel) as z:
            names = [n for n in z.namelist() if n.startswith(_SOURCES) and n.endswith(".py")]
            if "sglang/srt/server_args.py" not in names:
                raise SglangSourceError(f"{wheel} has no sglang/srt/server_args.py")
            for n in names:
                z.extract(n, tmp)
    except zipfile.BadZipFile as exc:
        raise SglangSourceError(f"{wheel} is not a wheel: {exc}") from exc
    shutil.rmtree(out, ignore_errors=True)
    tmp.rename(out)  # whole or nothing: a half-extracted cache is never used


# -- reading the declarations ----------------------------------------------------------------
def _literal(node: ast.AST, consts: dict[str, Any]) -> Any:
    if isinstance(node, ast.Name) and node.id in consts:
        return consts[node.id]
    try:
        return ast.literal_eval(node)
    except ValueError:
        return None


def _module_constants(path: Path) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for node in ast.parse(path.read_text()).body:
        if isinstance(node, ast.Assign) and len(node.targets) == 1 and isinstance(node.targets[0], ast.Name):
            try:
                out[node.targets[0].id] = ast.literal_eval(node.value)
            except ValueError:
                pass
    return out


def _name(node: ast.AST) -> str:
    return ast.unparse(node)


def _type_info(tp: ast.AST) -> tuple[str, str, tuple | None, str | None]:
    """(kind, value_type, literal choices, nargs) of an annotation's type expression."""
    # Optional[X] / X | None
    if isinstance(tp, ast.Subscript) and _name(tp.value) in ("Optional", "typing.Optional"):
        return _type_info(tp.slice)
    if isinstance(tp, ast.BinOp) and isinstance(tp.op, ast.BitOr):
        side = tp.right if _name(tp.left) == "None" else tp.left
        return _type_info(side)
    if isinstance(tp, ast.Subscript) and _name(tp.value) in ("Literal", "typing.Literal"):
        elts = tp.slice.elts if isinstance(tp.slice, ast.Tuple) else [tp.slice]
        vals = tuple(ast.literal_eval(e) for e in elts)
        vt = {int: "int", float: "float"}.get(type(vals[0]), "str") if vals else "str"
        return "value", vt, vals, None
    if isinstance(tp, ast.Subscript) and _name(tp.value) in ("List", "list", "typing.List"):
        _, vt, _, _ = _type_info(tp.slice)
        return "value", vt, None, "+"
    name = _name(tp)
    if name == "bool":
        return "bool", "str", None, None
    return "value", {"int": "int", "float": "float"}.get(name, "str"), None, None


def _action_kind(action: str) -> str:
    """Kind of a flag with a custom argparse action (argparse_actions.py: the deprecated
    store-true actions take no value)."""
    if action.endswith("BooleanOptionalAction"):
        return "bool_optional"
    if action.endswith("StoreTrueAction") or action == "DeprecatedAction":
        return "bool"
    return "custom"


def _field_flags(path: Path, classes: set[str], consts: dict[str, Any]) -> list[FlagSpec]:
    tree = ast.parse(path.read_text())
    out = []
    for cls in tree.body:
        if not (isinstance(cls, ast.ClassDef) and cls.name in classes):
            continue
        for st in cls.body:
            if not (isinstance(st, ast.AnnAssign) and isinstance(st.target, ast.Name)):
                continue
            ann = st.annotation
            if not (isinstance(ann, ast.Subscript) and _name(ann.value) in ("A", "Annotated")
                    and isinstance(ann.slice, ast.Tuple)):
                continue  # no A[...] metadata: not a CLI field
            tp, *meta = ann.slice.elts
            arg: dict[str, ast.AST] | None = None
            for m in meta:
                if isinstance(m, ast.Constant) and isinstance(m.value, str):
                    arg = {}
                    break
                if isinstance(m, ast.Call) and _name(m.func) == "Arg":
                    arg = {k.arg: k.value for k in m.keywords if k.arg}
                    break
            if arg is None:
                continue
            if "no_cli" in arg and _literal(arg["no_cli"], consts):
                continue
            field = st.target.id
            cli = _literal(arg["cli_name"], consts) if "cli_name" in arg else "--" + field.replace("_", "-")
            names = (cli, *(_literal(arg["aliases"], consts) or [] if "aliases" in arg else []))
            kind, vt, choices, nargs = _type_info(tp)
            if "action" in arg:
                kind = _action_kind(_name(arg["action"]))
            elif "type_parser" in arg:
                kind, choices, nargs = "custom", None, None
            if "choices" in arg:
                ch = _literal(arg["choices"], consts)
                choices = tuple(ch) if ch is not None else None
            if "nargs" in arg:
                nargs = _literal(arg["nargs"], consts)
            required = kind in ("value", "custom") and st.value is None
            if "required" in arg and _literal(arg["required"], consts) is not None:
                required = bool(_literal(arg["required"], consts))
            out.append(FlagSpec(tuple(names), field, kind, vt, choices, nargs, required,
                                f"{path.name}:{st.lineno}"))
    return out


def _manual_flags(path: Path, consts: dict[str, Any]) -> list[FlagSpec]:
    """``parser.add_argument(...)`` calls in ``server_args.py`` (dynamic choices, legacy flags)."""
    out = []
    for node in ast.walk(ast.parse(path.read_text())):
        if not (isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute)
                and node.func.attr == "add_argument"):
            continue
        names = tuple(a.value for a in node.args if isinstance(a, ast.Constant) and isinstance(a.value, str))
        if not names or not names[0].startswith("--"):
            continue
        kw = {k.arg: k.value for k in node.keywords if k.arg}
        action = _literal(kw["action"], consts) if "action" in kw else None
        if action in ("store_true", "store_false"):
            kind, vt = "bool", "str"
        elif "action" in kw:
            kind, vt = _action_kind(_name(kw["action"])), "str"
        else:
            tname = _name(kw["type"]) if "type" in kw else "str"
            kind = "value" if tname in ("int", "float", "str") else "custom"
            vt = tname if tname in ("int", "float") else "str"
        ch = _literal(kw["choices"], consts) if "choices" in kw else None
        dest = names[0].lstrip("-").replace("-", "_")
        out.append(FlagSpec(names, dest, kind, vt, tuple(ch) if isinstance(ch, (list, tuple)) else None,
                            _literal(kw["nargs"], consts) if "nargs" in kw else None,
                            False, f"{path.name}:{node.lineno}"))
    return out


def read_flags(root: Path) -> dict[str, FlagSpec]:
    """Every flag of ``ServerArgs.add_cli_args`` in the source under ``root``, by name
    (aliases included). Only field classes that ``server_args.py`` imports are read."""
    srt = Path(root) / "sglang" / "srt"
    server_args = srt / "server_args.py"
    if not server_args.is_file():
        raise SglangSourceError(f"{server_args} not found")
    consts = _module_constants(srt / "arg_groups" / "choices.py")
    by_module: dict[str, set[str]] = {}
    for node in ast.parse(server_args.read_text()).body:
        if isinstance(node, ast.ImportFrom) and (node.module or "").startswith("sglang.srt.arg_groups.fields."):
            by_module.setdefault(node.module.rsplit(".", 1)[1], set()).update(a.name for a in node.names)
    if not by_module:
        raise SglangSourceError("server_args.py imports no arg_groups.fields classes: layout changed?")
    flags: dict[str, FlagSpec] = {}
    specs = [s for mod, classes in sorted(by_module.items())
             for s in _field_flags(srt / "arg_groups" / "fields" / f"{mod}.py", classes, consts)]
    for spec in specs + _manual_flags(server_args, consts):
        for n in spec.names:
            flags[n] = spec
            if spec.kind == "bool_optional":
                flags["--no-" + n[2:]] = spec
    return flags


# -- checking a command ------------------------------------------------------------------
def _convert(value: str, spec: FlagSpec) -> str | None:
    try:
        v: Any = {"int": int, "float": float}.get(spec.value_type, str)(value)
    except ValueError:
        return f"{spec.names[0]}: {value!r} is not a valid {spec.value_type}"
    if spec.choices is not None and v not in spec.choices:
        return f"{spec.names[0]}: {value!r} is not one of {list(spec.choices)}"
    return None


def check_args(args: list[str], flags: dict[str, FlagSpec]) -> list[str]:
    """Problems argparse (plus declared choices and types) would find in ``args``; empty
    when the command parses. See the module docstring for what is not checked."""
    problems: list[str] = []
    seen: set[str] = set()
    i = 0
    while i < len(args):
        tok = args[i]
        i += 1
        if not tok.startswith("--"):
            problems.append(f"unexpected positional argument {tok!r}")
            continue
        name, eq, inline = tok.partition("=")
        spec = flags.get(name)
        if spec is None:
            problems.append(f"unknown flag {name}")
            continue
        seen.add(spec.dest)
        if spec.kind in ("bool", "bool_optional"):
            if eq:
                problems.append(f"{name} takes no value")
            continue
        values = [inline] if eq else []
        if not eq:
            while i < len(args) and not (args[i].startswith("--")):
                values.append(args[i])
                i += 1
                if spec.nargs not in ("+", "*"):
                    break
        if spec.nargs == "?":
            pass
        elif spec.nargs == "*":
            pass
        elif not values:
            problems.append(f"{name} expects a value")
            continue
        if spec.kind == "custom":
            continue
        problems += [p for v in values if (p := _convert(v, spec))]
    for spec in {s.dest: s for s in flags.values()}.values():
        if spec.required and spec.dest not in seen:
            problems.append(f"required flag {spec.names[0]} is missing")
    return problems
