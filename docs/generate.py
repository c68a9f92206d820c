"""The documentation site's generated parts: what each script is made of, read from its source, and the results,
tables and learning curves, computed from the committed result files. No figure on the site is typed by hand.

    python docs/generate.py                 # write docs/generated/ (the site build does this itself)
    mkdocs build --strict                   # the site, into site/ (neither folder is committed)
    mkdocs serve                            # browse it at http://127.0.0.1:8000, rebuilt on every change

``mkdocs.yml`` loads this file as a hook: before every build ``generate()`` rewrites ``docs/generated/`` (only the
files whose bytes change, so ``mkdocs serve`` does not loop), the pages pull its Markdown in with
pymdownx.snippets (``--8<-- "ppo_atari/results.md"``; a missing one fails the build) and show its PNGs. What is
generated, per script in ``algos/``: ``about.md`` (the module docstring, its commands as code), ``structure.md``
(sections, functions and classes with their first docstring sentence and line, the flags of ``Args`` with
defaults and help, the presets with the comments that cite their sources, the logged columns, the whole source),
``results.md`` (the blocks of ``RESULTS``). Shared pages: ``presets.md``, ``run_folder.md``, ``launch.md``,
``report.md``, ``results/*.md`` (Atari 100k, MuJoCo, the cheap figures, speed, the whole lab notebook).

Sources of the results (``benchmarks/results/``): the run folders of experiments (``experiments/report.py``'s
collection and rliable intervals, ``experiments/plot.py``'s curves: the mean over seeds with the min-max band
shaded), ``recheck.json`` (``benchmarks/checks/recheck_learning.py``'s intervals), ``atari100k``
(``benchmarks/learning/atari100k.py``'s table, with the published scores it holds), the committed PNGs, and
sections of ``README.md`` (the lab notebook: the figures measured once, the speed tables and the peers' published
numbers, quoted as they stand). A section named here that the notebook no longer has is an error: the build fails
and says which.
"""

from __future__ import annotations

import ast
import contextlib
import csv
import functools
import importlib.util
import io
import json
import re
import shutil
import sys
import tempfile
import textwrap
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from markdown.extensions.toc import slugify

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:  # mkdocs loads this hook by path: experiments/ imports without pip install -e too
    sys.path.insert(0, str(ROOT))
RESULTS = ROOT / "benchmarks" / "results"
NOTEBOOK = RESULTS / "README.md"
OUT = ROOT / "docs" / "generated"
IMG = "../generated/img"  # the pages that include generated Markdown sit one folder below docs/
SCRIPTS = [
    "ppo_atari",
    "a2c_atari",
    "ppo_lstm",
    "ppo_mujoco",
    "dqn_atari",
    "catdqn_atari",
    "r2d1_atari",
    "sac_mujoco",
    "td3_mujoco",
    "ddpg_mujoco",
]
BASE_COLUMNS = ["global_step", "wall_time_s", "sps", "episodes", "return_mean"]


def _module(path: Path, name: str):
    """A benchmark module by path, under a name of its own (mkdocs loads this hook by path too): the tables it holds."""
    if name in sys.modules:
        return sys.modules[name]
    spec = importlib.util.spec_from_file_location(name, path)
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    spec.loader.exec_module(module)
    return module


def plot():
    from experiments import plot

    return plot


def report():
    from experiments import report

    return report


def recheck():
    return _module(ROOT / "benchmarks" / "checks" / "recheck_learning.py", "benchmarks_recheck")


# ------------------------------------------------------------------------------------------ text helpers


def escape(text: str, table: bool = False) -> str:
    """Prose from a docstring or a comment, safe as Markdown: no emphasis, links or HTML by accident."""
    out = []
    for i, part in enumerate(re.split(r"(``?[^`]+``?)", text)):
        if i % 2:  # code spans stay as they are (``x`` is a code span in Markdown too)
            out.append(part.replace("|", "\\|") if table else part)
            continue
        part = part.replace("\\", "\\\\").replace("*", "\\*").replace("[", "\\[").replace("]", "\\]")
        part = part.replace("<", "&lt;").replace(">", "&gt;").replace("_", "\\_")
        out.append(part.replace("|", "\\|") if table else part)
    return "".join(out)


def code_names(text: str, names: set[str]) -> str:
    """Escaped prose with the script's own names (functions, classes, flags) as code."""
    pattern = re.compile(r"(?<![\w.`-])(" + "|".join(sorted(map(re.escape, names), key=len, reverse=True)) + r")(?![\w`])")
    out = []
    for i, part in enumerate(re.split(r"(``?[^`]+``?)", text)):
        if i % 2:
            out.append(part)
        else:
            pieces = pattern.split(part) if names else [part]
            out.append("".join(f"`{p}`" if j % 2 else escape(p) for j, p in enumerate(pieces)))
    return "".join(out)


def docstring_markdown(doc: str, names: set[str] = frozenset()) -> str:
    """A module docstring as Markdown: indented blocks become code (shell commands: bash), ``Title`` underlined with
    dashes a bold line, the rest paragraphs and lists with the script's names as code."""
    lines, out, i = doc.splitlines(), [], 0
    while i < len(lines):
        line = lines[i]
        if line.startswith("    ") and (not out or out[-1] == ""):
            block = []
            while i < len(lines) and (lines[i].startswith("    ") or not lines[i].strip()):
                block.append(lines[i])
                i += 1
            while block and not block[-1].strip():
                block.pop()
            body = textwrap.dedent("\n".join(block))
            shell = all(
                not ln.strip() or re.match(r"\s*(python|torchrun|taskset|#|srun|sbatch|pip|\w+=)", ln)
                for ln in body.splitlines()
            )
            out += ["```" + ("bash" if shell else "text"), body, "```", ""]
            continue
        if i + 1 < len(lines) and re.fullmatch(r"-{3,}", lines[i + 1].strip()) and line.strip():
            out += [f"**{escape(line.strip())}**", ""]
            i += 2
            continue
        text = line.rstrip()
        if text.endswith("::"):
            text = text[:-1]
        out.append(code_names(text, names) if text.strip() else "")
        i += 1
    return "\n".join(out).strip() + "\n"


