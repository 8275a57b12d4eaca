// Just enough of CUDA to run `host/model/src/invariant.cu` on a CPU, for a machine without a
// GPU: each block's threads are OS threads (so `__syncthreads` is a real barrier), `__shared__`
// memory is a static the block's threads share (blocks run one after another), a warp's
// shuffle is an exchange through a per-warp barrier. It checks the kernels' indexing, masks
// and orders of summation; not the GPU's memory model, its arithmetic (no fused
// multiply-adds are contracted here but `fmaf`'s), nor speed.
#pragma once
#include <barrier>
#include <cmath>
#include <cstring>
#include <memory>
#include <thread>
#include <vector>

struct dim3 {
    unsigned x = 1, y = 1, z = 1;
};

inline thread_local dim3 threadIdx, blockIdx;
inline dim3 blockDim, gridDim;

#define __global__
#define __device__
#define __forceinline__ inline
#define __shared__ static

struct Warp {
    std::barrier<> barrier{32};
    float values[32];
};
inline std::barrier<>* block_barrier;
inline std::vector<std::unique_ptr<Warp>>* warps;

inline void __syncthreads() { block_barrier->arrive_and_wait(); }

inline float __shfl_xor_sync(unsigned, float value, int offset) {
    Warp& warp = *(*warps)[threadIdx.x / 32];
    const int lane = threadIdx.x % 32;
    warp.values[lane] = value;
    warp.barrier.arrive_and_wait();
    const float other = warp.values[lane ^ offset];
    warp.barrier.arrive_and_wait();
    return other;
}

inline float __uint_as_float(unsigned int bits) {
    float value;
    std::memcpy(&value, &bits, sizeof value);
    return value;
}

using std::fmaf;
using std::min;

// `kernel<<<grid, block>>>(args...)`: block after block, each block's threads at once.
template <typename Kernel, typename... Args>
void launch(dim3 grid, dim3 block, Kernel kernel, Args... args) {
    gridDim = grid;
    blockDim = block;
    const unsigned threads = block.x * block.y * block.z;
    for (unsigned z = 0; z < grid.z; ++z)
        for (unsigned y = 0; y < grid.y; ++y)
            for (unsigned x = 0; x < grid.x; ++x) {
                std::barrier<> barrier(threads);
                std::vector<std::unique_ptr<Warp>> block_warps;
                for (unsigned w = 0; w < (threads + 31) / 32; ++w) block_warps.push_back(std::make_unique<Warp>());
                block_barrier = &barrier;
                warps = &block_warps;
                std::vector<std::thread> running;
                for (unsigned t = 0; t < threads; ++t)
                    running.emplace_back([=] {
                        threadIdx = dim3{t, 0, 0};
                        blockIdx = dim3{x, y, z};
                        kernel(args...);
                    });
                for (auto& thread : running) thread.join();
            }
}
