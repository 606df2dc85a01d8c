"""The experts registry: built-in experts, the user's experts.toml, add_expert, and base URLs
(redacted, checked, refused with credentials)."""

from __future__ import annotations

import math
import re
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from ctd_cli import assert_one_line_error, run_ctd

from experts import (
    BUILTIN_EXPERTS,
    ConfigError,
    InvalidSetting,
    RateLimit,
    add_expert,
    check_base_url,
    expert_from_url,
    experts_file,
    load_experts,
    load_template,
    redact_url,
    resolve_expert,
)

# Private: an expert's endpoint, built from the registry's spec.
from experts._endpoint import Endpoint

STAKES_V1 = Path(__file__).resolve().parents[2] / "experts" / "prompts" / "stakes-v1.toml"


@pytest.fixture
def experts_toml(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    path = tmp_path / "config" / "experts.toml"
    monkeypatch.setenv("CTD_EXPERTS_FILE", str(path))
    for spec in BUILTIN_EXPERTS.values():
        if spec.base_url_env:
            monkeypatch.delenv(spec.base_url_env, raising=False)
    return path


def test_builtin_experts(experts_toml: Path) -> None:
    assert experts_file() == experts_toml
    experts = load_experts()  # the file does not exist: built-ins only
    guards = {"llama-guard-3-1b", "llama-guard-3-8b", "shieldgemma-2b", "granite-guardian-2b"}
    assert set(experts) == {"gemma-27b", "llama-1b", "smollm2", "smollm2-vllm", *guards}
    assert experts["gemma-27b"].model == "google/gemma-3-27b-it"
    assert experts["llama-1b"].model == "meta-llama/Llama-3.2-1B-Instruct"
    assert experts["smollm2"].model == "smollm2"
    for spec in experts.values():
        assert spec.method in ("next-token", "likelihood")
        assert spec.base_urls and all(u.startswith("http://127.0.0.1:") for u in spec.base_urls)
        load_template(spec.template)
    with pytest.raises(ConfigError, match="unknown expert 'nope'"):
        resolve_expert("nope")


def test_base_url_override_by_environment(experts_toml: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    spec = resolve_expert("gemma-27b")
    assert spec.base_url_env == "CTD_GEMMA_27B_URL"
    assert spec.resolved_urls() == ("http://127.0.0.1:8000/v1",)
    monkeypatch.setenv("CTD_GEMMA_27B_URL", "http://10.0.0.2:9000/v1/, http://10.0.0.1:9000/v1")
    assert spec.resolved_urls() == ("http://10.0.0.2:9000/v1/", "http://10.0.0.1:9000/v1")
    assert spec.endpoint_id() == "http://10.0.0.1:9000/v1,http://10.0.0.2:9000/v1"


def test_user_file_adds_and_overrides(experts_toml: Path) -> None:
    experts_toml.parent.mkdir(parents=True)
    experts_toml.write_text(
        "[experts.judge]\n"
        'base_urls = ["http://127.0.0.1:9001/v1", "http://127.0.0.1:9002/v1"]\n'
        'model = "Qwen/Qwen2.5-7B-Instruct"\n'
        'api_key_env = "MY_JUDGE_KEY"\n'
        'method = "likelihood"\n'
        "concurrency = 32\n"
        "rpm = 600\n"
        "tpm = 500000\n"
        "timeout = 5.5\n"
        "max_attempts = 3\n"
        "\n"
        '[experts."smollm2"]\n'
        'base_url = "http://127.0.0.1:7777/v1"\n'
        'model = "other"\n'
    )
    experts = load_experts()
    judge = experts["judge"]
    assert judge.base_urls == ("http://127.0.0.1:9001/v1", "http://127.0.0.1:9002/v1")
    assert judge.model == "Qwen/Qwen2.5-7B-Instruct"
    assert judge.api_key_env == "MY_JUDGE_KEY"
    assert judge.method == "likelihood"
    assert judge.rate == RateLimit(concurrency=32, rpm=600, tpm=500000)
    assert judge.timeout.read == 5.5
    assert judge.retry.max_attempts == 3
    assert judge.source == str(experts_toml)
    assert experts["smollm2"].base_urls == ("http://127.0.0.1:7777/v1",)
    assert experts["smollm2"].model == "other"
    assert experts["gemma-27b"] == BUILTIN_EXPERTS["gemma-27b"]


GOOD_ENTRY = '[experts.good]\nbase_url = "http://127.0.0.1:1/v1"\nmodel = "m"\n\n'


@pytest.mark.parametrize(
    ("bad", "line", "match"),
    [
        # line numbers count GOOD_ENTRY's four lines
        (
            '[experts.bad]\nbase_url = "http://x/v1"\nmodel = "m"\ncolour = "blue"\n',
            8,
            "unknown key 'colour'",
        ),
        ('[experts.bad]\nbase_url = "http://x/v1"\nmethod = "next-token"\n', 5, "missing 'model'"),
        ('[experts.bad]\nmodel = "m"\n', 5, "missing 'base_url'"),
        ('[experts.bad]\nbase_url = "http://x/v1"\nmodel = "m"\n\nmethod = "vibes"\n', 9, "method = 'vibes'"),
        ('[experts.bad]\nbase_url = "http://x/v1"\nmodel = \n', 7, "Invalid value"),
        ('[experts.bad]\nbase_url = "http://x/v1"\nmodel = "m"\nconcurrency = 0\n', 8, "concurrency = 0"),
        ("[other]\nx = 1\n", None, r"unknown section \[other\]"),
        *[
            ('[experts.bad]\nbase_url = "http://x/v1"\nmodel = "m"\n' + setting + "\n", 8, match)
            for setting, match in [
                ("rpm = nan", r"rpm = nan: must be a number per minute above 0"),
                ("tpm = inf", r"tpm = inf: must be a number per minute above 0"),
                ('rpm = "fast"', r"rpm = 'fast': must be a number"),
                ("timeout = nan", r"timeout = nan: must be a number of seconds above 0"),
                ("concurrency = 2.5", r"concurrency = 2.5: must be a whole number"),
                ("top_logprobs = 0", r"top_logprobs = 0"),
                ("max_attempts = true", r"max_attempts = True"),
                ('api_key_env = "sk-live-123"', r"api_key_env = '\*\*\*': must name an environment variable"),
                *[
                    (f'api_key_env = "{key}"', r"api_key_env = '\*\*\*': must name an environment variable")
                    for key in (
                        "gsk_8fJ2kLm9Qw3Rt5Yu7Io1Pa4Sd6Fg8Hj0Kl2Zx4Cv6",
                        "AIzaSyD3fK9mLq2Rt7Vw1Xy5Zb8Nc4Pd6Ge0Hj1",
                    )
                ],
                ('server = "docker"', r"server = 'docker'"),
            ]
        ],
        ('[experts.bad]\nmodel = "m"\nbase_url = 5\n', 7, r"base_url = 5: must be a URL like http://"),
        (
            '[experts.bad]\nmodel = "m"\nbase_url = "ftp//nope"\n',
            7,
            r"base_url = 'ftp//nope': must start with",
        ),
        ('[experts.bad]\nmodel = "m"\nbase_urls = "http://x/v1"\n', 7, r"base_urls = .*must be a list"),
        ('[experts.bad]\nmodel = "m"\nbase_urls = ["http://x/v1", "x"]\n', 7, r"base_urls = 'x'"),
        ('[experts.bad]\nmodel = "m"\nbase_url = "http://x/v1?key=1"\n', 7, r"no \?query"),
        (
            '[experts.bad]\nmodel = "m"\nbase_url = "http://me:s3cret@x:8000/v1"\n',
            7,
            r"base_url = 'http://\*\*\*@x:8000/v1': credentials in the URL are refused.*--api-key-env",
        ),
    ],
)
def test_user_file_errors_name_file_and_line(
    experts_toml: Path, bad: str, line: int | None, match: str
) -> None:
    experts_toml.parent.mkdir(parents=True)
    experts_toml.write_text(GOOD_ENTRY + bad)
    with pytest.raises(ConfigError, match=match) as info:
        load_experts()
    message = str(info.value)
    assert str(experts_toml) in message and "s3cret" not in message and "sk-live" not in message
    assert "\n" not in message
    if line is not None:
        assert re.search(rf"(:{line}:|line {line}\b)", message), message


def test_add_expert_round_trip(experts_toml: Path) -> None:
    add_expert("alpha", {"base_url": "http://127.0.0.1:9001/v1", "model": "a-model", "rpm": 600})
    add_expert(
        "beta",
        {
            "base_urls": ["http://127.0.0.1:9002/v1", "http://127.0.0.1:9003/v1"],
            "model": 'quote"d\\model',
            "api_key_env": "BETA_KEY",
            "method": "likelihood",
            "tpm": None,  # None values are left out
        },
    )
    experts = load_experts()
    assert experts["alpha"].model == "a-model"
    assert experts["alpha"].rate.rpm == 600
    assert experts["beta"].model == 'quote"d\\model'
    assert experts["beta"].base_urls == ("http://127.0.0.1:9002/v1", "http://127.0.0.1:9003/v1")
    assert experts["beta"].method == "likelihood"
    assert experts["beta"].rate.tpm is None
    before_beta = load_experts()["beta"]

    # Replace alpha: beta stays as it was; alpha appears once, with its new values.
    add_expert("alpha", {"base_url": "http://127.0.0.1:9009/v1", "model": "a2", "concurrency": 3})
    text = experts_toml.read_text()
    assert text.count('[experts."alpha"]') == 1
    assert text.count('[experts."beta"]') == 1
    experts = load_experts()
    assert experts["alpha"].model == "a2"
    assert experts["alpha"].base_urls == ("http://127.0.0.1:9009/v1",)
    assert experts["alpha"].rate == RateLimit(concurrency=3)
    assert experts["beta"] == before_beta
    assert set(experts) == {*BUILTIN_EXPERTS, "alpha", "beta"}


def test_add_expert_rejects_bad_entries_and_leaves_the_file(experts_toml: Path) -> None:
    add_expert("keep", {"base_url": "http://127.0.0.1:9001/v1", "model": "m"})
    before = experts_toml.read_bytes()
    with pytest.raises(ConfigError, match="unknown key"):
        add_expert("bad", {"base_url": "http://127.0.0.1:9001/v1", "model": "m", "colour": "red"})
    with pytest.raises(ConfigError, match="method"):
        add_expert("bad", {"base_url": "http://127.0.0.1:9001/v1", "model": "m", "method": "vibes"})
    with pytest.raises(ConfigError, match="expert name"):
        add_expert("bad name!", {"base_url": "http://127.0.0.1:9001/v1", "model": "m"})
    assert experts_toml.read_bytes() == before


def test_add_expert_refuses_beside_another_broken_entry_and_can_replace_it(experts_toml: Path) -> None:
    """Another entry that cannot be read: the add is refused, naming its file, line and key, and
    writes nothing (it wrote its entry, then the command failed reading the file back); the
    broken entry itself can be replaced by an add of its name."""
    experts_toml.parent.mkdir(parents=True)
    experts_toml.write_text(
        '[experts.judge]\nbase_url = "http://127.0.0.1:9/v1"\nmodel = "m"\nrpm = "fast"\n'
    )
    before = experts_toml.read_bytes()
    with pytest.raises(ConfigError, match=r"experts\.toml:4: expert 'judge': rpm = 'fast'"):
        add_expert("judge2", {"base_url": "http://127.0.0.1:9001/v1", "model": "other"})
    assert experts_toml.read_bytes() == before
    add_expert("judge", {"base_url": "http://127.0.0.1:9001/v1", "model": "m", "rpm": 60})
    assert load_experts(experts_toml)["judge"].rate.rpm == 60


@pytest.mark.parametrize(
    ("change", "setting"),
    [
        ({"rpm": math.nan}, "rpm"),
        ({"tpm": -1}, "tpm"),
        ({"concurrency": 0}, "concurrency"),
        ({"template": "nosuch"}, "template"),
        ({"template": "missing.toml"}, "template"),
        ({"base_urls": ["ftp//nope"]}, "base_urls"),
        ({"base_urls": ["http://ok/v1", "http://user:pw@host/v1"]}, "base_urls"),
        ({"base_urls": []}, "base_urls"),
        ({"model": ""}, "model"),
        ({"model": "a\nb", "rpm": "fast"}, "rpm"),
    ],
)
def test_add_expert_refuses_a_bad_value_and_writes_nothing(
    experts_toml: Path, change: dict[str, Any], setting: str
) -> None:
    add_expert("keep", {"base_url": "http://127.0.0.1:9001/v1", "model": "m"})
    before = experts_toml.read_bytes()
    entry = {"base_urls": ["http://127.0.0.1:9002/v1"], "model": "m", **change}
    with pytest.raises(InvalidSetting) as info:
        add_expert("new", entry)
    assert info.value.setting == setting
    assert "pw" not in str(info.value)
    assert experts_toml.read_bytes() == before
    assert not experts_toml.with_suffix(".toml.tmp").exists()


def test_add_expert_writes_a_template_path_absolute(
    experts_toml: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    (tmp_path / "mine.toml").write_bytes(STAKES_V1.read_bytes())
    monkeypatch.chdir(tmp_path)
    add_expert("mine", {"base_url": "http://127.0.0.1:9001/v1", "model": "m", "template": "mine.toml"})
    monkeypatch.chdir(experts_toml.parent.parent.parent)  # elsewhere: the entry still loads
    assert load_experts()["mine"].template == str(tmp_path / "mine.toml")
    add_expert("builtin", {"base_url": "http://127.0.0.1:9001/v1", "model": "m", "template": "stakes-v1"})
    assert load_experts()["builtin"].template == "stakes-v1"


def test_a_hand_written_template_path_is_relative_to_the_registry_file(
    experts_toml: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """`template = "mine.toml"` written by hand beside experts.toml loads from any folder (it
    worked only from the file's own); one that is not there is the file's line, key and path
    when the file is read, not a template error without a place at the first request."""
    experts_toml.parent.mkdir(parents=True)
    (experts_toml.parent / "mine.toml").write_bytes(STAKES_V1.read_bytes())
    entry = '[experts.mine]\nbase_url = "http://127.0.0.1:9/v1"\nmodel = "m"\ntemplate = "{}"\n'
    experts_toml.write_text(entry.format("mine.toml"))
    monkeypatch.chdir(tmp_path)
    assert load_experts()["mine"].template == str(experts_toml.parent / "mine.toml")
    experts_toml.write_text(entry.format("gone.toml"))
    with pytest.raises(
        ConfigError, match=r"experts\.toml:4: expert 'mine': template = 'gone\.toml': no such file"
    ):
        load_experts()


def test_add_expert_escapes_control_characters(experts_toml: Path) -> None:
    add_expert("odd", {"base_url": "http://127.0.0.1:9001/v1", "model": 'a\tb\x7f"c\\'})
    assert load_experts()["odd"].model == 'a\tb\x7f"c\\'


@pytest.mark.parametrize(
    ("url", "shown"),
    [
        ("http://user:pass@host:8000/v1", "http://***@host:8000/v1"),
        ("https://token@host/v1", "https://***@host/v1"),
        ("http://user:pa/ss@host/v1", "http://***@host/v1"),  # a '/' in the password
        ("user:pass@host/v1", "***@host/v1"),  # no scheme at all
        ("http://host:8000/v1", "http://host:8000/v1"),
    ],
)
def test_redact_url(url: str, shown: str) -> None:
    assert redact_url(url) == shown


@pytest.mark.parametrize(
    ("url", "problem"),
    [
        ("http://user:pass@host:8000/v1", "credentials in the URL are refused"),
        ("https://token@host/v1", "credentials"),
        ("http://user:pa/ss@host/v1", "credentials"),
        ("ftp//nope", "must start with http:// or https://"),
        ("ftp://host/v1", "must start with http"),
        ("http:///v1", "and a host"),
        ("http://host:port/v1", "not a valid URL"),
        ("http://[::1/v1", "not a valid URL"),
        ("http://host/v1?api_key=abc", "no ?query"),
        ("http://host/v1#x", "#fragment"),
        (5, "must be a URL"),
        (None, "must be a URL"),
    ],
)
def test_check_base_url_refuses(url: Any, problem: str) -> None:
    with pytest.raises(InvalidSetting) as info:
        check_base_url(url, "--url")
    assert problem in info.value.problem
    assert str(info.value).startswith("--url ")
    assert "pass" not in str(info.value) and "ss@" not in str(info.value)


def test_urls_with_credentials_are_refused_where_they_enter(
    experts_toml: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    for url in ("http://127.0.0.1:8000/v1", "HTTPS://[::1]:8443/v1/", "http://host/"):
        assert check_base_url(url) == url
    with pytest.raises(InvalidSetting, match=r"base_urls = 'http://\*\*\*@h/v1'"):
        expert_from_url("http://u:secret@h/v1", "m")
    with pytest.raises(InvalidSetting, match="credentials"):
        Endpoint(["http://u:secret@h/v1"])
    monkeypatch.setenv("CTD_GEMMA_27B_URL", "http://10.0.0.1:9000/v1, http://u:secret@10.0.0.2/v1")
    with pytest.raises(InvalidSetting, match=r"\$CTD_GEMMA_27B_URL = 'http://\*\*\*@10.0.0.2/v1'"):
        resolve_expert("gemma-27b").resolved_urls()
    monkeypatch.setenv("CTD_GEMMA_27B_URL", " , ")
    with pytest.raises(InvalidSetting, match="names no URL"):
        resolve_expert("gemma-27b").resolved_urls()


def test_add_expert_with_a_dotted_name(experts_toml: Path) -> None:
    add_expert("my.judge", {"base_url": "http://127.0.0.1:9001/v1", "model": "m"})
    assert load_experts()["my.judge"].model == "m"


def _entry(url: str, model: str) -> str:
    return f'base_url = "{url}"\nmodel = "{model}"\n'


def test_add_replaces_only_its_own_entry_however_the_file_writes_it(experts_toml: Path) -> None:
    """A hand-written registry: an indented header after the entry, a comment after its header,
    a link to the file with its permissions. The entry is replaced, every other entry and comment
    stays; one in a form `add` cannot replace (an inline table) is refused, the file untouched."""
    experts_toml.parent.mkdir(parents=True)
    kept = "# production judge, do not remove\n  [experts.bar]\n" + _entry("http://h:1/v1", "b")
    experts_toml.write_text("[experts.foo]  # my judge\n" + _entry("http://h:1/v1", "m") + "\n" + kept)
    add_expert("foo", {"base_url": "http://h:2/v1", "model": "m2"})
    loaded = load_experts()
    assert loaded["foo"].model == "m2" and loaded["bar"].model == "b"
    assert kept in experts_toml.read_text() and "my judge" not in experts_toml.read_text()
    inline = '[experts]\nfoo = {base_url = "http://h:1/v1", model = "m"}\n'
    experts_toml.write_text(inline)
    with pytest.raises(ConfigError, match=r"experts.toml:2: expert 'foo' is written in a form"):
        add_expert("foo", {"base_url": "http://h:2/v1", "model": "m2"})
    assert experts_toml.read_text() == inline
    real = experts_toml.parent / "dotfiles" / "experts.toml"
    real.parent.mkdir()
    real.write_text("[experts.bar]\n" + _entry("http://h:1/v1", "b"))
    real.chmod(0o600)
    experts_toml.unlink()
    experts_toml.symlink_to(real)
    add_expert("foo", {"base_url": "http://h:2/v1", "model": "m2"})
    assert experts_toml.is_symlink() and (real.stat().st_mode & 0o777) == 0o600
    assert set(load_experts()) >= {"foo", "bar"} and "foo" in real.read_text()
    assert sorted(p.name for p in real.parent.iterdir()) == [".experts.toml.lock", "experts.toml"]


def test_adds_at_once_keep_every_entry(experts_toml: Path) -> None:
    """Two processes adding entries at once: each reads what the other wrote, none is lost."""
    script = (
        "import sys; from experts import add_expert\n"
        "for i in range(12): add_expert(f'{sys.argv[1]}{i}', {'base_url': 'http://h:1/v1', 'model': 'm'})\n"
    )
    runs = [subprocess.Popen([sys.executable, "-c", script, who]) for who in ("a", "b")]
    assert [run.wait(timeout=120) for run in runs] == [0, 0]
    assert {f"{who}{i}" for who in "ab" for i in range(12)} <= set(load_experts())


@pytest.mark.parametrize(
    ("content", "problem"),
    [
        ("# caf\xe9\n[experts.x]\n".encode("latin-1"), r"experts.toml:1: not UTF-8 text"),
        (b"experts = 1\n", r"experts.toml:1: experts must be a table of entries"),
        (b'[[experts]]\nmodel = "m"\n', r"experts.toml:1: experts must be a table of entries"),
    ],
)
def test_a_registry_that_cannot_be_read_is_one_line(experts_toml: Path, content: bytes, problem: str) -> None:
    experts_toml.parent.mkdir(parents=True)
    experts_toml.write_bytes(content)
    for call in (load_experts, lambda: add_expert("y", {"base_url": "http://h:1/v1", "model": "m"})):
        with pytest.raises(ConfigError, match=problem):
            call()
    assert experts_toml.read_bytes() == content


def test_keys_are_refused_where_names_or_urls_are_expected_and_never_shown(experts_toml: Path) -> None:
    token = "hf_" + "AbCdEfGhIjKlMnOpQrStUvWx"  # a valid variable name, and a Hugging Face token's shape
    with pytest.raises(InvalidSetting) as info:
        add_expert("x", {"base_url": "http://h:1/v1", "model": "m", "api_key_env": token})
    assert "not hold a key" in str(info.value) and token not in str(info.value)
    for url in (
        "https://apim.example/v1?subscription-key=s3cr3tvalue",
        "https://f.example/v1#code=s3cr3tvalue",
    ):
        with pytest.raises(InvalidSetting) as info:
            check_base_url(url, "--url")
        assert "s3cr3tvalue" not in str(info.value) and "***" in str(info.value)
    assert not experts_toml.exists()


@pytest.mark.parametrize(
    ("key", "said"),
    [
        ("sk-live-abcdef\r", "ends in a line break"),
        ("sk-live-\xe9bcdef", "holds at character 9 a control or non-ASCII"),
    ],
)
def test_a_key_an_http_header_cannot_carry_is_one_line_naming_its_variable(
    experts_toml: Path, monkeypatch: pytest.MonkeyPatch, key: str, said: str
) -> None:
    monkeypatch.setenv("CTD_TEST_KEY", key)
    with pytest.raises(ConfigError) as info:
        Endpoint(["http://127.0.0.1:9/v1"], api_key_env="CTD_TEST_KEY")
    assert str(info.value).startswith(f"$CTD_TEST_KEY {said}") and "abcdef" not in str(info.value)
    add_expert("keyed", {"base_url": "http://127.0.0.1:9/v1", "model": "m", "api_key_env": "CTD_TEST_KEY"})
    done = run_ctd("experts", "check", "keyed", cwd=experts_toml.parent.parent)
    assert_one_line_error(done, f"$CTD_TEST_KEY {said}")
    assert "abcdef" not in done.stderr + done.stdout
