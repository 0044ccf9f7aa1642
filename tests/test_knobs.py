"""TRIDENT_* knobs (trident/knobs.py): one parser per type, so every knob reads every spelling of
on and off alike, refuses the rest naming its variable, and keeps its range."""

from __future__ import annotations

import math
import os

import pytest

from trident import errors, knobs, logs

TRUE = ["1", "true", "True", "TRUE", "yes", "Yes", "YES", "on", "On", "ON", "y", "Y", "t", "T", " 1 ", " on\t", "yes\n"]
FALSE = [
    "0",
    "false",
    "False",
    "FALSE",
    "no",
    "No",
    "NO",
    "off",
    "Off",
    "OFF",
    "n",
    "N",
    "f",
    "F",
    "none",
    "None",
    "",
    " ",
    " 0 ",
    " off\t",
    "no\n",
]

# Every knob: its reader, its value when unset, and a few (raw, parsed) pairs beyond the switches.
BOOLS = {
    "cache_attention": (knobs.cache_attention, True),
    "pdl_user_kernels": (knobs.pdl_user_kernels, True),
    "compile_cubin_on_cpu": (knobs.compile_cubin_on_cpu, True),
    "dynamo_symbolic": (knobs.dynamo_symbolic, True),
    "graph_lend": (knobs.graph_lend, True),
}
DEVICE_MODES = {
    "triton_copies": knobs.triton_copies,
    "decode_attention": knobs.decode_attention,
    "prefill_attention": knobs.prefill_attention,
    "gemm_epilogues": knobs.gemm_epilogues,
    "fuse_glue": knobs.fuse_glue,
    "decode_matmuls": knobs.decode_matmuls,
    "pdl": knobs.pdl,
    "graphs": knobs.graphs,
}
INTS = {  # reader, default, lowest, highest (None: unbounded)
    "mlir_opt_level": (knobs.mlir_opt_level, 0, 0, 3),
    "graph_limit": (knobs.graph_limit, 4, 0, 16),
    "graph_bytes": (knobs.graph_bytes, 4 << 30, 0, None),
    "graph_stage_written_bytes": (knobs.graph_stage_written_bytes, 16 << 20, 0, None),
    "captures": (knobs.captures, 32, 0, None),
}
STRS = {"dump_dir": knobs.dump_dir, "repro_dir": knobs.repro_dir, "cache_dir": knobs.cache_dir}
BAD_WORDS = ["maybe", "2", "-1", "enable", "yes please", "tru", "o", "nope"]


def _env(name: str) -> str:
    return knobs._KNOBS[name].env


def _refused(name: str, raw: str, read, *fragments: str) -> None:
    with knobs.scope(**{name: raw}), pytest.raises(knobs.KnobError) as info:
        read()
    message = str(info.value)
    assert message.startswith(f"{_env(name)}={raw!r}: expected") or "unknown" in message, message
    for fragment in (_env(name), repr(raw), *fragments):
        assert fragment in message, (fragment, message)


def test_every_knob_has_a_type_and_its_default_parses():
    """A knob added without a type, or with a default its own type refuses, fails here."""
    types = (knobs.Bool, knobs.Int, knobs.Float, knobs.Str, knobs.Choice, knobs.Names, knobs.Prefixes)
    for name, knob in knobs._KNOBS.items():
        assert isinstance(knob.type, types), name
        assert knob.env == "TRIDENT_" + name.upper(), name
        assert knob.doc, name
        knob.type.parse(knob.env, knob.default)
        with knobs.scope(**{name: None}):
            assert knobs.get(name) == knob.default
            assert knobs.value(name) == knob.type.parse(knob.env, knob.default)
    tested = set(BOOLS) | set(DEVICE_MODES) | set(INTS) | set(STRS)
    tested |= {"native_paths", "progress", "graph_min_saving_us", "dynamo_trace_disabled", "log"}
    tested |= {"tuning_dir"}  # tests/test_disk_cache.py: its default is a folder
    assert tested == set(knobs._KNOBS), "a new knob needs its rows in this file"


def test_knob_error_is_a_trident_error_and_a_value_error():
    assert issubclass(knobs.KnobError, errors.TridentError) and issubclass(knobs.KnobError, ValueError)


