"""The run configuration (issue 2 item 3): defaults < YAML (--config) < command line, validation
messages that name the flag or the file and key, custom distributions, and API-key masking."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any, get_args

import pytest
from pydantic import BaseModel

from trajforge.config import RunConfig
from trajforge.config.sections import TaskTypeConfig
from trajforge.model.types import DEFAULT_MODEL
from trajforge.config.checks import TOOLS_MAX
from trajforge.config.load import build_config, read_yaml
from trajforge.errors import ConfigError, UsageError


def yaml_file(tmp_path: Path, text: str, name: str = "cfg.yaml") -> Path:
    path = tmp_path / name
    path.write_text(text)
    return path


def error_of(cli: dict, config_file: Path | None = None) -> str:
    with pytest.raises(UsageError) as info:
        build_config(cli, config_file)
    return str(info.value)


def test_defaults_are_the_spec_defaults() -> None:
    c = build_config({})
    assert (c.dataset_file, c.batch_size, c.run_name) == (None, None, None)
    assert c.distribution == "default" and c.model == DEFAULT_MODEL == "anthropic/claude-sonnet-4.6"
    assert c.max_turns == 10 and c.num_workers == 4 and c.log_prefix_chars == 100
    assert c.output_dir == Path("data") and c.api_key is None and c.max_samples is None
    assert not (c.resume or c.verbose or c.reasoning_disabled or c.skip_invalid)
    assert c.providers_allowed is None and c.provider_sort is None and c.reasoning_effort is None
    assert c.retry_limit("anything") == 1 and c.task_types == {} and c.distributions == {}


def test_yaml_overrides_defaults_and_cli_overrides_yaml(tmp_path: Path) -> None:
    cfg = yaml_file(tmp_path, """
model: from-file
max_turns: 3
num_workers: 6
distribution: research
ephemeral_system_prompt: be brief
""")
    c = build_config({"max_turns": 7, "distribution": "science"}, cfg)
    assert c.model == "from-file"  # file beats default
    assert c.max_turns == 7 and c.distribution == "science"  # command line beats file
    assert c.num_workers == 6 and c.ephemeral_system_prompt == "be brief"
    assert c.batch_size is None and c.log_prefix_chars == 100  # untouched defaults


def test_nested_parallelism_and_task_types(tmp_path: Path) -> None:
    cfg = yaml_file(tmp_path, """
parallelism: {max_workers: 16, batch_size: 128, timeout: 600}
task_types: {image_gen: {retry_limit: 3}, code_eval: {retry_limit: 5}}
""")
    c = build_config({}, cfg)
    assert (c.num_workers, c.batch_size, c.timeout) == (16, 128, 600.0)
    assert c.retry_limit("image_gen") == 3 and c.retry_limit("code_eval") == 5
    assert c.retry_limit(None) == 1 and c.retry_limit("other") == 1
    assert build_config({"num_workers": 2, "batch_size": 9}, cfg).num_workers == 2
    assert read_yaml(cfg) == {"num_workers": 16, "batch_size": 128, "timeout": 600,
                              "task_types": {"image_gen": {"retry_limit": 3}, "code_eval": {"retry_limit": 5}}}


def test_flat_and_dashed_keys(tmp_path: Path) -> None:
    cfg = yaml_file(tmp_path, """
