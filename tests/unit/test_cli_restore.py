"""The placement commands on recorded profiles (the probe of a real device is in
tests/kvm/test_restore_placement.py): restore-profile builds what check-config takes and
restorable judges; a bad profile, template or name exits 2 with one line naming it."""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path

import pytest
import yaml
from _pytest.capture import CaptureResult
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from ate_devplugin.cli import main
from ate_devplugin.cpu.profile import CpuProfile, Tsc
from tests.unit.cpu.samples import ICELAKE, PVM, SKYLAKE, hardware


def record(tmp_path: Path, name: str, profile: CpuProfile) -> str:
    path = tmp_path / name
    path.write_text(json.dumps(profile.to_json()))
    return str(path)


def config_with(tmp_path: Path, built: str, extra: str = "") -> Path:
    """A config whose KVM resource has the profiles printed by restore-profile (and ``extra``)."""
    profiles = yaml.safe_load(built) | (yaml.safe_load(extra) if extra else {})
    path = tmp_path / "config.yaml"
    path.write_text(yaml.safe_dump({"resources": [{"name": "ate.dev/kvm", "devices": ["/dev/kvm"],
                                                   "restore_profiles": profiles}]}, sort_keys=False))  # fmt: skip
    return path


def test_a_profile_of_one_recorded_node_is_restorable_there_and_not_elsewhere(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    here = record(tmp_path, "pvm.json", PVM)
    assert main(["restore-profile", "--name", "here", here]) == 0
    built = capsys.readouterr().out
    assert built.startswith("# restore_here: built by ate-devplugin restore-profile of 1 recorded profile\n")
    assert yaml.safe_load(built)["here"]["tsc"] == {"khz": 2599998, "tolerance_ppm": 250, "scaling": "accept"}
    config = config_with(tmp_path, built, "{avx512: {features: [avx512f, cx16]}}")
    assert main(["check-config", str(config)]) == 0
    capsys.readouterr()
    assert main(["restorable", "--config", str(config), "--profile", here]) == 1
    assert capsys.readouterr().out.splitlines() == [
        "ate.dev/kvm avx512: not restorable: 1 feature missing: avx512f",
        "ate.dev/kvm here: restorable",
    ]
    sky = record(tmp_path, "sky.json", hardware(SKYLAKE))
    assert main(["restorable", "--config", str(config), "--profile", sky]) == 1
    out = capsys.readouterr().out
    assert "ate.dev/kvm here: not restorable: KVM here is vmx, not pvm; 48 features missing: 3dnowprefetch arat" in out


def test_a_pools_baseline_and_a_template_that_asks_what_a_node_lacks(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    sky = record(tmp_path, "sky.json", hardware(SKYLAKE))
    ice = record(tmp_path, "ice.json", hardware(ICELAKE, khz=2_900_000))
    assert main(["restore-profile", "--name", "pool", sky, ice]) == 0
    captured = capsys.readouterr()
    pool = yaml.safe_load(captured.out)["pool"]
    assert (pool["vendor"], pool["kvm_implementations"], pool["tsc"]) == (
        "GenuineIntel", ["vmx"], {"tolerance_ppm": 250, "scaling": "require"}
    )  # fmt: skip
    assert set(pool["features"]) == hardware(SKYLAKE).features
    assert "of the baseline of 2 recorded profiles" in captured.out
    assert captured.err == ""
    template = tmp_path / "template.json"
    template.write_text(json.dumps({"cpuid_modifiers": [
        {"leaf": "0x7", "subleaf": "0x0", "flags": 1, "modifiers": [
            {"register": "ebx", "bitmap": "0bxxxxxxxxxxxxxxx1xxxxxxxxxx0xxxxx"}]},  # avx512f set, avx2 cleared
        {"leaf": "0x1", "subleaf": "0x0", "flags": 0, "modifiers": [{"register": "eax", "bitmap": "0b1"}]},
    ]}))  # fmt: skip
    assert main(["restore-profile", "--name", "t", "--cpu-template", str(template), sky, ice]) == 0
    captured = capsys.readouterr()
    features = yaml.safe_load(captured.out)["t"]["features"]
    assert "avx512f" in features
    assert "avx2" not in features
    assert f"# narrowed by {template} (not features, left out: 0x1.0.eax)" in captured.out
    assert captured.err == f"ate-devplugin: warning: {sky}: t: not restorable: 1 feature missing: avx512f\n"


@pytest.mark.parametrize(
    ("args", "line"),
    [
        (["--name", "restore-q3", "{sky}"], "--name: must be 1-24 characters of a-z, 0-9 and '_'"),
        (["--name", "q3", "--tolerance-ppm", "-1", "{sky}"], "--tolerance-ppm: must be from 0 to 1000000 (got -1)"),
        (["--name", "q3", "{sky}", "{amd}"], "restore-profile: the vendors differ (GenuineIntel ({sky}), AuthenticAMD"),
        (["--name", "q3", "{fixed}", "{ice}"], "restore-profile: the TSC frequencies differ by more than 250 ppm"),
        (["--name", "q3", "{v2}"], "{v2}: version: 2: this ate-devplugin reads version 1"),
        (["--name", "q3", "{text}"], "{text}: not JSON: Expecting value"),
        (["--name", "q3", "{tmp}/absent.json"], "{tmp}/absent.json: cannot read: No such file or directory"),
        (["--name", "q3", "--cpu-template", "{msr}", "{sky}"], "{msr}.msr_modifiers: MSR modifiers are not supported"),
    ],
)
def test_no_profile_exits_2_with_one_line_naming_the_file_and_field(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], args: list[str], line: str
) -> None:
    files = {
        "sky": record(tmp_path, "sky.json", hardware(SKYLAKE)),
        "ice": record(tmp_path, "ice.json", hardware(ICELAKE, khz=2_900_000)),
        "amd": record(tmp_path, "amd.json", hardware(SKYLAKE, "AuthenticAMD")),
        "fixed": record(tmp_path, "fixed.json", hardware(SKYLAKE, scaling=False)),
        "v2": str(tmp_path / "v2.json"),
        "text": str(tmp_path / "text.json"),
        "msr": str(tmp_path / "msr.json"),
        "tmp": str(tmp_path),
    }
    Path(files["v2"]).write_text(json.dumps({**PVM.to_json(), "version": 2}))
    Path(files["text"]).write_text("not json")
    Path(files["msr"]).write_text(json.dumps({"msr_modifiers": [{"addr": "0x10a", "bitmap": "0b0"}]}))
    assert main(["restore-profile", *(a.format(**files) for a in args)]) == 2
    captured = capsys.readouterr()
    (said,) = captured.err.splitlines()
    assert said.startswith("ate-devplugin: config error: ")
    assert line.format(**files) in said
    assert captured.out == ""


def test_restorable_without_profiles_or_with_a_bad_config(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    plain = tmp_path / "plain.yaml"
    plain.write_text("resources: [{name: ate.dev/kvm, devices: [/dev/kvm]}]\n")
    assert main(["restorable", "--config", str(plain)]) == 0  # nothing to judge: no probe either
    assert capsys.readouterr().out == f"{plain}: no restore profiles\n"
    bad = tmp_path / "bad.yaml"
    bad.write_text("resources: [{name: ate.dev/kvm, devices: [/dev/kvm], restore_profiles: {q-3: {}}}]\n")
    assert main(["restorable", "--config", str(bad)]) == 2
    (said,) = capsys.readouterr().err.splitlines()
    assert said.startswith("ate-devplugin: config error: resources[0].restore_profiles.q-3: must be 1-24 characters")


def test_a_node_whose_probe_fails_has_no_profile(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["cpu-profile", "--device", "/dev/null", "--timeout", "5"]) == 1
    captured = capsys.readouterr()
    assert captured.out == ""
    assert captured.err.startswith("ate-devplugin: cpu-profile: FAIL not-a-kvm-device: /dev/null: character device 1:3")
    assert main(["cpu-profile", "--timeout", "0"]) == 2
    assert "cpu-profile --timeout: '0' is not a number of seconds" in capsys.readouterr().err


def test_a_recorded_profile_without_a_tsc_frequency_builds_without_a_tsc_rule_only_when_asked(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    old = record(tmp_path, "old.json", replace(PVM, tsc=Tsc()))
    assert main(["restore-profile", "--name", "old", old]) == 2
    assert "no TSC frequency recorded (leave the TSC rule out to go on)" in capsys.readouterr().err
    assert main(["restore-profile", "--name", "old", "--no-tsc", old]) == 0
    assert "tsc" not in yaml.safe_load(capsys.readouterr().out)["old"]


# --- bad input files: one line naming the file, exit 2, nothing printed ----------------

_PROFILE_JSON = json.dumps(PVM.to_json())
_BAD_INPUTS: dict[str, tuple[bytes | None, str]] = {  # content (None: no file), what the line says
    "missing": (None, "cannot read: No such file or directory"),
    "empty": (b"", "is empty: not JSON"),
    "blank": (b" \n\t\n", "is empty: not JSON"),
    "binary": (bytes(range(256)) * 64, "is not UTF-8 text: not JSON"),
    "too-large": (b'{"cpu_model_name": "' + b"x" * 2_000_000 + b'"}', "is larger than 1048576 bytes"),
    "nested-arrays": (b"[" * 100_000 + b"]" * 100_000, "is nested 100000 deep: at most 32 levels"),
    "nested-objects": (b'{"a":' * 5_000 + b"1" + b"}" * 5_000, "is nested 5000 deep: at most 32 levels"),
    "nested-unclosed": (b"[" * 50, "is nested 50 deep"),
    "truncated": (_PROFILE_JSON[: len(_PROFILE_JSON) // 2].encode(), "not JSON: "),
    "nan": (_PROFILE_JSON.replace('"family": 6', '"family": NaN').encode(), "not JSON: NaN is not a number JSON"),
    "huge-number": (_PROFILE_JSON.replace('"family": 6', '"family": ' + "9" * 5000).encode(), "thousands of digits"),
}
_BAD_PROFILES: dict[str, tuple[object, str]] = {  # a JSON document, the field and what the line says
    "a-list": ([1, 2], "a CPU profile is a JSON object"),
    "a-string": ("profile", "a CPU profile is a JSON object"),
    "wrong-format": ({**PVM.to_json(), "format": "x" * 100_000}, "format: 'xxxxxxxx"),
    "features-a-string": (
        {k: v for k, v in PVM.to_json().items() if k != "cpuid"} | {"features": "avx2"},
        "features: must be a list of feature names",
    ),
    "cpuid-a-list": ({**PVM.to_json(), "cpuid": ["0x7.0.ebx"]}, "cpuid: must be an object of registers"),
    "cpuid-a-bool": ({**PVM.to_json(), "cpuid": {"0x7.0.ebx": True}}, "cpuid.0x7.0.ebx: must be a 32-bit value"),
    "cpuid-a-huge-key": ({**PVM.to_json(), "cpuid": {"k" * 100_000: "0x1"}}, "cpuid.kkkk"),
    "family-negative": ({**PVM.to_json(), "family": -1}, "family: must be a whole number or null"),
    "tsc-a-list": ({**PVM.to_json(), "tsc": []}, "tsc: must be an object"),
    "architecture-missing": ({"format": "ate.dev/cpu-profile", "version": 1}, "architecture: must be a non-empty"),
}


def _bad_input(tmp_path: Path, case: str) -> tuple[str, str]:
    """The path of a bad input file and what its line must say."""
    path = tmp_path / f"{case}.json"
    if case in _BAD_INPUTS:
        content, said = _BAD_INPUTS[case]
        if content is not None:
            path.write_bytes(content)
        return str(path), said
    document, said = _BAD_PROFILES[case]
    path.write_text(json.dumps(document))
    return str(path), said


def _one_line_exit_2(code: int, captured: CaptureResult[str], path: str, said: str) -> None:
    assert code == 2, captured.err
    (line,) = captured.err.splitlines()
    assert line.startswith(f"ate-devplugin: config error: {path}"), line
    assert said in line, line
    assert len(line) < 400, f"the input is echoed: {len(line)} characters"
    assert captured.out == ""


@pytest.mark.parametrize("case", [*_BAD_INPUTS, *_BAD_PROFILES])
@pytest.mark.parametrize("command", ["restore-profile", "restorable"])
def test_a_bad_profile_file_is_one_line_naming_it_and_exit_2(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], command: str, case: str
) -> None:
    path, said = _bad_input(tmp_path, case)
    if command == "restore-profile":
        code = main(["restore-profile", "--name", "q3", record(tmp_path, "good.json", PVM), path])
    else:
        config = config_with(tmp_path, "{q3: {features: [sse4_2]}}")
        code = main(["restorable", "--config", str(config), "--profile", path])
    _one_line_exit_2(code, capsys.readouterr(), path, said)


@pytest.mark.parametrize("case", [*_BAD_INPUTS, "a-list", "a-string"])
def test_a_bad_template_file_is_one_line_naming_it_and_exit_2(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], case: str
) -> None:
    path, said = _bad_input(tmp_path, case)
    if case in ("a-list", "a-string"):
        said = "must be a mapping"
    code = main(["restore-profile", "--name", "q3", "--cpu-template", path, record(tmp_path, "good.json", PVM)])
    _one_line_exit_2(code, capsys.readouterr(), path, said)


def test_a_file_just_within_the_depth_bound_is_judged_as_a_profile(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    path = tmp_path / "deep.json"
    path.write_text(json.dumps({**PVM.to_json(), "kernel_release": json.loads("[" * 31 + "]" * 31)}))
    assert main(["restore-profile", "--name", "q3", str(path)]) == 2
    (line,) = capsys.readouterr().err.splitlines()
    assert line == f"ate-devplugin: config error: {path}: kernel_release: must be a string"


def test_restorable_says_3_when_the_probe_failed_and_1_when_not_restorable(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    config = config_with(tmp_path, "{q3: {features: [avx512f]}}")
    assert main(["restorable", "--config", str(config), "--device", "/dev/null", "--timeout", "5"]) == 3
    captured = capsys.readouterr()
    assert captured.out == ""
    assert captured.err.startswith("ate-devplugin: restorable: FAIL not-a-kvm-device: /dev/null")
    assert main(["restorable", "--config", str(config), "--profile", record(tmp_path, "pvm.json", PVM)]) == 1
    assert capsys.readouterr().out == "ate.dev/kvm q3: not restorable: 1 feature missing: avx512f\n"


def test_profiles_no_node_can_match_are_warned_about_by_the_commands(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    config = config_with(tmp_path, "{amd: {vendor: GenuineIntel, kvm_implementations: [svm]}}")
    assert main(["restorable", "--config", str(config), "--profile", record(tmp_path, "pvm.json", PVM)]) == 1
    assert capsys.readouterr().err == (
        "ate-devplugin: warning: resources[0].restore_profiles.amd.kvm_implementations: cannot match any node: KVM "
        "on a GenuineIntel CPU is vmx or pvm, never svm\n"
    )
    assert main(["check-config", str(config)]) == 0
    assert "cannot match any node" in capsys.readouterr().err
    here = record(tmp_path, "pvm.json", PVM)
    assert main(["restore-profile", "--name", "loose", "--tolerance-ppm", "1000000", here]) == 0
    assert capsys.readouterr().err.startswith(
        "ate-devplugin: warning: loose.tsc.tolerance_ppm: 1000000 ppm lets almost any TSC frequency pass"
    )


# --- fuzzed profile files through the commands: a profile, or one line and exit 2 ---------

_json_junk = st.recursive(
    st.one_of(st.none(), st.booleans(), st.integers(), st.floats(allow_nan=False), st.text(max_size=12)),
    lambda inner: st.one_of(
        st.lists(inner, max_size=3),
        st.dictionaries(
            st.sampled_from(
                [
                    "format",
                    "version",
                    "architecture",
                    "vendor",
                    "family",
                    "tsc",
                    "khz",
                    "scaling",
                    "cpuid",
                    "features",
                    "0x7.0.ebx",
                    "kvm_implementation",
                    "x",
                ]
            ),
            inner,
            max_size=4,
        ),
    ),
    max_leaves=10,
)
_mutated_profile = st.builds(
    lambda key, value: {**PVM.to_json(), key: value},
    st.sampled_from(sorted(PVM.to_json())),
    _json_junk,
)
_raw_bytes = st.one_of(st.binary(max_size=200), st.text(max_size=200).map(str.encode))


@settings(max_examples=150, derandomize=True, database=None, deadline=None,
          suppress_health_check=[HealthCheck.function_scoped_fixture])  # fmt: skip
@given(content=st.one_of(_json_junk.map(lambda d: json.dumps(d).encode()),
                         _mutated_profile.map(lambda d: json.dumps(d).encode()), _raw_bytes))  # fmt: skip
def test_fuzzed_profile_files_are_read_or_refused_in_one_line(
    content: bytes, tmp_path_factory: pytest.TempPathFactory, capsys: pytest.CaptureFixture[str]
) -> None:
    path = tmp_path_factory.mktemp("fuzz") / "profile.json"
    path.write_bytes(content)
    code = main(["restore-profile", "--name", "q3", "--no-tsc", str(path)])
    captured = capsys.readouterr()
    if code == 0:
        assert yaml.safe_load(captured.out)["q3"] is not None
        return
    assert code == 2, captured.err
    (line,) = captured.err.splitlines()
    assert line.startswith(f"ate-devplugin: config error: {path}") or line.startswith(
        "ate-devplugin: config error: restore-profile: "
    ), line  # a valid profile with no CPUID or the like: no profile of it, said as such
    assert captured.out == ""
