/*
 * test_emu.cc — tests of the CUDA emulator itself (suite cuda_emu of
 * kvtrim-cuda-emu-tests): a kernel test that passes under the emulator is
 * only worth something if the emulator's barriers, shuffles and checks do
 * what the device does, and if it fails loudly where the device would hang
 * or return garbage.  Expected values are computed here from the CUDA
 * programming guide's definitions, not by the emulator.
 *
 * Run: build/bin/kvtrim-cuda-emu-tests cuda_emu
 */
#include <fcntl.h>
#include <math.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <vector>

#include "common.cuh"
#include "cublas_v2.h"
#include "cudaTypedefs.h"

extern "C" {
#include "handle.h"
#include "kernels.h"
#include "test.h"
}

#include "cuda_check.h"

template <typename T> static T *dalloc(size_t n)
{
	void *p = nullptr;
	CK(cudaMalloc(&p, n * sizeof(T)));
	return (T *)p;
}

template <typename T> static std::vector<T> download(const T *d, size_t n)
{
	std::vector<T> h(n);
	CK(cudaMemcpy(h.data(), d, n * sizeof(T), cudaMemcpyDeviceToHost));
	return h;
}

/* ------------------------------------------------------------ shuffles */

#define SH_N 10 /* results per thread */

/* Two warps; every lane records what each warp op gave it. */
static __global__ void k_shuffles(unsigned *out /* [64][SH_N] */)
{
	const unsigned t = threadIdx.x, lane = t & 31, v = 1000 * (t >> 5) + lane;
	unsigned *o = out + t * SH_N;
	o[0] = __shfl_xor_sync(0xffffffffu, v, 5);
	o[1] = __shfl_up_sync(0xffffffffu, v, 3);
	o[2] = __shfl_down_sync(0xffffffffu, v, 3);
	o[3] = __shfl_sync(0xffffffffu, v, 7);
	o[4] = __shfl_xor_sync(0xffffffffu, v, 4, 8);  /* inside groups of 8 */
	o[5] = __shfl_xor_sync(0xffffffffu, v, 8, 8);  /* later group: own */
	o[6] = __shfl_up_sync(0xffffffffu, v, 2, 8);
	o[7] = __shfl_sync(0xffffffffu, v, 9, 8);      /* lane 1 of the group */
	o[8] = __ballot_sync(0xffffffffu, lane % 3 == 0);
	/* half a warp at a time, as the lanes of one branch */
	if (lane < 16)
		o[9] = __ballot_sync(0x0000ffffu, lane & 1);
	else
		o[9] = __ballot_sync(0xffff0000u, !(lane & 1));
	float f = (float)lane * 0.5f;
	f += __shfl_xor_sync(0xffffffffu, f, 1);
	if (f != (float)(lane ^ 1) * 0.5f + (float)lane * 0.5f)
		o[0] = 0xdeadu; /* floats travel as bits */
}

TEST(cuda_emu, shuffles_and_votes)
{
	unsigned *d = dalloc<unsigned>(64 * SH_N);
	KVT_LAUNCH(k_shuffles, 1, 64, 0, 0, d);
	CK(cudaGetLastError());
	std::vector<unsigned> h = download(d, 64 * SH_N);
	for (unsigned t = 0; t < 64; t++) {
		unsigned lane = t & 31, w = 1000 * (t >> 5), g = lane & ~7u;
		unsigned want[SH_N] = {
			w + (lane ^ 5),
			w + (lane >= 3 ? lane - 3 : lane),
			w + (lane + 3 < 32 ? lane + 3 : lane),
			w + 7,
			w + (lane ^ 4),
			/* an earlier group is read, a later one is not */
			w + (lane & 8 ? lane ^ 8 : lane),
			w + ((lane & 7) >= 2 ? lane - 2 : lane),
			w + g + 1,
			0x49249249u,
			lane < 16 ? 0x0000aaaau : 0x55550000u};
		for (int i = 0; i < SH_N; i++)
			if (h[t * SH_N + i] != want[i])
				th_fail(__FILE__, __LINE__,
				        "thread %u result %d: %#x, expected %#x", t,
				        i, h[t * SH_N + i], want[i]);
	}
	cudaFree(d);
}

/* ---------------------------------------------------- block and memory */

/* A tree sum in shared memory over a 2-D block, one barrier per level. */
static __global__ void k_block_sum(const int *in, int *out, int *count)
{
	__shared__ int s[256];
	const unsigned t = threadIdx.y * blockDim.x + threadIdx.x;
	const unsigned b = blockIdx.x + gridDim.x * blockIdx.y;
	s[t] = in[b * 256 + t];
	__syncthreads();
	for (unsigned h = 128; h > 0; h >>= 1) {
		if (t < h)
			s[t] += s[t + h];
		__syncthreads();
	}
	if (t == 0)
		out[b] = s[0];
	atomicAdd(count, 1);
}

TEST(cuda_emu, block_barrier_2d_grid)
{
	const int nb = 6;
	std::vector<int> h(nb * 256);
	for (size_t i = 0; i < h.size(); i++)
		h[i] = (int)(i * 7 % 1001);
	int *in = dalloc<int>(h.size()), *out = dalloc<int>(nb);
	int *cnt = dalloc<int>(1);
	CK(cudaMemcpy(in, h.data(), h.size() * 4, cudaMemcpyHostToDevice));
	CK(cudaMemset(cnt, 0, 4));
	KVT_LAUNCH(k_block_sum, dim3(3, 2), dim3(16, 16), 0, 0, in, out, cnt);
	CK(cudaGetLastError());
	std::vector<int> o = download(out, nb), c = download(cnt, 1);
	for (int b = 0; b < nb; b++) {
		int want = 0;
		for (int i = 0; i < 256; i++)
			want += h[b * 256 + i];
		T_EQ(o[b], want);
	}
	T_EQ(c[0], nb * 256);
}

/* Dynamic shared memory through KVT_DYN_SHARED, sized by the launch. */
static __global__ void k_dyn(int *out, int n)
{
	KVT_DYN_SHARED(int, buf);
	for (int i = threadIdx.x; i < n; i += blockDim.x)
		buf[i] = i * 3;
	__syncthreads();
	if (threadIdx.x == 0) {
		int s = 0;
		for (int i = 0; i < n; i++)
			s += buf[i];
		*out = s;
	}
}

TEST(cuda_emu, dynamic_shared_memory_limits)
{
	int *out = dalloc<int>(1);
	int n = 1000;
	KVT_LAUNCH(k_dyn, 1, 128, n * sizeof(int), 0, out, n);
	CK(cudaGetLastError());
	T_EQ(download(out, 1)[0], 3 * n * (n - 1) / 2);
	/* beyond the 48 KiB default without the attribute */
	n = 20000;
	KVT_LAUNCH(k_dyn, 1, 128, n * sizeof(int), 0, out, n);
	T_EQ(cudaGetLastError(), cudaErrorInvalidValue);
	T_EQ(cudaFuncSetAttribute(k_dyn, cudaFuncAttributeMaxDynamicSharedMemorySize,
	                          n * (int)sizeof(int)),
	     cudaSuccess);
	KVT_LAUNCH(k_dyn, 1, 128, n * sizeof(int), 0, out, n);
	CK(cudaGetLastError());
	T_EQ(download(out, 1)[0], 3 * n * (n - 1) / 2);
	/* the device has 227 KiB */
	T_EQ(cudaFuncSetAttribute(k_dyn, cudaFuncAttributeMaxDynamicSharedMemorySize,
	                          228 * 1024),
	     cudaErrorInvalidValue);
	cudaGetLastError();
}

#ifndef __SANITIZE_ADDRESS__
/* Shared memory, static (here in a template kernel) or dynamic, that no
 * thread of this block wrote reads as 0xff bytes in a launch's first
 * blocks, not as the previous block's values (ASan builds keep red zones
 * instead). */
template <typename T> static __global__ void k_stale(T *out)
{
	__shared__ T s[32];
	KVT_DYN_SHARED(T, dyn);
	if (blockIdx.x == 0) {
		s[threadIdx.x] = threadIdx.x;
		dyn[threadIdx.x] = threadIdx.x + 100;
	}
	__syncthreads();
	out[blockIdx.x * 64 + threadIdx.x] = s[threadIdx.x];
	out[blockIdx.x * 64 + 32 + threadIdx.x] = dyn[threadIdx.x];
}

