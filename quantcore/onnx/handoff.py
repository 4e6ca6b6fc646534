"""quantcore's ranges handed to ONNX Runtime's ``quantize_static`` in
memory: no calibration cache, no text format on the way.

``quantize_static`` (ORT 1.32, ``onnxruntime/quantization/quantize.py``)
makes its calibrator with the module-level name ``create_calibrator``, calls
``collect_data(calibration_data_reader)`` (``CalibStridedMinMax=k``: once
per ``set_range`` of ``len(reader)``), then ``compute_data()``, which must
return ORT's ``TensorsData``, and hands that to its quantizer.
:func:`quantize_static_with` runs ORT's function whole, with that one name
answering, in this thread and for this call only, a calibrator whose
``compute_data`` returns quantcore's ranges (ORT's own objects, built from
:meth:`~quantcore.compat.onnxruntime.TensorsData.to_ort`) and whose
``collect_data`` reads nothing.  Every other step (the model's shape
inference, the opset update, the argument checks, the quantizer, the model
writing) is ORT's, as in its default call with a reader; the quantizer sees
the numpy values ORT's own calibrator would hand it, not their JSON round
trip.

The name is replaced once, by a function that defers to ORT's own unless
the calling thread has ranges pending (other threads, and ORT called
directly, get ORT's calibrators).  If a later ORT stops looking the name up
(the ranges not taken), the call fails with a RuntimeError rather than
writing a model from ranges that are not ours.

ORT's first step, ``load_model_with_shape_infer`` (``quant_utils.py``),
writes the shape-inferred model as ``<model>-inferred.onnx`` *beside the
user's model*, loads it and deletes it: two runs on one model delete each
other's file, and a model in a read-only folder cannot be quantized.  Every
call made through :func:`ort_quantize_static` (all of quantcore's) has that
name answer :func:`_shape_infer_privately` instead: the same
``infer_shapes_path`` of the same file and the same load, its output in a
private temporary folder, the external data read from the model's own
folder (what ``onnx.load`` of ORT's file does), so the same ModelProto and
nothing written beside the model.

In those calls ORT's QDQ quantizer also gets a faster
``ONNXModel.replace_input_of_all_nodes`` (:func:`_replace_input_fast`): ORT's
visits every node for every tensor it quantizes (``onnx_model.py``: one
Python call of ``replace_node_input`` per node; on the PP-OCR detector 491
tensors x 1162 nodes, 570 k calls, 1.9 s of a 3 s quantizer).  Ours renames
the same inputs of the same nodes, found through :class:`_Readers`, an index
name -> the nodes that read it, built once per call and kept true: the node
list is compared by identity on every use (nodes appended since are
indexed, any other change of the list rebuilds the index), and every rename
made through ``ONNXModel.replace_node_input`` (which ORT's
``replace_input_of_nodes`` and its per-consumer renames call) is recorded.
Those are the only ways ORT 1.32's QDQ quantizer changes a node's inputs
(``qdq_quantizer.py``: ``replace_node_input`` :786,
``replace_input_of_nodes`` :413 :916 :955, ``replace_input_of_all_nodes``
:707 :805; its operators only mark tensors).  A node found is renamed only
if it still reads the name, so the index may hold too many, never too few.
Both are installed only over the implementation this was written against
(their code's names checked); another ORT keeps its own; where the
protobuf runtime does not return one Python object per node, the full scan
runs (:meth:`_Readers.of`).

The quantizer also looks initializers up by name, each time over the whole
list (``quant_utils.find_by_name``: a list comprehension of every item's
name; ``ONNXModel.get_initializer``: a loop), 3.8 k lookups over about
1000 initializers on the detector, 0.4 s.  In quantcore's calls, for a
protobuf repeated field, both answer from :class:`_FirstByName` (each
name's first item), kept true the same way: the field's items compared by
identity on every lookup (appended items indexed, any other change
rebuilds), and the item found checked to still have the name.  ORT 1.32's
quantizer names an initializer only before adding it (``qdq_quantizer.py``
:366, ``base_quantizer.py`` :345, ``quant_utils.py`` :700: a new
TensorProto each), never one in the list.  Other lists (Python lists of
nodes) get ORT's own function.

Each time the quantizer adds initializers (``initializer_extend``) ORT
checks every initializer for a float8 NaN code, one Python step a byte
(``ONNXModel._check_init``): on silero-vad quantized to float 8 that was
0.8 of a 1.3 s call (profiled).  :func:`_check_init_fast` tests the same
bytes with numpy and raises the same error.
"""
import contextlib
import importlib
import operator
import os
import sys
import tempfile
import threading