def first_sentence(doc: str | None) -> str:
    if not doc:
        return ""
    para = " ".join(doc.strip().split("\n\n")[0].split())
    m = re.match(r"(.+?\.)(\s|$)", para)
    text = m.group(1) if m else para
    return text if len(text) <= 240 else text[:237].rsplit(" ", 1)[0] + " ..."


def table(header: list[str], rows: list[list[str]]) -> str:
    lines = ["| " + " | ".join(header) + " |", "|" + "|".join(" --- " for _ in header) + "|"]
    lines += ["| " + " | ".join(str(c) for c in row) + " |" for row in rows]
    return "\n".join(lines) + "\n"


def num(x: float, digits: int = 1) -> str:
    return "-" if x != x else f"{x:.{digits}f}"


# ------------------------------------------------------------------------------------- a script's structure


@dataclass
class Entry:
    section: str
    kind: str  # class, function, value
    name: str
    line: int
    summary: str
    members: list[str]


def _sections(lines: list[str]) -> list[tuple[int, str]]:
    """(line, name) of the script's section markers, ``# ------ name``."""
    found = [(1, "flags and presets")]
    for n, line in enumerate(lines, 1):
        m = re.match(r"#\s*-{5,}\s*(\S.*)$", line)
        if m:
            found.append((n, m.group(1).strip()))
    return found


def structure(path: Path) -> dict:
    """What a script is made of, read from its source (nothing is imported or run)."""
    source = path.read_text()
    lines = source.splitlines()
    tree = ast.parse(source)

    def segment(node) -> str:  # ast.get_source_segment splits the whole source at every call: slow here
        first, last = node.lineno - 1, node.end_lineno - 1
        if first == last:
            return lines[first].encode()[node.col_offset : node.end_col_offset].decode()
        part = [
            lines[first].encode()[node.col_offset :].decode(),
            *lines[first + 1 : last],
            lines[last].encode()[: node.end_col_offset].decode(),
        ]
        return "\n".join(part)

    sections = _sections(lines)
    section_at = lambda n: [name for start, name in sections if start <= n][-1]
    entries, args, presets, keys, periodic, main_source = [], [], [], set(), [], (0, 0, "")
    for node in tree.body:
        line = getattr(node, "lineno", 0)
        if isinstance(node, ast.ClassDef | ast.FunctionDef):
            kind = "class" if isinstance(node, ast.ClassDef) else "function"
            members = (
                [b.name for b in node.body if isinstance(b, ast.FunctionDef) and not b.name.startswith("__")]
                if kind == "class"
                else []
            )
            deco = [ast.unparse(d) for d in getattr(node, "decorator_list", [])]
            summary = first_sentence(ast.get_docstring(node))
            if node.name == "Args" and not summary:
                summary = "The script's flags: the table below."
            if node.name == "main":
                main_source = (node.lineno, node.end_lineno, segment(node))
            if "compiled" in deco:
                summary = (summary + " " if summary else "") + "(compiled by `--compile`)"
            entries.append(Entry(section_at(line), kind, node.name, line, summary, members))
        elif isinstance(node, ast.Assign) and len(node.targets) == 1 and isinstance(node.targets[0], ast.Name):
            name = node.targets[0].id
            if name not in ("ROOT", "SCRIPT", "PRESETS") and isinstance(node.value, ast.Call):
                comment = lines[line - 2].lstrip("# ").strip() if line > 1 and lines[line - 2].startswith("#") else ""
                entries.append(
                    Entry(section_at(line), "value", name, line, comment or f"`{ast.unparse(node.value.func)}(...)`", [])
                )
        if isinstance(node, ast.ClassDef) and node.name == "Args":
            group = ""
            for i, b in enumerate(node.body):
                if isinstance(b, ast.AnnAssign) and isinstance(b.target, ast.Name):
                    after = node.body[i + 1] if i + 1 < len(node.body) else None
                    documented = isinstance(after, ast.Expr) and isinstance(after.value, ast.Constant)
                    helptext = after.value.value if documented else ""
                    for n in range(b.lineno - 1, 0, -1):  # the group comment above the field, if any
                        text = lines[n - 1].strip()
                        if text.startswith("#"):
                            group = text.lstrip("# ").split(":")[0]
                            break
                        if text and not text.startswith('"""') and not text.endswith('"""'):
                            break
                    default = segment(b.value) if b.value is not None else ""
                    args.append((group, b.target.id, default, " ".join(helptext.split())))
        if isinstance(node, ast.Assign) and any(isinstance(t, ast.Name) and t.id == "PRESETS" for t in node.targets):
            prev_end = node.lineno
            for k, v in zip(node.value.keys, node.value.values):
                comment = [
                    ln.strip().lstrip("#").strip() for ln in lines[prev_end : k.lineno - 1] if ln.strip().startswith("#")
                ]
                settings = [f"{kw.arg}={segment(kw.value)}" for kw in getattr(v, "keywords", []) if kw.arg != "preset"]
                presets.append((k.value, " ".join(comment), settings))
                prev_end = v.end_lineno
    for node in ast.walk(tree):  # the statistics a row logs: the keys of the dicts of detached values, and periodic's
        if isinstance(node, ast.Dict):
            values = [ast.unparse(v) for v in node.values]
            spread = [ast.unparse(v) for k, v in zip(node.keys, node.values) if k is None]
            if any(".detach()" in v for v in values) or any("stats" in s for s in spread):
                keys |= {k.value for k in node.keys if isinstance(k, ast.Constant) and isinstance(k.value, str)}
        if isinstance(node, ast.Assign) and isinstance(node.targets[0], ast.Subscript):
            t = node.targets[0]
            if isinstance(t.value, ast.Name) and t.value.id == "stats" and isinstance(t.slice, ast.Constant):
                keys.add(t.slice.value)
        if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.func.attr == "periodic":
            periodic = [kw.arg for kw in node.keywords if kw.arg] + [
                f"**{ast.unparse(kw.value)}" for kw in node.keywords if kw.arg is None
            ]
    return {
        "doc": ast.get_docstring(tree) or "",
        "lines": len(lines),
        "source": source,
        "sections": sections,
        "entries": entries,
        "args": args,
        "presets": presets,
        "stats": sorted(keys),
        "periodic": periodic,
        "main": main_source,
    }


