// The CuPy kernel's source (src/anyrope/_kernels/rope.cu) built by nvcc: its __global__ kernels
// for the GPU (a compile check, and the PTX tests/cuda_report.py reads), and rotate_thread for
// the host, where tests/test_cuda_source.py runs every thread of a launch in turn on NumPy arrays
// and holds the result to the generic path.

#include "rope.cu"

namespace anyrope {

// Every thread of a (grid_x, grid_y) x block launch of rotate<T, V, HALF_PAIRS, ALIGNED>, one
// after another.
template <typename T, int V, bool HALF_PAIRS, bool ALIGNED>
void host_rotate(long long grid_x, long long grid_y, long long block, ANYROPE_PARAMETERS(T)) {
    for (long long by = 0; by < grid_y; ++by) {
        for (long long bx = 0; bx < grid_x; ++bx) {
            for (long long tx = 0; tx < block; ++tx) {
                rotate_at<T, V, HALF_PAIRS, ALIGNED>(bx, by, tx, block, ANYROPE_NAMES);
            }
        }
    }
}

}  // namespace anyrope

// Every kernel CuPy compiles (cupy_cuda.NAMES): for the GPU, and as a case of the host entry of
// its dtype, which returns 1 for a kernel that is not among them.
#define ANYROPE_KERNEL(T, V, HALF_PAIRS, ALIGNED)                                                     \
    template __global__ void anyrope::rotate<T, V, HALF_PAIRS, ALIGNED>(ANYROPE_PARAMETERS(T));
#define ANYROPE_CASE(T, V, HALF_PAIRS, ALIGNED)                                                       \
    if (v == V && half == HALF_PAIRS && aligned == ALIGNED) {                                        \
        anyrope::host_rotate<T, V, HALF_PAIRS, ALIGNED>(grid_x, grid_y, block, ANYROPE_NAMES);        \
        return 0;                                                                                     \
    }
#define ANYROPE_HALF(EACH)                                                                            \
    EACH(__half, 8, true, true) EACH(__half, 4, true, true) EACH(__half, 2, true, true)               \
    EACH(__half, 1, true, true) EACH(__half, 4, false, true) EACH(__half, 2, false, true)             \
    EACH(__half, 1, false, true) EACH(__half, 1, false, false)
#define ANYROPE_FLOAT(EACH)                                                                           \
    EACH(float, 4, true, true) EACH(float, 2, true, true) EACH(float, 1, true, true)                  \
    EACH(float, 2, false, true) EACH(float, 1, false, true) EACH(float, 1, false, false)
#define ANYROPE_DOUBLE(EACH)                                                                          \
    EACH(double, 2, true, true) EACH(double, 1, true, true) EACH(double, 1, false, true)              \
    EACH(double, 1, false, false)

ANYROPE_HALF(ANYROPE_KERNEL)
ANYROPE_FLOAT(ANYROPE_KERNEL)
ANYROPE_DOUBLE(ANYROPE_KERNEL)

#define ANYROPE_HOST(NAME, T, KERNELS)                                                                \
    extern "C" int NAME(long long grid_x, long long grid_y, long long block, int v, bool half,        \
                        bool aligned, ANYROPE_PARAMETERS(T)) {                                        \
        KERNELS(ANYROPE_CASE)                                                                         \
        return 1;                                                                                     \
    }

using anyrope::Work;
ANYROPE_HOST(rotate_float16, __half, ANYROPE_HALF)
ANYROPE_HOST(rotate_float32, float, ANYROPE_FLOAT)
ANYROPE_HOST(rotate_float64, double, ANYROPE_DOUBLE)