_STATE = threading.local()
_INSTALL = threading.Lock()
_ORIGINAL = []
_ORIGINAL_INFER = []
_ORIGINAL_REPLACE = []
_ORIGINAL_NODE_REPLACE = []
_ORIGINAL_FIND = []
_ORIGINAL_CHECK = []
#: the names that the code of ORT 1.32's functions replaced here uses (its
#: own, then its nested comprehensions'): :func:`_code_names`
_REPLACE_NAMES = (("model", "graph", "node", "ONNXModel", "replace_node_input"),)
_NODE_REPLACE_NAMES = (("isinstance", "str", "range", "len", "input"),)
_FIND_NAMES = (("len",), ("name",))
_GET_INITIALIZER_NAMES = (("model", "graph", "initializer", "name"),)
_CHECK_INIT_NAMES = (("data_type", "onnx", "TensorProto", "FLOAT8E4M3FN", "HasField", "list",
                      "raw_data", "any", "ValueError", "name"), ())


class _HandedCalibrator:
    """What ``quantize_static`` gets from ``create_calibrator``: the ranges
    computed already."""

    def __init__(self, tensors_range):
        self._ranges = tensors_range

    def collect_data(self, data_reader):
        """Nothing to read (the reader is :class:`_NoBatches`)."""

    def compute_data(self):
        return self._ranges


class _NoBatches:
    """The reader handed to ``quantize_static`` (it must not be None): no
    batch; ``len`` is the stride so that ``CalibStridedMinMax`` makes one
    ``collect_data`` call."""

    def __init__(self, stride):
        self._len = int(stride or 0)

    def get_next(self):
        return None

    def __len__(self):
        return self._len

    def set_range(self, start_index, end_index):
        pass


def _create_calibrator(*args, **kwargs):
    pending = getattr(_STATE, "ranges", None)
    if pending is None:
        return _ORIGINAL[0](*args, **kwargs)
    _STATE.ranges = None    # taken: once per call
    return _HandedCalibrator(pending)


def _shape_infer_privately(model_path):
    """ORT's ``load_model_with_shape_infer(model_path)`` with its temporary
    inferred model in a private folder (module docstring); ORT's own in a
    thread not inside :func:`ort_quantize_static`."""
    if not getattr(_STATE, "inside", False):
        return _ORIGINAL_INFER[0](model_path)
    import onnx
    from onnx.external_data_helper import load_external_data_for_model
    from onnxruntime.quantization.quant_utils import add_infer_metadata

    model_path = os.fspath(model_path)
    with tempfile.TemporaryDirectory(prefix="quantcore-infer-") as private:
        inferred = os.path.join(private, "inferred" + os.path.splitext(model_path)[1])
        onnx.shape_inference.infer_shapes_path(model_path, inferred)
        model = onnx.load(inferred, load_external_data=False)
    load_external_data_for_model(model, os.path.dirname(model_path))
    add_infer_metadata(model)
    return model


class _ListIndex:
    """An index over a protobuf repeated field's items, kept true through
    the field's changes (module docstring): the items indexed are held, in
    order (so that their ids stay theirs), and compared by identity with
    the field on every use.  A subclass indexes one item (``_add``)."""

    def __init__(self, items):
        self.seen = []
        self._extend(items)

    def _extend(self, items):
        for item in items:
            self.seen.append(item)
            self._add(item)

    def follow(self, items):
        """Bring the index up to date with ``items`` (the field as it is
        now): True, or False where the field changed otherwise than by
        appending (the caller makes a new index)."""
        known = len(self.seen)
        if len(items) < known or not all(map(operator.is_, items, self.seen)):
            return False
        if len(items) > known:
            self._extend(items[known:])
        return True


class _Readers(_ListIndex):
    """Which nodes of one graph read each tensor name, kept true through a
    quantizer's renames (module docstring); one per quantize_static call
    and thread (``_STATE.readers``)."""

    def __init__(self, graph):
        self.graph = graph
        #: the nodes indexed by id; name -> {id(node): node} of the nodes
        #: that read it (or did)
        self.by_id, self.by_name = {}, {}
        super().__init__(graph.node)

    def _add(self, node):
        self.by_id[id(node)] = node
        for name in node.input:
            self.by_name.setdefault(name, {})[id(node)] = node

    @staticmethod
    def of(graph):
        """The index of ``graph`` as its node list is now (this thread's,
        brought up to date), or None where node objects are not kept by
        the protobuf runtime (then the caller scans every node)."""
        readers = getattr(_STATE, "readers", None)
        if readers is not None and readers.graph is graph and readers.follow(graph.node):
            return readers
        if len(graph.node) and graph.node[0] is not graph.node[0]:
            return None
        readers = _STATE.readers = _Readers(graph)
        return readers

    def renamed(self, node, new_input_name):
        """Record that ``node`` may now read ``new_input_name``."""
        if self.by_id.get(id(node)) is node:
            self.by_name.setdefault(new_input_name, {})[id(node)] = node


