"""scripts/measure_precondition.py: a user's mistake is one line on stderr and exit 2, never a traceback."""

from __future__ import annotations

import importlib.util
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def _main():
    spec = importlib.util.spec_from_file_location(
        "measure_precondition", ROOT / "scripts" / "measure_precondition.py"
    )
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module.main


def test_mistakes_are_one_line_and_exit_2(tmp_path, capsys):
    main = _main()
    study = ROOT / "studies" / "kb-jsoncall-portool-regime.yaml"
    out = tmp_path / "m.json"
    cases = [
        (["--study", str(study), "--model", str(tmp_path / "nope"), "--out", str(out)], "--model"),
        (["--study", str(tmp_path / "missing.yaml"), "--model", str(tmp_path), "--out", str(out)], "--study"),
    ]
    bad = tmp_path / "bad.yaml"
    bad.write_text(study.read_text().replace("seeds: [0, 1, 2]", "seeds: []"))  # one mistake
    cases.append((["--study", str(bad), "--model", str(tmp_path), "--out", str(out)], str(bad)))
    for argv, names in cases:
        assert main(argv) == 2
        err = capsys.readouterr().err.strip()
        assert len(err.splitlines()) == 1 and err.startswith("error: ") and names in err, err
    assert not out.exists()
