"""Target profiles: shipped profiles load and cite their sources, user profiles work, bad profiles are refused
with one-line InputErrors, explicit options override a profile, and every constraint of every shipped profile is
reported by the checker on a small model that violates it."""

from __future__ import annotations

import dataclasses
import re
from pathlib import Path

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

from onnx_npu_fix.config.options import KINDS, FixOptions, field_kind
from onnx_npu_fix.config.targets import (
    TargetProfile,
    apply_target,
    list_targets,
    load_target,
    parse_size,
    render_target_list,
    shipped_target_names,
)
from onnx_npu_fix.errors import InputError

TARGETS_DIR = Path(__file__).resolve().parent.parent / "onnx_npu_fix" / "config" / "profiles"
SHIPPED = {"ethos-u55", "ethos-u65", "tidl", "mdla2", "neutron", "sigmastar", "mstar-ipu", "stm32n6", "k210",
           "bm1684x", "rv1106", "rk3566", "rk3588"}


# --- shipped profiles -------------------------------------------------------------------------------------


def test_the_issue_8_profiles_are_shipped():
    assert set(shipped_target_names()) == SHIPPED
    assert [p.name for p in list_targets()] == sorted(SHIPPED)


@pytest.mark.parametrize("name", sorted(SHIPPED))
def test_shipped_profile_loads_with_description_and_sources(name):
    profile = load_target(name)
    assert profile.name == name
    assert Path(profile.path).stem == name  # file stem = name, so --target NAME finds it
    assert profile.description
    assert profile.sources and all(len(s) > 20 for s in profile.sources)
    assert profile.constraints, "a profile without constraints would change nothing"
    # Every value converts into a valid FixOptions.
    options = apply_target(profile, FixOptions(), {})
    for key, value in profile.constraints.items():
        assert getattr(options, key) == value


@pytest.mark.parametrize("name", sorted(SHIPPED))
def test_every_constraint_line_cites_its_source(name):
    """The profiles' rule: each constraint with its public source in a comment next to it."""
    text = (TARGETS_DIR / f"{name}.toml").read_text(encoding="utf-8")
    section = re.search(r"^\[constraints\]\n(.*?)(?=^\[|\Z)", text, re.S | re.M)
    assert section, "no [constraints] table"
    lines = [ln for ln in section.group(1).splitlines() if ln.strip() and not ln.lstrip().startswith("#")]
    assert lines
    for line in lines:
        assert "#" in line, f"constraint without a source comment: {line!r}"
        comment = line.split("#", 1)[1].strip()
        assert len(comment) >= 20, f"source comment too thin: {line!r}"


def test_list_targets_shows_every_profile_with_its_sources_and_notes():
    profiles = list_targets()
    text = render_target_list(profiles)
    for profile in profiles:
        assert re.search(rf"^{re.escape(profile.name)}\s+{re.escape(profile.description)}$", text, re.M)
        for source in profile.sources:
            assert f"  source: {source}" in text
        for key, note in profile.notes.items():
            assert f"  not checked: {key}: {note}" in text
    assert "sram_bytes=2 MiB" in text  # sizes are shown in a readable unit
    assert render_target_list([]) == ""


def test_facts_from_the_issue_are_encoded():
    """Spot checks of values the issue and the constraint sources state outright."""
    k210 = load_target("k210").constraints
    assert k210["sram_bytes"] == 2 * 1024 * 1024
    assert (k210["allowed_kernels"], k210["max_stride"]) == ((1, 3), 2) and "symmetric_pads" not in k210
    assert k210["forbidden_ops"] == ("PRelu", "ConvTranspose")
    assert load_target("mstar-ipu").constraints["max_dilation"] == 4
    mdla = load_target("mdla2").constraints
    assert mdla["allowed_dilations"] == (1, 2, 4, 8)
    assert set(load_target("ethos-u55").constraints["forbidden_ops"]) == {"SpaceToDepth", "DepthToSpace"}
    assert load_target("ethos-u55").constraints == load_target("ethos-u65").constraints
    assert load_target("neutron").constraints["concat_align"] == 8
    assert load_target("sigmastar").constraints["align"] == 16
    stm = load_target("stm32n6").constraints
    assert stm["align"] == 8 and stm["batch_one"] and stm["require_nearest_resize"] and not stm["allow_batchnorm"]
    assert "sram_bytes" not in stm  # depends on the project's memory pool: left to --sram, not guessed


def test_vendor_compiler_profiles_encode_the_measured_facts():
    """What tpu-mlir 1.30.2 and rknn-toolkit2 2.5.0 did (docs/vendor-judge.md)."""
    bm = load_target("bm1684x").constraints
    assert bm["max_dilation"] == 15 and bm["remainder_pad"] == "concat" and bm["lift_conv1d"] is True
    assert bm["max_convtranspose_stride"] == 8
    assert load_target("rv1106").constraints["max_dilation"] == 31
    for name in ("rv1106", "rk3566", "rk3588"):
        assert load_target(name).constraints["s2b_layouts"] == ("spatial",)
    for name in ("rk3566", "rk3588"):  # large dilations ran on their NPUs: nothing to rewrite
        assert "max_dilation" not in load_target(name).constraints
    # The portable defaults: no rank-3 Pad, no lift, every layout, ConvTranspose allowed without a stride limit.
    defaults = FixOptions()
    assert (defaults.remainder_pad, defaults.lift_conv1d, defaults.s2b_layouts) == ("concat", False, None)
    assert defaults.allow_convtranspose and defaults.max_convtranspose_stride is None


