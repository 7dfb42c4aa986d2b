/*
 * vector_types.h — stand-in for the CUDA toolkit's vector types in the CPU
 * emulation of the kernels (tests/kernels/emu/, docs/cuda.md "CPU emulation
 * of the kernels").  Same names, members and alignment as the toolkit's, so
 * a kernel that reads a 16-byte row as uint4 sees the same layout, and an
 * unaligned uint4 access is as wrong here as on the device (UBSan's
 * alignment check reports it).  Valid C and C++: the C test includes it
 * through cuda_runtime_api.h.
 */
#ifndef KVT_EMU_VECTOR_TYPES_H
#define KVT_EMU_VECTOR_TYPES_H

#define KVT_EMU_VEC2(T, name, al)                                              \
	typedef struct __attribute__((aligned(al))) name {                     \
		T x, y;                                                        \
	} name
#define KVT_EMU_VEC3(T, name)                                                  \
	typedef struct name {                                                  \
		T x, y, z;                                                     \
	} name
#define KVT_EMU_VEC4(T, name, al)                                              \
	typedef struct __attribute__((aligned(al))) name {                     \
		T x, y, z, w;                                                  \
	} name

KVT_EMU_VEC2(int, int2, 8);
KVT_EMU_VEC2(unsigned int, uint2, 8);
KVT_EMU_VEC2(float, float2, 8);
KVT_EMU_VEC2(unsigned short, ushort2, 4);
KVT_EMU_VEC3(int, int3);
KVT_EMU_VEC3(unsigned int, uint3);
KVT_EMU_VEC3(float, float3);
KVT_EMU_VEC4(int, int4, 16);
KVT_EMU_VEC4(unsigned int, uint4, 16);
KVT_EMU_VEC4(float, float4, 16);

#undef KVT_EMU_VEC2
#undef KVT_EMU_VEC3
#undef KVT_EMU_VEC4

/* Launch dimensions; unset members are 1, as in CUDA. */
#ifdef __cplusplus
struct dim3 {
	unsigned int x, y, z;
	constexpr dim3(unsigned int vx = 1, unsigned int vy = 1,
	               unsigned int vz = 1)
		: x(vx), y(vy), z(vz)
	{
	}
	constexpr dim3(uint3 v) : x(v.x), y(v.y), z(v.z) {}
	constexpr operator uint3() const { return uint3{x, y, z}; }
};
#else
typedef struct dim3 {
	unsigned int x, y, z;
} dim3;
#endif

static inline int2 make_int2(int x, int y)
{
	int2 r = {x, y};
	return r;
}
static inline uint2 make_uint2(unsigned int x, unsigned int y)
{
	uint2 r = {x, y};
	return r;
}
static inline float2 make_float2(float x, float y)
{
	float2 r = {x, y};
	return r;
}
static inline uint3 make_uint3(unsigned int x, unsigned int y, unsigned int z)
{
	uint3 r = {x, y, z};
	return r;
}
static inline int4 make_int4(int x, int y, int z, int w)
{
	int4 r = {x, y, z, w};
	return r;
}
static inline uint4 make_uint4(unsigned int x, unsigned int y, unsigned int z,
                               unsigned int w)
{
	uint4 r = {x, y, z, w};
	return r;
}
static inline float4 make_float4(float x, float y, float z, float w)
{
	float4 r = {x, y, z, w};
	return r;
}

#endif
