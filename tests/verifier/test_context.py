"""A whole user text fed to the verifier is refused in one line when it cannot fit its context (it used to prefill
for minutes)."""

import pytest

from taps_train.errors import TapsError
from taps_train.verifier.generation import greedy_reply
from taps_train.verifier.loading import load_verifier
from tests.conftest import one_line_error


def test_a_prompt_past_the_context_is_refused_before_prefill(random_verifier_dir, capsys, taps_home):
    loaded = load_verifier(str(random_verifier_dir))
    context = loaded.model.config.max_position_embeddings
    with pytest.raises(TapsError, match=rf"tokens with its chat template .* past the verifier's context of {context:,} tokens"):
        greedy_reply(loaded.model, loaded.tokenizer, "word " * (4 * context), 8)
    capsys.readouterr()  # the model load's progress above
    err = one_line_error(capsys, ["verifier", "generate", "word " * (4 * context), "--verifier", str(random_verifier_dir)])
    assert f"context of {context:,} tokens" in err
