"""The public top-level names of real CuPy (``dir(cupy)`` of CuPy 14.2.0,
``cupy-cuda12x``, less the names that start with an underscore), for the
fake's module ``__getattr__``: a name here that the fake does not define is
real CuPy API the emulator does not implement (NotImplementedError), any
other name is one real CuPy does not have either (AttributeError).

Regenerate with real CuPy installed (``make gpu-toolchain-check``'s venv):
``.venv-cuda/bin/python -c "import cupy; print(' '.join(n for n in dir(cupy)
if not n.startswith('_')))"``.
"""

VERSION = "14.2.0"

NAMES = frozenset("""
AxisError ComplexWarning DataSource ElementwiseKernel Inf Infinity
ModuleDeprecationWarning NAN NINF NZERO NaN PINF PZERO RankWarning RawKernel RawModule
ReductionKernel TooHardError VisibleDeprecationWarning abs absolute acos acosh add all
allclose alltrue amax amin angle annotations any append apply_along_axis apply_over_axes
arange arccos arccosh arcsin arcsinh arctan arctan2 arctanh argmax argmin argpartition
argsort argwhere around array array2string array_equal array_equiv array_repr array_split
array_str asanyarray asarray asarray_chkfinite ascontiguousarray asfarray asfortranarray
asin asinh asnumpy astype atan atan2 atanh atleast_1d atleast_2d atleast_3d average
bartlett base_repr binary_repr bincount bitwise_and bitwise_count bitwise_invert
bitwise_left_shift bitwise_not bitwise_or bitwise_right_shift bitwise_xor blackman bool
bool_ broadcast broadcast_arrays broadcast_shapes broadcast_to byte byte_bounds c_
can_cast cbrt cdouble ceil cfloat choose clear_memo clip column_stack common_type
complex128 complex64 complex_ complexfloating compress concat concatenate conj conjugate
convolve copy copysign copyto corrcoef correlate cos cosh count_nonzero cov cross csingle
cuda cumprod cumproduct cumsum cumulative_prod cumulative_sum deg2rad degrees delete diag
diag_indices diag_indices_from diagflat diagonal diff digitize
disable_experimental_feature_warning disp divide divmod dot double dsplit dstack dtype e
ediff1d einsum empty empty_like equal euler_gamma exceptions exp exp2 expand_dims expm1
extract eye fabs fft fill_diagonal find_common_type finfo fix flatiter flatnonzero flip
fliplr flipud float16 float32 float64 float_ float_power floating floor floor_divide fmax
fmin fmod format_float_positional format_float_scientific format_parser frexp fromDlpack
from_dlpack frombuffer fromfile fromfunction fromiter fromstring full full_like fuse gcd
generic genfromtxt get_array_module get_array_wrap get_default_memory_pool
get_default_pinned_memory_pool get_printoptions gradient greater greater_equal half
hamming hanning heaviside histogram histogram2d histogramdd hsplit hstack hypot i0
identity iinfo imag in1d index_exp indices inexact inf infty inner int16 int32 int64 int8
int_ intc integer interp intersect1d intp invert is_available isclose iscomplex
iscomplexobj isdtype isfinite isfortran isin isinf isnan isneginf isposinf isreal
isrealobj isscalar issctype issubclass_ issubdtype issubsctype iterable ix_ kaiser kron
lcm ldexp left_shift less less_equal lexsort lib linalg linspace load loadtxt log log10
log1p log2 logaddexp logaddexp2 logical_and logical_not logical_or logical_xor logspace
long longlong make_aligned_dtype mask_indices matmul matrix_transpose max maximum
may_share_memory mean median memoize meshgrid mgrid min min_scalar_type minimum
mintypecode mod modf moveaxis msort multiply nan nan_to_num nanargmax nanargmin nancumprod
nancumsum nanmax nanmean nanmedian nanmin nanprod nanstd nansum nanvar ndarray ndim
ndindex negative newaxis nextafter nonzero not_equal number obj2sctype ogrid ones
ones_like outer packbits pad partition percentile permute_dims pi piecewise place poly
poly1d polyadd polyfit polymul polynomial polysub polyval positive pow power printoptions
prod product promote_types ptp put put_along_axis putmask quantile r_ rad2deg radians
random ravel ravel_multi_index real real_if_close reciprocal remainder repeat require
reshape resize result_type right_shift rint roll rollaxis roots rot90 round round_
row_stack s_ safe_eval save savetxt savez savez_compressed sctype2char searchsorted select
set_printoptions set_string_function setdiff1d setxor1d shape shares_memory short
show_config sign signbit signedinteger sin sinc single singlecomplex sinh size sometrue
sort sort_complex split sqrt square squeeze stack std subtract sum swapaxes take
take_along_axis tan tanh tensordot testing tile trace transpose trapezoid trapz tri tril
tril_indices tril_indices_from trim_zeros triu triu_indices triu_indices_from true_divide
trunc typename typing ubyte ufunc uint uint16 uint32 uint64 uint8 uintc uintp ulong
ulonglong union1d unique unique_all unique_counts unique_inverse unique_values unpackbits
unravel_index unsignedinteger unwrap ushort vander var vdot vectorize vsplit vstack where
who zeros zeros_like
""".split())