@pytest.mark.parametrize(("content", "message"), [
    ('[constraints]\nremainder_pad = "zeros"\n', "remainder_pad must be one of concat, pad4d, pad"),
    ('[constraints]\ns2b_layouts = ["spatial", "diagonal"]\n', "s2b_layouts values must be among"),
    ('[constraints]\nmax_convtranspose_stride = 0\n', "max_convtranspose_stride must be >= 1"),
    ('[constraints]\nlift_conv1d = "yes"\n', "lift_conv1d must be true or false"),
])
def test_emission_keys_are_checked(tmp_path, content, message):
    path = tmp_path / "bad.toml"
    path.write_text(content, encoding="utf-8")
    with pytest.raises(InputError, match=re.escape(message)):
        load_target(str(path))


def test_every_fixoptions_field_can_be_set_from_a_profile():
    """A field added to FixOptions with a type the validator does not know would be unusable in profiles."""
    for f in dataclasses.fields(FixOptions):
        kind, _ = field_kind(f.type)
        assert kind in KINDS, f"options.check_value has no rules for FixOptions.{f.name}: {f.type}"


# --- one validator: a value is refused by FixOptions and by a profile alike, with the same message ------------

# (field, the value from Python, the same value in TOML, the message both give): one or more per kind of field.
REFUSED_BOTH_WAYS = [
    ("batch_one", 1, "batch_one = 1", "batch_one must be true or false, got integer 1"),
    ("max_dilation", 0, "max_dilation = 0", "max_dilation must be >= 1, got 0"),
    ("max_dilation", "4", 'max_dilation = "4"', "max_dilation must be an integer, got string '4'"),
    ("max_dilation", 2.0, "max_dilation = 2.0", "max_dilation must be an integer, got float 2.0"),
    ("sram_bytes", -1, "sram_bytes = -1", "sram_bytes must be >= 0, got -1"),
    ("rtol", -1.0, "rtol = -1.0", "rtol must be >= 0, got -1.0"),
    ("rtol", float("nan"), "rtol = nan", "rtol must be a finite number, got nan"),
    ("max_approx_error", "big", 'max_approx_error = "big"', "max_approx_error must be a number, got string 'big'"),
    ("resize_mode", "bilinear", 'resize_mode = "bilinear"', "resize_mode must be one of nearest, exact, got "
                                                             "'bilinear'"),
    ("validation_data", 3, "validation_data = 3", "validation_data must be a string, got integer 3"),
    ("allowed_dilations", [0, 1], "allowed_dilations = [0, 1]", "allowed_dilations must be >= 1, got [0, 1]"),
    ("allowed_dilations", [1, "2"], 'allowed_dilations = [1, "2"]',
     "allowed_dilations must be a list of integers, got list [1, '2']"),
    ("allowed_dilations", 4, "allowed_dilations = 4", "allowed_dilations must be a list of integers, got integer 4"),
    ("s2b_layouts", ["spatial", "diagonal"], 's2b_layouts = ["spatial", "diagonal"]',
     "s2b_layouts values must be among spatial, channel, batch, got 'diagonal'"),
    ("forbidden_ops", ["Prelu"], 'forbidden_ops = ["Prelu"]',
     "forbidden_ops: 'Prelu' is not an ONNX op type (did you mean 'PRelu'?)"),
    ("forbidden_ops", "PRelu", 'forbidden_ops = "PRelu"', "forbidden_ops must be a list of strings, got string "
                                                           "'PRelu'"),
    # A zero dimension is no usable shape: FixOptions accepted it while a profile refused it.
    ("input_shapes", {"x": [0, 3]}, "input_shapes = { x = [0, 3] }",
     "input_shapes: input 'x' has a dimension < 1: [0, 3]"),
    ("input_shapes", {"x": [1, -2]}, "input_shapes = { x = [1, -2] }",
     "input_shapes: input 'x' has a dimension < 1: [1, -2]"),
    ("input_shapes", {"x": "1,3"}, 'input_shapes = { x = "1,3" }',
     "input_shapes: input 'x' must map to a list of integers, got '1,3'"),
    ("input_shapes", [1, 3], "input_shapes = [1, 3]",
     "input_shapes must be a mapping of input name to dims, got list [1, 3]"),
    ("freeze_inputs", "sr=16000", 'freeze_inputs = "sr=16000"',
     "freeze_inputs must be a mapping of strings, got string 'sr=16000'"),
]


@pytest.mark.parametrize(("field", "value", "toml", "message"), REFUSED_BOTH_WAYS,
                         ids=[f"{case[0]}-{i}" for i, case in enumerate(REFUSED_BOTH_WAYS)])
