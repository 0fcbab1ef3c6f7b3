"""``agentcredit view``: one self-contained HTML page showing where a method put its credit.

Every policy token is a ``<span class="tok">`` whose background is its advantage on a diverging scale (red
negative, white zero, blue positive; |A| at or above the scale is full colour). Tokens sampled but left out of the
update (``in_loss`` false, e.g. carl-critical's unselected actions) get no colour and a dotted outline. Each
policy segment starts with a boundary marker naming its kind (invoke / assimilate / commit, ...), its mean
advantage and, with a critic, V of the state it was generated from. Tool observations are set apart: grey,
monospace, indented, never coloured. The prompt is collapsed.

The page needs no network and no external file: CSS and the few lines of script (a hover read-out and a filter
box) are inline. Records without per-token advantages (``agentcredit eval`` episodes) are shown as plain text.
"""

from __future__ import annotations

import html
import json
import math
from collections.abc import Sequence
from pathlib import Path
from typing import Any

NEGATIVE = (
    178,
    24,
    43,
)  # ColorBrewer RdBu end points: distinguishable for the common colour-vision deficiencies
POSITIVE = (33, 102, 172)
WHITE = (255, 255, 255)


def advantage_colour(advantage: float, scale: float) -> str:
    """CSS colour of an advantage: white at 0, linearly to blue at +scale and red at -scale (clipped beyond)."""
    if scale <= 0 or not math.isfinite(scale):
        raise ValueError(f"colour scale must be a positive finite number, got {scale}")
    if not math.isfinite(advantage):
        raise ValueError(f"advantage must be finite, got {advantage}")
    t = max(-1.0, min(1.0, advantage / scale))
    end = POSITIVE if t >= 0 else NEGATIVE
    rgb = [round(w + abs(t) * (e - w)) for w, e in zip(WHITE, end, strict=True)]
    return f"rgb({rgb[0]},{rgb[1]},{rgb[2]})"


def read_episodes(path: str | Path) -> list[dict[str, Any]]:
    """Records of an episodes JSONL; a bad line is an error naming the file and line."""
    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(f"{path}: no such episodes file")
    records = []
    for lineno, line in enumerate(path.read_text().splitlines(), start=1):
        if not line.strip():
            continue
        try:
            record = json.loads(line)
        except json.JSONDecodeError as exc:
            raise ValueError(f"{path} line {lineno}: not valid JSON ({exc.msg})") from None
        if not isinstance(record, dict) or not isinstance(record.get("segments"), list):
            raise ValueError(f"{path} line {lineno}: an episode record needs a 'segments' list")
        for k, seg in enumerate(record["segments"]):
            _check_segment(seg, f"{path} line {lineno} segment {k}")
        records.append(record)
    if not records:
        raise ValueError(f"{path}: no episodes")
    return records


def _check_segment(seg: Any, where: str) -> None:
    if not isinstance(seg, dict) or seg.get("role") not in ("prompt", "policy", "observation"):
        raise ValueError(f"{where}: needs role 'prompt', 'policy' or 'observation'")
    tokens, adv = seg.get("tokens"), seg.get("advantages")
    if adv is not None:
        if not isinstance(tokens, list) or len(tokens) != len(adv):
            raise ValueError(f"{where}: 'advantages' needs a 'tokens' list of the same length")
        used = seg.get("in_loss")
        if used is not None and len(used) != len(adv):
            raise ValueError(f"{where}: 'in_loss' has {len(used)} entries for {len(adv)} advantages")
        if not all(isinstance(a, int | float) and math.isfinite(a) for a in adv):
            raise ValueError(f"{where}: advantages must be finite numbers")


def default_scale(records: Sequence[dict[str, Any]]) -> float:
    """max |A| over the tokens that entered the loss (1.0 when there are none or all are 0)."""
    biggest = 0.0
    for record in records:
        for seg in record["segments"]:
            adv = seg.get("advantages") or []
            used = seg.get("in_loss") or [True] * len(adv)
            biggest = max([biggest, *(abs(a) for a, u in zip(adv, used, strict=True) if u)])
    return biggest if biggest > 0 else 1.0