def _replace_node_input_noted(node, old_input_name, new_input_name):
    """ORT's ``ONNXModel.replace_node_input``, the rename recorded in this
    thread's :class:`_Readers` (module docstring)."""
    _ORIGINAL_NODE_REPLACE[0](node, old_input_name, new_input_name)
    readers = getattr(_STATE, "readers", None)
    if readers is not None:
        readers.renamed(node, new_input_name)


class _FirstByName(_ListIndex):
    """The first item of one protobuf repeated field with each name, kept
    true through the field's changes (module docstring); in
    ``_STATE.firsts`` by the field's id (the field is held: the id stays
    its own), for one quantize_static call."""

    def __init__(self, items):
        self.items, self.first = items, {}
        super().__init__(items)

    def _add(self, item):
        self.first.setdefault(item.name, item)

    @staticmethod
    def find(items, name):
        """``items``' first item named ``name`` (None if none), as
        ``find_by_name(name, items)`` answers."""
        firsts = _STATE.firsts
        index = firsts.get(id(items))
        if index is None or not index.follow(items):
            index = firsts[id(items)] = _FirstByName(items)
        item = index.first.get(name)
        if item is not None and item.name != name:     # renamed in place: not ORT's way
            index = firsts[id(items)] = _FirstByName(items)
            item = index.first.get(name)
        return item


def _indexed(items):
    """Whether lookups in ``items`` go through :class:`_FirstByName`: in
    quantcore's calls, for a protobuf repeated field."""
    return getattr(_STATE, "inside", False) and type(items).__name__ == "RepeatedCompositeContainer"


def _find_by_name_fast(item_name, item_list):
    """ORT's ``quant_utils.find_by_name``: the first item of ``item_list``
    whose ``name`` is ``item_name``, or None (module docstring)."""
    if not _indexed(item_list):
        return _ORIGINAL_FIND[0](item_name, item_list)
    return _FirstByName.find(item_list, item_name)


def _get_initializer_fast(self, name):
    """ORT's ``ONNXModel.get_initializer``: the first initializer named
    ``name``, or None (module docstring)."""
    initializers = self.model.graph.initializer
    if not _indexed(initializers):
        return _ORIGINAL_FIND[1](self, name)
    return _FirstByName.find(initializers, name)


def _check_init_fast(self, init, test=None):
    """ORT's ``ONNXModel._check_init``: a float8 e4m3fn initializer with a
    NaN code (``code & 127 == 127``) in its raw data refused, by the same
    ValueError; the codes tested by numpy, not one Python step a byte (ORT
    tests every initializer each time it adds some: ``initializer_extend``)."""
    if not getattr(_STATE, "inside", False):
        return _ORIGINAL_CHECK[0](self, init, test)
    import numpy as np
    import onnx
    if init.data_type == onnx.TensorProto.FLOAT8E4M3FN and init.HasField("raw_data"):
        codes = np.frombuffer(init.raw_data, np.uint8)
        if np.any((codes & 127) == 127):
            raise ValueError(f"Initializer {init.name!r} has nan.")
    return init


def _replace_input_fast(self, old_input_name, new_input_name):
    """ORT's ``ONNXModel.replace_input_of_all_nodes``: every input named
    ``old_input_name`` of every node renamed ``new_input_name``, with ORT's
    own ``replace_node_input``, called only for the nodes that read the name
    (module docstring); ORT's own in a thread not inside
    :func:`ort_quantize_static`."""
    if not getattr(_STATE, "inside", False):
        return _ORIGINAL_REPLACE[0](self, old_input_name, new_input_name)
    assert isinstance(old_input_name, str) and isinstance(new_input_name, str)
    replace = _ORIGINAL_NODE_REPLACE[0]
    graph = self.model.graph
    readers = _Readers.of(graph)
    if readers is None:
        for node in graph.node:
            if old_input_name in node.input:
                replace(node, old_input_name, new_input_name)
        return
    reading = readers.by_name.pop(old_input_name, {})
    renamed = readers.by_name.setdefault(new_input_name, {})    # (after: old may be new)
    for key, node in reading.items():
        if old_input_name in node.input:
            replace(node, old_input_name, new_input_name)
            renamed[key] = node


def _code_names(function):
    """The global and attribute names that ``function``'s code uses, then
    each nested code object's (a comprehension's): what pins the version of
    an ORT function replaced here."""
    code = function.__code__
    return (code.co_names,) + tuple(c.co_names for c in code.co_consts if hasattr(c, "co_names"))