TEST(cuda_emu, shared_memory_starts_as_garbage)
{
	unsigned *d = dalloc<unsigned>(128);
	KVT_LAUNCH(k_stale<unsigned>, 2, 32, 32 * sizeof(unsigned), 0, d);
	CK(cudaGetLastError());
	std::vector<unsigned> h = download(d, 128);
	T_EQ(h[5], 5);
	T_EQ(h[32 + 5], 105);
	T_EQ(h[64 + 5], 0xffffffffu);
	T_EQ(h[96 + 5], 0xffffffffu);
}
#endif

/* --------------------------------------------- faults the emulator finds */

/* Each mode is a kernel bug that hangs the device or gives undefined
 * values; the emulator must end the launch with an error instead. */
static __global__ void k_bad(int mode)
{
	const unsigned lane = threadIdx.x & 31;
	unsigned v = lane;
	switch (mode) {
	case 0: /* barrier after some threads returned */
		if (threadIdx.x >= 32)
			return;
		__syncthreads();
		break;
	case 1: /* two different barriers */
		if (threadIdx.x & 1)
			__syncthreads();
		else
			__syncthreads();
		break;
	case 2: /* lanes of a warp in different shuffles */
		if (lane < 16)
			v = __shfl_xor_sync(0xffffffffu, v, 1);
		else
			v = __shfl_xor_sync(0xffffffffu, v, 2);
		break;
	case 3: /* a shuffle waits for a lane that returned */
		if (lane == 5)
			return;
		v = __shfl_xor_sync(0xffffffffu, v, 1);
		break;
	case 4: /* the mask does not name the calling lane */
		v = __shfl_sync(0x0000ffffu, v, 0);
		break;
	case 5: /* one lane at __syncthreads, its warp in a shuffle */
		if (threadIdx.x != 4)
			v = __shfl_xor_sync(0xffffffffu, v, 1);
		__syncthreads();
		break;
	case 6: /* reading a lane outside the mask */
		if (lane < 16)
			v = __shfl_xor_sync(0x0000ffffu, v, 16);
		break;
	}
	(void)v;
}

TEST(cuda_emu, deadlock_and_divergence_fail_the_launch)
{
	for (int mode = 0; mode <= 6; mode++) {
		fprintf(stderr, "    mode %d (an error report is expected):\n",
		        mode);
		KVT_LAUNCH(k_bad, 2, 64, 0, 0, mode);
		cudaError_t e = cudaGetLastError();
		if (e != cudaErrorLaunchFailure)
			th_fail(__FILE__, __LINE__, "mode %d: %s", mode,
			        cudaGetErrorName(e));
		/* sticky, as after a device fault */
		T_EQ(cudaDeviceSynchronize(), cudaErrorLaunchFailure);
		T_EQ(cudaDeviceReset(), cudaSuccess);
	}
	/* the fibers of failed blocks are reused cleanly */
	unsigned *d = dalloc<unsigned>(64 * SH_N);
	KVT_LAUNCH(k_shuffles, 1, 64, 0, 0, d);
	CK(cudaGetLastError());
	T_EQ(download(d, 64 * SH_N)[3], 7u);
}

static __global__ void __launch_bounds__(64) k_bounded(int *p)
{
	p[threadIdx.x] = 1;
}

/* Refused configurations; kvt_emu_threads counts the threads of the
 * launches that ran only. */
TEST(cuda_emu, launch_configuration)
{
	int *d = dalloc<int>(1024);
	uint64_t t0 = kvt_emu_threads();
	KVT_LAUNCH(k_bounded, 1, 64, 0, 0, d);
	CK(cudaGetLastError());
	T_EQ(kvt_emu_threads() - t0, 64u);
	KVT_LAUNCH(k_bounded, 1, 128, 0, 0, d);
	T_EQ(cudaGetLastError(), cudaErrorLaunchOutOfResources);
	T_EQ(kvt_emu_threads() - t0, 64u);
	KVT_LAUNCH(k_bounded, dim3(3, 2), dim3(8, 4), 0, 0, d);
	CK(cudaGetLastError());
	T_EQ(kvt_emu_threads() - t0, 64u + 6 * 32);
	KVT_LAUNCH(k_block_sum, 1, 2048, 0, 0, d, d, d);
	T_EQ(cudaGetLastError(), cudaErrorInvalidConfiguration);
	KVT_LAUNCH(k_block_sum, dim3(1, 70000), 256, 0, 0, d, d, d);
	T_EQ(cudaGetLastError(), cudaErrorInvalidConfiguration);
	KVT_LAUNCH(k_block_sum, 0, 256, 0, 0, d, d, d);
	T_EQ(cudaGetLastError(), cudaErrorInvalidConfiguration);
	KVT_LAUNCH(k_bounded, 1, 64, 0, (cudaStream_t)0x1234, d);
	T_EQ(cudaGetLastError(), cudaErrorInvalidResourceHandle);
	/* configuration errors are not sticky */
	T_EQ(cudaDeviceSynchronize(), cudaSuccess);
	cudaStream_t s;
	CK(cudaStreamCreate(&s));
	KVT_LAUNCH(k_bounded, 1, 32, 0, s, d);
	CK(cudaGetLastError());
	CK(cudaStreamSynchronize(s));
	CK(cudaStreamDestroy(s));
}

TEST(cuda_emu, memory_checks)
{
	char host[64];
	char *d = dalloc<char>(100);
	T_EQ(cudaMemcpy(d, host, 64, cudaMemcpyHostToDevice), cudaSuccess);
	/* a host pointer as the device side, an overrun, a bad free */
	T_EQ(cudaMemcpy(host, host, 64, cudaMemcpyHostToDevice),
	     cudaErrorInvalidValue);
	T_EQ(cudaMemcpy(host, d + 50, 64, cudaMemcpyDeviceToHost),
	     cudaErrorInvalidValue);
	T_EQ(cudaMemset(d + 1, 0, 100), cudaErrorInvalidValue);
	T_EQ(cudaFree(d + 1), cudaErrorInvalidValue);
	T_EQ(cudaGetLastError(), cudaErrorInvalidValue);
	T_EQ(cudaGetLastError(), cudaSuccess);
	/* fresh device memory is 0xff bytes: NaN as floats */
	float *f = dalloc<float>(4);
	T_ASSERT(isnan(download(f, 4)[2]));
	T_EQ(cudaFree(d), cudaSuccess);
	T_EQ(cudaFree(f), cudaSuccess);
}

/* cudaMemcpyDefault tells device from host by the address, as unified
 * addressing does; pinned memory is freed only by cudaFreeHost. */
TEST(cuda_emu, memcpy_default_and_pinned)
{
	char host[64], back[64];
	for (int i = 0; i < 64; i++)
		host[i] = (char)i;
	char *d = dalloc<char>(64), *e = dalloc<char>(64);
	CK(cudaMemcpy(d, host, 64, cudaMemcpyDefault));
	CK(cudaMemcpy(e, d, 64, cudaMemcpyDefault));
	memset(back, 0, sizeof(back));
	CK(cudaMemcpy(back, e, 64, cudaMemcpyDefault));
	T_ASSERT(memcmp(back, host, 64) == 0);
	CK(cudaMemcpy(back, host, 64, cudaMemcpyDefault)); /* host to host */
	/* a device side that starts inside an allocation must fit in it */
	T_EQ(cudaMemcpy(d + 32, host, 64, cudaMemcpyDefault),
	     cudaErrorInvalidValue);
	T_EQ(cudaMemcpy2D(back, 8, e, 16, 12, 2, cudaMemcpyDefault),
	     cudaErrorInvalidPitchValue);
	CK(cudaMemcpy2D(back, 8, e, 16, 8, 4, cudaMemcpyDefault));
	for (int r = 0; r < 4; r++)
		T_ASSERT(memcmp(back + 8 * r, host + 16 * r, 8) == 0);
	/* each side is checked over its own pitch: 8 rows of 8 bytes fill
	 * the 64 device bytes, while the host side spans 8 * 7 + 8 */
	char wide[128];
	memset(wide, 0, sizeof(wide));
	CK(cudaMemcpy2D(wide, 16, e, 8, 8, 8, cudaMemcpyDeviceToHost));
	for (int r = 0; r < 8; r++)
		T_ASSERT(memcmp(wide + 16 * r, host + 8 * r, 8) == 0);
	T_EQ(cudaMemcpy2D(wide, 16, e, 16, 8, 8, cudaMemcpyDeviceToHost),
	     cudaErrorInvalidValue); /* the source runs past the 64 bytes */
	void *p = nullptr;
	CK(cudaMallocHost(&p, 100));
	T_ASSERT(p != nullptr && ((uintptr_t)p & 255) == 0);
	T_EQ(cudaFreeHost(host), cudaErrorInvalidValue);
	T_EQ(cudaFreeHost(d), cudaErrorInvalidValue);
	CK(cudaFreeHost(p));
	T_EQ(cudaFreeHost(p), cudaErrorInvalidValue); /* twice */
	CK(cudaFreeHost(nullptr));
	(void)cudaGetLastError();
	CK(cudaFree(d));
	CK(cudaFree(e));
}