def _tokens_html(seg: dict[str, Any], scale: float) -> str:
    adv = seg["advantages"]
    used = seg.get("in_loss") or [True] * len(adv)
    parts = []
    for token, a, u in zip(seg["tokens"], adv, used, strict=True):
        text = html.escape(token)
        if u:
            ink = (
                ";color:#fff" if abs(a) > 0.55 * scale else ""
            )  # keep text readable on the dark end of the scale
            parts.append(
                f'<span class="tok" data-a="{a:.4g}" style="background:{advantage_colour(a, scale)}{ink}">{text}</span>'
            )
        else:
            parts.append(f'<span class="tok off" data-a="{a:.4g}" data-off="1">{text}</span>')
    return "".join(parts)


def _segment_html(seg: dict[str, Any], scale: float) -> str:
    role, kind = seg["role"], html.escape(str(seg.get("kind") or ""))
    if role == "prompt":
        return (
            f'<details class="prompt"><summary>prompt ({seg.get("n_tokens", "?")} tokens)</summary>'
            f"<pre>{html.escape(seg.get('text', ''))}</pre></details>"
        )
    if role == "observation":
        label = (
            "tool output (transient, replaced by its extraction)" if seg.get("transient") else "tool output"
        )
        return (
            f'<div class="obs"><div class="obs-label">{label}</div>'
            f"<pre>{html.escape(seg.get('text', ''))}</pre></div>"
        )
    # an environment's step reward, on the step whose calls it answered (environment.step())
    step_reward = (
        f" · step reward {float(seg['env_reward']):+.3f}" if seg.get("env_reward") is not None else ""
    )
    if seg.get("advantages") is None:
        body = f'<span class="plain">{html.escape(seg.get("text", ""))}</span>'
        label = (kind or "policy") + step_reward
    else:
        adv = seg["advantages"]
        used = [a for a, u in zip(adv, seg.get("in_loss") or [True] * len(adv), strict=True) if u]
        mean = f"mean A {sum(used) / len(used):+.3f}" if used else "not in the update"
        value = f" · V {seg['value']:.3f}" if seg.get("value") is not None else ""
        label = f"{kind or 'policy'} · {mean}{value}{step_reward}"
        body = _tokens_html(seg, scale)
    return f'<div class="seg"><div class="boundary">{html.escape(label)}</div><div class="toks">{body}</div></div>'


def _episode_html(index: int, record: dict[str, Any], scale: float) -> str:
    head = [f"#{index}", f"id {record.get('id')}"]
    if record.get("method"):
        head.append(str(record["method"]))
    if record.get("step") is not None:
        head.append(f"step {record['step']}")
    head.append(f"reward {float(record.get('reward', float('nan'))):.3f}")
    if record.get("step_rewards"):  # the return: the outcome plus the environment's step rewards
        outcome = record.get("outcome_reward")
        outcome_text = f"{float(outcome):.3f}" if outcome is not None else "?"
        steps = " ".join(f"{float(r):+.3f}" for r in record["step_rewards"])
        head.append(f"outcome {outcome_text} + step rewards {steps}")
    answers = ", ".join(map(str, record.get("answers") or []))
    meta = (
        f'<div class="meta"><b>Q:</b> {html.escape(str(record.get("question", "")))}<br>'
        f"<b>gold:</b> {html.escape(answers)} &nbsp; <b>answer:</b> {html.escape(str(record.get('answer')))}"
        f" &nbsp; <b>tool calls:</b> {record.get('tool_calls', 0)}</div>"
    )
    segments = "".join(_segment_html(seg, scale) for seg in record["segments"])
    search = html.escape(f"{record.get('id')} {record.get('question', '')}".lower(), quote=True)
    return (
        f'<section class="episode" data-search="{search}"><h2>{html.escape(" · ".join(head))}</h2>{meta}'
        f"{segments}</section>"
    )


def _legend_html(scale: float) -> str:
    stops = ", ".join(advantage_colour(scale * x / 4, scale) for x in range(-4, 5))
    return (
        '<div class="legend"><span>advantage</span>'
        f'<span class="lab">&minus;{scale:.3g}</span><span class="bar" style="background:linear-gradient(to right, '
        f'{stops})"></span><span class="lab">+{scale:.3g}</span>'
        '<span class="tok off sample">not in update</span><span class="obs-sample">tool output</span></div>'
    )