def about_markdown(name: str, s: dict) -> str:
    names = {e.name for e in s["entries"]}
    doc = s["doc"]
    return (
        f"The script's own summary (the docstring of `algos/{name}.py`, {s['lines']} lines today):\n\n"
        + "\n".join("> " + ln if ln else ">" for ln in docstring_markdown(doc, names).splitlines())
        + "\n"
    )


def structure_markdown(name: str, s: dict) -> str:
    out = [
        f"Read top to bottom, `algos/{name}.py` is these sections, in this order (its section markers, "
        "`# ---- name`), each with the functions and classes it defines:\n"
    ]
    rows, previous = [], None
    for e in s["entries"]:
        what = escape(e.summary, table=True)
        if e.members:
            what += (" " if what else "") + "Methods: " + ", ".join(f"`{m}`" for m in e.members) + "."
        section = f"**{escape(e.section, True)}**" if e.section != previous else ""
        previous = e.section
        kind = {"class": "class ", "function": "", "value": ""}[e.kind]
        rows.append([section, f"{kind}`{e.name}`<br>line {e.line}", what])
    out.append(table(["section", "name", "what it is (its docstring's first sentence)"], rows))
    defined = {e.name for e in s["entries"]}
    flags = s["args"]
    start, end, body = s["main"]
    if body:
        out.append(
            f"\n#### The loop: `main` (lines {start}-{end})\n\n`main` is the whole algorithm in the order it runs: "
            "the run's lifecycle calls (`shared.run.Run`, see [the contract](../contract.md#how-a-script-is-built))"
            " around the loop over iterations.\n\n```python\n" + body + "\n```\n"
        )
    out.append(
        f"\n#### Flags (`Args`)\n\nThe script's own flags, after the run flags every script shares "
        f"(`shared.cli.RunArgs`: see [the contract](../contract.md#command-line)). "
        f"`python algos/{name}.py --help` prints the same.\n"
    )
    out.append(
        table(
            ["group", "flag", "default", "help"],
            [
                [escape(g, True), f"`--{f.replace('_', '-')}`", f"`{d}`".replace("|", "\\|"), escape(h, True)]
                for g, f, d, h in flags
            ],
        )
    )
    out.append(
        "\n#### Presets (`PRESETS`)\n\n`--preset NAME` starts from these settings; any flag given overrides "
        "them. The comments are the script's, with the sources of the values.\n"
    )
    out.append(
        table(
            ["preset", "where the values come from", "settings it changes"],
            [
                [
                    f"`{p}`",
                    code_names(c, defined).replace("|", "\\|") or "the defaults above",
                    "<br>".join(f"`{x}`" for x in st) or "none",
                ]
                for p, c, st in s["presets"]
            ],
        )
    )
    logged = ", ".join(f"`{k}`" for k in s["stats"])
    extra = ", ".join(f"`{k}`" for k in s["periodic"])
    if "**waits" in s["periodic"]:
        extra += (
            " (`waits`: `wait_s` and `sampler_wait_s`, the seconds the learner and the sampler waited for each "
            "other in async mode and under torchrun, `shared/pacing.py`)"
        )
    out.append(
        "\n#### What a progress row logs\n\nEvery row of `progress.csv` (and the TensorBoard scalars) starts "
        "with " + ", ".join(f"`{c}`" for c in BASE_COLUMNS) + f"; this script adds the statistics its "
        f"losses return, {logged}, and what `main` passes to `run.periodic`: {extra} (read from the source).\n"
    )
    fence = "````"
    listing = textwrap.indent(f'{fence}python linenums="1"\n{s["source"].rstrip()}\n{fence}', "    ")
    out.append(f'\n??? abstract "The whole script, `algos/{name}.py` ({s["lines"]} lines)"\n\n{listing}\n')
    return "\n".join(out)


def presets_markdown(all_structures: dict[str, dict]) -> str:
    """Every preset of every script (links relative to docs/, where getting-started.md includes it)."""
    rows = []
    for name, s in all_structures.items():
        for p, comment, settings in s["presets"]:
            rows.append(
                [
                    f"[`{name}`](algos/{name}.md)",
                    f"`--preset {p}`",
                    escape(" ".join(comment.split()[:40]) + (" ..." if len(comment.split()) > 40 else ""), True)
                    or "the script's defaults",
                    ", ".join(f"`{x}`" for x in settings if x.split("=")[0] in ("env_id", "total_timesteps")) or "-",
                ]
            )
    return table(["script", "preset", "where its values come from (the script's comment)", "env and budget"], rows)


# ----------------------------------------------------------------------------------------- result blocks


class Notebook:
    """``benchmarks/results/README.md`` by its ``##`` sections (grouped under ``#`` headings: speed, learning, GPU)."""

    def __init__(self, path: Path = NOTEBOOK):
        self.path = path
        self.text = path.read_text()
        self.sections: dict[str, str] = {}
        for part in re.split(r"^(?=##? )", self.text, flags=re.M):  # a group's heading (#) ends a section too
            if part.startswith("## "):
                title, _, body = part.partition("\n")
                self.sections[title[3:].strip()] = body

    def find(self, prefix: str) -> tuple[str, str]:
        hits = [t for t in self.sections if t.startswith(prefix)]
        if len(hits) != 1:
            raise KeyError(
                f"{self.path}: {len(hits)} sections start with {prefix!r} (the site "
                f"quotes exactly one; headings: {', '.join(repr(t) for t in self.sections)})"
            )
        return hits[0], self.sections[hits[0]]


