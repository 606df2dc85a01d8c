"""`ctd eval --config FILE`: an unknown key is one line naming the file, the line and what to
write instead; an option whose key differs (`--arch`, key `archs`) or that is no key at all (a flag
of one invocation) says so rather than sending the reader to `--help`, which names the option."""

from __future__ import annotations

from pathlib import Path

import pytest

from harness import InputError
from harness.run import RunConfig, load_run_config

REPO = Path(__file__).resolve().parents[2]


@pytest.mark.parametrize(
    ("line", "said"),
    [
        ('arch = ["mean"]', "unknown key 'arch': the key of --arch is 'archs'"),
        ('runs_dir = "elsewhere"', "unknown key 'runs_dir': --runs-dir is a flag of ctd eval only"),
        ("json = true", "unknown key 'json': --json is a flag of ctd eval only"),
        ("budget = 0.2", "unknown key 'budget' (the keys: docs/reference/configuration.md"),
    ],
)
def test_an_unknown_key_says_what_to_write_instead(tmp_path: Path, line: str, said: str) -> None:
    config = tmp_path / "run.toml"
    config.write_text(f"[run]\nseeds = [0]\n{line}\n")
    with pytest.raises(InputError) as raised:
        load_run_config(config, {})
    assert str(raised.value).startswith(f"{config}:3: ")
    assert said in str(raised.value)
    assert "\n" not in str(raised.value)


def test_the_key_of_arch_is_archs_and_the_page_named_exists(tmp_path: Path) -> None:
    config = tmp_path / "run.toml"
    config.write_text('[run]\narchs = ["mean", "mlp"]\n')
    assert load_run_config(config, {}).archs == ("mean", "mlp")
    assert "archs" in RunConfig.__dataclass_fields__
    assert (REPO / "docs" / "reference" / "configuration.md").is_file()