CSS = """
body{font:14px/1.5 system-ui,sans-serif;margin:0;color:#222;background:#fafafa}
header{position:sticky;top:0;background:#fff;border-bottom:1px solid #ddd;padding:8px 16px;z-index:1}
header h1{font-size:17px;margin:0 0 4px}
.legend{display:flex;align-items:center;gap:8px;flex-wrap:wrap}
.legend .bar{display:inline-block;width:220px;height:14px;border:1px solid #999}
.legend .lab{font-variant-numeric:tabular-nums}
#readout{font-family:monospace;min-width:160px;color:#444}
main{padding:8px 16px}
.episode{background:#fff;border:1px solid #ddd;border-radius:6px;margin:12px 0;padding:8px 12px}
.episode h2{font-size:15px;margin:2px 0 6px}
.meta{color:#444;margin-bottom:6px}
.seg{border-left:3px solid #555;margin:8px 0;padding-left:8px}
.boundary{font-size:12px;font-weight:600;color:#555;text-transform:none;border-top:1px dashed #aaa;padding-top:2px}
.toks{font-family:ui-monospace,Menlo,Consolas,monospace;font-size:13px;white-space:pre-wrap;word-break:break-word}
.tok{border-radius:2px}
.tok.off{outline:1px dotted #999;background:none;color:#777}
.obs{margin:8px 0 8px 28px;padding:4px 8px;background:#eee;color:#777;border-left:3px solid #bbb}
.obs pre,.prompt pre{margin:0;white-space:pre-wrap;word-break:break-word;font-size:12px}
.obs-label{font-size:11px;font-weight:600;color:#888}
.obs-sample{background:#eee;color:#777;padding:0 4px;border-left:3px solid #bbb}
.prompt{color:#666;font-size:12px}
.plain{color:#222}
"""

SCRIPT = """
(function(){
  var out=document.getElementById('readout');
  document.addEventListener('mouseover',function(e){
    var t=e.target;
    if(t.classList&&t.classList.contains('tok')&&t.dataset.a!==undefined){
      out.textContent='A = '+t.dataset.a+(t.dataset.off?' (not in the update)':'');
    }
  });
  var box=document.getElementById('filter');
  box.addEventListener('input',function(){
    var q=box.value.toLowerCase();
    document.querySelectorAll('section.episode').forEach(function(s){
      s.style.display=(!q||s.dataset.search.indexOf(q)>=0)?'':'none';
    });
  });
  document.body.setAttribute('data-ready','1');
})();
"""


def render_viewer(
    records: Sequence[dict[str, Any]], *, title: str = "agentcredit credit viewer", scale: float | None = None
) -> str:
    """The HTML page for ``records`` (see the module docstring)."""
    if not records:
        raise ValueError("render_viewer: no episodes")
    scale = scale if scale else default_scale(records)
    has_credit = any(seg.get("advantages") is not None for r in records for seg in r["segments"])
    note = (
        ""
        if has_credit
        else "<p><b>These episodes carry no per-token advantages</b> (shown as plain text).</p>"
    )
    methods = sorted({str(r.get("method")) for r in records if r.get("method")})
    subtitle = f"{len(records)} episodes" + (f" · {', '.join(methods)}" if methods else "")
    body = "".join(_episode_html(i, r, scale) for i, r in enumerate(records))
    return (
        "<!DOCTYPE html><html lang='en'><head><meta charset='utf-8'>"
        f"<title>{html.escape(title)}</title><style>{CSS}</style></head><body>"
        f"<header><h1>{html.escape(title)}</h1><div>{html.escape(subtitle)}</div>{_legend_html(scale)}"
        '<div class="legend"><input id="filter" placeholder="filter by id or question"> '
        '<span id="readout">hover a token for its advantage</span></div></header>'
        f"<main>{note}{body}</main><script>{SCRIPT}</script></body></html>"
    )


def write_viewer(
    episodes: str | Path,
    out: str | Path | None = None,
    *,
    limit: int | None = None,
    scale: float | None = None,
) -> Path:
    """Read an episodes JSONL and write its viewer page (default: ``<episodes>.html`` beside it)."""
    episodes = Path(episodes)
    records = read_episodes(episodes)
    if limit is not None:
        records = records[:limit]
    out = Path(out) if out is not None else episodes.with_suffix(".html")
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(render_viewer(records, title=f"credit: {episodes.name}", scale=scale), encoding="utf-8")
    return out
