/*
 * qc_builds.h -- the SIMD builds of the CPU loops, chosen at run time.
 *
 * A unit of loops is compiled once per SIMD level (setup.py's SIMD_UNITS;
 * QC_SIMD_LEVEL = 2, 3 or 4) into that build's namespace, QC_LOOPS_NS:
 *
 *   qc_base   the loops with the extension's flags (x86-64-v2 on x86-64:
 *             SSE4.1 roundps), always present;
 *   qc_v3     the same loops compiled with -march=x86-64-v3 (AVX2 + FMA);
 *   qc_v4     the same loops compiled with -march=x86-64-v4 (AVX-512),
 *             each used when the CPU (and OS) support it (QC_HAVE_V3 /
 *             QC_HAVE_V4: setup.py built it, defined in the extension's
 *             own unit, the dispatcher).
 *
 * Every build is the same formulas with the same flags (-ffp-contract=off),
 * so they give the same bits (tests/test_simd.py).  Each extension holds
 * its own qc::simd_level, set by qc::select_simd when it is imported.
 *
 * An extension whose entries are plain functions lists them as
 * ENTRIES(X), X(return type, name, parameters, arguments), and
 *   - its per-build unit defines them: namespace QC_LOOPS_NS {
 *     ENTRIES(QC_BUILD_DEFINE) }, each name as qc_<name>(arguments) of the
 *     formulas' header;
 *   - its dispatcher declares them in every build made and defines
 *     qc_run_<name>(...), the entry of the build in use: QC_BUILDS(ENTRIES).
 * (_kernels' entries, templates by type and family, dispatch in
 * qc_kernels.h.)
 */
#ifndef QC_BUILDS_H
#define QC_BUILDS_H

/* The namespace of the build that a per-build unit compiles. */
#if defined(QC_SIMD_LEVEL) && QC_SIMD_LEVEL == 4
#define QC_LOOPS_NS qc_v4
#elif defined(QC_SIMD_LEVEL) && QC_SIMD_LEVEL == 3
#define QC_LOOPS_NS qc_v3
#else
#define QC_LOOPS_NS qc_base
#endif

namespace qc {

/* The level of the build in use: 2 (baseline), 3 (x86-64-v3: AVX2 + FMA)
 * or 4 (x86-64-v4: AVX-512 F / BW / DQ / VL / CD), set by select_simd. */
inline int simd_level = 2;

/* The levels built, as a bit mask (bit 2: the baseline, always; bit 3:
 * x86-64-v3; bit 4: x86-64-v4). */
inline int simd_builds() {
  int builds = 1 << 2;
#ifdef QC_HAVE_V3
  builds |= 1 << 3;
#endif
#ifdef QC_HAVE_V4
  builds |= 1 << 4;
#endif
  return builds;
}

/* Use the highest build of level at most `max_level` that the CPU (and
 * OS) support; returns the level in use. */
inline int select_simd(int max_level) {
  int level = 2;
#if defined(QC_HAVE_V3) || defined(QC_HAVE_V4)
  __builtin_cpu_init();
#endif
#ifdef QC_HAVE_V3
  if (max_level >= 3 && __builtin_cpu_supports("x86-64-v3")) level = 3;
#endif
#ifdef QC_HAVE_V4
  if (max_level >= 4 && __builtin_cpu_supports("x86-64-v4")) level = 4;
#endif
  (void)max_level;
  simd_level = level;
  return level;
}

} /* namespace qc */

#ifdef QC_HAVE_V3
#define QC_IF_V3(...) __VA_ARGS__
#else
#define QC_IF_V3(...)
#endif
#ifdef QC_HAVE_V4
#define QC_IF_V4(...) __VA_ARGS__
#else
#define QC_IF_V4(...)
#endif

/* X-macros over ENTRIES (see above) */
#define QC_BUILD_DEFINE(ret, name, params, args)                                              \
  ret name params { return qc_##name args; }
#define QC_BUILD_DECLARE(ret, name, params, args) ret name params;
#define QC_BUILD_RUN(ret, name, params, args)                                                 \
  inline ret qc_run_##name params {                                                           \
    switch (qc::simd_level) {                                                                 \
      QC_IF_V4(case 4: return qc_v4::name args;)                                              \
      QC_IF_V3(case 3: return qc_v3::name args;)                                              \
    default: return qc_base::name args;                                                       \
    }                                                                                         \
  }
#define QC_BUILDS(ENTRIES)                                                                    \
  namespace qc_base { ENTRIES(QC_BUILD_DECLARE) }                                             \
  QC_IF_V3(namespace qc_v3 { ENTRIES(QC_BUILD_DECLARE) })                                     \
  QC_IF_V4(namespace qc_v4 { ENTRIES(QC_BUILD_DECLARE) })                                     \
  ENTRIES(QC_BUILD_RUN)

#endif /* QC_BUILDS_H */