def fix_images(text: str, copied: set[str]) -> str:
    """The notebook's images, relative to benchmarks/results/, as the site's copies."""

    def sub(m):
        copied.add(m.group(2))
        return f"![{m.group(1)}]({IMG}/{m.group(2)})"

    return re.sub(r"!\[([^\]]*)\]\(([\w.-]+\.png)\)", sub, text)


def demote(text: str, levels: int) -> str:
    return re.sub(r"^(#+) ", lambda m: "#" * min(len(m.group(1)) + levels, 6) + " ", text, flags=re.M)


@dataclass
class Context:
    out: Path  # the folder being written (docs/generated's replacement)
    notebook: Notebook
    images: set  # committed PNGs to copy
    figures: list  # PNGs drawn (names under img/)
    cache: dict = field(default_factory=dict)  # what two pages show alike is computed once


Block = Callable[[Context], str]


def quote(prefix: str, bullets: tuple[str, ...] = (), rows: tuple[str, ...] = (), level: int = 4) -> Block:
    """A section of the lab notebook as it stands: whole, only its bullets starting with ``bullets`` (bold label
    prefixes), or only its tables' rows containing one of ``rows`` (the header kept)."""

    def block(ctx: Context) -> str:
        title, body = ctx.notebook.find(prefix)
        if bullets:
            items = re.findall(r"^- \*\*.*?(?=^- |^\S|\Z)", body, flags=re.M | re.S)
            picked = [it.rstrip() for it in items if any(it.startswith(f"- **{b}") for b in bullets)]
            if not picked:
                raise KeyError(f"notebook section {title!r}: no bullet starts with any of {bullets}")
            body = "\n".join(picked) + "\n"
        elif rows:
            kept, n = [], 0
            for table_lines in re.findall(r"(?:^\|.*\n)+", body, flags=re.M):
                tl = table_lines.splitlines()
                hit = [ln for ln in tl[2:] if any(r in ln for r in rows)]
                if hit:
                    kept.append("\n".join(tl[:2] + hit))
                    n += len(hit)
            if not n:
                raise KeyError(f"notebook section {title!r}: no table row contains any of {rows}")
            body = "\n\n".join(kept) + "\n"
        anchor = slugify(title.replace("`", ""), "-")
        short, _, command = title.partition(" (`")  # the heading without its command, which the note gives
        head = "#" * level + f" {escape(short)}\n\n" if level else ""
        command = f" (`{command}" if command else ""
        note = (
            f"From [the lab notebook](../results/notebook.md#{anchor}){command}"
            f"{', the rows of this script' if rows else ''}{', an excerpt' if bullets else ''}:\n\n"
        )
        return head + note + demote(fix_images(body.strip(), ctx.images), level - 2 if level else 2) + "\n"

    return block


def figure(png: str, caption: str) -> Block:
    """A committed PNG (drawn by a benchmark with experiments/plot.py) with its caption."""

    def block(ctx: Context) -> str:
        if not (RESULTS / png).is_file():
            raise FileNotFoundError(f"benchmarks/results/{png}")
        ctx.images.add(png)
        return f"![{escape(caption)}]({IMG}/{png})\n\n*{escape(caption)}* (`benchmarks/results/{png}`)\n"

    return block


def recheck_rows(script: str | None) -> list[tuple[str, dict]]:
    data = json.loads((RESULTS / "recheck.json").read_text())
    return [(k, v) for k, v in data.items() if script is None or f"algos/{script}.py" in v["command"]]


def recheck_block(script: str | None = None, level: int = 4) -> Block:
    """The cheap learning figures of ``benchmarks/results/recheck.json``: every seed, the mean and its 95%
    percentile-bootstrap interval (``benchmarks/checks/recheck_learning.py``'s)."""

    def block(ctx: Context) -> str:
        rc = recheck()
        picked = recheck_rows(script)
        if not picked:
            raise KeyError(f"recheck.json: no figure of algos/{script}.py")
        rows = []
        for name, rec in picked:
            mean, lo, hi = rc.interval(rec["values"])
            rows.append(
                [
                    name,
                    f"`{rec['command']}`",
                    str(len(rec["values"])),
                    f"**{num(mean)}** [{num(lo)}, {num(hi)}]",
                    ", ".join(num(v, 0) for v in rec["values"]),
                    rec["commit"],
                    rec.get("date", "-"),
                    escape(rec.get("cpu", "-"), True),
                ]
            )
        head = "#" * level + " Several seeds, re-measured by one command\n\n" if level else ""
        return (
            head + "The figure of a run is the mean return of the training episodes that end in the last tenth "
            "of its steps; over seeds: the mean and a 95% percentile-bootstrap interval "
            "(`benchmarks/checks/recheck_learning.py`, which re-measures them: "
            "`taskset -c 0 python benchmarks/checks/recheck_learning.py`). From "
            "`benchmarks/results/recheck.json`.\n\n"
            + table(["figure", "command", "seeds", "mean [95% interval]", "per seed", "commit", "date", "CPU"], rows)
        )

    return block


@functools.cache
def _mean_interval(scores: tuple[float, ...]) -> tuple[float, float, float, float]:
    """Mean, std (ddof=1) and the 95% stratified-bootstrap interval of the mean over seeds, as
    ``experiments/report.py``'s ``group_stats`` gives them (rliable, 2,000 resamples, the same draws), without its
    IQM (whose resampling costs 20 times as much): no interval for one seed, the point for equal seeds."""
    import numpy as np

    x = np.asarray(scores, np.float64).reshape(-1, 1)
    mean, std = float(x.mean()), float(x.std(ddof=1)) if len(x) > 1 else float("nan")
    if len(x) < 2:
        return mean, std, float("nan"), float("nan")
    if np.ptp(x) == 0:
        return mean, std, mean, mean
    from rliable import metrics

    _, cis = report()._bootstrap(
        {"g": x}, lambda s: np.array([metrics.aggregate_mean(s)]), reps=2000, random_state=np.random.RandomState(0)
    )
    return mean, std, float(cis["g"][0, 0]), float(cis["g"][1, 0])