batch-size: 12
run_name: nightly
parallelism: 8
providers_allowed: anthropic, openai
providers_order: [b, a]
provider_sort: latency
reasoning_effort: xhigh
output_dir: out
""")
    c = build_config({}, cfg)
    assert (c.batch_size, c.run_name, c.num_workers) == (12, "nightly", 8)
    assert c.providers_allowed == ["anthropic", "openai"] and c.providers_order == ["b", "a"]
    assert (c.provider_sort, c.reasoning_effort, c.output_dir) == ("latency", "xhigh", Path("out"))


def test_empty_yaml_file_is_all_defaults(tmp_path: Path) -> None:
    assert build_config({}, yaml_file(tmp_path, "# nothing set\n")) == build_config({})


def test_cli_parallelism_is_num_workers() -> None:
    assert build_config({"parallelism": 8}).num_workers == 8
    assert build_config({"parallelism": 8, "num_workers": 8}).num_workers == 8
    assert "--parallelism=8 and --num_workers=3 disagree" in error_of({"parallelism": 8, "num_workers": 3})
    assert error_of({"parallelism": 0}) == "--parallelism: invalid value 0: must be at least 1"


@pytest.mark.parametrize(("cli", "message"), [
    ({"batch_size": 0}, "--batch_size: invalid value 0: must be at least 1"),
    ({"max_turns": -1}, "--max_turns: invalid value -1: must be at least 1"),
    ({"num_workers": 0}, "--num_workers: invalid value 0: must be at least 1"),
    ({"provider_sort": "fast"}, "--provider_sort: invalid value 'fast': must be one of 'price', 'throughput' "
                                "or 'latency'"),
    ({"reasoning_effort": "huge"}, "--reasoning_effort: invalid value 'huge': must be one of 'none', 'minimal', "
                                   "'low', 'medium', 'high' or 'xhigh'"),
    ({"run_name": ""}, "--run_name: invalid value '': must not be empty"),
    ({"timeout": 0.0}, "--timeout: invalid value 0.0: must be greater than 0"),
    ({"sandbox": "vm"}, "--sandbox: invalid value 'vm': must be one of 'auto', 'local', 'bwrap' or 'container'"),
    ({"reasoning_effort": "hihg"}, "--reasoning_effort: invalid value 'hihg': must be one of 'none', 'minimal', "
                                   "'low', 'medium', 'high' or 'xhigh'; did you mean 'high'?"),
    ({"run_name": ".."}, "--run_name: invalid value '..': must be a single directory name (no '/' or NUL character, "
                         "not '.' or '..')"),
    ({"run_name": "/srv/runs/a"}, "--run_name: invalid value '/srv/runs/a': must be a single directory name (no "
                                  "'/' or NUL character, not '.' or '..')"),
    ({"run_name": "r" * 256}, f"--run_name: invalid value '{'r' * 256}': must be at most 255 bytes long (one "
                              "directory name)"),
    ({"batch_size": 10**23}, "--batch_size: invalid value 100000000000000000000000: must be at most 1000000"),
    ({"max_tokens_per_sample": 10**10}, "--max_tokens_per_sample: invalid value 10000000000: must be at most "
                                        "1000000000"),
    ({"dataset_file": Path("")}, "--dataset_file: is empty (or '.'): give the path of a file"),
    ({"base_url": "not a url"}, "--base_url: invalid value 'not a url': not a valid URL: needs a scheme (http or "
                                "https) and a host, e.g. http://127.0.0.1:8000/v1"),
    ({"base_url": "http://127.0.0.1:99999/v1"}, "--base_url: invalid value 'http://127.0.0.1:99999/v1': not a "
                                                "valid URL: needs a scheme (http or https) and a host, e.g. "
                                                "http://127.0.0.1:8000/v1"),
    # the password of a URL that is refused is not repeated in the error
    ({"base_url": "ftp://me:hunter2@h/v1"}, "--base_url: invalid value 'ftp://me:***@h/v1': not a valid URL: needs "
                                            "a scheme (http or https) and a host, e.g. http://127.0.0.1:8000/v1"),
])
def test_invalid_cli_values_name_flag_value_and_what_is_allowed(cli: dict, message: str) -> None:
    assert error_of(cli) == message


def test_unknown_distribution_names_flag_value_suggestion_and_choices() -> None:
    msg = error_of({"distribution": "reserch"})
    assert msg.startswith("--distribution: invalid value 'reserch': no such distribution; did you mean 'research'?")
    assert "(allowed: default, image_gen, research," in msg and msg.endswith("mixed_tasks)")
    assert "did you mean" not in error_of({"distribution": "zzzzzzzz"})


def test_several_problems_are_one_line_each() -> None:
    lines = error_of({"batch_size": 0, "max_turns": 0, "provider_sort": "x"}).splitlines()
    assert [ln.split(":")[0] for ln in lines] == ["--batch_size", "--max_turns", "--provider_sort"]


@pytest.mark.parametrize(("text", "message"), [
    ("parallelism: {max_workers: x}", "cfg.yaml: key 'parallelism.max_workers': invalid value 'x': "
                                      "must be a whole number"),
    ("parallelism: {max_workers: 0}", "cfg.yaml: key 'parallelism.max_workers': invalid value 0: must be at least 1"),
    ("parallelism: {workers: 3}", "cfg.yaml: unknown key 'parallelism.workers'; did you mean "
                                  "'parallelism.max_workers'?"),
    ("parallelism: x", "cfg.yaml: key 'parallelism': invalid value 'x': must be a whole number"),
    ("num_workrs: 3", "cfg.yaml: unknown key 'num_workrs'; did you mean 'num_workers'?"),
    ("max_turns: lots", "cfg.yaml: key 'max_turns': invalid value 'lots': must be a whole number"),
    ("max_turns: true", "cfg.yaml: key 'max_turns': invalid value True: must be a number, not true"),
    ("batch_size: 2.5", "cfg.yaml: key 'batch_size': invalid value 2.5: must be a whole number"),
    ("model: [a, b]", "cfg.yaml: key 'model': invalid value ['a', 'b']: must be a string"),
    ("resume: maybe", "cfg.yaml: key 'resume': invalid value 'maybe': must be true or false"),
    ("provider_sort: fast", "cfg.yaml: key 'provider_sort': invalid value 'fast': must be one of 'price'"),
    ("distribution: mine", "cfg.yaml: key 'distribution': invalid value 'mine': no such distribution"),
    ("task_types: 3", "cfg.yaml: key 'task_types': invalid value 3: must be a mapping"),
    ("task_types: {a: {retry_limit: x}}", "cfg.yaml: key 'task_types.a.retry_limit': invalid value 'x': "
                                          "must be a whole number"),
    ("task_types: {a: {retry_limit: -1}}", "cfg.yaml: key 'task_types.a.retry_limit': invalid value -1: "
                                           "must be at least 0"),
    ("task_types: {a: {retries: 2}}", "cfg.yaml: key 'task_types.a.retries': unknown key"),
    ("tools: {web: {bogus: 1}}", "cfg.yaml: key 'tools.web.bogus': unknown key"),
    ("api_key: 12345", "cfg.yaml: key 'api_key': invalid value ***: must be a string"),
    ("[1, 2]", "cfg.yaml: the top level must be a mapping of keys, got list"),
    ("a: [unclosed", "cfg.yaml: not valid YAML"),
    ("x: " + "[" * 5000 + "]" * 5000, "cfg.yaml: not valid YAML: collections nested too deeply to read"),
    ("run_name: ..", "cfg.yaml: key 'run_name': invalid value '..': must be a single directory name"),
    ("batch_size: 100000000000000000000000", "cfg.yaml: key 'batch_size': invalid value 100000000000000000000000: "
                                             "must be at most 1000000"),
    ("parallelism: {batch_size: 2000000}", "cfg.yaml: key 'parallelism.batch_size': invalid value 2000000: "
                                           "must be at most 1000000"),
    ("task_types: {a: {retry_limit: 1001}}", "cfg.yaml: key 'task_types.a.retry_limit': invalid value 1001: "
                                            "must be at most 1000"),
    ("tools: {browser: {viewport_width: 100000}}", "cfg.yaml: key 'tools.browser.viewport_width': invalid value "
                                                   "100000: must be at most 16384"),
    ("sandbox_memory: 17t", "cfg.yaml: key 'sandbox_memory': invalid value '17t': must be at most 16t (16 TiB)"),
    ("sandbox_memory: lots", "cfg.yaml: key 'sandbox_memory': invalid value 'lots': must be a size: a number with "
                             "an optional unit b, k, m, g or t (e.g. 512m, 4g)"),
    ("dataset_file: ''", "cfg.yaml: key 'dataset_file': is empty (or '.'): give the path of a file"),
    ("judge_base_url: localhost:8000", "cfg.yaml: key 'judge_base_url': invalid value 'localhost:8000': not a valid "
                                       "URL"),
])
def test_bad_yaml_names_file_and_key(tmp_path: Path, text: str, message: str) -> None:
    cfg = yaml_file(tmp_path, text + "\n")
    assert error_of({}, cfg).startswith(f"{cfg}: " + message.removeprefix("cfg.yaml: "))


def _whole_number_fields(model: type[BaseModel], prefix: str = "") -> Iterator[tuple[str, Any]]:
    for name, field in model.model_fields.items():
        kinds = [field.annotation, *get_args(field.annotation)]
        nested = [k for k in kinds if isinstance(k, type) and issubclass(k, BaseModel)]
        if nested:
            yield from _whole_number_fields(nested[0], f"{prefix}{name}.")
        elif int in kinds:
            yield f"{prefix}{name}", field


def test_every_whole_number_setting_has_an_upper_bound() -> None:
    """A whole number beyond 64 bits used to pass validation and crash the run once it had begun
    (config.json is JSON): every one, a new one too, must be bounded from above."""
    unbounded = []
    for model, prefix in ((RunConfig, ""), (TaskTypeConfig, "task_types.*.")):
        for name, field in _whole_number_fields(model, prefix):
            if name.startswith("tools."):
                bounded = any(hasattr(m, "le") for m in field.metadata) or name[6:] in TOOLS_MAX
            else:  # stop_after_passes: at most samples_per_prompt, a whole-model check
                bounded = any(hasattr(m, "le") for m in field.metadata) or name == "stop_after_passes"
            if not bounded:
                unbounded.append(name)
    assert unbounded == []
    tools = {name[6:] for name, _ in _whole_number_fields(RunConfig) if name.startswith("tools.")}
    assert set(TOOLS_MAX) <= tools  # a bound for a field that does not exist is a typo
    huge = build_config({"samples_per_prompt": 10_000, "stop_after_passes": 10_000})
    assert huge.stop_after_passes == 10_000
    assert "must be at most --samples_per_prompt" in error_of({"stop_after_passes": 10**23})


@pytest.mark.parametrize("name", ["r", "my run", "nightly-2026.12.04", "..r", "r..", ".hidden", "é" * 127])
def test_run_names_that_are_one_directory_name_pass(name: str) -> None:
    assert build_config({"run_name": name}).run_name == name


@pytest.mark.parametrize("url", ["http://127.0.0.1:8000/v1", "https://openrouter.ai/api/v1", "http://[::1]:8080/v1",
                                 "https://alice:pw@llm.example/v1?x=1", "http://localhost/v1"])
def test_http_urls_pass(url: str) -> None:
    assert build_config({"base_url": url, "judge_base_url": url}).base_url == url


def test_cli_value_wins_and_is_named_even_when_the_file_has_the_key(tmp_path: Path) -> None:
    cfg = yaml_file(tmp_path, "batch_size: 5\n")
    assert error_of({"batch_size": 0}, cfg) == "--batch_size: invalid value 0: must be at least 1"
    assert build_config({"batch_size": 1}, yaml_file(tmp_path, "batch_size: 0\n", "bad.yaml")).batch_size == 1


def test_unreadable_config_files(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match=r"missing\.yaml: cannot read config file: No such file"):
        build_config({}, tmp_path / "missing.yaml")
    with pytest.raises(ConfigError, match=r": cannot read config file: Is a directory"):
        build_config({}, tmp_path)
    bad = tmp_path / "latin1.yaml"
    bad.write_bytes(b"model: caf\xe9\n")
    with pytest.raises(ConfigError, match=r"latin1\.yaml: not valid YAML: .*utf-8"):
        build_config({}, bad)
    assert issubclass(ConfigError, UsageError) and ConfigError("x").exit_code == 2


def test_custom_distributions_from_yaml(tmp_path: Path) -> None:
    cfg = yaml_file(tmp_path, """
