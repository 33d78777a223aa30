"""The preset loader is strict: unknown keys and wrong types are errors that name the key and the file."""

import pytest

from dapo.config import ConfigError, list_presets, load_preset


def test_every_preset_loads():
    names = list_presets()
    assert {"tiny", "smoke", "7b", "early", "full"} <= set(names)
    for name in names:
        assert load_preset(name).name == name


def test_unknown_key_names_full_path_and_suggests():
    with pytest.raises(ConfigError, match=r"recipe\.actor\.optim\.lrr.*did you mean 'lr'"):
        load_preset("full", ["recipe.actor.optim.lrr=1e-5"])


def test_wrong_type_is_rejected():
    with pytest.raises(ConfigError, match=r"recipe\.data\.train_batch_size.*integer"):
        load_preset("full", ["recipe.data.train_batch_size=lots"])


def test_override_applies_and_parses_yaml_scalars():
    p = load_preset("full", ["recipe.actor.optim.lr=2e-6", "placement.nodes=4"])
    assert p.recipe.actor.optim.lr == 2e-6 and p.placement.nodes == 4


def test_unknown_preset_lists_available():
    with pytest.raises(ConfigError, match='unknown preset "nope".*full'):
        load_preset("nope")


@pytest.mark.parametrize(
    "override, key",
    [
        ("recipe.reward.overlong_buffer.len=30000", "overlong_buffer.len"),
        ("recipe.actor.clip_ratio_c=1.0", "clip_ratio_c"),
        ("recipe.actor.clip_ratio_low=1.5", "clip_ratio_low"),
        ("recipe.actor.loss_agg_mode=mean", "loss_agg_mode"),
        ("recipe.actor.ppo_mini_batch_size=33", "ppo_mini_batch_size"),
        ("placement.nodes=0", "placement.nodes"),
    ],
)
def test_cross_field_rules(override, key):
    with pytest.raises(ConfigError, match=key.replace(".", r"\.")):
        load_preset("full", [override])


def test_extends_merges_base_and_child():
    early, full = load_preset("early"), load_preset("full")
    assert early.recipe.actor.loss_agg_mode == "seq-mean-token-mean"
    assert full.recipe.actor.loss_agg_mode == "token-mean"
    assert early.recipe.data.max_response_length == full.recipe.data.max_response_length == 20480


def test_every_wrong_key_is_named_on_its_own_line_with_its_index():
    with pytest.raises(ConfigError) as info:
        load_preset("full", ["recipe.data.shufle=true", "recipe.actor.optim.betas=[0.9, true]", "placement.nodes=x"])
    lines = str(info.value).splitlines()
    assert lines[0].startswith("unknown key 'recipe.data.shufle'") and "did you mean 'shuffle'" in lines[0]
    assert any(line.startswith("'recipe.actor.optim.betas[1]'") and "expected a number, got True" in line
               for line in lines)
    assert any(line.startswith("'placement.nodes'") and "full.yaml + override 'placement.nodes=x': expected an "
               "integer" in line for line in lines)


def test_an_error_names_the_file_of_the_extends_chain_that_holds_the_key(tmp_path):
    from dapo.config import PRESET_DIR

    (tmp_path / "_base.yaml").write_text((PRESET_DIR / "_dapo_qwen32b.yaml").read_text().replace(
        "      lr: 1.0e-6", "      lr: 1.0e-6\n      lrr: 1"))
    assert "lrr: 1" in (tmp_path / "_base.yaml").read_text()
    (tmp_path / "mine.yaml").write_text((PRESET_DIR / "full.yaml").read_text().replace(
        "extends: _dapo_qwen32b", "extends: _base"))
    with pytest.raises(ConfigError, match=r"unknown key 'recipe\.actor\.optim\.lrr' in \S*_base\.yaml "
                                          r"\(extended by mine\.yaml\) \(did you mean 'lr'\?\)"):
        load_preset(str(tmp_path / "mine.yaml"))


def test_numbers_are_not_read_from_strings_or_booleans():
    for override, expected in [("recipe.data.shuffle=1", "true/false"), ("recipe.actor.optim.lr='1e-5'", "a number"),
                               ("recipe.actor.optim.lr=true", "a number"), ("recipe.trainer.save_freq=5.0", "integer"),
                               ("recipe.data.truncation=middle", "not one of \\['left', 'right', 'error'\\]")]:
        with pytest.raises(ConfigError, match=expected):
            load_preset("full", [override])


def test_yaml_12_floats_in_files_and_unquoted_env_values(tmp_path):
    from dapo.config import PRESET_DIR

    text = (PRESET_DIR / "tiny.yaml").read_text()
    assert "lr: 1.0e-4" in text
    mine = tmp_path / "mine.yaml"
    mine.write_text(text.replace("lr: 1.0e-4", "lr: 1e-4"))  # YAML 1.1 would read the string '1e-4'
    assert load_preset(str(mine)).recipe.actor.optim.lr == 1e-4
    p = load_preset("tiny", ["recipe.actor.optim.lr=3e-5", "placement.env.A=1", "placement.env.B=true"])
    assert p.recipe.actor.optim.lr == 3e-5
    assert p.placement.env == {**load_preset("tiny").placement.env, "A": "1", "B": "true"}
