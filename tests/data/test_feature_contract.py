"""The feature contract: a backbone that reads several verifier layers gets them, and its targets, from
the cache, from online mode and in decoding alike; the contract is part of the cache fingerprint."""

import pytest
import torch

from taps_train.data.batching import pad_collate
from taps_train.data.feature_cache import CacheSettings
from taps_train.data.prepare import RecipePreparer
from taps_train.data.recipe import load_recipe
from taps_train.features import EAGLE_FEATURES, FEATURES, TARGETS, FeatureContract
from taps_train.errors import TapsError
from tests.data.test_feature_cache import HIDDEN, data, write_recipe  # noqa: F401 - fixtures

THREE_LAYERS = FeatureContract((0, 1, 2))  # the random verifier has 2 layers: embeddings, layer 1, layer 2 (pre-norm)


def test_contract_names_widths_and_fingerprints():
    assert EAGLE_FEATURES.names == (FEATURES,) and EAGLE_FEATURES.hidden_state_indices == [-1]
    assert EAGLE_FEATURES.fingerprint() == "last_hidden_state_post_norm"  # caches built before the contract stay valid
    assert THREE_LAYERS.names == (FEATURES, TARGETS) and THREE_LAYERS.hidden_state_indices == [-1, 0, 1, 2]
    assert THREE_LAYERS.widths(8) == {FEATURES: 24, TARGETS: 8}
    assert THREE_LAYERS.fingerprint() != EAGLE_FEATURES.fingerprint()


@pytest.mark.parametrize("dtype", ["bfloat16", "fp8_e4m3"])
def test_cache_stores_every_named_tensor_of_a_multi_layer_contract(tmp_path, data, random_verifier_dir, dtype):  # noqa: F811
    recipe = load_recipe(write_recipe(tmp_path, "math", [(data["math"], 2, 5)]))
    preparer = RecipePreparer(recipe, str(random_verifier_dir), tmp_path / "cache", CacheSettings(dtype=dtype), contract=THREE_LAYERS)
    [source] = preparer.sources()
    [cache] = preparer.build([source])
    model = preparer.verifier.model
    tolerance = {"rtol": 2**-7, "atol": 1e-5} if dtype == "bfloat16" else {"rtol": 0.07, "atol": 0.02}
    for position, sample in enumerate(source.samples):
        item = cache[position]
        with torch.no_grad():
            out = model(input_ids=torch.tensor([sample.input_ids]), output_hidden_states=True)
        expected = torch.cat([out.hidden_states[i][0] for i in (0, 1, 2)], dim=-1)
        assert item[FEATURES].shape == (len(sample.input_ids), 3 * HIDDEN) and item[TARGETS].shape == (len(sample.input_ids), HIDDEN)
        torch.testing.assert_close(item[FEATURES], expected, **tolerance)
        torch.testing.assert_close(item[TARGETS], out.hidden_states[-1][0], **tolerance)
    batch = pad_collate([cache[0], cache[1]])
    assert batch[FEATURES].shape[-1] == 3 * HIDDEN and batch[TARGETS].shape[-1] == HIDDEN
    eagle = RecipePreparer(recipe, str(random_verifier_dir), tmp_path / "cache").sources()[0]
    assert eagle.directory != source.directory  # another contract, another cache


def test_layers_outside_the_verifier_are_refused(tmp_path, data, random_verifier_dir):  # noqa: F811
    recipe = load_recipe(write_recipe(tmp_path, "math", [(data["math"], 2, 5)]))
    with pytest.raises(TapsError, match=r"\[0, 7\].*-3\.\.2"):
        RecipePreparer(recipe, str(random_verifier_dir), tmp_path / "cache", contract=FeatureContract((0, 7)))