/* kvt_emu_traffic counts host <-> device bytes by direction, from the
 * addresses whatever kind the copy names: device-to-device, host-to-host,
 * memsets, empty and refused copies count nothing; a 2D copy counts its
 * rows' bytes (width x height), not the pitches.  Expected sums by hand. */
TEST(cuda_emu, traffic_counts_host_device_bytes)
{
	char host[256], back[256];
	memset(host, 7, sizeof(host));
	char *d = dalloc<char>(256), *e = dalloc<char>(256);
	void *pin = nullptr;
	CK(cudaMallocHost(&pin, 64));
	cudaStream_t s;
	CK(cudaStreamCreate(&s));
	uint64_t h0 = 1, d0 = 1, h1 = 0, d1 = 0;
	kvt_emu_traffic(&h0, &d0);
	CK(cudaMemcpy(d, host, 100, cudaMemcpyHostToDevice));        /* h 100 */
	CK(cudaMemcpyAsync(e, pin, 64, cudaMemcpyDefault, s));        /* h 64 */
	CK(cudaMemcpy(back, d, 40, cudaMemcpyDeviceToHost));          /* d 40 */
	CK(cudaMemcpy(e, d, 64, cudaMemcpyDeviceToDevice));           /* 0 */
	CK(cudaMemcpyAsync(e + 64, d, 64, cudaMemcpyDefault, s));     /* 0 */
	CK(cudaMemcpy(back, host, 32, cudaMemcpyDefault));            /* 0 */
	CK(cudaMemcpy(back, host, 32, cudaMemcpyHostToHost));         /* 0 */
	CK(cudaMemset(d, 0, 256));                                     /* 0 */
	CK(cudaMemsetAsync(e, 0, 256, s));                             /* 0 */
	CK(cudaMemcpy(d, host, 0, cudaMemcpyHostToDevice));           /* 0 */
	CK(cudaMemcpy2D(back, 8, e, 16, 8, 4, cudaMemcpyDeviceToHost)); /* d 32 */
	CK(cudaMemcpy2DAsync(d, 16, host, 4, 4, 3, cudaMemcpyDefault,
	                     s));                                      /* h 12 */
	/* refused: an overrun, a host pointer as the device side */
	T_EQ(cudaMemcpy(d + 200, host, 100, cudaMemcpyHostToDevice),
	     cudaErrorInvalidValue);
	T_EQ(cudaMemcpy(back, host, 16, cudaMemcpyDeviceToHost),
	     cudaErrorInvalidValue);
	(void)cudaGetLastError();
	kvt_emu_traffic(&h1, nullptr);
	kvt_emu_traffic(nullptr, &d1);
	T_EQ_U64(h1 - h0, 100 + 64 + 12);
	T_EQ_U64(d1 - d0, 40 + 32);
	CK(cudaStreamDestroy(s));
	CK(cudaFreeHost(pin));
	CK(cudaFree(d));
	CK(cudaFree(e));
}

/* Events: complete when never recorded, errors once destroyed; the lag
 * holds recorded events back until later records or a synchronisation;
 * interprocess events need DisableTiming and share their state with the
 * events opened from their handle. */