def test_fixoptions_and_profiles_refuse_the_same_values_alike(field, value, toml, message):
    from onnx_npu_fix.config.targets import parse_profile
    from onnx_npu_fix.errors import OptionError

    with pytest.raises(OptionError) as direct:
        FixOptions(**{field: value})
    assert str(direct.value) == message and direct.value.field == field
    with pytest.raises(InputError) as profile:
        parse_profile(f"[constraints]\n{toml}\n", where="p.toml", default_name="p")
    assert str(profile.value) == f"target profile p.toml: [constraints] {message}"


# (field, the value from Python, the same value in TOML, the FixOptions value both give)
ACCEPTED_BOTH_WAYS = [
    ("batch_one", True, "batch_one = true", True),
    ("max_dilation", 4, "max_dilation = 4", 4),
    ("rtol", 1, "rtol = 1", 1.0),
    ("remainder_pad", "pad4d", 'remainder_pad = "pad4d"', "pad4d"),
    ("allowed_dilations", [1, 2, 4], "allowed_dilations = [1, 2, 4]", (1, 2, 4)),
    ("s2b_layouts", ["spatial"], 's2b_layouts = ["spatial"]', ("spatial",)),
    ("forbidden_ops", ["PRelu", "Gather"], 'forbidden_ops = ["PRelu", "Gather"]', ("PRelu", "Gather")),
    ("input_shapes", {"x": [1, 3]}, "input_shapes = { x = [1, 3] }", {"x": (1, 3)}),
    ("freeze_inputs", {"sr": "16000"}, 'freeze_inputs = { sr = "16000" }', {"sr": "16000"}),
]


@pytest.mark.parametrize(("field", "value", "toml", "expected"), ACCEPTED_BOTH_WAYS)
def test_fixoptions_and_profiles_accept_the_same_values_alike(field, value, toml, expected):
    from onnx_npu_fix.config.targets import parse_profile

    direct = getattr(FixOptions(**{field: value}), field)
    profile = parse_profile(f"[constraints]\n{toml}\n", where="p.toml", default_name="p").constraints[field]
    assert direct == profile == expected
    assert type(direct) is type(profile) is type(expected)


def test_profile_sizes_and_typed_freeze_values_are_converted_before_the_check():
    """What only TOML needs converting: a size with a unit, a frozen value TOML typed as a number or a list."""
    from onnx_npu_fix.config.targets import parse_profile

    profile = parse_profile('[constraints]\nsram_bytes = "384KiB"\nfreeze_inputs = { sr = 16000, w = [1, 2] }\n',
                            where="p.toml", default_name="p")
    assert profile.constraints == {"sram_bytes": 384 << 10, "freeze_inputs": {"sr": "16000", "w": "[1, 2]"}}
    with pytest.raises(InputError, match=re.escape("[constraints] sram_bytes '384KB': KB is ambiguous")):
        parse_profile('[constraints]\nsram_bytes = "384KB"\n', where="p.toml", default_name="p")


@pytest.mark.parametrize("spelling", ["K210", "k210", " k210 ", "Ethos_U55", "MSTAR-IPU"])
def test_names_ignore_case_and_underscores(spelling):
    assert load_target(spelling).name == spelling.strip().lower().replace("_", "-")


# --- options precedence -------------------------------------------------------------------------------------


def test_explicit_options_override_the_profile_and_the_profile_overrides_the_base():
    profile = load_target("mstar-ipu")
    base = FixOptions(align=4, seed=7, max_dilation=None)
    options = apply_target(profile, base, {"max_dilation": 2})
    assert options.max_dilation == 2  # explicit beats the profile's 4
    assert options.align == 16  # profile beats the base's 4
    assert options.concat_align == 16
    assert options.seed == 7  # untouched by the profile: the base stays
    assert apply_target(profile, base, {}).max_dilation == 4
    assert base.align == 4  # the base object is not modified (frozen, replaced)


def test_explicit_none_clears_a_profile_limit():
    options = apply_target(load_target("k210"), FixOptions(), {"sram_bytes": None, "max_kernel": None})
    assert options.sram_bytes is None and options.max_kernel is None
    assert options.max_stride == 2


def test_apply_target_refuses_unknown_explicit_options():
    with pytest.raises(InputError, match="unknown option"):
        apply_target(load_target("k210"), FixOptions(), {"max_dilations": 3})


# --- user profiles --------------------------------------------------------------------------------------------


USER_PROFILE = """
[target]
description = "our board"
sources = ["datasheet rev 3, table 12"]

[constraints]
max_dilation = 6           # datasheet
allowed_dilations = [1, 2, 3, 6]
sram_bytes = "384KiB"
act_bytes = 2
forbidden_ops = ["SpaceToDepth"]
s2b_layout = "batch"
max_approx_error = 1       # an int where a float is expected is fine
input_shapes = { audio = [1, 1, 16000] }

[notes]
pooling = "MaxPool 2x2 only"
"""