def mean_interval(scores) -> tuple[float, float, float, float]:
    return _mean_interval(tuple(float(x) for x in scores))


def _stats_row(g, label: str | None = None) -> list[str]:
    mean, std, lo, hi = mean_interval(g.scores)
    ci = "-" if lo != lo else f"[{num(lo)}, {num(hi)}]"
    seeds = ", ".join(f"{r.seed}: {num(r.score)}" for r in g.runs)
    return [label or f"`{g.script}`", g.env_id, str(len(g.runs)), f"**{num(mean)}**", num(std), ci, seeds, g.source]


STATS_HEADER = ["run", "env", "seeds", "mean", "std", "95% CI of the mean", "per seed", "score"]


def experiment(
    folders: list[tuple[str, str]],
    script: str | None,
    title: str,
    caption: str,
    smooth: int = 1,
    last: int = 100,
    level: int = 4,
) -> Block:
    """Run folders of launcher experiments under benchmarks/results (``(folder, label)``; the label names a variant
    when several folders hold the same script and env): the table of final scores over seeds
    (``experiments/report.py``: eval.json's mean, else the last ``last`` training episodes; rliable's 95%
    stratified-bootstrap interval) and one figure per env id of the training curves (``experiments/plot.py``: the
    mean over seeds, the min-max band shaded)."""

    def block(ctx: Context) -> str:
        rep, pl = report(), plot()
        rows, curves = [], {}
        for folder, label in folders:
            groups = [g for g in rep.collect(RESULTS / folder, "auto", last, False) if script in (None, g.script)]
            if not groups:
                raise FileNotFoundError(f"benchmarks/results/{folder}: no finished run of {script or 'any script'}")
            for g in groups:
                name = f"`{g.script}`" + (f", {label}" if label else "")
                rows.append(_stats_row(g, name))
                runs = [pl.read_run(r.folder)[2] for r in g.runs]
                curves.setdefault(g.env_id, []).append((f"{g.script}" + (f", {label}" if label else ""), runs))
        out = [
            "#" * level + f" {escape(title)}\n" if level else "",
            f"From `benchmarks/results/{'`, `'.join(f for f, _ in folders)}` (each run's `progress.csv`, "
            "`config.json`, `eval.json`, `launch.json`). Score: `eval` is the mean of the evaluation episodes "
            f"after training (`eval.json`), `train` the mean of the last {last} training episodes; the interval is "
            "rliable's stratified bootstrap over seeds (`experiments/report.py`), none with one seed.\n",
            table(STATS_HEADER, rows),
        ]
        for env_id, lines in curves.items():
            png = re.sub(r"[^a-z0-9]+", "_", f"{script or 'all'} {title} {env_id}".lower()).strip("_") + ".png"
            if png in ctx.figures:
                raise ValueError(f"two figures would be {png}: give the blocks different titles")
            fig, axes = pl.figure()
            for label, runs in lines:
                pl.curve(axes[0], label, runs, smooth)
            axes[0].set_title(env_id)
            pl.save(fig, ctx.out / "img" / png, ylabel="training return (mean per progress row)")
            _close(fig)
            ctx.figures.append(png)
            out.append(
                f"\n![{escape(env_id)}: {escape(caption)}]({IMG}/{png})\n\n*{escape(env_id)}: {escape(caption)}; "
                f"the mean over seeds, the band from the lowest to the highest seed"
                f"{f', each smoothed over {smooth} rows' if smooth > 1 else ''}.*\n"
            )
        return "\n".join(out)

    return block


def _close(fig) -> None:
    import matplotlib.pyplot as plt

    plt.close(fig)