distributions:
  mine: {description: terminal with some web, toolsets: {terminal: 50, web: 20}}
  minimal: {toolsets: {web: 100, file: 100}}
distribution: mine
""")
    c = build_config({}, cfg)
    dists = c.all_distributions()
    assert c.distribution == "mine"
    assert dists["mine"].description == "terminal with some web"
    assert dists["mine"].probabilities == {"terminal": 50.0, "web": 20.0}
    assert dists["minimal"].probabilities == {"web": 100.0, "file": 100.0}  # a config may redefine a name
    assert dists["minimal"].description == "custom (config file)"
    assert len(dists) == 18
    assert build_config({"distribution": "research"}, cfg).distribution == "research"


@pytest.mark.parametrize(("toolsets", "message"), [
    ("{termnal: 50}", "unknown toolset 'termnal'; did you mean 'terminal'? (allowed: web, vision,"),
    ("{terminal: 150}", "probability of 'terminal' must be within 0..100, got 150"),
    ("{terminal: -1}", "probability of 'terminal' must be within 0..100, got -1"),
    ("{}", "a distribution needs at least one toolset"),
    ("{web: 0, file: 0}", "at least one toolset needs a probability above 0"),
    ("{web: yes}", "probability of 'web' must be a number of percent, got True"),
])
def test_bad_custom_distribution_names_file_and_key(tmp_path: Path, toolsets: str, message: str) -> None:
    cfg = yaml_file(tmp_path, f"distributions: {{mine: {{description: d, toolsets: {toolsets}}}}}\n")
    msg = error_of({}, cfg)
    assert msg.startswith(f"{cfg}: key 'distributions.mine.toolsets': invalid value ")
    assert message in msg


def test_custom_distribution_without_toolsets(tmp_path: Path) -> None:
    cfg = yaml_file(tmp_path, "distributions: {mine: {description: d}}\n")
    assert error_of({}, cfg) == f"{cfg}: key 'distributions.mine.toolsets': missing"


def test_masked_hides_the_api_key_everywhere() -> None:
    c = build_config({"api_key": "sk-or-v1-SECRET", "model": "m", "batch_size": 3})
    assert c.api_key is not None and c.api_key.get_secret_value() == "sk-or-v1-SECRET"
    assert c.model_settings().api_key == "sk-or-v1-SECRET"  # the client still gets it
    masked = c.masked()
    assert masked["api_key"] == "***" and masked["batch_size"] == 3
    assert "SECRET" not in json.dumps(masked) and "SECRET" not in repr(c) and "SECRET" not in str(c)
    assert build_config({}).masked()["api_key"] is None
    # A bad key type in an error message is masked too.
    assert "SECRET" not in error_of({"api_key": ["sk-SECRET"]})


def test_masked_is_json_and_round_trips() -> None:
    c = build_config({"dataset_file": Path("d.jsonl"), "run_name": "r", "batch_size": 4,
                      "providers_ignored": "together,deepinfra"})
    data = json.loads(json.dumps(c.masked()))
    assert data["dataset_file"] == "d.jsonl" and data["providers_ignored"] == ["together", "deepinfra"]
    assert RunConfig.model_validate(data) == c


def test_validated_config_is_immutable() -> None:
    """A value decided after validation makes a copy (model_copy), so no layer sees the config
    change under it (issue 16)."""
    c = build_config({})
    with pytest.raises(ValueError, match="frozen"):
        c.run_name = "later"
    later = c.model_copy(update={"run_name": "later"})
    assert (c.run_name, later.run_name) == (None, "later")


@pytest.mark.parametrize(("text", "key", "lines"), [
    ("model: a\nmax_turns: 3\nmodel: b\n", "model", (1, 3)),
    ("parallelism:\n  max_workers: 4\n  batch_size: 2\n  max_workers: 5\n", "max_workers", (2, 4)),
    ("task_types:\n  code: {retry_limit: 1, retry_limit: 2}\n", "retry_limit", (2, 2)),
    ("pricing:\n  m: {prompt: 1, completion: 2}\n  m: {prompt: 3, completion: 4}\n", "m", (2, 3)),
])
def test_a_key_given_twice_is_refused_naming_it_and_both_lines(tmp_path: Path, text: str, key: str,
                                                               lines: tuple[int, int]) -> None:
    cfg = yaml_file(tmp_path, text)
    with pytest.raises(ConfigError) as info:
        build_config({}, cfg)
    assert str(info.value) == f"{cfg}: key '{key}' appears twice, on lines {lines[0]} and {lines[1]}; keep one"


def test_yaml_merge_keys_may_still_override(tmp_path: Path) -> None:
    cfg = yaml_file(tmp_path, "pricing:\n  a: &p {prompt: 1, completion: 2}\n  b: {<<: *p, prompt: 3}\n")
    assert build_config({}, cfg).pricing["b"].prompt == 3


def test_a_key_given_twice_stops_the_command_with_exit_2(tmp_path: Path, clean_env: dict[str, str]) -> None:
    import subprocess
    import sys

    cfg = yaml_file(tmp_path, "compression:\n  target_max_tokens: 10\n  target_max_tokens: 20\n")
    proc = subprocess.run([sys.executable, "-m", "trajforge", "compress", "--input", str(cfg), "--config", str(cfg)],
                          env=clean_env, capture_output=True, text=True, timeout=60)
    assert proc.returncode == 2, proc.stderr
    assert proc.stderr == f"error: {cfg}: key 'target_max_tokens' appears twice, on lines 2 and 3; keep one\n"


# ---- one section per layer, each default spelled once, the run's decisions in one value ----

def test_each_layer_declares_its_section_and_the_config_collects_them_all() -> None:
    from trajforge.config import RunSection
    from trajforge.model.settings import ModelSection
    from trajforge.sandbox.section import SandboxSection
    from trajforge.tasks.task_settings import TaskSection
    from trajforge.tools.tool_settings import ToolSection
    from trajforge.verify.settings import VerifySection

    sections = [RunSection, ModelSection, ToolSection, SandboxSection, VerifySection, TaskSection]
    names = [name for s in sections for name in s.model_fields]
    assert len(names) == len(set(names))  # no setting declared twice
    assert names == list(RunConfig.model_fields)  # every one collected, in the order --help lists them
    for section in sections:  # the section's own default is the run's
        for name, field in section.model_fields.items():
            assert field.get_default(call_default_factory=True) == \
                RunConfig.model_fields[name].get_default(call_default_factory=True), name


def test_the_layers_settings_take_their_defaults_from_the_sections() -> None:
    """Each default is spelled once, in the settings a layer reads (ResourceLimits, ContainerSettings,
    SandboxSettings, TaskSettings, ModelSettings) and shown by its section: built with none given,
    each equals what the default RunConfig hands down."""
    import dataclasses

    from trajforge.model.types import ModelSettings
    from trajforge.sandbox.sandbox_settings import SandboxSettings
    from trajforge.tasks.task_settings import TaskSettings

    config = RunConfig()
    bare = SandboxSettings()  # a container's memory and CPUs unset mean the sample's: the run fills them in
    container = dataclasses.replace(bare.container, memory=config.sandbox_memory, cpus=config.sandbox_cpus)
    assert dataclasses.replace(bare, container=container) == config.sandbox_settings()
    assert TaskSettings() == config.task_settings()
    handed = config.model_settings()
    assert dataclasses.replace(ModelSettings(model=DEFAULT_MODEL), pricing={}) == handed
    assert config.sandbox_settings().limits.memory == 4 << 30  # "4g", the section's Field, read by both


def test_what_the_run_decides_is_one_resolved_value_and_the_settings_stay_as_given() -> None:
    import pickle

    from trajforge.catalog.sandboxes import NetworkMode
    from trajforge.config.resolved import Resolved

    asked = RunConfig(run_name="r")
    assert asked.resolved == Resolved(DEFAULT_MODEL, "auto", "auto")  # nothing decided yet: the settings as given
    decided = asked.resolve(Resolved("local", "bwrap", NetworkMode.EGRESS))
    assert (decided.model, decided.sandbox, decided.sandbox_network) == (DEFAULT_MODEL, "auto", "auto")
    assert asked.resolved.backend == "auto"  # the original is untouched
    sandbox = decided.sandbox_settings()
    assert (sandbox.backend, sandbox.network, sandbox.container.run_name) == ("bwrap", "egress", "r")
    assert decided.model_settings().model == "local" and decided.tool_settings().model.model == "local"
    assert decided.tool_settings().fetch_model_urls
    assert not asked.resolve(Resolved("m", "local", NetworkMode.NONE)).tool_settings().fetch_model_urls
    # config.json keeps what was decided; --verbose's print before the decision, what was asked
    assert {k: decided.masked()[k] for k in ("model", "sandbox", "sandbox_network")} == \
        {"model": "local", "sandbox": "bwrap", "sandbox_network": "egress"}
    assert asked.masked()["sandbox"] == "auto"
    # executors ship the configuration to other processes (Ray): the decision goes with it
    assert pickle.loads(pickle.dumps(decided)).resolved == decided.resolved


@pytest.mark.parametrize("key", ["sandbox_memory", "sandbox_disk", "sandbox_tmp_size", "container_memory"])
def test_a_size_written_as_a_whole_number_in_the_file_is_that_many_bytes(tmp_path: Path, key: str) -> None:
    # YAML reads `sandbox_memory: 0` (the README's way to turn the limit off) as an integer, not "0".
    c = build_config({}, yaml_file(tmp_path, f"{key}: 0\n"))
    assert getattr(c, key) == "0"
    assert getattr(build_config({}, yaml_file(tmp_path, f"{key}: 1048576\n")), key) == "1048576"
    for bad in ("-1", "1.5", "true"):
        assert f"key '{key}'" in error_of({}, yaml_file(tmp_path, f"{key}: {bad}\n"))