def test_user_profile_file(tmp_path):
    path = tmp_path / "board-v3.toml"
    path.write_text(USER_PROFILE, encoding="utf-8")
    profile = load_target(str(path))
    assert profile.name == "board-v3"  # no [target] name: the file stem
    assert profile.path == str(path)
    c = profile.constraints
    assert c["max_dilation"] == 6
    assert c["allowed_dilations"] == (1, 2, 3, 6)
    assert c["sram_bytes"] == 384 * 1024
    assert c["forbidden_ops"] == ("SpaceToDepth",)
    assert c["max_approx_error"] == 1.0 and isinstance(c["max_approx_error"], float)
    assert c["input_shapes"] == {"audio": (1, 1, 16000)}
    assert profile.notes == {"pooling": "MaxPool 2x2 only"}

    options = apply_target(profile, FixOptions(), {"act_bytes": 4})
    assert options.act_bytes == 4 and options.s2b_layout == "batch" and options.sram_bytes == 393216
    assert "board-v3  our board" in render_target_list([profile])


def test_user_profile_with_a_name_and_without_the_toml_suffix(tmp_path, monkeypatch):
    (tmp_path / "myboard").write_text('[target]\nname = "mine"\n[constraints]\nalign = 32  # spec\n')
    monkeypatch.chdir(tmp_path)
    profile = load_target("myboard")
    assert profile.name == "mine" and profile.constraints == {"align": 32}


def test_empty_user_profile_changes_nothing(tmp_path):
    path = tmp_path / "empty.toml"
    path.write_text("")
    profile = load_target(str(path))
    assert profile == TargetProfile("empty", "", (), {}, {}, str(path))
    assert apply_target(profile, FixOptions(), {}) == dataclasses.replace(FixOptions(), target="empty", requested={})
    assert "constraints: (none" in render_target_list([profile])


BAD_PROFILES = [
    ("[constraints]\nmax_dilations = 4\n", "unknown key 'max_dilations' in [constraints]; did you mean 'max_dilation'"),
    ("[constraints]\nmax_dilation = \"4\"\n", "max_dilation must be an integer, got string '4'"),
    ("[constraints]\nmax_dilation = true\n", "max_dilation must be an integer, got boolean"),
    ("[constraints]\nmax_dilation = 0\n", "max_dilation must be >= 1"),
    ("[constraints]\nalign = -8\n", "align must be >= 0"),
    ("[constraints]\nbatch_one = 1\n", "batch_one must be true or false, got integer"),
    ("[constraints]\nallowed_dilations = [1, \"2\"]\n", "allowed_dilations must be a list of integers"),
    ("[constraints]\nallowed_dilations = 4\n", "allowed_dilations must be a list of integers"),
    ("[constraints]\nallowed_dilations = [0, 1]\n", "allowed_dilations must be >= 1, got [0, 1]"),
    ("[constraints]\nresize_mode = \"bilinear\"\n", "resize_mode must be one of nearest, exact"),
    ("[constraints]\nforbidden_ops = [\"Prelu\"]\n", "'Prelu' is not an ONNX op type (did you mean 'PRelu'?)"),
    ("[constraints]\nforbidden_ops = \"PRelu\"\n", "forbidden_ops must be a list of strings"),
    ("[constraints]\nsram_bytes = \"384KB\"\n", "binary unit"),
    ("[constraints]\nsram_bytes = -1\n", "sram_bytes must be >= 0, got -1"),
    ("[constraints]\nmax_approx_error = \"big\"\n", "max_approx_error must be a number"),
    ("[constraints]\ninput_shapes = { x = [1, 0] }\n", "dimension < 1"),
    ("[constraint]\nalign = 8\n", "unknown table [constraint]"),
    ("constraints = 3\n", "constraints must be a table"),
    ("[target]\nvendor = \"x\"\n", "unknown key 'vendor' in [target]"),
    ("[target]\nsources = \"a url\"\n", "sources must be a list of strings"),
    ("[target]\nname = \"\"\n", "name must be a non-empty string"),
    ("[notes]\nx = 3\n", "[notes] x must be a string"),
    ("[constraints\nalign = 8\n", "not valid TOML"),
]


@pytest.mark.parametrize(("content", "message"), BAD_PROFILES)
def test_bad_profile_gives_one_line_input_error(tmp_path, content, message):
    path = tmp_path / "bad.toml"
    path.write_text(content)
    with pytest.raises(InputError) as info:
        load_target(str(path))
    text = str(info.value)
    assert message in text
    assert str(path) in text  # says which file
    assert "\n" not in text
    assert info.value.exit_code == 2


def test_unknown_target_name_lists_the_valid_ones():
    with pytest.raises(InputError) as info:
        load_target("sigmastr")
    text = str(info.value)
    assert "unknown target 'sigmastr'" in text and "did you mean 'sigmastar'" in text
    for name in SHIPPED:
        assert name in text
    assert ".toml" in text and "\n" not in text


def test_missing_directory_and_binary_profile_files(tmp_path):
    with pytest.raises(InputError, match="not found"):
        load_target(str(tmp_path / "nope.toml"))
    folder = tmp_path / "dir.toml"
    folder.mkdir()
    with pytest.raises(InputError, match="not a file"):
        load_target(str(folder))
    binary = tmp_path / "bin.toml"
    binary.write_bytes(b"\xff\xfe\x00garbage")
    with pytest.raises(InputError, match="not UTF-8"):
        load_target(str(binary))


