/*
 * cudaemu_float.h -- CUDA's floating-point rules for emulated device code
 * (included at the end of cudaemu.h; README.md cites the CUDA documents).
 *
 * Where x86 and a CUDA device differ in a way that can change a result,
 * device code gets the device's rule:
 *
 *   canonical NaN   every float32 operation whose result is NaN returns
 *                   0x7fffffff; x86 keeps the NaN operand's sign and
 *                   payload, and makes 0xffc00000 (negative) for an invalid
 *                   operation.  Code that reads the sign of a computed NaN
 *                   gets a different answer here than on x86, as it would
 *                   on a GPU.  float64 NaN results (unspecified by CUDA) are
 *                   the marker 0xfff80000c0da6464, which neither x86 nor the
 *                   device makes, so such code is caught too.
 *   flush to zero   with CUDAEMU_FTZ=1 (NVRTC -ftz=true: the fake cupy sets
 *                   it from the last -ftz option) float32 subnormal inputs
 *                   and results of arithmetic, comparisons, conversions and
 *                   the math functions are flushed to a zero of the same
 *                   sign; float64 never is
 *   float -> int    saturates to the 32- / 64-bit range, NaN -> 0 (cvt.rzi:
 *                   x86 gives INT_MIN / garbage); an 8- / 16-bit integer is
 *                   the low bits of the 32-bit conversion (300.0f -> 44)
 *   fminf / fmaxf   a NaN operand gives the other operand, two NaNs the
 *                   canonical NaN
 *   neg / abs       float32 -x and fabsf(x) of a NaN: the canonical NaN (PTX:
 *                   an unspecified NaN); float64 -x and fabs(x) of a NaN pass
 *                   it unchanged (the CUDA C++ Programming Guide)
 *
 * How: `float` and `double` are macros for the wrapper types cudaemu::f32
 * and cudaemu::f64 in everything compiled after the prelude (the kernel
 * source and its headers).  The wrappers have the built-in types' layout
 * (4 / 8 bytes, trivially copyable: kernel arguments, shuffles, unions and
 * reinterpret_casts are unchanged) and overload the arithmetic, the
 * comparisons, the conversions and the math functions device code uses.
 * Literals (1.0f) stay built-in and convert on use.  A construct the
 * wrappers do not cover is a compile error, never a silent x86 result.
 *
 * -DCUDAEMU_PLAIN_FLOAT keeps the built-in types (plain x86 semantics):
 * the self-tests build with it to show that each rule changes a result.
 */
#ifndef CUDAEMU_FLOAT_H
#define CUDAEMU_FLOAT_H

#include <limits>
#include <type_traits>

#ifndef CUDAEMU_FTZ
#define CUDAEMU_FTZ 0
#endif

#ifdef CUDAEMU_PLAIN_FLOAT

namespace cudaemu {
typedef float f32;
typedef double f64;
}  // namespace cudaemu

#else /* CUDA's rules */

