"""agentcredit.integrations.verl.signals: what verl's workers score for a signal, keyed by its name."""

from __future__ import annotations

from types import SimpleNamespace

import pytest

pytest.importorskip("verl")

from agentcredit.credit import SignalProvider, register_provider  # noqa: E402
from agentcredit.credit.signals import PROVIDERS  # noqa: E402
from agentcredit.integrations.verl.signals import teacher_prompt_ids  # noqa: E402

pytestmark = pytest.mark.verl


def test_a_teacher_logp_provider_without_a_teacher_prompt_is_one_line_on_verl():
    """Regression: a user's provider registered in the built-in's place (replace_existing) without the
    ``teacher_prompt`` verl's workers build the teacher prompt with failed with an AttributeError traceback."""

    class MyTeacher(SignalProvider):
        provides = frozenset({"teacher_logp"})

    builtin = PROVIDERS["teacher_logp"]
    register_provider(MyTeacher, replace_existing=True)
    try:
        ctx = SimpleNamespace(part=SimpleNamespace(reference="answer"))
        with pytest.raises(ValueError, match=r"^MyTeacher provides teacher_logp without a teacher_prompt"):
            teacher_prompt_ids(ctx)
    finally:
        register_provider(builtin, replace_existing=True)
    assert PROVIDERS["teacher_logp"] is builtin