@pytest.mark.parametrize("name", sorted(BOOLS))
def test_bools(name):
    read, default = BOOLS[name]
    with knobs.scope(**{name: None}):
        assert read() is default
    for raw in TRUE:
        with knobs.scope(**{name: raw}):
            assert read() is True, raw
    for raw in FALSE:
        with knobs.scope(**{name: raw}):
            assert read() is False, raw
    for raw in BAD_WORDS + ["cuda", "all"]:
        _refused(name, raw, read, "on (1/true/yes/on/y/t)", "off (0/false/no/off/n/f/none/'')")
    with knobs.scope(**{name: False}):  # scope writes Python booleans as 1/0
        assert read() is False and knobs.get(name) == "0"


def test_compile_cubin_on_cpu_off_is_off():
    """The bug: only 0/false/False/'' were off, so TRIDENT_COMPILE_CUBIN_ON_CPU=off turned it on."""
    for raw in ("off", "no", "OFF", "n", "none"):
        with knobs.scope(compile_cubin_on_cpu=raw):
            assert knobs.compile_cubin_on_cpu() is False, raw


def test_dynamo_symbolic_takes_every_spelling():
    """The bug: only 0 and 1 were accepted."""
    with knobs.scope(dynamo_symbolic="false"):
        assert knobs.dynamo_symbolic() is False
    with knobs.scope(dynamo_symbolic="yes"):
        assert knobs.dynamo_symbolic() is True


@pytest.mark.parametrize("name", sorted(DEVICE_MODES))
def test_device_modes(name):
    """'cuda', 'all', off (any off spelling: ''), and on (any on spelling: 'cuda', the default;
    decode attention's is 'measured')."""
    read = DEVICE_MODES[name]
    with knobs.scope(**{name: None}):
        assert read() == {"decode_attention": "measured"}.get(name, "cuda")
    for raw, mode in [
        ("cuda", "cuda"),
        ("CUDA", "cuda"),
        (" Cuda ", "cuda"),
        ("all", "all"),
        ("ALL", "all"),
        (" all\n", "all"),
    ]:
        with knobs.scope(**{name: raw}):
            assert read() == mode, raw
    for raw in TRUE:
        with knobs.scope(**{name: raw}):
            assert read() == "cuda", raw
    for raw in FALSE:
        with knobs.scope(**{name: raw}):
            assert read() == "", raw
    for raw in BAD_WORDS + ["cpu", "always"]:
        _refused(name, raw, read, "'cuda', 'all'", "off (0/false/no/off/n/f/none/'')")


def test_graphs_no_is_off():
    """The bug: TRIDENT_GRAPHS=no raised."""
    with knobs.scope(graphs="no"):
        assert knobs.graphs() == ""
    _refused("graphs", "maybe", knobs.graphs, "expected 'cuda', 'all', on (", "or off (0/false/no/off/")


def test_progress():
    with knobs.scope(progress=None):
        assert knobs.progress() == "auto"
    for raw, mode in [("auto", "auto"), ("AUTO", "auto"), (" auto ", "auto"), ("always", "always"), ("Never", "never")]:
        with knobs.scope(progress=raw):
            assert knobs.progress() == mode, raw
    for raw in TRUE:
        with knobs.scope(progress=raw):
            assert knobs.progress() == "always", raw
    for raw in FALSE:
        with knobs.scope(progress=raw):
            assert knobs.progress() == "never", raw
    for raw in BAD_WORDS + ["sometimes", "cuda"]:
        _refused("progress", raw, knobs.progress, "'auto', 'always', 'never'", "'always'", "'never'")


@pytest.mark.parametrize("name", sorted(INTS))
def test_ints(name):
    read, default, lo, hi = INTS[name]
    with knobs.scope(**{name: None}):
        assert read() == default
    inside = [lo, lo + 1, f" {lo + 1} ", str(hi if hi is not None else 1 << 40)]
    for raw in inside:
        with knobs.scope(**{name: raw}):
            assert read() == int(raw), raw
    outside = [str(lo - 1), str(lo - 100)] + ([str(hi + 1), str(hi + 100)] if hi is not None else [])
    expected = f"an integer in {lo}..{hi}" if hi is not None else f"an integer >= {lo}"
    for raw in outside + ["", " ", "lots", "1.5", "1e3", "0x10", "on", "true", "inf"]:
        _refused(name, raw, read, expected)


