// anyrope's fused rotation for CuPy arrays: the CUDA twin of the Triton kernel (_triton.py).
//
// CuPy compiles it with NVRTC on first use, with --fmad=false: no fused multiply-adds, so the
// arithmetic is the generic path's, operation for operation. The test suite compiles the same
// source with nvcc, for the GPU (a compile check) and for the host, where it runs rotate_thread
// on NumPy arrays and holds it to the generic result.
//
// x and out are seen as (batch, heads, seq, trail, width), strides in elements, features
// adjacent. One thread per (batch row b, token s, pair j) forms that pair's angle once, by the
// core's float64 scheme (anyrope/_angles.py: the position's magnitude in 21-bit parts, each times
// its level's exactly reduced step, summed in float64; float64 cos and sin; one cast), then
// rotates the pair in each head of its group (blockIdx.y).

#include <cuda_fp16.h>

namespace anyrope {

enum Mode { OFFSET = 0, STARTS = 1, POSITIONS = 2, TABLES = 3 };
enum Flag { HALF = 1, INVERSE = 2, SCALED = 4, COPY_TAIL = 8, MULTI = 16 };

struct Call {
    long long batch, heads, seq, trail, width, pairs, group, start;
    long long xs[4], os[4];  // strides of x and out's first four axes
    long long is[3];         // of the positions (stream, row, token); 0 where shared
    long long ts[2];         // of the caller's tables (row, token)
    int mode, flags;
};

template <typename T> struct Work { typedef float type; };  // float16 and float32 turn in float32
template <> struct Work<double> { typedef double type; };

__host__ __device__ inline float widen(__half v) { return __half2float(v); }
__host__ __device__ inline float widen(float v) { return v; }
__host__ __device__ inline double widen(double v) { return v; }
__host__ __device__ inline void narrow(float v, __half* to) { *to = __float2half_rn(v); }
__host__ __device__ inline void narrow(float v, float* to) { *to = v; }
__host__ __device__ inline void narrow(double v, double* to) { *to = v; }

// The split, anyrope._angles.SPLIT_BITS, comes from the compiler options; three parts cover a
// 63-bit magnitude (anyrope._kernel_angles.LEVELS).
#ifndef ANYROPE_SPLIT_BITS
#error "compile with -DANYROPE_SPLIT_BITS=<anyrope._angles.SPLIT_BITS>"
#endif
const long long PART = (1LL << ANYROPE_SPLIT_BITS) - 1;

template <typename T>
__host__ __device__ void rotate_thread(
    long long thread, long long group, const T* x, T* out, const long long* index, const double* steps,
    const int* streams, const typename Work<T>::type* cos_table, const typename Work<T>::type* sin_table,
    const Call& call) {
    typedef typename Work<T>::type W;
    const long long pairs = call.pairs;
    const long long j = thread % pairs;
    const long long s = (thread / pairs) % call.seq;
    const long long b = thread / (pairs * call.seq);
    if (b >= call.batch) return;
    W c, n;
    if (call.mode == TABLES) {
        const long long at = b * call.ts[0] + s * call.ts[1] + j;
        c = cos_table[at];
        n = sin_table[at];
    } else {
        long long p, row_start = 0;
        if (call.mode == OFFSET) {
            p = call.start + s;
        } else if (call.mode == STARTS) {
            row_start = index[b * call.is[1]];
            p = (long long)((unsigned long long)row_start + (unsigned long long)s);  // wraps, defined
        } else {
            const long long stream = (call.flags & MULTI) ? streams[j] : 0;  // the pair's own stream
            p = index[stream * call.is[0] + b * call.is[1] + s * call.is[2]];
        }
        const bool negative = p < 0;
        const long long magnitude = negative ? -1 - p : p;  // never overflows
        const double f0 = steps[j];
        double low = (double)(magnitude & PART) * f0;
        const long long high = magnitude >> ANYROPE_SPLIT_BITS;
        low = (double)(high & PART) * steps[pairs + j] + low;
        low = (double)((high >> ANYROPE_SPLIT_BITS) & PART) * steps[2 * pairs + j] + low;
        double angle = negative ? -(low + f0) : low;
        // a position past int64 wrapped below its row's start: 2**64 positions back (as the core's)
        if (call.mode == STARTS && p < row_start) angle = angle + steps[4 * pairs + j];
        c = (W)cos(angle);
        n = (W)sin(angle);
        if (call.flags & SCALED) {
            const W scale = (W)steps[3 * pairs + j];
            c = c * scale;
            n = n * scale;
        }
    }
    if (call.flags & INVERSE) n = -n;
    const long long first = (call.flags & HALF) ? j : 2 * j;
    const long long second = (call.flags & HALF) ? j + pairs : 2 * j + 1;
    const long long every = call.heads * call.trail;
    const long long stop = (group + 1) * call.group < every ? (group + 1) * call.group : every;
    for (long long h = group * call.group; h < stop; ++h) {
        const long long a = h / call.trail, t = h % call.trail;
        const T* from = x + b * call.xs[0] + a * call.xs[1] + s * call.xs[2] + t * call.xs[3];
        T* to = out + b * call.os[0] + a * call.os[1] + s * call.os[2] + t * call.os[3];
        const W x1 = widen(from[first]), x2 = widen(from[second]);
        const W turned1 = x1 * c - x2 * n;
        const W turned2 = x2 * c + x1 * n;
        narrow(turned1, to + first);
        narrow(turned2, to + second);
        if (call.flags & COPY_TAIL) {
            for (long long k = 2 * pairs + j; k < call.width; k += pairs) to[k] = from[k];
        }
    }
}

// The arguments one by one (CuPy passes scalars, not structs), gathered into a Call.
#define ANYROPE_PARAMETERS(T)                                                                         \
    const T *x, T *out, const long long *index, const double *steps, const int *streams,             \
        const typename Work<T>::type *cos_table, const typename Work<T>::type *sin_table,           \
        long long batch, long long heads, long long seq, long long trail, long long width,          \
        long long pairs, long long group, long long start, long long xs0, long long xs1,            \
        long long xs2, long long xs3, long long os0, long long os1, long long os2, long long os3,   \
        long long is0, long long is1, long long is2, long long ts0, long long ts1, int mode, int flags

#define ANYROPE_CALL                                                                                  \
    {batch, heads, seq, trail, width, pairs, group, start, {xs0, xs1, xs2, xs3}, {os0, os1, os2, os3}, \
     {is0, is1, is2}, {ts0, ts1}, mode, flags}

template <typename T>
__global__ void rotate(ANYROPE_PARAMETERS(T)) {
    const Call call = ANYROPE_CALL;
    const long long thread = (long long)blockIdx.x * blockDim.x + threadIdx.x;
    if (thread < batch * seq * pairs) {
        rotate_thread<T>(thread, blockIdx.y, x, out, index, steps, streams, cos_table, sin_table, call);
    }
}

}  // namespace anyrope
