/*
 * numpy.histogram's counting loops (qc_np_histogram.h) for one build:
 * setup.py compiles this unit once per SIMD level (QC_SIMD_LEVEL 2, 3, 4)
 * into that build's namespace, and links the builds into _hist, which calls
 * the one in use (qc_hist_builds.h, qc_builds.h).
 */
#include "qc_np_histogram.h"
#include "qc_hist_builds.h"

namespace QC_LOOPS_NS {
QC_HIST_ENTRIES(QC_BUILD_DEFINE)
}