def test_range_limits():
    with knobs.scope(graph_limit="16"):
        assert knobs.graph_limit() == 16
    _refused("graph_limit", "17", knobs.graph_limit, "0..16")
    with knobs.scope(graph_limit=0):
        assert knobs.graph_limit() == 0
    _refused("graph_limit", "-1", knobs.graph_limit, "0..16")
    with knobs.scope(mlir_opt_level=3):
        assert knobs.mlir_opt_level() == 3
    _refused("mlir_opt_level", "4", knobs.mlir_opt_level, "0..3")
    with knobs.scope(captures=1):
        assert knobs.captures() == 1
    _refused("captures", "-1", knobs.captures, ">= 0")
    with knobs.scope(captures=0, graph_bytes=0, graph_stage_written_bytes=0):
        assert knobs.captures() == knobs.graph_bytes() == knobs.graph_stage_written_bytes() == 0


def test_graph_min_saving_us():
    with knobs.scope(graph_min_saving_us=None):
        assert knobs.graph_min_saving_us() == 0.0
    for raw, us in [
        ("0", 0.0),
        ("2.5", 2.5),
        (" -3 ", -3.0),
        ("1e2", 100.0),
        ("-inf", -math.inf),
        ("-INF", -math.inf),
        ("inf", math.inf),
    ]:
        with knobs.scope(graph_min_saving_us=raw):
            assert knobs.graph_min_saving_us() == us, raw
    for raw in ["", "soon", "nan", "NaN", "1 us", "on"]:
        _refused("graph_min_saving_us", raw, knobs.graph_min_saving_us, "a number")


@pytest.mark.parametrize("name", sorted(STRS))
def test_strs(name):
    """Folders: kept as they came ('' is none)."""
    read = STRS[name]
    with knobs.scope(**{name: None}):
        assert read() == ""
    for raw in ["/tmp/x", "relative/dir", "/path with spaces/", "0", "off", ""]:
        with knobs.scope(**{name: raw}):
            assert read() == raw


def test_native_paths():
    every = knobs.NATIVE_PATHS
    assert every == ("views", "constants", "typed", "gemm", "arena", "release")
    with knobs.scope(native_paths=None):
        assert all(knobs.native_path(p) for p in every)
    for raw, on in [
        ("views", {"views"}),
        ("gemm, arena", {"gemm", "arena"}),
        (" Typed ,RELEASE,", {"typed", "release"}),
        ("views,views", {"views"}),
        (",".join(every), set(every)),
        (("views", "gemm"), {"views", "gemm"}),
    ]:
        with knobs.scope(native_paths=raw):
            assert {p for p in every if knobs.native_path(p)} == on, raw
    for raw in FALSE:  # A/B: none
        with knobs.scope(native_paths=raw):
            assert not any(knobs.native_path(p) for p in every), raw
    for raw in ["view", "views,gem", "all", "1", "views;gemm"]:
        _refused(
            "native_paths",
            raw,
            lambda: knobs.native_path("views"),
            "unknown",
            "expected a comma list of views, constants, typed, gemm, arena, release",
        )
    with pytest.raises(KeyError, match="no native path 'vews'"):
        knobs.native_path("vews")


