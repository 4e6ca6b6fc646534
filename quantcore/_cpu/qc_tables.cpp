/*
 * The extension's tables that need the families' Ops (qc_kernels.h): their
 * parameter counts (NP) and code widths (CODE_BYTES) by id.  Compiled once
 * (not per SIMD build); no loop: an edit of a family header rebuilds this
 * small unit, not the extension's own (_kernels.pyx needs the ids only).
 */
#include "qc_families.h"
#include "qc_format_families.h"
#include "qc_kernels.h"

const int qc_ew_family_np[QC_EW_COUNT] = {QC_EW_FAMILIES(QC_X_NP)};
const int qc_encode_family_np[QC_ENC_COUNT] = {QC_ENCODE_FAMILIES(QC_X_NP)};
const int qc_decode_family_np[QC_DEC_COUNT] = {QC_DECODE_FAMILIES(QC_X_NP)};
const int qc_encode_family_bytes[QC_ENC_COUNT] = {QC_ENCODE_FAMILIES(QC_X_CODE_BYTES)};
const int qc_decode_family_bytes[QC_DEC_COUNT] = {QC_DECODE_FAMILIES(QC_X_CODE_BYTES)};
