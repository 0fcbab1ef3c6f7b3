"""A built-in method is one home (issue 53): in the package's code its name appears only in its home
(``agentcredit/credit/methods/<section>.py``, or the package ``credit/methods/<section>/``), its presets and the
registry (``credit/methods/__init__.py`` and ``base.py``).

"Names it in code" reads the module's syntax tree, not its text: an identifier (``tips_stats``, ``TipsSettings``,
``carl_segment``), an imported module path, or a string constant (``"carl-segment"``), split into words, holds the
method's words in a row. Comments, docstrings and descriptions (``Field(description=...)``, a command's ``help``:
they cite the paper a default comes from) are prose and do not count.

Another library's names are that library's, not a method's: a name imported from another library (verl's
``PPOTrainerSync``, from ``verl.trainer.ppo``) and verl's config keys (``ppo_mini_batch_size``). verl's keys are read
from the package's verl presets, which layer on verl's own ``ppo_trainer.yaml``: every key they set outside their
``agentcredit`` block is verl's (that block is ours: ``agentcredit.ppo.lam`` is our method's and still counts). Only
those names are taken out of a term; the rest of it is still read (``critic.ppo_mini_batch_size`` in an error
message is verl's key, ``ppo_scale`` would be ours).

The counts are a ratchet (a method may only lose files, never gain one); today every method is at 0.
Run ``python tests/credit/test_method_homes.py`` for the table of files per method.
"""

from __future__ import annotations

import ast
import re
import sys
from pathlib import Path

import yaml

ROOT = Path(__file__).resolve().parents[2]
PACKAGE = ROOT / "agentcredit"
#: the registry: it finds the methods (``__init__``) and defines what a method is (``base``)
REGISTRY = {"agentcredit/credit/methods/__init__.py", "agentcredit/credit/methods/base.py"}
#: the lab is apart from the library: a study or a probe chooses the methods it compares, which is not part of a
#: method (as tests/test_method_files.py leaves studies/ out)
LAB = "agentcredit/lab/"
BUILT_IN = ("grpo", "ppo", "gigpo", "carl-segment", "carl-critical", "portool", "tips", "gear")

#: verl's presets: layered on verl's own config, so the keys they set outside their ``agentcredit`` block are verl's
VERL_PRESETS = PACKAGE / "integrations" / "verl" / "config"
#: the block of a verl preset that is agentcredit's own (its keys are ours and are read)
OWN_BLOCK = "agentcredit"

#: files outside its home that name each method today (the ratchet: counts only ever go down)
RATCHET = {
    "grpo": 0,
    "ppo": 0,
    "gigpo": 0,
    "carl-segment": 0,
    "carl-critical": 0,
    "portool": 0,
    "tips": 0,
    "gear": 0,
}

_CAMEL = re.compile(r"[A-Z]+(?=[A-Z][a-z])|[A-Z]?[a-z]+|[A-Z]+|[0-9]+")


def words(text: str) -> list[str]:
    """``TipsSettings`` -> tips, settings; ``carl_segment`` / ``"carl-segment"`` -> carl, segment."""
    return [w.lower() for part in re.split(r"[^A-Za-z0-9]+", text) for w in _CAMEL.findall(part)]


def _docstrings(tree: ast.AST) -> set[int]:
    """A string that is a whole statement: a module's, class's or function's docstring, or an attribute's (the
    string after a field, which Sphinx documents the field with)."""
    return {
        id(node.value)
        for node in ast.walk(tree)
        if isinstance(node, ast.Expr)
        and isinstance(node.value, ast.Constant)
        and isinstance(node.value.value, str)
    }


#: keyword arguments whose strings are documentation (a setting's or a command option's description, which cites
#: the paper a default comes from: "carl-segment §2.4"), not code
PROSE_KEYWORDS = {"description", "help"}


def _keys(node) -> set[str]:
    if isinstance(node, dict):
        return {str(k) for k in node} | {k for v in node.values() for k in _keys(v)}
    if isinstance(node, list):
        return {k for v in node for k in _keys(v)}
    return set()


def verl_keys(folder: Path = VERL_PRESETS) -> set[str]:
    """The config keys of verl's own that the package's verl presets set (every key outside their ``agentcredit``
    block and hydra's ``defaults`` / ``hydra`` lists)."""
    out: set[str] = set()
    for path in sorted(folder.rglob("*.yaml")):
        doc = yaml.safe_load(path.read_text()) or {}
        out |= {
            k
            for top, v in doc.items()
            if top not in (OWN_BLOCK, "defaults", "hydra")
            for k in {top} | _keys(v)
        }
    return out


def foreign_imports(tree: ast.AST) -> set[str]:
    """The names a module binds by importing them from another library (``from verl... import PPOTrainerSync``)."""
    return {
        alias.asname or alias.name
        for node in ast.walk(tree)
        if isinstance(node, ast.ImportFrom)
        and not (node.module or "").startswith("agentcredit")
        and node.level == 0
        for alias in node.names
    }


def without_foreign(term: str, foreign: set[str]) -> str:
    """``term`` with another library's names taken out (each a whole identifier), the rest kept to be read."""
    return re.sub(r"[A-Za-z_][A-Za-z0-9_]*", lambda m: " " if m.group(0) in foreign else m.group(0), term)


def code_terms(source: str, foreign_keys: frozenset[str] = frozenset()) -> list[str]:
    """The identifiers, module paths and string constants of a module, docstrings and descriptions left out, and
    another library's names (its imports', ``foreign_keys``) taken out of each."""
    tree = ast.parse(source)
    foreign = foreign_imports(tree) | set(foreign_keys)
    return [t for t in (without_foreign(term, foreign) for term in _code_terms(tree)) if t.strip()]