def _install():
    """Put :func:`_create_calibrator` and :func:`_shape_infer_privately` in
    quantize.py's namespace, :func:`_find_by_name_fast` in the quantizer's
    modules, and :func:`_replace_input_fast`, :func:`_replace_node_input_noted`,
    :func:`_get_initializer_fast` and :func:`_check_init_fast` in ONNXModel
    (once each, over the ORT code they were written against)."""
    # (the module: the package's name "quantize" is a function)
    ort_quantize = importlib.import_module("onnxruntime.quantization.quantize")
    from onnxruntime.quantization import quant_utils
    from onnxruntime.quantization.onnx_model import ONNXModel
    with _INSTALL:
        replace = ONNXModel.replace_input_of_all_nodes
        node_replace = ONNXModel.replace_node_input
        if (not _ORIGINAL_REPLACE and _code_names(replace) == _REPLACE_NAMES
                and _code_names(node_replace) == _NODE_REPLACE_NAMES):
            _ORIGINAL_REPLACE.append(replace)
            _ORIGINAL_NODE_REPLACE.append(node_replace)
            ONNXModel.replace_node_input = staticmethod(_replace_node_input_noted)
            ONNXModel.replace_input_of_all_nodes = _replace_input_fast
        find, get = quant_utils.find_by_name, ONNXModel.get_initializer
        if (not _ORIGINAL_FIND and _code_names(get) == _GET_INITIALIZER_NAMES
                and _code_names(find) == _FIND_NAMES):
            _ORIGINAL_FIND.extend((find, get))
            ONNXModel.get_initializer = _get_initializer_fast
            for module in list(sys.modules.values()):   # (each module imported the name)
                if (getattr(module, "__name__", "").startswith("onnxruntime.quantization")
                        and getattr(module, "find_by_name", None) is find):
                    module.find_by_name = _find_by_name_fast
        check = ONNXModel._check_init
        if not _ORIGINAL_CHECK and _code_names(check) == _CHECK_INIT_NAMES:
            _ORIGINAL_CHECK.append(check)
            ONNXModel._check_init = _check_init_fast
        if not _ORIGINAL_INFER and hasattr(ort_quantize, "load_model_with_shape_infer"):
            _ORIGINAL_INFER.append(ort_quantize.load_model_with_shape_infer)
            ort_quantize.load_model_with_shape_infer = _shape_infer_privately
        if not _ORIGINAL:
            if "create_calibrator" not in ort_quantize.quantize_static.__code__.co_names:
                raise RuntimeError("this onnxruntime's quantize_static does not make its "
                                   "calibrator with create_calibrator: quantcore cannot hand "
                                   "it the ranges (use calibration_cache_path)")
            _ORIGINAL.append(ort_quantize.create_calibrator)
            ort_quantize.create_calibrator = _create_calibrator
    return ort_quantize.quantize_static


@contextlib.contextmanager
def _inside_quantcore_call():
    """Mark this thread as inside one of quantcore's quantize_static calls
    (the names installed by :func:`_install` act only there)."""
    previous = (getattr(_STATE, "inside", False), getattr(_STATE, "readers", None),
                getattr(_STATE, "firsts", None))
    _STATE.inside, _STATE.readers, _STATE.firsts = True, None, {}
    try:
        yield
    finally:
        _STATE.inside, _STATE.readers, _STATE.firsts = previous


def ort_quantize_static(model_input, model_output, calibration_data_reader, **kwargs):
    """ORT's ``quantize_static`` as it is, except that its shape inference
    writes nothing beside ``model_input`` and its quantizer renames inputs
    faster (module docstring): the same model."""
    quantize_static = _install()
    with _inside_quantcore_call():
        quantize_static(model_input, model_output, calibration_data_reader, **kwargs)


def quantize_static_with(tensors_range, model_input, model_output, *, calibrate_method,
                         extra_options=None, **kwargs):
    """ORT's ``quantize_static(model_input, model_output, reader,
    calibrate_method=..., extra_options=..., **kwargs)`` with quantcore's
    ``tensors_range`` (a :class:`~quantcore.compat.onnxruntime.TensorsData`)
    as its calibrator's result: ORT writes the model; no cache is read or
    written (``calibration_cache_path`` must not be in ``kwargs``)."""
    stride = (extra_options or {}).get("CalibStridedMinMax")
    _STATE.ranges = tensors_range.to_ort()
    try:
        ort_quantize_static(model_input, model_output, _NoBatches(stride),
                            calibrate_method=calibrate_method, extra_options=extra_options,
                            calibration_cache_path=None, **kwargs)
        if getattr(_STATE, "ranges", None) is not None:
            raise RuntimeError("onnxruntime's quantize_static did not take quantcore's ranges "
                               "(its create_calibrator was not called)")
    finally:
        _STATE.ranges = None
