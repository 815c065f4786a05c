// The CuPy kernel's source (src/anyrope/_kernels/rope.cu) built by nvcc: its __global__ kernels
// for the GPU (a compile check), and rotate_thread for the host, where tests/test_cuda_source.py
// runs every thread of a launch in turn on NumPy arrays and holds the result to the generic path.

#include "rope.cu"

#define ANYROPE_NAMES                                                                                \
    x, out, index, steps, streams, cos_table, sin_table, batch, heads, seq, trail, width, pairs,   \
        group, start, xs0, xs1, xs2, xs3, os0, os1, os2, os3, is0, is1, is2, ts0, ts1, mode, flags

namespace anyrope {

template __global__ void rotate<__half>(ANYROPE_PARAMETERS(__half));
template __global__ void rotate<float>(ANYROPE_PARAMETERS(float));
template __global__ void rotate<double>(ANYROPE_PARAMETERS(double));

// Every thread of a (grid_x, grid_y) x block launch, one after another.
template <typename T>
void host_rotate(long long grid_x, long long grid_y, long long block, ANYROPE_PARAMETERS(T)) {
    const Call call = ANYROPE_CALL;
    for (long long g = 0; g < grid_y; ++g) {
        for (long long thread = 0; thread < grid_x * block; ++thread) {
            if (thread < batch * seq * pairs) {
                rotate_thread<T>(thread, g, x, out, index, steps, streams, cos_table, sin_table, call);
            }
        }
    }
}

}  // namespace anyrope

#define ANYROPE_HOST(NAME, T)                                                                        \
    extern "C" void NAME(long long grid_x, long long grid_y, long long block, ANYROPE_PARAMETERS(T)) { \
        anyrope::host_rotate<T>(grid_x, grid_y, block, ANYROPE_NAMES);                               \
    }

using anyrope::Work;
ANYROPE_HOST(rotate_float16, __half)
ANYROPE_HOST(rotate_float32, float)
ANYROPE_HOST(rotate_float64, double)
