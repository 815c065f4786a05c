// anyrope's fused rotation for CuPy arrays: the CUDA twin of the Triton kernel (_triton.py).
//
// CuPy compiles it with NVRTC on first use, with --fmad=false: no fused multiply-adds, so the
// arithmetic is the generic path's, operation for operation. The test suite compiles the same
// source with nvcc, for the GPU (a compile check) and for the host, where it runs rotate_thread
// on NumPy arrays and holds it to the generic result.
//
// x and out are seen as (batch, heads, seq, trail, width), strides in elements, features
// adjacent. One thread per (batch row b, token s, V adjacent pairs from j0) forms those pairs'
// angles once, by the core's float64 scheme (anyrope/_angles.py: the position's magnitude in
// 21-bit parts, each times its level's exactly reduced step, summed in float64; float64 cos and
// sin; one cast), or reads them from the tables, then rotates them in each head of its group
// (blockIdx.y), moving 16 bytes per access where the launch allows (cupy_cuda.pairs_per_thread).

#include <cuda_fp16.h>

namespace anyrope {

enum Mode { OFFSET = 0, STARTS = 1, POSITIONS = 2, TABLES = 3 };
enum Flag { INVERSE = 2, SCALED = 4, COPY_TAIL = 8, MULTI = 16 };  // the layout is HALF_PAIRS

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

// An unsigned integer or CUDA vector type of BYTES bytes: one access of that width.
template <int BYTES> struct Word;
template <> struct Word<2> { typedef unsigned short type; };
template <> struct Word<4> { typedef unsigned int type; };
template <> struct Word<8> { typedef uint2 type; };
template <> struct Word<16> { typedef uint4 type; };

// N adjacent elements: read and written as one word where ALIGNED (the launch checked every
// address: 16 bytes, one 128-bit instruction, where it could), else element by element. The
// elements share their storage with the word: a struct of elements alone, built one by one, is
// stored one by one again.
template <typename T, int N, bool ALIGNED> struct Pack {
    T v[N];
};
template <typename T, int N> struct Pack<T, N, true> {
    typedef typename Word<sizeof(T) * N>::type Whole;
    union {
        Whole word;
        T v[N];
    };
};

// One word stored by one instruction of its width: written in C++, a word whose parts were
// computed apart is stored apart again (the compiler splits it back into its elements).
__host__ __device__ inline void store(unsigned short* to, unsigned short w) { *to = w; }
__host__ __device__ inline void store(unsigned int* to, unsigned int w) { *to = w; }
__host__ __device__ inline void store(uint2* to, uint2 w) {
#ifdef __CUDA_ARCH__
    asm volatile("st.global.v2.b32 [%0], {%1, %2};" ::"l"(to), "r"(w.x), "r"(w.y) : "memory");
#else
    *to = w;
#endif
}
__host__ __device__ inline void store(uint4* to, uint4 w) {
#ifdef __CUDA_ARCH__
    asm volatile("st.global.v4.b32 [%0], {%1, %2, %3, %4};" ::"l"(to), "r"(w.x), "r"(w.y), "r"(w.z), "r"(w.w)
                 : "memory");
#else
    *to = w;
#endif
}

// A pack written to memory: an aligned one as its word, the other element by element.
template <typename T, int N>
__host__ __device__ inline void put(T* to, const Pack<T, N, true>& pack) {
    store(reinterpret_cast<typename Pack<T, N, true>::Whole*>(to), pack.word);
}
template <typename T, int N>
__host__ __device__ inline void put(T* to, const Pack<T, N, false>& pack) {
    *reinterpret_cast<Pack<T, N, false>*>(to) = pack;
}

// Pairs per thread, V: a power of two dividing the rotary pairs. Half pairs (HALF_PAIRS) move as
// two packs of V elements (j..j+V, and pairs later), interleaved ones as one pack of 2V.
template <typename T, int V, bool HALF_PAIRS, bool ALIGNED>
__host__ __device__ void rotate_thread(
    long long thread, long long group, const T* x, T* out, const long long* index, const double* steps,
    const int* streams, const typename Work<T>::type* cos_table, const typename Work<T>::type* sin_table,
    const Call& call) {
    typedef typename Work<T>::type W;
    const long long pairs = call.pairs, chunks = pairs / V;
    const long long j0 = (thread % chunks) * V;
    const long long s = (thread / chunks) % call.seq;
    const long long b = thread / (chunks * call.seq);
    if (b >= call.batch) return;
    W c[V], n[V];
    long long p = 0, row_start = 0;
    if (call.mode == OFFSET) {
        p = call.start + s;
    } else if (call.mode == STARTS) {
        row_start = index[b * call.is[1]];
        p = (long long)((unsigned long long)row_start + (unsigned long long)s);  // wraps, defined
    }
    const bool streams_apart = call.mode == POSITIONS && (call.flags & MULTI);  // one per pair
    if (call.mode == POSITIONS && !streams_apart) p = index[b * call.is[1] + s * call.is[2]];
    for (int v = 0; v < V; ++v) {
        const long long j = j0 + v;
        if (call.mode == TABLES) {
            const long long at = b * call.ts[0] + s * call.ts[1] + j;
            c[v] = cos_table[at];
            n[v] = sin_table[at];
        } else {
            if (streams_apart) p = index[streams[j] * call.is[0] + b * call.is[1] + s * call.is[2]];
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
            c[v] = (W)cos(angle);
            n[v] = (W)sin(angle);
            if (call.flags & SCALED) {
                const W scale = (W)steps[3 * pairs + j];
                c[v] = c[v] * scale;
                n[v] = n[v] * scale;
            }
        }
        if (call.flags & INVERSE) n[v] = -n[v];
    }
    const long long every = call.heads * call.trail;
    const long long stop = (group + 1) * call.group < every ? (group + 1) * call.group : every;
    for (long long h = group * call.group; h < stop; ++h) {
        const long long a = h / call.trail, t = h % call.trail;
        const T* from = x + b * call.xs[0] + a * call.xs[1] + s * call.xs[2] + t * call.xs[3];
        T* to = out + b * call.os[0] + a * call.os[1] + s * call.os[2] + t * call.os[3];
        if constexpr (HALF_PAIRS) {  // the other layout's packs are not instantiated
            typedef Pack<T, V, ALIGNED> Half;
            const Half first = *reinterpret_cast<const Half*>(from + j0);
            const Half second = *reinterpret_cast<const Half*>(from + j0 + pairs);
            Half turned1, turned2;
            for (int v = 0; v < V; ++v) {
                const W x1 = widen(first.v[v]), x2 = widen(second.v[v]);
                narrow(x1 * c[v] - x2 * n[v], &turned1.v[v]);
                narrow(x2 * c[v] + x1 * n[v], &turned2.v[v]);
            }
            put(to + j0, turned1);
            put(to + j0 + pairs, turned2);
        } else {
            typedef Pack<T, 2 * V, ALIGNED> Both;
            const Both both = *reinterpret_cast<const Both*>(from + 2 * j0);
            Both turned;
            for (int v = 0; v < V; ++v) {
                const W x1 = widen(both.v[2 * v]), x2 = widen(both.v[2 * v + 1]);
                narrow(x1 * c[v] - x2 * n[v], &turned.v[2 * v]);
                narrow(x2 * c[v] + x1 * n[v], &turned.v[2 * v + 1]);
            }
            put(to + 2 * j0, turned);
        }
        if (call.flags & COPY_TAIL) {  // the features past the rotary ones, a pack at a time
            const int size = HALF_PAIRS ? V : 2 * V;  // the width and the features divide by it
            typedef Pack<T, HALF_PAIRS ? V : 2 * V, ALIGNED> Rest;
            for (long long k = 2 * pairs + (j0 / V) * size; k < call.width; k += chunks * size) {
                put(to + k, *reinterpret_cast<const Rest*>(from + k));
            }
        }
    }
}

// The arguments one by one (CuPy passes scalars, not structs), gathered into a Call: x's, then
// y's (k of the same call: its head counts and strides; x again where x is alone), then the blocks
// of x along the grid's first axis (y's come after them).
#define ANYROPE_PARAMETERS(T)                                                                         \
    const T *x, T *out, const long long *index, const double *steps, const int *streams,             \
        const typename Work<T>::type *cos_table, const typename Work<T>::type *sin_table,           \
        long long batch, long long heads, long long seq, long long trail, long long width,          \
        long long pairs, long long group, long long start, long long xs0, long long xs1,            \
        long long xs2, long long xs3, long long os0, long long os1, long long os2, long long os3,   \
        long long is0, long long is1, long long is2, long long ts0, long long ts1, int mode, int flags, \
        const T *y, T *y_out, long long y_heads, long long y_trail, long long ys0, long long ys1,   \
        long long ys2, long long ys3, long long yos0, long long yos1, long long yos2, long long yos3, \
        long long x_blocks

#define ANYROPE_CALL                                                                                  \
    {batch, heads, seq, trail, width, pairs, group, start, {xs0, xs1, xs2, xs3}, {os0, os1, os2, os3}, \
     {is0, is1, is2}, {ts0, ts1}, mode, flags}

// One thread of a launch, block (bx, by), thread tx of its block: of x where bx < x_blocks, else
// of y, which differs from x in its head counts and strides alone.
template <typename T, int V, bool HALF_PAIRS, bool ALIGNED>
__host__ __device__ void rotate_at(long long bx, long long by, long long tx, long long threads,
                                   ANYROPE_PARAMETERS(T)) {
    Call call = ANYROPE_CALL;
    const bool second = bx >= x_blocks;
    if (second) {
        call.heads = y_heads;
        call.trail = y_trail;
        call.xs[0] = ys0, call.xs[1] = ys1, call.xs[2] = ys2, call.xs[3] = ys3;
        call.os[0] = yos0, call.os[1] = yos1, call.os[2] = yos2, call.os[3] = yos3;
    }
    if (by * call.group >= call.heads * call.trail) return;  // this array has fewer groups of heads
    const long long thread = (bx - (second ? x_blocks : 0)) * threads + tx;
    if (thread < batch * seq * (pairs / V)) {
        rotate_thread<T, V, HALF_PAIRS, ALIGNED>(thread, by, second ? y : x, second ? y_out : out, index, steps,
                                                 streams, cos_table, sin_table, call);
    }
}

#define ANYROPE_NAMES                                                                                 \
    x, out, index, steps, streams, cos_table, sin_table, batch, heads, seq, trail, width, pairs,    \
        group, start, xs0, xs1, xs2, xs3, os0, os1, os2, os3, is0, is1, is2, ts0, ts1, mode, flags,  \
        y, y_out, y_heads, y_trail, ys0, ys1, ys2, ys3, yos0, yos1, yos2, yos3, x_blocks

template <typename T, int V, bool HALF_PAIRS, bool ALIGNED>
__global__ void rotate(ANYROPE_PARAMETERS(T)) {
    rotate_at<T, V, HALF_PAIRS, ALIGNED>(blockIdx.x, blockIdx.y, threadIdx.x, blockDim.x, ANYROPE_NAMES);
}

}  // namespace anyrope
