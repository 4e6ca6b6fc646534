"""ONNX tensor types, ORT's ``QuantType`` / ``QuantFormat`` / ``CalibrationMethod``
and their numpy dtypes."""
import enum
import numbers

import numpy as np

from ... import _arrays as A

_F32 = np.float32
_F64 = np.float64
VERSIONS = ("1.32", "1.27")

# ------------------------------------------------------------------ types
#: ONNX TensorProto element types used by the quantizer (name -> code)
TENSOR_TYPES = {"FLOAT": 1, "UINT8": 2, "INT8": 3, "UINT16": 4, "INT16": 5, "INT32": 6,
                "FLOAT16": 10, "FLOAT8E4M3FN": 17, "FLOAT8E4M3FNUZ": 18, "FLOAT8E5M2": 19,
                "FLOAT8E5M2FNUZ": 20, "UINT4": 21, "INT4": 22, "FLOAT4E2M1": 23, "UINT2": 25,
                "INT2": 26}
_TYPE_NAMES = {code: name for name, code in TENSOR_TYPES.items()}
_INT_TYPES = ("INT8", "UINT8", "INT16", "UINT16", "INT4", "UINT4")
_FLOAT8_TYPES = ("FLOAT8E4M3FN", "FLOAT8E4M3FNUZ", "FLOAT8E5M2", "FLOAT8E5M2FNUZ")
#: full, symmetric and reduced integer ranges (QU's three tables)
_RANGE = {"INT8": (-128, 127), "UINT8": (0, 255), "INT16": (-32768, 32767),
          "UINT16": (0, 65535), "INT4": (-8, 7), "UINT4": (0, 15), "INT32": (-2**31, 2**31 - 1)}
#: the ranges of ORT's QuantizeLinear kernel: QU's and the 2-bit types (opset 25),
#: which ORT's quantization tools do not use
_LINEAR_RANGE = {**_RANGE, "INT2": (-2, 1), "UINT2": (0, 3)}
_SYMMETRIC_RANGE = {"INT8": (-127, 127), "INT16": (-32767, 32767)}
_REDUCED_RANGE = {"INT8": (-64, 64), "UINT8": (0, 127), "INT16": (-16384, 16384),
                  "UINT16": (0, 32767), "INT4": (-4, 3), "UINT4": (0, 7)}


class QuantType(enum.Enum):
    """ORT's ``QuantType`` (``str()`` and ``from_string`` as ORT spells them)."""
    QInt8 = 0
    QUInt8 = 1
    QFLOAT8E4M3FN = 2
    QInt16 = 3
    QUInt16 = 4
    QInt4 = 5
    QUInt4 = 6

    def __str__(self):
        return self.name

    @staticmethod
    def from_string(t):
        try:
            return QuantType[t]
        except KeyError:
            raise ValueError() from None  # ORT raises a bare ValueError

    @property
    def tensor_type(self):
        """The ONNX TensorProto element type code."""
        return TENSOR_TYPES[_QUANT_TYPE_NAMES[self]]


_QUANT_TYPE_NAMES = {QuantType.QInt8: "INT8", QuantType.QUInt8: "UINT8",
                     QuantType.QFLOAT8E4M3FN: "FLOAT8E4M3FN", QuantType.QInt16: "INT16",
                     QuantType.QUInt16: "UINT16", QuantType.QInt4: "INT4",
                     QuantType.QUInt4: "UINT4"}


class QuantFormat(enum.Enum):
    QOperator = 0
    QDQ = 1

    def __str__(self):
        return self.name


class CalibrationMethod(enum.Enum):
    MinMax = 0
    Entropy = 1
    Percentile = 2
    Distribution = 3


def type_name(qtype, func="onnxruntime"):
    """Canonical TensorProto name ("INT8", ...) of a quantization type given
    as a TensorProto code, a name ("INT8", "int8"), ORT's ``QuantType`` or
    its name ("QInt8")."""
    if isinstance(qtype, QuantType):
        return _QUANT_TYPE_NAMES[qtype]
    if isinstance(qtype, numbers.Integral) and not isinstance(qtype, bool):
        if int(qtype) in _TYPE_NAMES:
            return _TYPE_NAMES[int(qtype)]
    elif isinstance(qtype, str):
        if qtype.upper() in TENSOR_TYPES:
            return qtype.upper()
        if qtype in QuantType.__members__:
            return _QUANT_TYPE_NAMES[QuantType[qtype]]
    elif type(qtype).__name__ == "QuantType" and hasattr(qtype, "name"):  # ORT's own enum
        return _QUANT_TYPE_NAMES[QuantType[qtype.name]]
    raise ValueError(f"{func}: unknown quantization type {qtype!r} (expected one of "
                     f"{', '.join(_INT_TYPES + _FLOAT8_TYPES)}, a TensorProto code or a "
                     "QuantType)")


def _ml_dtypes(what):
    try:
        import ml_dtypes
    except ImportError:  # pragma: no cover - installed with onnx
        raise ImportError(f"{what} needs the ml_dtypes package (pip install ml_dtypes)") from None
    return ml_dtypes


#: the ml_dtypes names of the sub-byte and float 8 / float 4 types
_ML_DTYPE_NAMES = {"INT4": "int4", "UINT4": "uint4", "INT2": "int2", "UINT2": "uint2",
                   "FLOAT8E4M3FN": "float8_e4m3fn", "FLOAT8E4M3FNUZ": "float8_e4m3fnuz",
                   "FLOAT8E5M2": "float8_e5m2", "FLOAT8E5M2FNUZ": "float8_e5m2fnuz",
                   "FLOAT4E2M1": "float4_e2m1fn"}


def np_dtype(qtype):
    """numpy dtype of a quantized type (int4 / float 8 from ml_dtypes)."""
    name = type_name(qtype)
    plain = {"INT8": np.int8, "UINT8": np.uint8, "INT16": np.int16, "UINT16": np.uint16,
             "INT32": np.int32}
    if name in plain:
        return np.dtype(plain[name])
    md = _ml_dtypes(f"the {name} type")
    return np.dtype(getattr(md, _ML_DTYPE_NAMES[name]))


def _require_numpy(x, name, func):
    if A.is_cupy_array(x):
        raise TypeError(f"{func}: {name} is a cupy array; quantcore.compat.onnxruntime takes "
                        "numpy arrays only (ONNX Runtime's quantization is host code): use "
                        f"{name}.get()")
    return x