@pytest.mark.parametrize(
    ("text", "expected"),
    [("2MiB", 2 << 20), ("384KiB", 384 << 10), ("384 kib", 384 << 10), ("1.5KiB", 1536), ("4096", 4096),
     ("4096B", 4096), ("1G", 1 << 30), (0, 0), (123, 123)],
)
def test_parse_size(text, expected):
    assert parse_size(text) == expected


@pytest.mark.parametrize("text", ["384KB", "2 MB", "lots", "1.3B", "", "-5KiB", True])
def test_parse_size_refuses(text):
    with pytest.raises(ValueError):
        parse_size(text)


@pytest.mark.parametrize(("text", "says"), [
    ("3.1MiB", "'3.1MiB' is 3250585.6 bytes, not whole bytes: write a whole number of bytes or of a smaller unit, "
               "e.g. 3250585 or 3174KiB"),
    ("384KB", "KB is ambiguous (vendors use it for both 1000 and 1024 bytes); the binary units are B, KiB, MiB, GiB "
              "(K, M, G mean the same), e.g. 384KiB"),
    ("2 MB", "e.g. 2MiB"),
    ("lots", "a binary unit: B, KiB, MiB, GiB"),
])
def test_parse_size_says_why_and_which_units_exist(text, says):
    with pytest.raises(ValueError) as info:
        parse_size(text)
    assert says in str(info.value)


# --- every constraint of every shipped profile is reported by the checker --------------------------------------
#
# For each profile: a small model that satisfies all of its constraints gives no violation (the control), and for
# each constraint a model that breaks exactly that one is reported at the offending node with the checker's
# constraint name. Profile settings that relax npufix's defaults (align = 0, allow_batchnorm = true,
# require_nearest_resize = false) are shown to take effect: the same model is reported under the defaults and not
# under the profile.

# Options that choose how passes rewrite, not what the checker reports.
OPTION_ONLY = {"resize_mode", "act_bytes", "s2b_layout", "bn_standalone",
               # emission forms: how passes write their rewrites for the target's compiler
               "remainder_pad", "lift_conv1d", "s2b_layouts", "force_rewrite", "allow_convtranspose",
               "max_convtranspose_stride", "fold_pad_into_conv",
               # which convs max_stride judges (Vela 5.2), tested with max_stride in test_constraints.py
               "stride_limit_depthwise_only"}


def _vi(name, shape):
    return helper.make_tensor_value_info(name, TensorProto.FLOAT, shape)


def _w(name, shape):
    return numpy_helper.from_array((np.ones(shape) / np.prod(shape[1:])).astype(np.float32), name)


def _const(name, values, dtype=np.int64):
    return numpy_helper.from_array(np.asarray(values, dtype), name)


def _model(nodes, inputs, inits=(), outputs=("y",)):
    graph = helper.make_graph(nodes, "t", [_vi(n, s) for n, s in inputs], [_vi(n, None) for n in outputs],
                              initializer=list(inits))
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=8)
    model = onnx.shape_inference.infer_shapes(model, strict_mode=True)  # declares the output shapes
    onnx.checker.check_model(model)
    return model