def atari100k_block(level: int = 4, curves: bool = True) -> Block:
    """Data-efficient Rainbow on the Atari 100k games: ``benchmarks/learning/atari100k.py``'s table (ours over seeds beside
    the published DER, random and human scores it holds; human-normalised aggregates with rliable's intervals) and
    the training curves of every game."""

    def block(ctx: Context) -> str:
        a100 = _module(ROOT / "benchmarks" / "learning" / "atari100k.py", "benchmarks_atari100k")
        root = RESULTS / "atari100k"
        out = [
            "#" * level + " Atari 100k: data-efficient Rainbow beside the published scores\n" if level else "",
            "`python algos/catdqn_atari.py --preset atari100k --env-id GAME --seed S`, run by `python "
            "benchmarks/learning/atari100k.py`; ours: the mean over seeds of each run's 100 evaluation episodes after "
            "100k agent steps. DER: data-efficient Rainbow as published (van Hasselt et al. 2019, tabulated "
            "in the SPR paper); random and human: the Atari 100k reference scores; HNS: human-normalised score. "
            "From `benchmarks/results/atari100k/` and the published scores in `benchmarks/learning/atari100k.py`.\n",
        ]
        if "atari100k" not in ctx.cache:
            games = [g for g in report().collect(root, "eval", 100, False) if g.script == "catdqn_atari"]
            ctx.cache["atari100k"] = games, a100.table(root, list(a100.SCORES), 2000), [_stats_row(g) for g in games]
        games, published, intervals = ctx.cache["atari100k"]
        out.append(published)
        out.append("\nPer game over seeds, with rliable's 95% stratified-bootstrap interval of the mean:\n")
        out.append(table(STATS_HEADER, intervals))
        if curves and "atari100k_curves.png" not in ctx.figures:
            pl = plot()
            import matplotlib

            matplotlib.use("Agg")
            import matplotlib.pyplot as plt

            cols = 4
            rows_n = -(-len(games) // cols)
            fig, axes = plt.subplots(rows_n, cols, figsize=(4.2 * cols, 3.2 * rows_n), squeeze=False)
            flat = list(axes.flat)
            for ax, g in zip(flat, games):
                pl.curve(ax, "catdqn_atari", [pl.read_run(r.folder)[2] for r in g.runs], 5)
                ax.set_title(g.env_id.replace("NoFrameskip-v4", ""))
            for ax in flat[len(games) :]:
                ax.axis("off")
            pl.save(
                fig,
                ctx.out / "img" / "atari100k_curves.png",
                axes=flat[: len(games)],
                xlabel="agent steps",
                ylabel="training return",
            )
            plt.close(fig)
            ctx.figures.append("atari100k_curves.png")
        if curves:
            out.append(
                f"\n![Atari 100k training curves]({IMG}/atari100k_curves.png)\n\n*Training returns (whole games) "
                "against agent steps, each game's mean over seeds with the band from the lowest to the highest "
                "seed, smoothed over 5 rows. The score above is the evaluation after training, not this curve.*\n"
            )
        return "\n".join(out)

    return block


def minigrid_block(level: int = 4) -> Block:
    """ppo_atari.py beside SB3's PPO on MiniGrid-DoorKey-5x5 from its Dict observation: per-seed final returns from
    ``minigrid/100k/summary.json`` and both curves over the seeds from each run's ``progress.csv``."""

    def block(ctx: Context) -> str:
        rc, pl = recheck(), plot()
        root = RESULTS / "minigrid" / "100k"
        summary = json.loads((root / "summary.json").read_text())
        rows, lines = [], []
        for side, label in (("ours", "`ppo_atari.py`"), ("sb3", "SB3 2.9.2 PPO, `MultiInputPolicy`, the same torso")):
            seeds = sorted(summary[side].values(), key=lambda r: r["seed"])
            values = [r["final_return"] for r in seeds]
            mean, lo, hi = rc.interval(values)
            rows.append(
                [
                    label,
                    str(len(values)),
                    f"**{num(mean, 3)}** [{num(lo, 3)}, {num(hi, 3)}]",
                    ", ".join(f"{r['seed']}: {num(r['final_return'], 3)}" for r in seeds),
                ]
            )
            runs = []
            for r in seeds:
                with open(root / f"{side}_{r['seed']}" / "progress.csv", newline="") as f:
                    runs.append(
                        [(float(x["global_step"]), float(x["return_mean"])) for x in csv.DictReader(f) if x.get("return_mean")]
                    )
            lines.append((label.replace("`", ""), runs))
        fig, axes = pl.figure()
        for label, runs in lines:
            pl.curve(axes[0], label, runs, 3)
        axes[0].set_title(summary.get("env", "MiniGrid"))
        pl.save(fig, ctx.out / "img" / "minigrid_doorkey.png", ylabel="training return (mean per progress row)")
        _close(fig)
        ctx.figures.append("minigrid_doorkey.png")
        return (
            "#" * level + " MiniGrid DoorKey 5x5 from its Dict observation, beside Stable-Baselines3\n\n"
            "rl-baselines3-zoo's PPO settings on both sides, 100k steps; the figure is the mean return of the "
            "episodes of the last tenth, over seeds with a 95% percentile-bootstrap interval. From "
            "`benchmarks/results/minigrid/100k/` (`summary.json` and each run's `progress.csv`).\n\n"
            + table(["implementation", "seeds", "final return [95% interval]", "per seed"], rows)
            + f"\n![MiniGrid DoorKey]({IMG}/minigrid_doorkey.png)\n\n*MiniGrid-DoorKey-5x5, ours and SB3: the mean over "
            "3 seeds, the band from the lowest to the highest seed, smoothed over 3 rows.*\n"
        )

    return block


def run_folder_markdown() -> str:
    """A committed run folder, as an example of what every run writes."""
    folder = RESULTS / "ppo-hopper-1m" / "ppo_mujoco" / "Hopper-v5" / "base" / "seed1"
    rel = folder.relative_to(ROOT)
    files = sorted(p.name for p in folder.iterdir())
    config = json.loads((folder / "config.json").read_text())
    with open(folder / "progress.csv", newline="") as f:
        reader = list(csv.reader(f))
    header, rows = reader[0], reader[1:4] + [reader[-1]]
    ev = json.loads((folder / "eval.json").read_text())
    short = {k: config[k] for k in list(config)[:6] if k != "args"}
    args = config.get("args", {})
    return (
        f"A real one, committed with the results: `{rel}/` (`python algos/ppo_mujoco.py --env-id Hopper-v5 "
        f"--total-timesteps 1000000`, run by the launcher, which adds `launch.json`). Its files: "
        + ", ".join(f"`{n}`" for n in files)
        + ". The checkpoint is not kept in the repository.\n\n"
        f"`config.json` holds the exact arguments ({len(args)} of them) and the facts of the run:\n\n"
        "```json\n"
        + json.dumps({**short, "args": {k: args[k] for k in list(args)[:8]} | {"...": "..."}}, indent=1)
        + "\n```\n\n`progress.csv`, one row per `--log-every` (its first rows and its last):\n\n"
        + table([f"`{h}`" for h in header], [[c if len(c) < 12 else f"{float(c):.4g}" for c in r] for r in rows])
        + f"\n`eval.json`: the {len(ev.get('returns', []))} evaluation episodes after training "
        f"(keys: {', '.join(f'`{k}`' for k in ev)}).\n"
    )


def docstring_page(path: Path) -> str:
    source = path.read_text()
    return docstring_markdown(ast.get_docstring(ast.parse(source)) or "")


# --------------------------------------------------------------------------------------- what goes where

IMG_CAP = "the mean over seeds, with the band from the lowest to the highest seed"

RESULTS_BY_SCRIPT: dict[str, list[Block]] = {
    "ppo_atari": [
        recheck_block("ppo_atari"),
        quote("Atari learning, Breakout"),
        figure(
            "atari_breakout.png",
            "Breakout, 500k agent steps: ppo_atari.py and a2c_atari.py, one seed each "
            "(benchmarks/learning/breakout_vs_sb3.py; SB3's PPO is in the table)",
        ),
        minigrid_block(),
        quote("Learning curves, CartPole-v1 (", level=4),
        quote("PPO training vs Stable-Baselines3"),
        quote("PPO sampling, Atari"),
        quote("Invalid-action masking"),
        quote("Data-parallel scaling"),
        quote("`--compile` against eager", rows=("ppo_atari",)),
    ],
    "a2c_atari": [
        recheck_block("a2c_atari"),
        quote("Atari learning, Breakout"),
        figure(
            "atari_breakout.png",
            "Breakout, 500k agent steps: ppo_atari.py and a2c_atari.py, one seed each "
            "(benchmarks/learning/breakout_vs_sb3.py; SB3's PPO is in the table)",
        ),
        quote("Learning curves, CartPole-v1 (", level=4),
        quote("`--compile` against eager", rows=("a2c_atari",)),
    ],
    "ppo_lstm": [
        recheck_block("ppo_lstm"),
        experiment(
            [("ppo_lstm-breakout-500k", "")], "ppo_lstm", "Breakout, 500k agent steps", "ppo_lstm.py, one seed", smooth=10
        ),
        quote("Recurrent PPO vs sb3-contrib RecurrentPPO"),
        quote("`--compile` against eager", rows=("ppo_lstm",)),
    ],
    "ppo_mujoco": [
        recheck_block("ppo_mujoco"),
        experiment([("ppo-hopper-1m", "")], "ppo_mujoco", "Hopper-v5, 1M steps, 3 seeds", "ppo_mujoco.py, 1M steps", smooth=5),
        quote("TD3 and SAC at 100k steps", bullets=("PPO Hopper",)),
        quote("Learning, PPO on InvertedPendulum-v5 and HalfCheetah-v5"),
        quote("PPO for continuous actions vs Stable-Baselines3"),
        quote("`--compile` against eager", rows=("ppo_mujoco",)),
    ],
    "dqn_atari": [
        recheck_block("dqn_atari"),
        quote("Learning curves, CartPole-v1, DQN and C51"),
        quote("DQN and C51 training vs Stable-Baselines3"),
        quote("Replay memory"),
        quote("A long run does not grow"),
        quote("`--compile` against eager", rows=("dqn_atari",)),
    ],
    "catdqn_atari": [
        atari100k_block(),
        quote("Atari 100k: data-efficient Rainbow"),
        recheck_block("catdqn_atari"),
        quote("Learning curves, CartPole-v1, DQN and C51"),
        quote("DQN and C51 training vs Stable-Baselines3"),
        quote("Evaluation on a vector of envs"),
        quote("`--compile` against eager", rows=("catdqn_atari",)),
    ],
    "r2d1_atari": [
        recheck_block("r2d1_atari"),
        quote("R2D1 memory task"),
        quote("R2D1 speed"),
        quote("`--compile` against eager", rows=("r2d1_atari",)),
    ],
    "sac_mujoco": [
        experiment(
            [("offpolicy-100k", "")],
            "sac_mujoco",
            "HalfCheetah-v5 and Hopper-v5, 100k steps, 3 seeds",
            "sac_mujoco.py, 100k steps",
        ),
        quote("TD3 and SAC at 100k steps", bullets=("SAC HalfCheetah", "SAC Hopper")),
        quote("Learning curves, Pendulum-v1"),
        quote("Learning curves, HalfCheetah-v5, 30 minutes"),
        quote("DDPG, TD3 and SAC training vs Stable-Baselines3"),
        quote("`--compile` against eager", rows=("sac_mujoco",)),
    ],
    "td3_mujoco": [
        experiment(
            [
                ("offpolicy-100k", "the preset"),
                ("td3-start10k-100k", "10k random steps (the paper's)"),
                ("td3-paper-100k", "the paper's hyperparameters"),
            ],
            "td3_mujoco",
            "HalfCheetah-v5 and Hopper-v5, 100k steps, 3 seeds",
            "td3_mujoco.py, 100k steps",
        ),
        quote("TD3 and SAC at 100k steps", bullets=("TD3 HalfCheetah", "TD3 Hopper")),
        quote("Learning curves, Pendulum-v1"),
        quote("Learning curves, HalfCheetah-v5, 30 minutes"),
        quote("DDPG, TD3 and SAC training vs Stable-Baselines3"),
        quote("`--compile` against eager", rows=("td3_mujoco",)),
    ],
    "ddpg_mujoco": [
        experiment([("ddpg-100k", "")], "ddpg_mujoco", "HalfCheetah-v5, 100k steps, 3 seeds", "ddpg_mujoco.py, 100k steps"),
        quote("TD3 and SAC at 100k steps", bullets=("DDPG HalfCheetah",)),
        quote("Learning curves, Pendulum-v1"),
        quote("Learning curves, HalfCheetah-v5, 30 minutes"),
        quote("DDPG, TD3 and SAC training vs Stable-Baselines3"),
        quote("`--compile` against eager", rows=("ddpg_mujoco",)),
    ],
}

RESULTS_PAGES: dict[str, list[Block]] = {
    "atari100k": [atari100k_block(level=0)],
    "mujoco": [
        experiment(
            [("offpolicy-100k", ""), ("ddpg-100k", "")],
            None,
            "TD3, SAC and DDPG at 100k steps",
            "100k steps, 3 seeds",
            level=3,
        ),
        experiment(
            [("td3-start10k-100k", "10k random steps (the paper's)"), ("td3-paper-100k", "the paper's hyperparameters")],
            "td3_mujoco",
            "TD3 with the paper's settings",
            "td3_mujoco.py, the paper's settings",
            level=3,
        ),
        experiment(
            [("ppo-hopper-1m", "")], "ppo_mujoco", "PPO, Hopper-v5, 1M steps", "ppo_mujoco.py, 1M steps", smooth=5, level=3
        ),
        quote("TD3 and SAC at 100k steps", level=3),
    ],
    "cheap": [recheck_block(None, level=0)],
    "speed": [
        quote("PPO training vs Stable-Baselines3", level=3),
        quote("DQN and C51 training vs Stable-Baselines3", level=3),
        quote("DDPG, TD3 and SAC training vs Stable-Baselines3", level=3),
        quote("PPO for continuous actions vs Stable-Baselines3", level=3),
        quote("R2D1 speed", level=3),
        quote("`--compile` against eager", level=3),
        quote("GPU figures", level=3),
        quote("Data-parallel scaling", level=3),
        quote("PPO sampling, Atari", level=3),
        quote("Replay memory", level=3),
        quote("Prioritized replay bookkeeping", level=3),
        quote("Saving a 1M-transition Atari replay", level=3),
    ],
}


# ------------------------------------------------------------------------------------------ generation


def write_all(out: Path) -> list[str]:
    """Every generated file under ``out``; returns the figures drawn."""
    ctx = Context(out, Notebook(), set(), [])
    (out / "img").mkdir(parents=True, exist_ok=True)
    structures = {name: structure(ROOT / "algos" / f"{name}.py") for name in SCRIPTS}
    for name, s in structures.items():
        d = out / name
        d.mkdir(parents=True, exist_ok=True)
        (d / "about.md").write_text(about_markdown(name, s))
        (d / "structure.md").write_text(structure_markdown(name, s))
        (d / "results.md").write_text("\n".join(block(ctx) for block in RESULTS_BY_SCRIPT[name]))
    (out / "presets.md").write_text(presets_markdown(structures))
    (out / "run_folder.md").write_text(run_folder_markdown())
    (out / "launch.md").write_text(docstring_page(ROOT / "experiments" / "launch.py"))
    (out / "report.md").write_text(docstring_page(ROOT / "experiments" / "report.py"))
    (out / "tune.md").write_text(docstring_page(ROOT / "experiments" / "tune.py"))
    (out / "results").mkdir(exist_ok=True)
    for page, blocks in RESULTS_PAGES.items():
        (out / "results" / f"{page}.md").write_text("\n".join(block(ctx) for block in blocks))
    notebook = fix_images(ctx.notebook.text, ctx.images)
    (out / "results" / "notebook.md").write_text(notebook)
    for png in sorted(ctx.images):
        if not (RESULTS / png).is_file():
            raise FileNotFoundError(f"benchmarks/results/{png} (named in the notebook)")
        shutil.copyfile(RESULTS / png, out / "img" / png)
    return ctx.figures


def sync(src: Path, dst: Path) -> int:
    """Make ``dst`` hold exactly ``src``'s files, writing only those whose bytes differ; returns how many changed."""
    changed = 0
    want = {p.relative_to(src) for p in src.rglob("*") if p.is_file()}
    if dst.exists():
        for p in sorted(dst.rglob("*"), reverse=True):
            if p.is_file() and p.relative_to(dst) not in want:
                p.unlink()
                changed += 1
            elif p.is_dir() and not any(p.iterdir()):
                p.rmdir()
    for rel in sorted(want):
        target = dst / rel
        data = (src / rel).read_bytes()
        if not target.is_file() or target.read_bytes() != data:
            target.parent.mkdir(parents=True, exist_ok=True)
            target.write_bytes(data)
            changed += 1
    return changed


def generate(out: Path = OUT) -> int:
    """Rewrite ``out`` (docs/generated) from the scripts and the results; returns the number of files changed."""
    with tempfile.TemporaryDirectory() as tmp, contextlib.redirect_stdout(io.StringIO()):  # plot.save's "saved ..."
        write_all(Path(tmp))
        return sync(Path(tmp), out)


# ------------------------------------------------------------------------------ mkdocs hooks (mkdocs.yml)


def shared_modules() -> list[str]:
    return sorted(p.stem for p in (ROOT / "shared").glob("*.py") if p.stem != "__init__")


def on_config(config, **kwargs):
    """Snippets come from docs/generated (an absolute path: any working directory), and a missing one fails the
    build; the API section lists every module of shared/."""
    snippets = config.mdx_configs.setdefault("pymdownx.snippets", {})
    snippets["base_path"] = [str(OUT)]
    snippets["check_paths"] = True
    api = [{"Overview": "api/index.md"}] + [{f"shared.{m}": f"api/{m}.md"} for m in shared_modules()]
    config.nav = [item for item in (config.nav or []) if not (isinstance(item, dict) and "API (shared/)" in item)]
    config.nav.append({"API (shared/)": api})
    return config


def on_pre_build(config, **kwargs):
    changed = generate()
    print(f"docs/generate.py: docs/generated up to date ({changed} files changed)", file=sys.stderr)


def on_files(files, config, **kwargs):
    """One API page per module of shared/ (mkdocstrings renders its docstrings), and their index."""
    from mkdocs.structure.files import File

    rows = []
    for m in shared_modules():
        doc = ast.get_docstring(ast.parse((ROOT / "shared" / f"{m}.py").read_text())) or ""
        rows.append([f"[`shared.{m}`]({m}.md)", escape(first_sentence(doc), True)])
        files.append(File.generated(config, f"api/{m}.md", content=f"# `shared.{m}`\n\n::: shared.{m}\n"))
    index = (
        "# API of shared/\n\nThe scripts import what is hard to get right and identical across algorithms from "
        "`shared/`; a researcher who copies a script reads what it imports. Each page is the module's "
        "docstrings, as `help()` would show them.\n\n" + table(["module", "what it is"], rows)
    )
    files.append(File.generated(config, "api/index.md", content=index))
    return files


def main() -> int:
    changed = generate()
    print(f"{OUT.relative_to(ROOT)}: {changed} files changed")
    return 0


if __name__ == "__main__":
    sys.exit(main())