def _code_terms(tree: ast.AST) -> list[str]:
    skip = _docstrings(tree)
    for node in ast.walk(tree):
        if isinstance(node, ast.keyword) and node.arg in PROSE_KEYWORDS:
            skip |= {id(n) for n in ast.walk(node.value) if isinstance(n, ast.Constant)}
    out: list[str] = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Name):
            out.append(node.id)
        elif isinstance(node, ast.Attribute):
            out.append(node.attr)
        elif isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef):
            out.append(node.name)
        elif isinstance(node, ast.arg):
            out.append(node.arg)
        elif isinstance(node, ast.alias):
            out.extend([node.name, node.asname or ""])
        elif isinstance(node, ast.ImportFrom) and (node.module or "").startswith("agentcredit"):
            out.append(
                node.module or ""
            )  # another library's module path is its name (verl.trainer.ppo), not ours
        elif isinstance(node, ast.keyword) and node.arg:
            out.append(node.arg)
        elif isinstance(node, ast.Constant) and isinstance(node.value, str) and id(node) not in skip:
            out.append(node.value)
    return out


def names_method(terms: list[str], method: str) -> bool:
    target = method.split("-")
    n = len(target)
    for term in terms:
        w = words(term)
        if any(w[i : i + n] == target for i in range(len(w) - n + 1)):
            return True
    return False


def home(method: str) -> tuple[str, str]:
    section = method.replace("-", "_")
    return f"agentcredit/credit/methods/{section}.py", f"agentcredit/credit/methods/{section}/"


def outside_home() -> dict[str, list[str]]:
    """For each built-in method, the package's .py files outside its home and the registry that name it in code."""
    keys = frozenset(verl_keys())
    terms = {
        path.relative_to(ROOT).as_posix(): code_terms(path.read_text(encoding="utf-8"), keys)
        for path in sorted(PACKAGE.rglob("*.py"))
    }
    out: dict[str, list[str]] = {}
    for method in BUILT_IN:
        own_file, own_dir = home(method)
        out[method] = [
            rel
            for rel, t in terms.items()
            if rel != own_file
            and not rel.startswith(own_dir)
            and rel not in REGISTRY
            and not rel.startswith(LAB)
            and names_method(t, method)
        ]
    return out


def presets() -> dict[str, list[str]]:
    """The YAML presets that name each method (allowed: a method's presets are part of it)."""
    files = sorted(PACKAGE.rglob("*.yaml"))
    out: dict[str, list[str]] = {}
    for method in BUILT_IN:
        section = method.replace("-", "_")
        pattern = re.compile(rf"(?<![a-z0-9_-])({re.escape(method)}|{re.escape(section)})(?![a-z0-9_])")
        out[method] = [f.relative_to(ROOT).as_posix() for f in files if pattern.search(f.read_text().lower())]
    return out


def test_the_reading_finds_names_in_code_not_in_prose():
    source = '''"""TIPS and gear in a docstring do not count."""
# carl-segment in a comment does not count
from agentcredit.credit.methods.portool import PortoolSettings
from verl.trainer.ppo.core_algos import register_adv_est
x = {"algorithm.method": "carl-critical"}
def f(settings):
    """ppo here neither."""
    return settings.grpo_scale
y = Field(0.1, description="gigpo in a description neither")
class Limits:
    seconds: float = 5.0
    """gear in an attribute's docstring neither."""
'''
    terms = code_terms(source)
    assert {m for m in BUILT_IN if names_method(terms, m)} == {"portool", "carl-critical", "grpo"}
    assert words("TipsSettings.gear_reweight") == ["tips", "settings", "gear", "reweight"]
    assert not names_method(["segment_advantages", "carl"], "carl-segment")  # the words in a row


def test_no_method_gains_a_file_outside_its_home():
    found = outside_home()
    grown = {m: (len(files), RATCHET[m], files) for m, files in found.items() if len(files) > RATCHET[m]}
    assert not grown, f"a method's name spread to more files outside its home: {grown}"


def test_another_librarys_names_are_its_own_and_ours_are_still_read():
    source = """from verl.trainer.ppo.v1 import PPOTrainerSync
from agentcredit.credit.methods.ppo import PpoSettings
class T(PPOTrainerSync):
    def f(self, cfg):
        cfg.ppo_mini_batch_size = 2
        raise ValueError(f"need critic.ppo_mini_batch_size ({cfg.ppo_epochs}) for our ppo_scale")
"""
    keys = frozenset({"ppo_mini_batch_size", "ppo_epochs"})
    terms = code_terms(source, keys)
    assert not any("PPOTrainerSync" in t or "ppo_mini_batch_size" in t or "ppo_epochs" in t for t in terms)
    assert "PpoSettings" in terms  # an import of ours is ours
    assert any("ppo_scale" in t for t in terms)  # the rest of the message is still read
    assert names_method(terms, "ppo")
    # verl's keys come from the presets, never from their agentcredit block (our method's own settings)
    keys = verl_keys()
    assert {"ppo_mini_batch_size", "ppo_micro_batch_size_per_gpu", "adv_estimator"} <= keys
    assert not keys & {"method", "whiten", "ppo", "tips", "gear", "portool"}


def test_each_method_is_named_only_in_its_home_its_presets_and_the_registry():
    found = outside_home()
    assert not any(found.values()), {m: files for m, files in found.items() if files}


if __name__ == "__main__":  # the table for a report
    found, yaml = outside_home(), presets()
    for method in BUILT_IN:
        print(f"{method:14s} {len(found[method]):3d} files outside its home, {len(yaml[method]):3d} presets")
        if "-v" in sys.argv:
            for rel in found[method]:
                print(f"    {rel}")