TEST(cuda_emu, events_and_lag)
{
	cudaStream_t s, t;
	CK(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
	CK(cudaStreamCreateWithFlags(&t, cudaStreamNonBlocking));
	cudaEvent_t a, b, x, y;
	CK(cudaEventCreateWithFlags(&a, cudaEventDisableTiming));
	CK(cudaEventCreateWithFlags(&b, cudaEventDisableTiming));
	CK(cudaEventQuery(a));
	CK(cudaEventSynchronize(a));
	CK(cudaStreamWaitEvent(s, a, 0));

	T_EQ(kvt_emu_set_event_lag(2), 0u);
	CK(cudaEventRecord(a, s));
	T_EQ(cudaEventQuery(a), cudaErrorNotReady);
	T_EQ(cudaGetLastError(), cudaSuccess); /* an answer, not an error */
	CK(cudaEventRecord(b, t));
	T_EQ(cudaEventQuery(a), cudaErrorNotReady);
	CK(cudaEventRecord(b, t));
	CK(cudaEventQuery(a)); /* two records later */
	T_EQ(cudaEventQuery(b), cudaErrorNotReady);
	CK(cudaStreamSynchronize(s)); /* not b's stream */
	T_EQ(cudaEventQuery(b), cudaErrorNotReady);
	CK(cudaStreamSynchronize(t));
	CK(cudaEventQuery(b));
	CK(cudaEventRecord(a, s));
	CK(cudaEventSynchronize(a));
	CK(cudaEventQuery(a));
	CK(cudaEventRecord(a, s));
	CK(cudaDeviceSynchronize());
	CK(cudaEventQuery(a));
	CK(cudaEventRecord(a, s));
	CK(cudaStreamDestroy(s)); /* its work completes */
	CK(cudaEventQuery(a));
	T_EQ(kvt_emu_set_event_lag(0), 2u);

	CK(cudaEventDestroy(a));
	T_EQ(cudaEventQuery(a), cudaErrorInvalidResourceHandle);
	T_EQ(cudaEventSynchronize(a), cudaErrorInvalidResourceHandle);
	T_EQ(cudaEventRecord(a, t), cudaErrorInvalidResourceHandle);
	T_EQ(cudaStreamWaitEvent(t, a, 0), cudaErrorInvalidResourceHandle);
	T_EQ(cudaEventDestroy(a), cudaErrorInvalidResourceHandle);

	cudaIpcEventHandle_t h;
	T_EQ(cudaEventCreateWithFlags(&x, cudaEventInterprocess),
	     cudaErrorInvalidValue);
	T_EQ(cudaIpcGetEventHandle(&h, b), cudaErrorInvalidResourceHandle);
	CK(cudaEventCreateWithFlags(&x, cudaEventInterprocess |
	                                    cudaEventDisableTiming));
	CK(cudaIpcGetEventHandle(&h, x));
	CK(cudaIpcOpenEventHandle(&y, h));
	T_ASSERT(y != x);
	kvt_emu_set_event_lag(1);
	CK(cudaEventRecord(y, t)); /* the opener records, the exporter sees */
	T_EQ(cudaEventQuery(x), cudaErrorNotReady);
	CK(cudaEventSynchronize(x));
	CK(cudaEventQuery(y));
	kvt_emu_set_event_lag(0);
	CK(cudaEventDestroy(x)); /* the opened one lives on */
	CK(cudaEventRecord(y, t));
	CK(cudaEventDestroy(y));
	T_EQ(cudaIpcOpenEventHandle(&y, h), cudaErrorInvalidResourceHandle);
	/* a handle of another process opens a new event, always complete:
	 * the other process's work ran when it recorded (ordering between
	 * processes is not modelled) */
	int pid;
	memcpy(&pid, h.reserved + 8, sizeof(pid));
	pid++;
	memcpy(h.reserved + 8, &pid, sizeof(pid));
	CK(cudaIpcOpenEventHandle(&y, h));
	CK(cudaEventQuery(y));
	CK(cudaStreamWaitEvent(t, y, 0));
	CK(cudaEventDestroy(y));
	CK(cudaEventDestroy(b));
	CK(cudaStreamDestroy(t));
}

/* Legacy IPC memory within one process: the handle names the allocation
 * (any address inside it), opens count, and the exporter cannot free
 * what is still open. */
TEST(cuda_emu, ipc_memory)
{
	char *d = dalloc<char>(1000);
	cudaIpcMemHandle_t h, h2;
	char host[8];
	T_EQ(cudaIpcGetMemHandle(&h, host), cudaErrorInvalidValue);
	CK(cudaIpcGetMemHandle(&h, d + 100));
	void *p = nullptr, *q = nullptr;
	T_EQ(cudaIpcOpenMemHandle(&p, h, 0), cudaErrorInvalidValue);
	CK(cudaIpcOpenMemHandle(&p, h, cudaIpcMemLazyEnablePeerAccess));
	CK(cudaIpcOpenMemHandle(&q, h, cudaIpcMemLazyEnablePeerAccess));
	T_ASSERT(p == (void *)d && q == p);
	T_EQ(cudaFree(d), cudaErrorInvalidValue); /* still open */
	CK(cudaIpcCloseMemHandle(p));
	T_EQ(cudaFree(d), cudaErrorInvalidValue);
	CK(cudaIpcCloseMemHandle(q));
	T_EQ(cudaIpcCloseMemHandle(q), cudaErrorInvalidValue);
	CK(cudaFree(d));
	/* the handle of a freed allocation, even with a new one at its
	 * address, opens nothing */
	char *d2 = dalloc<char>(1000);
	T_EQ(cudaIpcOpenMemHandle(&p, h, cudaIpcMemLazyEnablePeerAccess),
	     cudaErrorInvalidResourceHandle);
	memset(&h2, 0, sizeof(h2));
	T_EQ(cudaIpcOpenMemHandle(&p, h2, cudaIpcMemLazyEnablePeerAccess),
	     cudaErrorInvalidValue);
	(void)cudaGetLastError();
	CK(cudaFree(d2));
}

#ifndef __SANITIZE_ADDRESS__
/* Legacy IPC memory across processes (plain builds: a memfd per
 * allocation): a forked child maps the parent's allocation from its handle
 * through /proc/<pid>/fd, both see each other's writes, the parent cannot
 * free it while the child has it open, and the handle of a freed
 * allocation opens nothing. */
TEST(cuda_emu, ipc_memory_across_processes)
{
	const size_t n = 10000; /* not a whole page */
	char *d = dalloc<char>(n);
	CK(cudaMemset(d, 0x11, n));
	cudaIpcMemHandle_t h;
	CK(cudaIpcGetMemHandle(&h, d + 7));
	int up[2], down[2];
	T_EQ(pipe(up), 0);
	T_EQ(pipe(down), 0);
	pid_t pid = fork();
	T_ASSERT(pid >= 0);
	if (pid == 0) {
		void *p = nullptr, *q = nullptr;
		char c = 0, hb[n];
		int bad = cudaIpcOpenMemHandle(&p, h,
		                               cudaIpcMemLazyEnablePeerAccess) ||
		          cudaIpcOpenMemHandle(&q, h,
		                               cudaIpcMemLazyEnablePeerAccess) ||
		          p != q ||
		          cudaMemcpy(hb, p, n, cudaMemcpyDeviceToHost) ||
		          hb[0] != 0x11 || hb[n - 1] != 0x11 ||
		          cudaMemset(p, 0x22, n) || cudaIpcCloseMemHandle(q);
		/* opened: tell the parent, wait for its go, then close */
		if (write(up[1], bad ? "B" : "G", 1) != 1 ||
		    read(down[0], &c, 1) != 1)
			_exit(2);
		bad |= cudaIpcCloseMemHandle(p) != cudaSuccess;
		bad |= cudaIpcCloseMemHandle(p) == cudaSuccess;
		_exit(bad);
	}
	char c = 0;
	T_EQ(read(up[0], &c, 1), 1);
	T_EQ(c, 'G');
	char hb[n];
	CK(cudaMemcpy(hb, d, n, cudaMemcpyDeviceToHost));
	T_EQ(hb[0], 0x22);
	T_EQ(hb[n - 1], 0x22);
	T_EQ(cudaFree(d), cudaErrorInvalidValue); /* the child has it open */
	(void)cudaGetLastError();
	T_EQ(write(down[1], "x", 1), 1);
	int st = 0;
	T_EQ(waitpid(pid, &st, 0), pid);
	T_ASSERT(WIFEXITED(st));
	T_EQ(WEXITSTATUS(st), 0);
	CK(cudaFree(d));
	/* a freed allocation's handle opens nothing in another process */
	pid = fork();
	T_ASSERT(pid >= 0);
	if (pid == 0) {
		void *p = nullptr;
		_exit(cudaIpcOpenMemHandle(&p, h,
		                           cudaIpcMemLazyEnablePeerAccess) ==
		      cudaErrorInvalidResourceHandle ? 0 : 1);
	}
	T_EQ(waitpid(pid, &st, 0), pid);
	T_ASSERT(WIFEXITED(st));
	T_EQ(WEXITSTATUS(st), 0);
	for (int fd : {up[0], up[1], down[0], down[1]})
		close(fd);
}
#endif

/* ------------------------------------------------------- driver (VMM) */

/* The driver's VMM calls, found as the backend finds them. */
static struct {
	PFN_cuGetErrorString_v6000 errstr;
	PFN_cuDeviceGet_v2000 devget;
	PFN_cuDeviceGetAttribute_v2000 attr;
	PFN_cuMemGetAllocationGranularity_v10020 gran;
	PFN_cuMemCreate_v10020 create;
	PFN_cuMemRelease_v10020 release;
	PFN_cuMemExportToShareableHandle_v10020 exp;
	PFN_cuMemImportFromShareableHandle_v10020 imp;
	PFN_cuMemAddressReserve_v10020 reserve;
	PFN_cuMemAddressFree_v10020 afree;
	PFN_cuMemMap_v10020 map;
	PFN_cuMemUnmap_v10020 unmap;
	PFN_cuMemSetAccess_v10020 access;
} cu;

static void *entry(const char *sym)
{
	void *fn = nullptr;
	cudaDriverEntryPointQueryResult q = cudaDriverEntryPointSymbolNotFound;
	CK(cudaGetDriverEntryPointByVersion(sym, &fn, 12000, cudaEnableDefault,
	                                    &q));
	if (q != cudaDriverEntryPointSuccess || !fn)
		th_fail(__FILE__, __LINE__, "%s not found", sym);
	return fn;
}

static void load_driver(void)
{
#define LOAD(f, sym) cu.f = (decltype(cu.f))entry(sym)
	LOAD(errstr, "cuGetErrorString");
	LOAD(devget, "cuDeviceGet");
	LOAD(attr, "cuDeviceGetAttribute");
	LOAD(gran, "cuMemGetAllocationGranularity");
	LOAD(create, "cuMemCreate");
	LOAD(release, "cuMemRelease");
	LOAD(exp, "cuMemExportToShareableHandle");
	LOAD(imp, "cuMemImportFromShareableHandle");
	LOAD(reserve, "cuMemAddressReserve");
	LOAD(afree, "cuMemAddressFree");
	LOAD(map, "cuMemMap");
	LOAD(unmap, "cuMemUnmap");
	LOAD(access, "cuMemSetAccess");
#undef LOAD
}

#define CU_OK(x) T_EQ((int)(x), (int)CUDA_SUCCESS)
#define CU_ERR(x, e) T_EQ((int)(x), (int)(e))

static CUmemAllocationProp vmm_prop(void)
{
	CUmemAllocationProp p;
	memset(&p, 0, sizeof(p));
	p.type = CU_MEM_ALLOCATION_TYPE_PINNED;
	p.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
	p.location.id = 0;
	p.requestedHandleTypes = CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR;
	return p;
}

static CUresult set_rw(CUdeviceptr p, size_t n, CUmemAccess_flags f)
{
	CUmemAccessDesc d;
	memset(&d, 0, sizeof(d));
	d.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
	d.location.id = 0;
	d.flags = f;
	return cu.access(p, n, &d, 1);
}

static __global__ void k_iota(unsigned *p, unsigned n, unsigned base)
{
	unsigned i = blockIdx.x * blockDim.x + threadIdx.x;
	if (i < n)
		p[i] = base + i;
}

/* The entry points the backend asks for are there, others are not; a
 * version beyond the driver's is refused; kvt_emu_set_driver takes them
 * away and gives them back. */
TEST(cuda_emu, driver_entry_points)
{
	void *fn = (void *)&fn;
	cudaDriverEntryPointQueryResult q = cudaDriverEntryPointSuccess;
	load_driver();
	CK(cudaGetDriverEntryPointByVersion("cuLaunchKernel", &fn, 12000,
	                                    cudaEnableDefault, &q));
	T_ASSERT(fn == nullptr);
	T_EQ(q, cudaDriverEntryPointSymbolNotFound);
	T_EQ(cudaGetDriverEntryPointByVersion("cuMemCreate", &fn, 99000,
	                                      cudaEnableDefault, &q),
	     cudaErrorInvalidValue);
	(void)cudaGetLastError();
	T_EQ(kvt_emu_set_driver(KVT_EMU_DRIVER_NONE), KVT_EMU_DRIVER_VMM);
	CK(cudaGetDriverEntryPointByVersion("cuMemCreate", &fn, 12000,
	                                    cudaEnableDefault, &q));
	T_ASSERT(fn == nullptr);
	T_EQ(q, cudaDriverEntryPointSymbolNotFound);
	T_EQ(kvt_emu_set_driver(KVT_EMU_DRIVER_NO_VMM), KVT_EMU_DRIVER_NONE);
	int v = -1;
	CU_OK(cu.attr(&v, CU_DEVICE_ATTRIBUTE_VIRTUAL_MEMORY_MANAGEMENT_SUPPORTED,
	              0));
	T_EQ(v, 0);
	kvt_emu_set_driver(KVT_EMU_DRIVER_VMM);
	CK(cudaDriverGetVersion(&v));
	T_EQ(v, CUDART_VERSION);
	CK(cudaSetDevice(0));
	CK(cudaFree(nullptr));
}

/*
 * Within one process: device, attributes, granularity; create, reserve,
 * map, access, unmap, free, release, with the arguments the driver
 * refuses; a mapping is device memory for copies, memsets, kernels and
 * cuBLAS only while it is accessible; two mappings of one allocation (one
 * through an exported and imported fd) see the same bytes; the memory
 * lives while a mapping holds it, after cuMemRelease.
 */
TEST(cuda_emu, vmm_in_one_process)
{
	load_driver();
	const size_t G = (size_t)2 << 20;
	CUdevice dev = -1;
	int v = 0;
	const char *str = nullptr;
	CU_OK(cu.devget(&dev, 0));
	T_EQ(dev, 0);
	CU_ERR(cu.devget(&dev, 1), CUDA_ERROR_INVALID_DEVICE);
	CU_OK(cu.attr(&v, CU_DEVICE_ATTRIBUTE_VIRTUAL_MEMORY_MANAGEMENT_SUPPORTED,
	              0));
	T_EQ(v, 1);
	CU_OK(cu.attr(&v,
	              CU_DEVICE_ATTRIBUTE_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR_SUPPORTED,
	              0));
	T_EQ(v, 1);
	CU_ERR(cu.attr(&v, (CUdevice_attribute)1, 0), CUDA_ERROR_INVALID_VALUE);
	CU_OK(cu.errstr(CUDA_ERROR_INVALID_VALUE, &str));
	T_EQ_STR(str, "invalid argument");
	CU_ERR(cu.errstr((CUresult)12345, &str), CUDA_ERROR_INVALID_VALUE);
	T_ASSERT(str == nullptr);

	CUmemAllocationProp prop = vmm_prop(), bad = prop;
	size_t g = 0;
	CU_OK(cu.gran(&g, &prop, CU_MEM_ALLOC_GRANULARITY_MINIMUM));
	T_EQ_U64(g, G);
	CU_OK(cu.gran(&g, &prop, CU_MEM_ALLOC_GRANULARITY_RECOMMENDED));
	T_EQ_U64(g, G);
	bad.location.id = 1;
	CU_ERR(cu.gran(&g, &bad, CU_MEM_ALLOC_GRANULARITY_MINIMUM),
	       CUDA_ERROR_INVALID_DEVICE);

	size_t free0 = 0, free1 = 0, total = 0;
	CK(cudaMemGetInfo(&free0, &total));
	CUmemGenericAllocationHandle h = 0, h2 = 0;
	CU_ERR(cu.create(&h, G + 4096, &prop, 0), CUDA_ERROR_INVALID_VALUE);
	CU_ERR(cu.create(&h, 0, &prop, 0), CUDA_ERROR_INVALID_VALUE);
	CU_ERR(cu.create(&h, G, &prop, 1), CUDA_ERROR_INVALID_VALUE);
	CU_ERR(cu.create(&h, G, &bad, 0), CUDA_ERROR_INVALID_DEVICE);
	CU_OK(cu.create(&h, 2 * G, &prop, 0));
	CK(cudaMemGetInfo(&free1, &total));
	T_EQ_U64(free0 - free1, 2 * G);

	/* export: an fd the caller owns, of a memfd of the size */
	int fd = -1;
	CU_ERR(cu.exp(&fd, h, CU_MEM_HANDLE_TYPE_NONE, 0),
	       CUDA_ERROR_INVALID_VALUE);
	CU_OK(cu.exp(&fd, h, CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR, 0));
	T_ASSERT(fd >= 0);
	struct stat st;
	T_EQ(fstat(fd, &st), 0);
	T_EQ_U64((uint64_t)st.st_size, 2 * G);
	CUmemAllocationProp noexp = prop;
	noexp.requestedHandleTypes = CU_MEM_HANDLE_TYPE_NONE;
	CU_OK(cu.create(&h2, G, &noexp, 0));
	int fd2 = -1;
	CU_ERR(cu.exp(&fd2, h2, CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR, 0),
	       CUDA_ERROR_INVALID_VALUE);
	CU_OK(cu.release(h2));
	CU_ERR(cu.release(h2), CUDA_ERROR_INVALID_VALUE);

	/* reserve: whole granules, aligned */
	CUdeviceptr r = 0, r2 = 0;
	CU_ERR(cu.reserve(&r, G + 1, 0, 0, 0), CUDA_ERROR_INVALID_VALUE);
	CU_ERR(cu.reserve(&r, G, 3 * G, 0, 0), CUDA_ERROR_INVALID_VALUE);
	CU_OK(cu.reserve(&r, 4 * G, 4 * G, 0, 0));
	T_EQ_U64(r % (4 * G), 0);
	CU_OK(cu.reserve(&r2, 2 * G, 0, 0, 0));
	T_EQ_U64(r2 % G, 0);

	/* map: inside one reservation, offset 0, over no other mapping */
	CU_ERR(cu.map(r + 3 * G, 2 * G, 0, h, 0), CUDA_ERROR_INVALID_VALUE);
	CU_ERR(cu.map(r + 4096, 2 * G, 0, h, 0), CUDA_ERROR_INVALID_VALUE);
	CU_ERR(cu.map(r, 2 * G, G, h, 0), CUDA_ERROR_INVALID_VALUE);
	CU_ERR(cu.map(r, 4 * G, 0, h, 0), CUDA_ERROR_INVALID_VALUE);
	CU_ERR(cu.map(r, 2 * G, 0, h + 99, 0), CUDA_ERROR_INVALID_VALUE);
	CU_OK(cu.map(r, 2 * G, 0, h, 0));
	CU_ERR(cu.map(r + G, 2 * G, 0, h, 0), CUDA_ERROR_INVALID_VALUE);
	CU_ERR(cu.map(r, 2 * G, 0, h, 0), CUDA_ERROR_INVALID_VALUE);

	/* not device memory until access is set; then it is, and holds the
	 * garbage (0xff) new device memory holds */
	unsigned *d = (unsigned *)(uintptr_t)r;
	const unsigned n = (unsigned)(2 * G / 4);
	std::vector<unsigned> hv(n);
	T_EQ(cudaMemset(d, 0, 64), cudaErrorInvalidValue);
	(void)cudaGetLastError();
	CU_ERR(set_rw(r, G, CU_MEM_ACCESS_FLAGS_PROT_READWRITE),
	       CUDA_ERROR_INVALID_VALUE); /* part of a mapping */
	CU_ERR(set_rw(r + 2 * G, 2 * G, CU_MEM_ACCESS_FLAGS_PROT_READWRITE),
	       CUDA_ERROR_INVALID_VALUE); /* nothing mapped */
	CU_OK(set_rw(r, 2 * G, CU_MEM_ACCESS_FLAGS_PROT_READWRITE));
	hv = download(d, n);
	T_EQ(hv[0], 0xffffffffu);
	T_EQ(hv[n - 1], 0xffffffffu);
	KVT_LAUNCH(k_iota, (n + 255) / 256, 256, 0, 0, d, n, 7u);
	CK(cudaGetLastError());
	hv = download(d, n);
	for (unsigned i = 0; i < n; i += 4099)
		T_EQ(hv[i], 7u + i);
	T_EQ(hv[n - 1], 7u + n - 1);
	T_EQ(cudaMemcpy(hv.data(), d, 2 * G + 4, cudaMemcpyDeviceToHost),
	     cudaErrorInvalidValue); /* beyond the mapping */
	(void)cudaGetLastError();
	/* a mapping is no cudaMalloc allocation */
	cudaIpcMemHandle_t ih;
	T_EQ(cudaFree(d), cudaErrorInvalidValue);
	T_EQ(cudaIpcGetMemHandle(&ih, d), cudaErrorInvalidValue);
	(void)cudaGetLastError();

	/* import the fd (the caller keeps it), map it too: same bytes */
	CUmemGenericAllocationHandle hi = 0;
	CU_ERR(cu.imp(&hi, (void *)(uintptr_t)fd, CU_MEM_HANDLE_TYPE_NONE),
	       CUDA_ERROR_INVALID_VALUE);
	int nul = open("/dev/null", O_RDONLY);
	CU_ERR(cu.imp(&hi, (void *)(uintptr_t)nul,
	              CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR),
	       CUDA_ERROR_INVALID_VALUE);
	close(nul);
	CU_ERR(cu.imp(&hi, (void *)(uintptr_t)9999,
	              CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR),
	       CUDA_ERROR_INVALID_VALUE);
	CU_OK(cu.imp(&hi, (void *)(uintptr_t)fd,
	             CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR));
	T_EQ(fcntl(fd, F_GETFD), 0); /* still open, still the caller's */
	close(fd);
	CUdeviceptr r3 = 0;
	CU_OK(cu.reserve(&r3, 2 * G, 0, 0, 0));
	CU_OK(cu.map(r3, 2 * G, 0, hi, 0));
	CU_OK(set_rw(r3, 2 * G, CU_MEM_ACCESS_FLAGS_PROT_READ));
	std::vector<unsigned> h3 = download((unsigned *)(uintptr_t)r3, n);
	T_ASSERT(h3 == hv);
	CK(cudaMemGetInfo(&free1, &total));
	T_EQ_U64(free0 - free1, 2 * G); /* one allocation, mapped twice */

	/* released: the mappings keep the memory */
	CU_OK(cu.release(h));
	CU_OK(cu.release(hi));
	CK(cudaMemset(d, 0x11, 4));
	h3 = download((unsigned *)(uintptr_t)r3, 1);
	T_EQ(h3[0], 0x11111111u);

	/* access back to none: no device memory any more */
	CU_OK(set_rw(r3, 2 * G, CU_MEM_ACCESS_FLAGS_PROT_NONE));
	T_EQ(cudaMemcpy(hv.data(), (void *)(uintptr_t)r3, 4,
	                cudaMemcpyDeviceToHost),
	     cudaErrorInvalidValue);
	(void)cudaGetLastError();

	/* unmap whole mappings only; free reservations once unmapped */
	CU_ERR(cu.afree(r, 4 * G), CUDA_ERROR_INVALID_VALUE);
	CU_ERR(cu.unmap(r, G), CUDA_ERROR_INVALID_VALUE);
	CU_ERR(cu.unmap(r, 4 * G), CUDA_ERROR_INVALID_VALUE);
	CU_OK(cu.unmap(r, 2 * G));
	CU_ERR(cu.unmap(r, 2 * G), CUDA_ERROR_INVALID_VALUE);
	T_EQ(cudaMemset(d, 0, 4), cudaErrorInvalidValue);
	(void)cudaGetLastError();
	CK(cudaMemGetInfo(&free1, &total));
	T_EQ_U64(free0 - free1, 2 * G); /* r3 still maps it */
	CU_OK(cu.unmap(r3, 2 * G));
	CK(cudaMemGetInfo(&free1, &total));
	T_EQ_U64(free1, free0);
	CU_ERR(cu.afree(r, 2 * G), CUDA_ERROR_INVALID_VALUE); /* size */
	CU_OK(cu.afree(r, 4 * G));
	CU_ERR(cu.afree(r, 4 * G), CUDA_ERROR_INVALID_VALUE);
	CU_OK(cu.afree(r2, 2 * G));
	CU_OK(cu.afree(r3, 2 * G));
}

/*
 * A read-only mapping (cuMemSetAccess PROT_READ), as the client maps the
 * daemon's device table: copies from it work and see the writes made
 * through a read-write mapping of the same allocation; a copy or memset
 * into it fails, each with the sticky cudaErrorIllegalAddress of the
 * device's fault (cudaDeviceReset clears it), and leaves the bytes as
 * they were.  Back to read-write, it takes writes again.
 */
TEST(cuda_emu, vmm_read_only_mapping)
{
	load_driver();
	const size_t G = (size_t)2 << 20;
	CUmemAllocationProp prop = vmm_prop();
	CUmemGenericAllocationHandle h;
	CUdeviceptr rw = 0, ro = 0;
	CU_OK(cu.create(&h, G, &prop, 0));
	CU_OK(cu.reserve(&rw, G, 0, 0, 0));
	CU_OK(cu.reserve(&ro, G, 0, 0, 0));
	CU_OK(cu.map(rw, G, 0, h, 0));
	CU_OK(cu.map(ro, G, 0, h, 0));
	CU_OK(cu.release(h));
	CU_OK(set_rw(rw, G, CU_MEM_ACCESS_FLAGS_PROT_READWRITE));
	CU_OK(set_rw(ro, G, CU_MEM_ACCESS_FLAGS_PROT_READ));
	unsigned *dw = (unsigned *)(uintptr_t)rw, *dr = (unsigned *)(uintptr_t)ro;
	CK(cudaMemset(dw, 0x3c, G));
	T_EQ(download(dr, 4)[3], 0x3c3c3c3cu);

	const unsigned junk[4] = {1, 2, 3, 4};
	T_EQ(cudaMemcpy(dr + 8, junk, sizeof(junk), cudaMemcpyHostToDevice),
	     cudaErrorIllegalAddress);
	T_EQ(cudaDeviceSynchronize(), cudaErrorIllegalAddress); /* sticky */
	T_EQ(cudaDeviceReset(), cudaSuccess);
	T_EQ(cudaMemcpy(dr, dw + 16, 64, cudaMemcpyDefault),
	     cudaErrorIllegalAddress); /* device to device, told by address */
	T_EQ(cudaDeviceReset(), cudaSuccess);
	cudaStream_t s;
	CK(cudaStreamCreate(&s));
	T_EQ(cudaMemsetAsync(dr, 0, 4, s), cudaErrorIllegalAddress);
	T_EQ(cudaDeviceReset(), cudaSuccess);
	CK(cudaStreamDestroy(s));
	std::vector<unsigned> b = download(dr, 16);
	for (unsigned i = 0; i < 16; i++)
		T_EQ(b[i], 0x3c3c3c3cu);

	CU_OK(set_rw(ro, G, CU_MEM_ACCESS_FLAGS_PROT_READWRITE));
	CK(cudaMemcpy(dr + 8, junk, sizeof(junk), cudaMemcpyHostToDevice));
	T_EQ(download(dw, 12)[11], 4u);
	CU_OK(cu.unmap(rw, G));
	CU_OK(cu.unmap(ro, G));
	CU_OK(cu.afree(rw, G));
	CU_OK(cu.afree(ro, G));
}

/* The importer: maps the fd it was sent, checks the exporter's pattern,
 * writes its own, unmaps. */
static int vmm_child(int sock, size_t bytes)
{
	struct handle_ext x;
	int fd = -1;
	if (handle_recv_ext(sock, &x, &fd, 10000) ||
	    x.h.type != HANDLE_CHUNK_DEV)
		return 1;
	CUmemGenericAllocationHandle h;
	CUdeviceptr r;
	if (fd < 0 || cu.imp(&h, (void *)(uintptr_t)fd,
	                     CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR))
		return 1;
	close(fd);
	if (cu.reserve(&r, bytes, 0, 0, 0) || cu.map(r, bytes, 0, h, 0) ||
	    cu.release(h) ||
	    set_rw(r, bytes, CU_MEM_ACCESS_FLAGS_PROT_READWRITE))
		return 2;
	std::vector<unsigned char> b(bytes);
	if (cudaMemcpy(b.data(), (void *)(uintptr_t)r, bytes,
	               cudaMemcpyDeviceToHost) != cudaSuccess)
		return 3;
	for (size_t i = 0; i < bytes; i++)
		if (b[i] != 0x5a)
			return 4;
	if (cudaMemset((void *)(uintptr_t)r, 0xa5, bytes) != cudaSuccess ||
	    cu.unmap(r, bytes) || cu.afree(r, bytes))
		return 5;
	return 0;
}

/* Across processes, the fd passed over SCM_RIGHTS: the child maps the
 * parent's allocation and both see each other's writes; the parent has
 * released its handle and unmapped before the child maps (the child's
 * fd holds the memory meanwhile, like the driver's shareable handle). */
TEST(cuda_emu, vmm_across_processes)
{
	load_driver();
	const size_t G = (size_t)2 << 20;
	int sv[2];
	/* the handle channel's socket type and packet (ipc/handle.h) */
	T_EQ(socketpair(AF_UNIX, SOCK_SEQPACKET, 0, sv), 0);
	pid_t pid = fork();
	T_ASSERT(pid >= 0);
	if (pid == 0) {
		close(sv[0]);
		_exit(vmm_child(sv[1], G));
	}
	close(sv[1]);
	CUmemAllocationProp prop = vmm_prop();
	CUmemGenericAllocationHandle h;
	CUdeviceptr r;
	int fd = -1;
	CU_OK(cu.create(&h, G, &prop, 0));
	CU_OK(cu.exp(&fd, h, CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR, 0));
	CU_OK(cu.reserve(&r, G, 0, 0, 0));
	CU_OK(cu.map(r, G, 0, h, 0));
	CU_OK(set_rw(r, G, CU_MEM_ACCESS_FLAGS_PROT_READWRITE));
	CK(cudaMemset((void *)(uintptr_t)r, 0x5a, G));
	struct handle_ext x;
	memset(&x, 0, sizeof(x));
	x.h.magic = HANDLE_MAGIC;
	x.h.type = HANDLE_CHUNK_DEV;
	x.h.size = G;
	T_OK(handle_send_ext(sv[0], &x, fd));
	int st = 0;
	T_EQ(waitpid(pid, &st, 0), pid);
	T_ASSERT(WIFEXITED(st));
	T_EQ(WEXITSTATUS(st), 0);
	std::vector<unsigned char> b = download((unsigned char *)(uintptr_t)r, G);
	for (size_t i = 0; i < G; i += 4093)
		T_EQ(b[i], 0xa5);
	T_EQ(b[G - 1], 0xa5);
	close(fd);
	CU_OK(cu.unmap(r, G));
	CU_OK(cu.afree(r, G));
	CU_OK(cu.release(h));
	close(sv[0]);
}

/* ---------------------------------------------------------- half types */

/* The emulator converts as the device does, which is dtype.c's rounding
 * for every non-NaN float (the exhaustive check over all 2^32 inputs was
 * made once against the toolkit's own conversions; here a sample and the
 * edges).  NaNs: the device gives the canonical 0x7fff, and the kernels'
 * common_from_f then gives the CPU's bits. */
TEST(cuda_emu, half_conversions)
{
	/* every top half with the low halves around the rounding points of
	 * bf16 (bit 15) and f16 (bit 12, and bit 13 for the tie's parity),
	 * then random floats */
	static const uint32_t LOW[] = {0,      1,      0x0fff, 0x1000, 0x1001,
	                               0x2000, 0x2fff, 0x3000, 0x3001, 0x7fff,
	                               0x8000, 0x8001, 0xa000, 0xb000, 0xffff};
	const uint32_t n_edge = 65536 * 15;
	uint64_t x = 0x2545f4914f6cdd1dull;
	for (uint32_t i = 0; i < n_edge + (1u << 22); i++) {
		uint32_t u;
		if (i < n_edge) {
			u = (i / 15) << 16 | LOW[i % 15];
		} else {
			x ^= x << 13;
			x ^= x >> 7;
			x ^= x << 17;
			u = (uint32_t)x;
		}
		float f;
		memcpy(&f, &u, 4);
		uint16_t c16, cbf;
		dtype_from_f32(&f, KVT_DTYPE_F16, &c16, 1);
		dtype_from_f32(&f, KVT_DTYPE_BF16, &cbf, 1);
		uint16_t e16 = __half_as_ushort(__float2half_rn(f));
		uint16_t ebf = __bfloat16_as_ushort(__float2bfloat16_rn(f));
		uint16_t k16 = __half_as_ushort(common_from_f<f16_t>(f));
		uint16_t kbf = __bfloat16_as_ushort(common_from_f<bf16_t>(f));
		if (isnan(f)) {
			T_EQ(e16, 0x7fff);
			T_EQ(ebf, 0x7fff);
		} else if (e16 != c16 || ebf != cbf) {
			th_fail(__FILE__, __LINE__,
			        "%#010x: f16 %#06x (cpu %#06x), bf16 %#06x (cpu "
			        "%#06x)",
			        u, e16, c16, ebf, cbf);
		}
		if (k16 != c16 || kbf != cbf)
			th_fail(__FILE__, __LINE__,
			        "common_from_f(%#010x): f16 %#06x (cpu %#06x), "
			        "bf16 %#06x (cpu %#06x)",
			        u, k16, c16, kbf, cbf);
	}
	for (uint32_t h = 0; h < 65536; h++) {
		uint16_t h16 = (uint16_t)h;
		float c, e = __half2float(__ushort_as_half(h16));
		dtype_to_f32(&h16, KVT_DTYPE_F16, &c, 1);
		T_ASSERT(isnan(c) ? isnan(e) : memcmp(&c, &e, 4) == 0);
	}
}

/* --------------------------------------------------------------- cuBLAS */

/* C = alpha op(A) op(B) + beta C against the column-major definition, for
 * each transpose, with leading dimensions larger than the rows. */
TEST(cuda_emu, cublas_sgemm)
{
	const int m = 5, n = 3, k = 7, ld = 9;
	cublasHandle_t h;
	T_EQ(cublasCreate(&h), CUBLAS_STATUS_SUCCESS);
	std::vector<float> A(ld * 9), B(ld * 9), C(ld * n);
	for (size_t i = 0; i < A.size(); i++) {
		A[i] = (float)((i * 37) % 17) / 8.0f - 1.0f;
		B[i] = (float)((i * 11) % 13) / 6.0f - 1.0f;
	}
	for (size_t i = 0; i < C.size(); i++)
		C[i] = (float)i / 10.0f;
	float *dA = dalloc<float>(A.size()), *dB = dalloc<float>(B.size());
	float *dC = dalloc<float>(C.size());
	CK(cudaMemcpy(dA, A.data(), A.size() * 4, cudaMemcpyHostToDevice));
	CK(cudaMemcpy(dB, B.data(), B.size() * 4, cudaMemcpyHostToDevice));
	for (int ta = 0; ta < 2; ta++)
		for (int tb = 0; tb < 2; tb++)
			for (int zb = 0; zb < 2; zb++) {
				const float al = 1.5f, be = zb ? 0.0f : 0.25f;
				if (zb) /* beta 0: C is not read, NaN or not */
					CK(cudaMemset(dC, 0xff, C.size() * 4));
				else
					CK(cudaMemcpy(dC, C.data(), C.size() * 4,
					              cudaMemcpyHostToDevice));
				T_EQ(cublasSgemm(h, (cublasOperation_t)ta,
				                 (cublasOperation_t)tb, m, n, k, &al,
				                 dA, ld, dB, ld, &be, dC, ld),
				     CUBLAS_STATUS_SUCCESS);
				std::vector<float> g = download(dC, C.size());
				for (int c = 0; c < n; c++)
					for (int r = 0; r < m; r++) {
						double s = 0;
						for (int i = 0; i < k; i++)
							s += (double)(ta ? A[r * ld + i]
							                 : A[i * ld + r]) *
							     (tb ? B[i * ld + c]
							         : B[c * ld + i]);
						double want = al * s +
						              (zb ? 0.0 : be * C[c * ld + r]);
						if (fabs(g[c * ld + r] - want) > 1e-5)
							th_fail(__FILE__, __LINE__,
							        "op %d%d beta %g C[%d][%d]: "
							        "%g, expected %g",
							        ta, tb, be, r, c,
							        g[c * ld + r], want);
					}
			}
	/* arguments cuBLAS refuses, and host memory */
	const float one = 1.0f, zero = 0.0f;
	T_EQ(cublasSgemm(h, CUBLAS_OP_N, CUBLAS_OP_N, m, n, k, &one, dA, m - 1,
	                 dB, ld, &zero, dC, ld),
	     CUBLAS_STATUS_INVALID_VALUE);
	T_EQ(cublasSgemm(h, CUBLAS_OP_N, CUBLAS_OP_N, m, n, k, &one, A.data(), ld,
	                 dB, ld, &zero, dC, ld),
	     CUBLAS_STATUS_EXECUTION_FAILED);
	/* TF32 keeps 10 mantissa bits: 1 + 2^-20 becomes 1 */
	float a1 = 1.0f + ldexpf(1.0f, -20), b1 = 1.0f, c1;
	float *da = dalloc<float>(1), *db = dalloc<float>(1), *dc = dalloc<float>(1);
	CK(cudaMemcpy(da, &a1, 4, cudaMemcpyHostToDevice));
	CK(cudaMemcpy(db, &b1, 4, cudaMemcpyHostToDevice));
	T_EQ(cublasSgemm(h, CUBLAS_OP_N, CUBLAS_OP_N, 1, 1, 1, &one, da, 1, db, 1,
	                 &zero, dc, 1),
	     CUBLAS_STATUS_SUCCESS);
	CK(cudaMemcpy(&c1, dc, 4, cudaMemcpyDeviceToHost));
	T_ASSERT(c1 == a1);
	T_EQ(cublasSetMathMode(h, CUBLAS_TF32_TENSOR_OP_MATH),
	     CUBLAS_STATUS_SUCCESS);
	T_EQ(cublasSgemm(h, CUBLAS_OP_N, CUBLAS_OP_N, 1, 1, 1, &one, da, 1, db, 1,
	                 &zero, dc, 1),
	     CUBLAS_STATUS_SUCCESS);
	CK(cudaMemcpy(&c1, dc, 4, cudaMemcpyDeviceToHost));
	T_ASSERT(c1 == 1.0f);
	T_EQ(cublasDestroy(h), CUBLAS_STATUS_SUCCESS);
}

/* The grouped call: each problem's C the bits of the cublasSgemm of its
 * group's arguments, in one counted launch; refused arguments (cuBLAS's
 * documented list), pointer arrays in host memory and a matrix in host
 * memory write no C at all. */
TEST(cuda_emu, cublas_sgemm_grouped)
{
	enum { P = 3, CN = 64 }; /* problems; floats of each C */
	cublasHandle_t h;
	T_EQ(cublasCreate(&h), CUBLAS_STATUS_SUCCESS);
	/* group 0: two 3 x 2 products of k 5 (A transposed); group 1: one
	 * 4 x 1 of k 2 with alpha 2, beta 0.5 */
	cublasOperation_t ta[2] = {CUBLAS_OP_T, CUBLAS_OP_N};
	cublasOperation_t tb[2] = {CUBLAS_OP_N, CUBLAS_OP_N};
	int m[2] = {3, 4}, n[2] = {2, 1}, k[2] = {5, 2}, lda[2] = {5, 4};
	int ldb[2] = {5, 2}, ldc[2] = {3, 4}, size[2] = {2, 1};
	float al[2] = {1.0f, 2.0f}, be[2] = {0.0f, 0.5f};
	std::vector<float> AB(P * 2 * CN);
	for (size_t i = 0; i < AB.size(); i++)
		AB[i] = (float)((i * 29) % 23) / 7.0f - 1.5f;
	float *dAB = dalloc<float>(AB.size()), *dC = dalloc<float>(P * CN);
	float *dW = dalloc<float>(P * CN);
	CK(cudaMemcpy(dAB, AB.data(), AB.size() * 4, cudaMemcpyHostToDevice));
	const float *hA[P], *hB[P];
	float *hC[P];
	for (int i = 0; i < P; i++) {
		hA[i] = dAB + 2 * i * CN;
		hB[i] = dAB + (2 * i + 1) * CN;
		hC[i] = dC + i * CN;
	}
	const float **dA = dalloc<const float *>(P), **dB = dalloc<const float *>(P);
	float **dCp = dalloc<float *>(P);
	CK(cudaMemcpy(dA, hA, sizeof(hA), cudaMemcpyHostToDevice));
	CK(cudaMemcpy(dB, hB, sizeof(hB), cudaMemcpyHostToDevice));
	CK(cudaMemcpy(dCp, hC, sizeof(hC), cudaMemcpyHostToDevice));
	std::vector<float> c0(P * CN);
	for (size_t i = 0; i < c0.size(); i++)
		c0[i] = (float)i / 16.0f;
	/* the expected bits: the same problems one cublasSgemm each */
	CK(cudaMemcpy(dW, c0.data(), c0.size() * 4, cudaMemcpyHostToDevice));
	for (int i = 0, g = 0; i < P; i++, g = i < size[0] ? 0 : 1)
		T_EQ(cublasSgemm(h, ta[g], tb[g], m[g], n[g], k[g], &al[g], hA[i],
		                 lda[g], hB[i], ldb[g], &be[g], dW + i * CN,
		                 ldc[g]),
		     CUBLAS_STATUS_SUCCESS);
	std::vector<float> want = download(dW, P * CN);
	CK(cudaMemcpy(dC, c0.data(), c0.size() * 4, cudaMemcpyHostToDevice));
	uint64_t l0 = kvt_emu_launches();
	T_EQ(cublasSgemmGroupedBatched(h, ta, tb, m, n, k, al, dA, lda, dB, ldb,
	                               be, dCp, ldc, 2, size),
	     CUBLAS_STATUS_SUCCESS);
	T_EQ(kvt_emu_launches() - l0, 1);
	T_ASSERT(download(dC, P * CN) == want);
	T_EQ(cublasSgemmGroupedBatched(h, ta, tb, m, n, k, al, dA, lda, dB, ldb,
	                               be, dCp, ldc, 0, size),
	     CUBLAS_STATUS_SUCCESS);
	/* refusals: C keeps c0, group 0's problems included */
	CK(cudaMemcpy(dC, c0.data(), c0.size() * 4, cudaMemcpyHostToDevice));
	T_EQ(cublasSgemmGroupedBatched(h, ta, tb, m, n, k, al, dA, lda, dB, ldb,
	                               be, dCp, NULL, 2, size),
	     CUBLAS_STATUS_INVALID_VALUE);
	T_EQ(cublasSgemmGroupedBatched(h, ta, tb, m, n, k, al, dA, lda, dB, ldb,
	                               be, dCp, ldc, -1, size),
	     CUBLAS_STATUS_INVALID_VALUE);
	int bad[2];
	for (int c = 0; c < 5; c++) {
		int *arr = c == 0 ? size : c == 1 ? lda : c == 2 ? ldb
		           : c == 3 ? ldc : k;
		memcpy(bad, arr, sizeof(bad));
		/* group 1: negative size, lda < m (A as is), ldb < k,
		 * ldc < m, k < 0 */
		arr[1] = c == 0 ? -1 : c == 1 ? 3 : c == 2 ? 1 : c == 3 ? 3 : -1;
		T_EQ(cublasSgemmGroupedBatched(h, ta, tb, m, n, k, al, dA, lda,
		                               dB, ldb, be, dCp, ldc, 2, size),
		     CUBLAS_STATUS_INVALID_VALUE);
		memcpy(arr, bad, sizeof(bad));
	}
	tb[1] = (cublasOperation_t)7;
	T_EQ(cublasSgemmGroupedBatched(h, ta, tb, m, n, k, al, dA, lda, dB, ldb,
	                               be, dCp, ldc, 2, size),
	     CUBLAS_STATUS_INVALID_VALUE);
	tb[1] = CUBLAS_OP_N;
	/* host pointer arrays, and a host matrix in the last problem */
	T_EQ(cublasSgemmGroupedBatched(h, ta, tb, m, n, k, al, hA, lda, dB, ldb,
	                               be, dCp, ldc, 2, size),
	     CUBLAS_STATUS_EXECUTION_FAILED);
	const float *hostB = AB.data();
	CK(cudaMemcpy(dB + 2, &hostB, sizeof(hostB), cudaMemcpyHostToDevice));
	T_EQ(cublasSgemmGroupedBatched(h, ta, tb, m, n, k, al, dA, lda, dB, ldb,
	                               be, dCp, ldc, 2, size),
	     CUBLAS_STATUS_EXECUTION_FAILED);
	T_ASSERT(download(dC, P * CN) == c0);
	T_EQ(cublasDestroy(h), CUBLAS_STATUS_SUCCESS);
}

/* What wrap.awk would emit for this file. */
KVT_EMU_BOUNDS("tests/kernels/emu/test_emu.cc", k_bounded, 64);