def _conv(name, x, y, c_in, c_out, k=3, stride=1, dilation=1, group=1):
    pad = dilation * (k - 1) // 2
    node = helper.make_node("Conv", [x, f"{name}_w"], [y], name=name, kernel_shape=[k, k], strides=[stride] * 2,
                            dilations=[dilation] * 2, pads=[pad] * 4, group=group)
    return node, _w(f"{name}_w", [c_out, c_in // group, k, k])


def clean_model():
    """Conv 16 -> 16 (3x3, stride 1, dilation 1) -> Relu -> Concat with the input (16 + 16) -> nearest x2."""
    conv, w = _conv("conv", "x", "c", 16, 16)
    nodes = [
        conv,
        helper.make_node("Relu", ["c"], ["r"], name="relu"),
        helper.make_node("Concat", ["r", "x"], ["cat"], name="concat", axis=1),
        helper.make_node("Resize", ["cat", "", "scales"], ["y"], name="up", mode="nearest"),
    ]
    return _model(nodes, [("x", [1, 16, 8, 8])], [w, numpy_helper.from_array(
        np.array([1, 1, 2, 2], np.float32), "scales")])


def dilated_model(d):
    conv, w = _conv("conv_dilated", "x", "y", 16, 16, dilation=d)
    return _model([conv], [("x", [1, 16, 32, 32])], [w])


def unaligned_conv_model(align):
    """Conv 16 -> 1.5 * align channels -> Conv back to 16: the middle tensor is not a multiple of ``align``."""
    odd = align + align // 2
    conv1, w1 = _conv("conv_unaligned", "x", "m", 16, odd, k=1)
    conv2, w2 = _conv("conv_back", "m", "y", odd, 16, k=1)
    return _model([conv1, conv2], [("x", [1, 16, 8, 8])], [w1, w2])


def unaligned_concat_model(align):
    node = helper.make_node("Concat", ["x", "z"], ["y"], name="concat_unaligned", axis=1)
    return _model([node], [("x", [1, 16, 8, 8]), ("z", [1, align // 2, 8, 8])])


def batch_from_input_model():
    conv, w = _conv("conv", "x", "y", 16, 16)
    return _model([conv], [("x", [2, 16, 8, 8])], [w])


def batch_inside_model():
    """Batch 2 from a batch-1 input: the input's batch axis tiled to 2 before a Conv."""
    conv, w = _conv("conv", "b", "y", 16, 16)
    nodes = [helper.make_node("Tile", ["x", "repeats"], ["b"], name="to_batch2"), conv]
    return _model(nodes, [("x", [1, 16, 8, 8])], [_const("repeats", [2, 1, 1, 1]), w])


def rank5_model():
    nodes = [
        helper.make_node("Reshape", ["x", "s5"], ["r5"], name="to_rank5"),
        helper.make_node("Reshape", ["r5", "s4"], ["y"], name="from_rank5"),
    ]
    return _model(nodes, [("x", [1, 16, 8, 8])], [_const("s5", [1, 2, 8, 8, 8]), _const("s4", [1, 16, 8, 8])])


def batchnorm_model():
    node = helper.make_node("BatchNormalization", ["x", "s", "b", "m", "v"], ["y"], name="bn")
    params = [numpy_helper.from_array(np.full(16, v, np.float32), n) for n, v in
              (("s", 1.0), ("b", 0.0), ("m", 0.0), ("v", 1.0))]
    return _model([node], [("x", [1, 16, 8, 8])], params)


def bilinear_model():
    node = helper.make_node("Resize", ["x", "", "scales"], ["y"], name="up_linear", mode="linear")
    return _model([node], [("x", [1, 16, 8, 8])], [numpy_helper.from_array(np.array([1, 1, 2, 2], np.float32),
                                                                           "scales")])


def big_kernel_model(k):
    conv, w = _conv("conv_big_kernel", "x", "y", 16, 16, k=k)
    return _model([conv], [("x", [1, 16, 16, 16])], [w])


def strided_model(s, depthwise=False):
    conv, w = _conv("conv_strided", "x", "y", 16, 16, stride=s, group=16 if depthwise else 1)
    return _model([conv], [("x", [1, 16, 24, 24])], [w])


def quantized_strided_model(s):
    """A Conv with stride ``s`` whose weight is a DequantizeLinear of int8 constants (the QDQ weight form)."""
    conv, w = _conv("conv_q_strided", "x", "y", 16, 16, stride=s)
    conv.input[1] = "w_dequantized"
    weight = np.clip(np.round(numpy_helper.to_array(w) * 64), -127, 127).astype(np.int8)
    dq = helper.make_node("DequantizeLinear", ["w_q", "w_scale", "w_zero"], ["w_dequantized"], name="w_dq")
    return _model([dq, conv], [("x", [1, 16, 24, 24])],
                  [numpy_helper.from_array(weight, "w_q"), numpy_helper.from_array(np.float32(1 / 64), "w_scale"),
                   numpy_helper.from_array(np.int8(0), "w_zero")])


def stride_violations(key, value, options):
    if key == "max_stride_quantized":
        return [(f"quantized stride {value + 1}", quantized_strided_model(value + 1), "conv_q_strided",
                 "max-stride")]
    # stride_limit_depthwise_only (Vela 5.2): only a depthwise Conv's stride counts
    return [(f"stride {value + 1}", strided_model(value + 1, options.stride_limit_depthwise_only),
             "conv_strided", "max-stride")]


def large_activation_model(budget, act_bytes):
    """A Relu whose input alone exceeds the budget (input and output are live together)."""
    side = int(np.ceil(np.sqrt(budget / (16 * act_bytes)))) + 8
    return _model([helper.make_node("Relu", ["x"], ["y"], name="relu_big")], [("x", [1, 16, side, side])])


def if_model():
    """An If choosing Relu or Neg of x by a bool graph input."""
    then_g = helper.make_graph([helper.make_node("Relu", ["x"], ["t"], name="then_relu")], "then", [],
                               [_vi("t", None)])
    else_g = helper.make_graph([helper.make_node("Neg", ["x"], ["e"], name="else_neg")], "else", [],
                               [_vi("e", None)])
    node = helper.make_node("If", ["c"], ["y"], name="if_node", then_branch=then_g, else_branch=else_g)
    cond = helper.make_tensor_value_info("c", TensorProto.BOOL, [])
    graph = helper.make_graph([node], "t", [_vi("x", [1, 16, 8, 8]), cond], [_vi("y", [1, 16, 8, 8])])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=8)
    onnx.checker.check_model(model)
    return model


FORBIDDEN_OP_MODELS = {
    "SpaceToDepth": lambda: _model([helper.make_node("SpaceToDepth", ["x"], ["y"], name="s2d", blocksize=2)],
                                   [("x", [1, 16, 8, 8])]),
    "DepthToSpace": lambda: _model([helper.make_node("DepthToSpace", ["x"], ["y"], name="d2s", blocksize=2)],
                                   [("x", [1, 16, 8, 8])]),
    "PRelu": lambda: _model([helper.make_node("PRelu", ["x", "slope"], ["y"], name="prelu")],
                            [("x", [1, 16, 8, 8])],
                            [numpy_helper.from_array(np.full((16, 1, 1), 0.25, np.float32), "slope")]),
}
FORBIDDEN_OP_MODELS["ConvTranspose"] = lambda: _model(
    [helper.make_node("ConvTranspose", ["x", "wt"], ["y"], name="convt", strides=[2, 2])], [("x", [1, 16, 8, 8])],
    [_w("wt", [16, 16, 2, 2])])
FORBIDDEN_OP_NODES = {"SpaceToDepth": "s2d", "DepthToSpace": "d2s", "PRelu": "prelu", "ConvTranspose": "convt"}


def violations_for(key, value, options):
    """[(description, model, node, constraint)] that break the profile constraint ``key = value``."""
    if key == "max_dilation":
        return [(f"dilation {2 * value}", dilated_model(2 * value), "conv_dilated", "dilation")]
    if key == "allowed_dilations":
        limit = options.max_dilation or max(value)
        odd = next(d for d in range(2, limit + 1) if d not in value)  # passes max_dilation, not in the set
        return [(f"dilation {odd}", dilated_model(odd), "conv_dilated", "dilation-allowed")]
    if key == "align":
        return [(f"{value + value // 2} channels", unaligned_conv_model(value), "conv_unaligned",
                 "out-channels-align")]
    if key == "concat_align":
        return [(f"Concat of 16 + {value // 2}", unaligned_concat_model(value), "concat_unaligned",
                 "concat-align")]
    if key == "batch_one":
        return [("batch-2 graph input", batch_from_input_model(), "x", "batch-one"),
                ("batch 2 inside the graph", batch_inside_model(), "to_batch2", "batch-one")]
    if key == "max_rank":
        assert value == 4, "rank5_model assumes a rank limit of 4"
        return [("rank-5 tensor", rank5_model(), "to_rank5", "max-rank")]
    if key == "forbidden_ops":
        return [(op, FORBIDDEN_OP_MODELS[op](), FORBIDDEN_OP_NODES[op], "forbidden-op") for op in value]
    if key == "allow_batchnorm":
        return [("BatchNormalization", batchnorm_model(), "bn", "batchnorm")]
    if key == "require_nearest_resize":
        return [("bilinear Resize", bilinear_model(), "up_linear", "resize-mode")]
    if key == "max_kernel":
        return [(f"kernel {value + 2}", big_kernel_model(value + 2), "conv_big_kernel", "max-kernel")]
    if key in ("max_stride", "max_stride_quantized"):
        return stride_violations(key, value, options)
    if key == "allow_control_flow":
        return [("an If on a graph input", if_model(), "if_node", "control-flow")]
    if key == "sram_bytes":
        return [("activation above the SRAM budget", large_activation_model(value, options.act_bytes),
                 "relu_big", "sram")]
    cases = compiler_run_violations(key, value, options)
    if cases is None:
        raise AssertionError(f"no violating model for {key}")
    return cases


def compiler_run_violations(key, value, options):
    """The constraints the real compiler runs added (k210 kernels and pads, bm1684x QDQ, Vela's resize rule);
    None for another key."""
    if key == "allowed_kernels":
        odd = next(k for k in range(1, 8) if k not in value)
        node = helper.make_node("Conv", ["x", "w13"], ["y"], name="conv_1xk", pads=[0, odd // 2, 0, odd // 2])
        return [(f"kernel 1x{odd}", _model([node], [("x", [1, 16, 8, 8])], [_w("w13", [16, 16, 1, odd])]),
                 "conv_1xk", "kernel-allowed")]
    if key == "symmetric_pads":
        node = helper.make_node("Conv", ["x", "w33"], ["y"], name="conv_asym", pads=[0, 0, 1, 1])
        return [("pads [0, 0, 1, 1]", _model([node], [("x", [1, 16, 8, 8])], [_w("w33", [16, 16, 3, 3])]),
                 "conv_asym", "asymmetric-pads")]
    if key == "allow_qdq":
        nodes = [helper.make_node("QuantizeLinear", ["x", "s", "zp"], ["xq"], name="quant"),
                 helper.make_node("DequantizeLinear", ["xq", "s", "zp"], ["y"], name="dequant")]
        inits = [numpy_helper.from_array(np.array(0.1, np.float32), "s"),
                 numpy_helper.from_array(np.array(128, np.uint8), "zp")]
        return [("a QDQ model", _model(nodes, [("x", [1, 16, 8, 8])], inits), "quant", "quantized-input")]
    if key == "initializer_inputs":
        op = value[0]
        nodes = [helper.make_node("Constant", [], ["axes"], name="axes_const",
                                  value=numpy_helper.from_array(np.array([1], np.int64))),
                 helper.make_node(op, ["x", "axes"], ["y"], name="axes_from_constant")]
        return [(f"{op} axes from a Constant node", _model(nodes, [("x", [1, 16, 8])]), "axes_from_constant",
                 "constant-node-input")]
    if key == "squeeze_axes_ignored":
        node = helper.make_node("Squeeze", ["x", "axes"], ["y"], name="squeeze_keeps_one")
        return [("[1,16,1] squeezed on axis 2", _model([node], [("x", [1, 16, 1])],
                                                      [numpy_helper.from_array(np.array([2], np.int64), "axes")]),
                 "squeeze_keeps_one", "squeeze-axes")]
    if key == "resize_scales_only":
        node = helper.make_node("Resize", ["x", "", "", "sizes"], ["y"], name="resize_by_sizes", mode="linear")
        return [("a Resize given sizes", _model([node], [("x", [1, 16, 8, 8])],
                                                [numpy_helper.from_array(np.array([1, 16, 16, 16], np.int64),
                                                                         "sizes")]),
                 "resize_by_sizes", "resize-sizes")]
    if key == "resize_factors":
        odd = next(f for f in range(2, 9) if f not in value)
        return [(f"nearest x{odd}", resize_model("nearest", "asymmetric", odd), "up_factor", "resize-factor")]
    if key == "linear_half_pixel_factors":
        other = next(f for f in (options.resize_factors or (2, 4, 8)) if f not in value)
        return [(f"half-pixel linear x{other}", resize_model("linear", "half_pixel", other), "up_factor",
                 "resize-factor")]
    return None


def resize_model(mode, coord, factor):
    node = helper.make_node("Resize", ["x", "", "scales"], ["y"], name="up_factor", mode=mode,
                            coordinate_transformation_mode=coord)
    scales = numpy_helper.from_array(np.array([1, 1, factor, factor], np.float32), "scales")
    return _model([node], [("x", [1, 16, 8, 8])], [scales])


# Settings that relax npufix's defaults: (key, value) -> (model, constraints that must then stay silent).
RELAXED = {
    ("align", 0): (lambda: unaligned_conv_model(8), {"in-channels-align", "out-channels-align"}),
    ("allow_batchnorm", True): (batchnorm_model, {"batchnorm"}),
    ("require_nearest_resize", False): (bilinear_model, {"resize-mode"}),
}


def _strict_items(profile):
    return [(k, v) for k, v in profile.constraints.items() if k not in OPTION_ONLY and (k, v) not in RELAXED]


def _cases(kind):
    for profile in list_targets():
        if kind == "strict":
            for key, _value in _strict_items(profile):
                yield pytest.param(profile.name, key, id=f"{profile.name}-{key}")
        else:
            for key, value in profile.constraints.items():
                if (key, value) in RELAXED:
                    yield pytest.param(profile.name, key, id=f"{profile.name}-{key}")


@pytest.fixture(scope="module")
def checker():
    return pytest.importorskip("onnx_npu_fix.constraints")


@pytest.mark.parametrize("name", sorted(SHIPPED))
def test_clean_model_satisfies_every_profile(checker, name):
    options = apply_target(load_target(name), FixOptions(), {})
    assert checker.find_violations(clean_model(), options) == []


# Each constraint switched off, for the control below.
OFF = {"max_dilation": None, "allowed_dilations": None, "align": 0, "concat_align": 0, "batch_one": False,
       "max_rank": None, "forbidden_ops": (), "allow_batchnorm": True, "require_nearest_resize": False,
       "max_kernel": None, "max_stride": None, "max_stride_quantized": None, "sram_bytes": None,
       "allow_control_flow": True,
       "allowed_kernels": None, "symmetric_pads": False, "initializer_inputs": (), "squeeze_axes_ignored": False,
       "resize_scales_only": False,
       "allow_qdq": True,
       "resize_factors": None, "linear_half_pixel_factors": None}


@pytest.mark.parametrize(("name", "key"), list(_cases("strict")))
def test_profile_constraint_is_reported(checker, name, key):
    profile = load_target(name)
    options = apply_target(profile, FixOptions(), {})
    cases = violations_for(key, profile.constraints[key], options)
    assert cases
    for description, model, node, constraint in cases:
        found = checker.find_violations(model, options)
        hits = [v for v in found if v.node == node and v.constraint == constraint]
        assert hits, f"{name}: {description} not reported as {constraint} at {node}; got {[str(v) for v in found]}"
        # The control: the same profile with this one constraint switched off does not report it.
        relaxed = dataclasses.replace(options, **{key: OFF[key]})
        assert not [v for v in checker.find_violations(model, relaxed)
                    if v.node == node and v.constraint == constraint]


@pytest.mark.parametrize(("name", "key"), list(_cases("relaxed")))
def test_profile_relaxation_takes_effect(checker, name, key):
    profile = load_target(name)
    build, silenced = RELAXED[(key, profile.constraints[key])]
    model = build()
    under_defaults = {v.constraint for v in checker.find_violations(model, FixOptions())}
    assert under_defaults & silenced, "the model must violate npufix's default for this to mean anything"
    under_profile = {v.constraint for v in checker.find_violations(model, apply_target(profile, FixOptions(), {}))}
    assert not under_profile & silenced


def test_every_profile_constraint_is_exercised():
    """No shipped constraint escapes the tests above: each is checked strictly, as a relaxation, or is an
    option that only steers a pass."""
    for profile in list_targets():
        options = apply_target(profile, FixOptions(), {})
        for key, value in profile.constraints.items():
            if key in OPTION_ONLY or (key, value) in RELAXED:
                continue
            assert key in OFF, f"{profile.name}: {key} has no 'switched off' value for the control"
            assert violations_for(key, value, options), f"{profile.name}: {key}"