namespace cudaemu {

template <class B> struct fp;
typedef fp<float> f32;
typedef fp<double> f64;

/* the rules on the built-in types */
namespace fr {
inline float canon(float r) { return __builtin_isnan(r) ? __builtin_bit_cast(float, 0x7fffffffu) : r; }
/* float64: what the device returns for a NaN result is not documented (the
 * Guide specifies float32's 0x7fffffff only; the issue 38 reading says the
 * input NaN passes through, x86 does the same, and an invalid operation makes
 * its own NaN): the emulator returns a marker NaN that neither x86 nor the
 * device makes, negative, so that a result depending on a float64 NaN's
 * sign or payload differs from the CPU's here, never only on a GPU */
#define CUDAEMU_F64_NAN 0xfff80000c0da6464ull
inline double canon(double r) {
  return __builtin_isnan(r) ? __builtin_bit_cast(double, CUDAEMU_F64_NAN) : r;
}
/* a float32 subnormal -> the zero of its sign (CUDAEMU_FTZ only) */
inline float ftz(float v) {
  const unsigned b = __builtin_bit_cast(unsigned, v);
  return (CUDAEMU_FTZ && (b & 0x7f800000u) == 0u) ? __builtin_bit_cast(float, b & 0x80000000u) : v;
}
inline double ftz(double v) { return v; }
/* an operand as the device reads it, a result as the device writes it */
template <class B> inline B in(B v) { return ftz(v); }
template <class B> inline B out(B r) { return ftz(canon(r)); }

/* float32 <-> float64 (cvt.f64.f32 / cvt.rn.f32.f64) */
template <class To, class From> inline To convert(From v) {
  return std::is_same<To, From>::value ? (To)v : out((To)in(v));
}

/* float -> integer (cvt.rzi): truncation, saturation to the 32- or 64-bit
 * range, NaN -> 0.  An 8- or 16-bit destination is not saturated to its own
 * range: NVRTC converts to 32 bits of the destination's signedness
 * (cvt.rzi.s32.f32 / cvt.rzi.u32.f32, .f64 alike) and keeps the low bits
 * (st.u8 / st.u16, or cvt.s32.s8 / and.b32 255 where the value is used), so
 * (signed char)300.0f is 44, (unsigned char)-1.5f is 0 and
 * (unsigned char)1e30f is 255 (NVRTC 12.9, sm_90; PTX ISA, "Data Movement
 * and Conversion Instructions: cvt": float-to-integer results clamp to the
 * destination register's range). */
template <class I, class B> inline I to_int(B x) {
  x = in(x);
  if constexpr (std::is_same<I, bool>::value) {
    return x != 0;
  } else if constexpr (sizeof(I) < 4) {
    typedef typename std::conditional<std::is_signed<I>::value, int, unsigned>::type W;
    return (I)to_int<W>(x); /* modular (C++20 / GCC): the low bits */
  } else {
    typedef std::numeric_limits<I> L;
    if (x != x) return (I)0;
    const long double t = (long double)x;
    if (t <= (long double)L::min()) return L::min();
    if (t >= (long double)L::max()) return L::max();
    return (I)x;
  }
}
}  // namespace fr

template <class B> struct fp {
  B v;
  fp() = default;
  /* implicit from the same built-in type and from integers (exact types
   * only: a float literal must not convert to f64 as well as to f32) */
  template <class U, typename std::enable_if<std::is_same<U, B>::value ||
                                                 std::is_integral<U>::value,
                                             int>::type = 0>
  constexpr fp(U x) : v((B)x) {}
  /* explicit from the other built-in floating type */
  template <class U, typename std::enable_if<std::is_floating_point<U>::value &&
                                                 !std::is_same<U, B>::value,
                                             int>::type = 0>
  explicit fp(U x) : v(fr::convert<B>(x)) {}
  /* from the other wrapper: float32 <-> float64 */
  template <class C, typename std::enable_if<!std::is_same<C, B>::value, int>::type = 0>
  fp(fp<C> o) : v(fr::convert<B>(o.v)) {}
  /* reads and writes through volatile (templates: the type stays trivially
   * copyable) */
  template <class V, typename std::enable_if<std::is_same<V, fp>::value, int>::type = 0>
  fp(const volatile V &o) : v(o.v) {}
  template <class V, typename std::enable_if<std::is_same<V, fp>::value, int>::type = 0>
  void operator=(const V &o) volatile { v = o.v; }
  /* to integers and bool: cvt.rzi's saturation */
  template <class I, typename std::enable_if<std::is_integral<I>::value, int>::type = 0>
  explicit operator I() const { return fr::to_int<I>(v); }
};
static_assert(sizeof(f32) == 4 && alignof(f32) == 4, "f32 layout");
static_assert(sizeof(f64) == 8 && alignof(f64) == 8, "f64 layout");
static_assert(std::is_trivially_copyable<f32>::value && std::is_trivial<f64>::value, "trivial");

template <class T> struct base_of { typedef T type; };
template <class B> struct base_of<fp<B>> { typedef B type; };
template <class T> struct is_fp : std::false_type {};
template <class B> struct is_fp<fp<B>> : std::true_type {};
template <class T> inline typename base_of<T>::type val(T x) { return x; }
template <class B> inline B val(fp<B> x) { return x.v; }

/* the built-in type of `x op y` (C++'s usual arithmetic conversions) when
 * one operand is a wrapper and the other a wrapper or arithmetic */
template <class X, class Y, class = void> struct bin {};
template <class X, class Y>
struct bin<X, Y,
           typename std::enable_if<(is_fp<X>::value || is_fp<Y>::value) &&
                                   (is_fp<X>::value || std::is_arithmetic<X>::value) &&
                                   (is_fp<Y>::value || std::is_arithmetic<Y>::value)>::type> {
  typedef decltype(typename base_of<X>::type() + typename base_of<Y>::type()) R;
};

/* an operand converted to the operation's type R, as the device reads it */
template <class R, class T> inline R arg(T x) {
  typedef typename base_of<T>::type X;
  if constexpr (std::is_floating_point<X>::value) return (R)fr::in(val(x));
  else return (R)x;
}

#define CUDAEMU_FP_ARITH(op, cop)                                                          \
  template <class X, class Y, class R = typename bin<X, Y>::R>                             \
  inline fp<R> operator op(X a, Y b) {                                                     \
    return fp<R>(fr::out(arg<R>(a) op arg<R>(b)));                                         \
  }                                                                                        \
  template <class B, class Y, class = typename bin<fp<B>, Y>::R>                           \
  inline fp<B> &operator cop(fp<B> &a, Y b) {                                              \
    a = static_cast<fp<B>>(a op b);                                                        \
    return a;                                                                              \
  }
CUDAEMU_FP_ARITH(+, +=)
CUDAEMU_FP_ARITH(-, -=)
CUDAEMU_FP_ARITH(*, *=)
CUDAEMU_FP_ARITH(/, /=)
#undef CUDAEMU_FP_ARITH

#define CUDAEMU_FP_CMP(op)                                                                 \
  template <class X, class Y, class R = typename bin<X, Y>::R>                             \
  inline bool operator op(X a, Y b) {                                                      \
    return arg<R>(a) op arg<R>(b);                                                         \
  }
CUDAEMU_FP_CMP(==)
CUDAEMU_FP_CMP(!=)
CUDAEMU_FP_CMP(<)
CUDAEMU_FP_CMP(<=)
CUDAEMU_FP_CMP(>)
CUDAEMU_FP_CMP(>=)
#undef CUDAEMU_FP_CMP

inline f32 operator+(f32 a) { return a; }
inline f64 operator+(f64 a) { return a; }
/* float32 neg of a NaN: unspecified (canonical here); float64: unchanged */
inline f32 operator-(f32 a) {
  const float x = fr::in(a.v);
  return f32(__builtin_isnan(x) ? fr::canon(x) : -x);
}
inline f64 operator-(f64 a) { return f64(__builtin_isnan(a.v) ? a.v : -a.v); }
inline bool operator!(f32 a) { return !(bool)a; }
inline bool operator!(f64 a) { return !(bool)a; }

/* ------------------------------------------------------ math functions */
#define CUDAEMU_FP_F1(name, fname, impl, implf)                                            \
  inline f32 fname(f32 a) { return f32(fr::out(implf(fr::in(a.v)))); }                   \
  inline f32 name(f32 a) { return fname(a); }                                              \
  inline f64 name(f64 a) { return f64(fr::out(impl(a.v))); }
CUDAEMU_FP_F1(floor, floorf, __builtin_floor, __builtin_floorf)
CUDAEMU_FP_F1(ceil, ceilf, __builtin_ceil, __builtin_ceilf)
CUDAEMU_FP_F1(trunc, truncf, __builtin_trunc, __builtin_truncf)
CUDAEMU_FP_F1(rint, rintf, __builtin_rint, __builtin_rintf)
CUDAEMU_FP_F1(nearbyint, nearbyintf, __builtin_nearbyint, __builtin_nearbyintf)
CUDAEMU_FP_F1(round, roundf, __builtin_round, __builtin_roundf)
CUDAEMU_FP_F1(sqrt, sqrtf, __builtin_sqrt, __builtin_sqrtf)
#undef CUDAEMU_FP_F1

/* abs: float32 NaN -> canonical (unspecified NaN), float64 NaN unchanged */
inline f32 fabsf(f32 a) {
  const float x = fr::in(a.v);
  return f32(__builtin_isnan(x) ? fr::canon(x) : __builtin_fabsf(x));
}
inline f32 fabs(f32 a) { return fabsf(a); }
inline f64 fabs(f64 a) { return f64(__builtin_isnan(a.v) ? a.v : __builtin_fabs(a.v)); }

inline f32 fmaf(f32 a, f32 b, f32 c) {
  return f32(fr::out(__builtin_fmaf(fr::in(a.v), fr::in(b.v), fr::in(c.v))));
}
inline f32 fma(f32 a, f32 b, f32 c) { return fmaf(a, b, c); }
inline f64 fma(f64 a, f64 b, f64 c) { return f64(fr::out(__builtin_fma(a.v, b.v, c.v))); }

inline f32 ldexpf(f32 a, int e) { return f32(fr::out(__builtin_ldexpf(fr::in(a.v), e))); }
inline f32 ldexp(f32 a, int e) { return ldexpf(a, e); }
inline f64 ldexp(f64 a, int e) { return f64(fr::out(__builtin_ldexp(a.v, e))); }

inline f32 frexpf(f32 a, int *e) { return f32(fr::out(__builtin_frexpf(fr::in(a.v), e))); }
inline f32 frexp(f32 a, int *e) { return frexpf(a, e); }
inline f64 frexp(f64 a, int *e) { return f64(fr::out(__builtin_frexp(a.v, e))); }

/* fmin / fmax: a NaN operand gives the other one; two NaNs the canonical NaN */
template <class B> inline B fminmax(B a, B b, bool is_max) {
  a = fr::in(a);
  b = fr::in(b);
  if (__builtin_isnan(a) && __builtin_isnan(b)) return fr::canon(a);
  if (__builtin_isnan(a)) return b;
  if (__builtin_isnan(b)) return a;
  return is_max ? __builtin_fmax(a, b) : __builtin_fmin(a, b);
}
inline f32 fminf(f32 a, f32 b) { return f32(fminmax(a.v, b.v, false)); }
inline f32 fmaxf(f32 a, f32 b) { return f32(fminmax(a.v, b.v, true)); }
inline f32 fmin(f32 a, f32 b) { return fminf(a, b); }
inline f32 fmax(f32 a, f32 b) { return fmaxf(a, b); }
inline f64 fmin(f64 a, f64 b) { return f64(fminmax(a.v, b.v, false)); }
inline f64 fmax(f64 a, f64 b) { return f64(fminmax(a.v, b.v, true)); }
/* CUDA's min / max overloads for floating types are fminf / fmaxf, fmin / fmax */
inline f32 min(f32 a, f32 b) { return fminf(a, b); }
inline f32 max(f32 a, f32 b) { return fmaxf(a, b); }
inline f64 min(f64 a, f64 b) { return fmin(a, b); }
inline f64 max(f64 a, f64 b) { return fmax(a, b); }

/* bit operations: no flush, no canonical NaN */
inline f32 copysignf(f32 a, f32 b) { return f32(__builtin_copysignf(a.v, b.v)); }
inline f32 copysign(f32 a, f32 b) { return copysignf(a, b); }
inline f64 copysign(f64 a, f64 b) { return f64(__builtin_copysign(a.v, b.v)); }
template <class B> inline bool isnan(fp<B> a) { return __builtin_isnan(a.v); }
template <class B> inline bool isinf(fp<B> a) { return __builtin_isinf(a.v); }
template <class B> inline bool isfinite(fp<B> a) { return __builtin_isfinite(a.v); }
template <class B> inline bool signbit(fp<B> a) { return __builtin_signbit(a.v); }

/* kernel argument type codes */
template <> struct Code<f32> { static std::string get() { return "f4"; } };
template <> struct Code<f64> { static std::string get() { return "f8"; } };

}  // namespace cudaemu

#endif /* CUDAEMU_PLAIN_FLOAT */

/* ------------------------------------------- bit casts of the float types */
inline ::cudaemu::f32 __int_as_float(int v) {
  return ::cudaemu::f32(__builtin_bit_cast(float, v));
}
inline ::cudaemu::f32 __uint_as_float(unsigned v) {
  return ::cudaemu::f32(__builtin_bit_cast(float, v));
}
inline int __float_as_int(::cudaemu::f32 v) { return __builtin_bit_cast(int, v); }
inline unsigned __float_as_uint(::cudaemu::f32 v) { return __builtin_bit_cast(unsigned, v); }
inline ::cudaemu::f64 __longlong_as_double(long long v) {
  return ::cudaemu::f64(__builtin_bit_cast(double, v));
}
inline long long __double_as_longlong(::cudaemu::f64 v) { return __builtin_bit_cast(long long, v); }

#ifndef CUDAEMU_PLAIN_FLOAT
/* from here on (the kernel source), float and double are the wrappers */
#define float ::cudaemu::f32
#define double ::cudaemu::f64
#endif

#endif /* CUDAEMU_FLOAT_H */
