"""ONNX's own QuantizeLinear / DequantizeLinear node tests, run through
quantcore.

Where the cases come from: the installed onnx wheel's backend test
generators, ``onnx/backend/test/case/node/quantizelinear.py`` and
``dequantizelinear.py`` (classes ``QuantizeLinear`` / ``DequantizeLinear``,
every ``export*`` method).  Each ``expect(node, inputs, outputs, name)`` call
is recorded at test time (the module's ``expect`` is swapped for a recorder
while the generators run); nothing generated is committed.  Every case is
run through :func:`quantcore.quantize_linear` / :func:`quantcore.dequantize_linear`
and, for the types it implements, :mod:`quantcore.compat.onnxruntime`, and
compared bit for bit with the outputs ONNX wrote (and those with
``onnx.reference``, so that a generator and the reference cannot drift apart
unseen).  No case is excluded (docs/FORMATS.md, "ONNX's node tests").
"""
import zlib

import numpy as np
import pytest

onnx = pytest.importorskip("onnx")
ml_dtypes = pytest.importorskip("ml_dtypes")
from onnx import numpy_helper  # noqa: E402
from onnx.helper import get_attribute_value, tensor_dtype_to_np_dtype  # noqa: E402

import quantcore  # noqa: E402
from quantcore.compat import onnxruntime as qort  # noqa: E402

_SUBBYTE = {"int4": np.int8, "uint4": np.uint8, "int2": np.int8, "uint2": np.uint8}


def _collect(module_name, class_name):
    """[(name, node, inputs, outputs)] of every export* of the generator class."""
    import importlib
    mod = importlib.import_module(f"onnx.backend.test.case.node.{module_name}")
    cases = []

    def record(node, inputs, outputs, name, **_):
        cases.append((name, node, list(inputs), list(outputs)))

    saved = mod.expect
    mod.expect = record
    try:
        cls = getattr(mod, class_name)
        for attr in sorted(vars(cls)):
            if attr.startswith("export"):
                getattr(cls, attr)()
    finally:
        mod.expect = saved
    return cases


def _arr(v):
    return numpy_helper.to_array(v) if isinstance(v, onnx.TensorProto) else np.asarray(v)


def _as_cases(module_name, class_name):
    out = []
    for name, node, ins, outs in _collect(module_name, class_name):
        attrs = {a.name: get_attribute_value(a) for a in node.attribute}
        out.append(pytest.param(node.op_type, attrs, [_arr(v) for v in ins],
                                [_arr(v) for v in outs], id=name))
    return out


Q_CASES = _as_cases("quantizelinear", "QuantizeLinear")
DQ_CASES = _as_cases("dequantizelinear", "DequantizeLinear")


def _codes(a):
    """The values quantcore returns for an ONNX output: FP8 / FP4 as uint8
    codes, the sub-byte integers unpacked in int8 / uint8."""
    name = a.dtype.name
    if name.startswith(("float8_", "float4_")):
        return a.view(np.uint8)
    if name in _SUBBYTE:
        return a.astype(_SUBBYTE[name])
    return a


def _bits(a):
    a = np.asarray(a)
    return a.view({2: np.uint16, 4: np.uint32, 8: np.uint64}[a.itemsize])


def _reference(node, inputs):
    from onnx.reference import ReferenceEvaluator
    feeds = dict(zip(node.input, inputs))
    graph_inputs = [onnx.helper.make_tensor_value_info(n, onnx.helper.np_dtype_to_tensor_dtype(
        v.dtype), v.shape) for n, v in feeds.items()]
    graph = onnx.helper.make_graph([node], "g", graph_inputs,
                                   [onnx.helper.make_tensor_value_info(node.output[0], 0, None)])
    model = onnx.helper.make_model(graph, opset_imports=[onnx.helper.make_opsetid("", 25)])
    return ReferenceEvaluator(model).run(None, feeds)[0]


def test_the_generators_give_every_case():
    # 13 + 14 in onnx 1.23; a newer wheel may add more (they run as well)
    assert len(Q_CASES) >= 13 and len(DQ_CASES) >= 14


