# Included by _kernels.pyx (see _kernels_ew.pxi), last: the tables below
# read the name -> id dictionaries of the other parts.

# ------------------------------------------------ exported tables (issue 28)
# The headers' X-macro tables, exported as they are compiled (no copy in
# Python, no reading of header text): the rounding modes and affine mode
# bits (qc_elementwise.h), and the C++ type of every table entry, which
# quantcore_gpu.kernels instantiates.
cdef extern from *:
    """
    #include "qc_elementwise.h"
    #include "qc_registry.h"
    #include "qc_qparams.h"
    #define QC_X_TYPE_NAME(name, Type) #Type,
    #define QC_X_ROUND_NAME(name, id) #name,
    #define QC_X_ROUND_ID(name, id) id,
    static const char *const qc_rounding_names[] = {QC_ROUNDING_MODES(QC_X_ROUND_NAME)};
    static const int qc_rounding_ids[] = {QC_ROUNDING_MODES(QC_X_ROUND_ID)};
    static const int qc_rounding_count = (int)(sizeof(qc_rounding_ids) / sizeof(int));
    static const char *const qc_ew_family_types[] = {QC_EW_FAMILIES(QC_X_TYPE_NAME)};
    static const char *const qc_qp_scheme_types[] = {QC_QP_SCHEMES(QC_X_TYPE_NAME)};
    static const char *const qc_encode_family_types[] = {QC_ENCODE_FAMILIES(QC_X_TYPE_NAME)};
    static const char *const qc_decode_family_types[] = {QC_DECODE_FAMILIES(QC_X_TYPE_NAME)};
    static const char *const qc_group_recipe_types[] = {QC_GROUP_RECIPES(QC_X_TYPE_NAME)};
    static const char *const qc_block_recipe_types[] = {QC_BLOCK_RECIPES(QC_X_TYPE_NAME)};
    """
    const char* qc_rounding_names[]
    const int qc_rounding_ids[]
    const int qc_rounding_count
    const char* qc_ew_family_types[]
    const char* qc_qp_scheme_types[]
    const char* qc_encode_family_types[]
    const char* qc_decode_family_types[]
    const char* qc_group_recipe_types[]
    const char* qc_block_recipe_types[]
    int QC_ROUND_MASK, QC_ZP_BEFORE, QC_DIVIDE, QC_DEQUANT_WIDE, QC_NF_PROPAGATE
    int QC_NF_NAN_TO_QMIN, QC_NF_INT64, QC_OUTPUT_Q, QC_NO_ZERO_POINT, QC_FMA_ZP
    int QC_DEQUANT_NARROW, QC_ROUND_F32, QC_NUDGED_DIVIDE, QC_NUDGED_TF


#: rounding mode name -> id (qc_elementwise.h, QC_ROUNDING_MODES), in its order
ROUNDING_MODES = {qc_rounding_names[i].decode(): qc_rounding_ids[i]
                  for i in range(qc_rounding_count)}
#: the affine and nudged recipes' mode bits (qc_elementwise.h QC_<NAME>)
MODE_BITS = dict(ROUND_MASK=QC_ROUND_MASK, ZP_BEFORE=QC_ZP_BEFORE, DIVIDE=QC_DIVIDE,
                 DEQUANT_WIDE=QC_DEQUANT_WIDE, NF_PROPAGATE=QC_NF_PROPAGATE,
                 NF_NAN_TO_QMIN=QC_NF_NAN_TO_QMIN, NF_INT64=QC_NF_INT64,
                 OUTPUT_Q=QC_OUTPUT_Q, NO_ZERO_POINT=QC_NO_ZERO_POINT, FMA_ZP=QC_FMA_ZP,
                 DEQUANT_NARROW=QC_DEQUANT_NARROW, ROUND_F32=QC_ROUND_F32,
                 NUDGED_DIVIDE=QC_NUDGED_DIVIDE, NUDGED_TF=QC_NUDGED_TF)
#: table -> {entry name: its C++ type} (the CUDA instantiations' arguments)
TYPE_NAMES = {
    "ew": {n: qc_ew_family_types[i].decode() for n, i in FAMILIES.items()},
    "qparams": {n: qc_qp_scheme_types[i].decode() for n, (i, _) in QP_SCHEMES.items()},
    "encode": {n: qc_encode_family_types[i].decode() for n, i in ENCODE_FAMILIES.items()},
    "decode": {n: qc_decode_family_types[i].decode() for n, i in DECODE_FAMILIES.items()},
    "group": {n: qc_group_recipe_types[i].decode() for n, i in GROUP_RECIPES.items()},
    "block": {n: qc_block_recipe_types[i].decode() for n, i in BLOCK_RECIPES.items()}}
#: encode / decode family name -> (per-channel parameters, code widths: 1, 2 or 3 for both)
CODE_FAMILY_INFO = {
    "encode": {n: (qc_encode_family_np[i], qc_encode_family_bytes[i])
               for n, i in ENCODE_FAMILIES.items()},
    "decode": {n: (qc_decode_family_np[i], qc_decode_family_bytes[i])
               for n, i in DECODE_FAMILIES.items()}}
