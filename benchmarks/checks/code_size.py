"""The scripts' reading size against issue 52's targets, in one table: lines, code lines (not blank, comment or
docstring: a line holding a token outside them counts), docstring lines, names imported from shared/, and the code lines
shared verbatim (stripped, 15 characters or more) by all six replay scripts, by dqn/catdqn and by ppo_atari/a2c.

    python benchmarks/checks/code_size.py
"""

from __future__ import annotations

import ast
import io
import sys
import tokenize
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
# the ceilings: 1.8x CleanRL's counterpart; ppo_lstm, r2d1 and a2c by their own rule (a2c: ppo_atari's)
LIMITS = {
    "ppo_atari": 484,
    "dqn_atari": 396,
    "catdqn_atari": 441,
    "sac_mujoco": 473,
    "td3_mujoco": 471,
    "ddpg_mujoco": 381,
    "ppo_mujoco": 522,
    "ppo_lstm": 624,
    "r2d1_atari": 500,
    "a2c_atari": None,
}
TOTAL = 3764  # all ten: issue 68 (issue 52 had 4,200); tests/test_structure.py holds algos/ to it
REPLAY = ["dqn_atari", "catdqn_atari", "r2d1_atari", "sac_mujoco", "td3_mujoco", "ddpg_mujoco"]


def docstring_lines(tree: ast.AST) -> set[int]:
    lines: set[int] = set()
    for node in ast.walk(tree):
        if isinstance(node, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)) and node.body:
            first = node.body[0]
            if isinstance(first, ast.Expr) and isinstance(first.value, ast.Constant) and isinstance(first.value.value, str):
                lines.update(range(first.lineno, first.end_lineno + 1))
    return lines


def measure(path: Path) -> dict:
    src = path.read_text()
    tree = ast.parse(src)
    doc = docstring_lines(tree)
    skip = (tokenize.COMMENT, tokenize.NL, tokenize.NEWLINE, tokenize.INDENT, tokenize.DEDENT, tokenize.ENDMARKER)
    code: set[int] = set()
    for tok in tokenize.generate_tokens(io.StringIO(src).readline):
        if tok.type not in skip:
            code.update(ln for ln in range(tok.start[0], tok.end[0] + 1) if ln not in doc)
    imports = [n for n in ast.walk(tree) if isinstance(n, ast.ImportFrom) and (n.module or "").startswith("shared")]
    names = {a.asname or a.name for n in imports for a in n.names}
    lines = src.splitlines()
    texts = {lines[i - 1].strip() for i in code if len(lines[i - 1].strip()) >= 15}
    return {"lines": len(lines), "code": len(code), "doc": len(doc), "shared_names": len(names), "texts": texts}


def main() -> int:
    got = {p.stem: measure(p) for p in sorted((ROOT / "algos").glob("*.py"))}
    print(f"{'script':14} {'lines':>6} {'code':>6} {'limit':>6} {'doc':>5} {'names':>6}")
    for name, m in got.items():
        limit = LIMITS.get(name) or got["ppo_atari"]["code"]
        flag = "" if m["code"] <= limit else "  over"
        print(f"{name:14} {m['lines']:6} {m['code']:6} {limit:6} {m['doc']:5} {m['shared_names']:6}{flag}")
    total = sum(m["code"] for m in got.values())
    print(f"{'all ten':14} {sum(m['lines'] for m in got.values()):6} {total:6} {TOTAL:6}{'' if total <= TOTAL else '  over'}")
    common = set.intersection(*(got[n]["texts"] for n in REPLAY if n in got))
    print(f"code lines shared by all six replay scripts: {len(common)} (issue 52: under 47)")
    for a, b in (("dqn_atari", "catdqn_atari"), ("ppo_atari", "a2c_atari")):
        print(f"code lines shared by {a} and {b}: {len(got[a]['texts'] & got[b]['texts'])}")
    if "-v" in sys.argv:
        print(*sorted(common), sep="\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