@pytest.mark.parametrize("op, attrs, inputs, outputs", Q_CASES)
def test_quantize_linear_node_case(op, attrs, inputs, outputs):
    node = onnx.helper.make_node("QuantizeLinear", ["x", "s", "z"][:len(inputs)], ["y"], **attrs)
    want = outputs[0]
    ref = _reference(node, inputs)
    assert ref.dtype == want.dtype and np.array_equal(_codes(ref), _codes(want))
    x, scale = inputs[0], inputs[1]
    zp = inputs[2] if len(inputs) > 2 else None
    output = want.dtype.name
    got = quantcore.quantize_linear(x, scale, zp, axis=attrs.get("axis", 1),
                                    block_size=attrs.get("block_size", 0),
                                    saturate=bool(attrs.get("saturate", 1)),
                                    output=None if zp is not None else output)
    exp = _codes(want)
    assert got.dtype == exp.dtype and np.array_equal(got, exp), (got, exp)
    if "output_dtype" in attrs:
        assert tensor_dtype_to_np_dtype(attrs["output_dtype"]) == want.dtype
    # ORT's numerics (compat.onnxruntime): every ONNX type
    got_ort = qort.quantize_linear(x, scale, zp, axis=attrs.get("axis", 1),
                                   block_size=attrs.get("block_size", 0),
                                   saturate=attrs.get("saturate", 1),
                                   output_type=None if zp is not None
                                   else onnx.helper.np_dtype_to_tensor_dtype(want.dtype))
    assert got_ort.dtype == want.dtype and np.array_equal(_codes(got_ort), exp)


@pytest.mark.parametrize("op, attrs, inputs, outputs", DQ_CASES)
def test_dequantize_linear_node_case(op, attrs, inputs, outputs):
    node = onnx.helper.make_node("DequantizeLinear", ["x", "s", "z"][:len(inputs)], ["y"],
                                 **attrs)
    want = outputs[0]
    ref = _reference(node, inputs)
    assert ref.dtype == want.dtype and np.array_equal(_bits(ref), _bits(want))
    q, scale = inputs[0], inputs[1]
    zp = inputs[2] if len(inputs) > 2 else None
    got = quantcore.dequantize_linear(q, scale, zp, axis=attrs.get("axis", 1),
                                      block_size=attrs.get("block_size", 0),
                                      output_dtype=want.dtype)
    assert got.dtype == want.dtype and np.array_equal(_bits(got), _bits(want)), (got, want)
    got_ort = qort.dequantize_linear(q, scale, zp, axis=attrs.get("axis", 1),
                                     block_size=attrs.get("block_size", 0))
    assert got_ort.dtype == want.dtype and np.array_equal(_bits(got_ort), _bits(want))


def test_a_one_element_zero_point_beside_a_0d_scale_is_per_tensor():
    x = np.array([-3.0, 0.5, 1.0, 7.0], np.float32)
    a = quantcore.quantize_linear(x, np.float32(0.5), np.array([3], np.uint8))
    b = quantcore.quantize_linear(x, np.float32(0.5), np.uint8(3))
    assert a.dtype == np.uint8 and np.array_equal(a, b)
    d = quantcore.dequantize_linear(a, np.array([0.5], np.float32), np.uint8(3))
    assert np.array_equal(d, quantcore.dequantize_linear(b, np.float32(0.5), np.uint8(3)))
    with pytest.raises(ValueError, match="zero_point has shape"):
        quantcore.quantize_linear(np.zeros((2, 3), np.float32), np.ones(3, np.float32),
                                  np.zeros(1, np.uint8))