def test_dynamo_trace_disabled():
    """'auto' (default): every module checked; '+'/'-' (a bare prefix is '+') force per module,
    the longest prefix deciding ('*' the shortest); an off spelling: never kept."""
    check = knobs.ModuleRules("check")
    with knobs.scope(dynamo_trace_disabled=None):
        assert knobs.dynamo_trace_disabled() == check
    for raw, rules in [
        ("auto", check),
        (" AUTO ", check),
        ("liger_kernel", knobs.ModuleRules("check", (("liger_kernel", "trace"),))),
        ("+a, -b.c ,", knobs.ModuleRules("check", (("a", "trace"), ("b.c", "break")))),
        ("*", knobs.ModuleRules("check", (("*", "trace"),))),
        ("-*,+liger_kernel", knobs.ModuleRules("check", (("*", "break"), ("liger_kernel", "trace")))),
        ("auto,- Pkg.Sub_1", knobs.ModuleRules("check", (("Pkg.Sub_1", "break"),))),
        ("+a,a", knobs.ModuleRules("check", (("a", "trace"),))),
    ]:
        with knobs.scope(dynamo_trace_disabled=raw):
            assert knobs.dynamo_trace_disabled() == rules, raw
    for raw in FALSE:
        with knobs.scope(dynamo_trace_disabled=raw):
            assert knobs.dynamo_trace_disabled() == knobs.ModuleRules("break"), raw
    for raw in ["a b", "a..b", ".a", "a.", "1pkg", "a;b", "a/b", "+", "-", "++a", ",", "+a,-a"]:
        with knobs.scope(dynamo_trace_disabled=raw), pytest.raises(knobs.KnobError) as info:
            knobs.dynamo_trace_disabled()
        assert "TRIDENT_DYNAMO_TRACE_DISABLED" in str(info.value) and "module prefixes" in str(info.value), raw
    rules = knobs.PrefixRules().parse("TRIDENT_DYNAMO_TRACE_DISABLED", "-*,+lib,-lib.private,mylib")
    for module, action in [
        ("lib", "trace"),
        ("lib.ops", "trace"),
        ("libx", "break"),  # a prefix names whole dotted parts
        ("lib.private", "break"),
        ("lib.private.x", "break"),
        ("mylib.a", "trace"),
        ("other", "break"),
    ]:
        assert rules.action(module) == action, module
    assert check.action("anything") == "check" and knobs.ModuleRules("break").action("lib") == "break"


def test_log():
    """TRIDENT_LOG's syntax as before (a comma list of logger names, or all), now a knob: off
    spellings are none, names any case."""
    with knobs.scope(log=None):
        assert knobs.log() == ()
    for raw, names in [
        ("misses", ("misses",)),
        ("graphs, misses", ("misses", "graphs")),
        ("all", logs.NAMES),
        ("misses,all", logs.NAMES),
        ("Guards,LOWERING,", ("guards", "lowering")),
    ]:
        with knobs.scope(log=raw):
            assert knobs.log() == names, raw
        assert knobs.parse("log", raw) == names, raw
    for raw in FALSE:
        with knobs.scope(log=raw):
            assert knobs.log() == (), raw
    for raw in ["misses,everything", "miss", "all,typo", "1"]:
        _refused("log", raw, knobs.log, "unknown", "expected a comma list of misses, guards, graphs, lowering or all")
        with pytest.raises(ValueError, match="expected a comma list of misses, guards, graphs, lowering"):
            logs.configure(raw)
    logs.configure("")


def test_scope_restores():
    env = _env("graph_limit")
    with knobs.scope(graph_limit=None):
        with knobs.scope(graph_limit=2):
            assert knobs.get("graph_limit") == "2" and knobs.graph_limit() == 2
        assert env not in os.environ
    with knobs.scope(graph_limit="3"):
        with knobs.scope(graph_limit=None):
            assert knobs.graph_limit() == 4
        assert knobs.graph_limit() == 3


def test_monkeypatched_environment_is_read_at_use(monkeypatch):
    monkeypatch.setenv("TRIDENT_GRAPHS", "OFF")
    assert knobs.graphs() == ""
    monkeypatch.setenv("TRIDENT_COMPILE_CUBIN_ON_CPU", " No ")
    assert knobs.compile_cubin_on_cpu() is False
    monkeypatch.setenv("TRIDENT_GRAPH_LIMIT", "17")
    with pytest.raises(ValueError, match=r"TRIDENT_GRAPH_LIMIT='17': expected an integer in 0\.\.16"):
        knobs.graph_limit()


def test_the_settings_page_is_knobs_py():
    """docs/settings.md lists every knob as knobs.py defines it (regenerate: python tools/settings_doc.py)."""
    path = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "docs", "settings.md")
    with open(path) as f:
        assert f.read() == knobs.settings_markdown(), "docs/settings.md is stale: run python tools/settings_doc.py"
