/*
 * The engine checkpoint writers' row loops (qc_engines.h) for one build:
 * setup.py compiles this unit once per SIMD level (QC_SIMD_LEVEL 2, 3, 4)
 * into that build's namespace, and links the builds into _engines, which
 * calls the one in use (qc_eng_builds.h, qc_builds.h).  Only qc_engines.h's
 * formulas (qc_formats.h's encode) are compiled here: an edit of another
 * family's header does not rebuild it.
 */
#include "qc_engines.h"
#include "qc_eng_builds.h"

namespace QC_LOOPS_NS {
QC_ENG_ENTRIES(QC_BUILD_DEFINE)
}