# ------------------------------------------- FLOAT4E2M1, INT2 / UINT2 (and int4)
# Beyond the node tests: every layout (per tensor, per axis, blocked) of the
# sub-byte types against onnx.reference on random values with the specials.
_LAYOUTS = {"tensor": ({}, lambda shape: ()), "axis": ({"axis": 1}, lambda shape: (shape[1],)),
            "block": ({"axis": 1, "block_size": 4},
                      lambda shape: (shape[0], -(-shape[1] // 4), shape[2]))}
_SUB_TYPES = ["int2", "uint2", "int4", "uint4", "float4_e2m1fn"]


def _random_x(rng, shape, specials):
    x = (rng.standard_normal(shape) * rng.choice([0.1, 1.0, 8.0, 100.0], shape)).astype(np.float32)
    # ties of the grids (halves of the integer grid, the FP4 grid's midpoints)
    ties = np.array([0.5, 1.5, 2.5, -0.5, -2.5, 0.25, 0.75, 1.25, 1.75, 2.5, 3.5, 5.0, -5.0],
                    np.float32)
    flat = x.reshape(-1)
    flat[:ties.size] = ties
    if specials:
        flat[ties.size:ties.size + 6] = [np.nan, -np.nan, np.inf, -np.inf, -0.0, 1e-42]
    rng.shuffle(flat)
    return x


def _random_zero_point(rng, tname, shape):
    dt = np.dtype(getattr(ml_dtypes, tname))
    if tname.startswith("float4"):
        return np.zeros(shape, np.float32).astype(dt)
    info = ml_dtypes.iinfo(dt)
    return rng.integers(info.min, info.max + 1, shape).astype(np.int8).astype(dt)


@pytest.mark.filterwarnings("ignore:invalid value encountered in cast")
@pytest.mark.parametrize("layout", sorted(_LAYOUTS))
@pytest.mark.parametrize("tname", _SUB_TYPES)
@pytest.mark.parametrize("with_zp", [True, False])
def test_sub_byte_types_against_onnx_reference(tname, layout, with_zp):
    rng = np.random.default_rng(zlib.crc32(f"{tname} {layout} {with_zp}".encode()))
    shape = (3, 10, 5)
    attrs, pshape = _LAYOUTS[layout]
    ps = pshape(shape)
    x = _random_x(rng, shape, specials=True)
    scale = (rng.uniform(0.05, 2.0, ps) * rng.choice([1, -1], ps)).astype(np.float32)
    zp = _random_zero_point(rng, tname, ps) if with_zp else None
    ins = [x, scale] + ([zp] if with_zp else [])
    out_attr = {} if with_zp else {"output_dtype": onnx.helper.np_dtype_to_tensor_dtype(
        np.dtype(getattr(ml_dtypes, tname)))}
    node = onnx.helper.make_node("QuantizeLinear", ["x", "s", "z"][:len(ins)], ["y"],
                                 **attrs, **out_attr)
    want = _reference(node, ins)
    assert want.dtype.name == tname
    integer = not tname.startswith("float")
    got = quantcore.quantize_linear(x, scale, zp, output=None if with_zp else tname,
                                    compat="onnx_reference" if integer else None, **attrs)
    assert np.array_equal(got, _codes(want))
    # ORT's numerics: the same for FLOAT4E2M1 (specials included); the integer
    # types saturate NaN / +-inf as ORT's kernel does, so finite values only
    xf = np.where(np.isfinite(x), x, np.float32(1.0)) if integer else x
    want_f = _reference(node, [xf] + ins[1:])
    got_ort = qort.quantize_linear(xf, scale, zp, output_type=None if with_zp else
                                   onnx.helper.np_dtype_to_tensor_dtype(want.dtype), **attrs)
    assert got_ort.dtype == want.dtype and np.array_equal(_codes(got_ort), _codes(want_f))
    # and back: DequantizeLinear of the reference's codes
    dnode = onnx.helper.make_node("DequantizeLinear", ["x", "s", "z"][:len(ins)], ["y"], **attrs)
    back = _reference(dnode, [want] + ins[1:])
    got_back = quantcore.dequantize_linear(want, scale, zp, **attrs)
    assert np.array_equal(_bits(got_back), _bits(back))
    # the same codes in their numpy container, named by `input`
    got_named = quantcore.dequantize_linear(_codes(want), scale, zp, input=tname, **attrs)
    assert np.array_equal(_bits(got_named), _bits(back))
    got_ort_back = qort.dequantize_linear(want, scale, zp, **attrs)
    assert np.array_equal(_bits(got_ort_back), _bits(back))


def test_float4_e2m1_codes_of_the_specials():
    """NaN -> the zero of the opposite sign (ml_dtypes), overflow and +-inf
    -> +-6 whatever ``saturate``; a given zero point (0) makes -0 +0."""
    x = np.array([np.nan, -np.nan, np.inf, -np.inf, 7.0, -1e30, -0.0, 0.25, 0.75, 2.5],
                 np.float32)
    want = x.astype(ml_dtypes.float4_e2m1fn).view(np.uint8)
    for sat in (True, False):
        got = quantcore.quantize_linear(x, np.float32(1), output="float4_e2m1fn", saturate=sat)
        assert np.array_equal(got, want)
    zp = np.zeros(1, ml_dtypes.float4_e2m1fn)
    got = quantcore.quantize_linear(x, np.float32(1), zp)
    assert np.array_equal(got, (x + np.float32(0)).astype(ml_dtypes.float4_e2m1fn).view(np.uint8))
    assert got[6] == 0 and want[6] == 8
    with pytest.raises(ValueError, match="zero point must be 0"):
        quantcore.quantize_linear(x, np.float32(1), np.ones(1, ml_dtypes.float4_e2m1fn))
    with pytest.raises(ValueError, match=r"codes must be in \[0, 15\]"):
        quantcore.dequantize_linear(np.array([16], np.uint8), np.float32(1),
                                    input="float4_e2m1fn")
