/*
 * driver.cc — the CUDA driver's virtual memory management calls in the CPU
 * emulator (docs/cuda.md, "CPU emulation of the kernels"), which
 * cudaGetDriverEntryPointByVersion (runtime.cc) hands out under their
 * driver names, with the PFN_* types of include/cudaTypedefs.h: what
 * backend/cuda/ needs for its vmm mode.
 *
 *   cuMemCreate               a memfd of the size (MFD_CLOEXEC), filled
 *                             with 0xff bytes like cudaMalloc's memory
 *   cuMemExportToShareableHandle(POSIX_FILE_DESCRIPTOR)
 *                             a dup of that memfd, which the caller owns
 *                             (not close-on-exec, as the driver's)
 *   cuMemImportFromShareableHandle
 *                             a new handle holding its own dup of the fd
 *                             (the caller keeps its fd), or, for memory
 *                             this process holds already, a handle to
 *                             that same memory; only fds that
 *                             cuMemExportToShareableHandle made, in this
 *                             process or another (SCM_RIGHTS), import
 *   cuMemAddressReserve       a PROT_NONE anonymous mapping, aligned
 *   cuMemMap                  mmap(MAP_FIXED | MAP_SHARED) of the memfd
 *                             into a reservation, PROT_NONE: inaccessible
 *                             until cuMemSetAccess
 *   cuMemSetAccess            mprotect; READ or READWRITE records the
 *                             mapping as device memory (runtime.cc's
 *                             checks of copies, memsets and cuBLAS accept
 *                             it), PROT_NONE forgets it again; through a
 *                             READ mapping a copy or memset fails with
 *                             the sticky cudaErrorIllegalAddress of the
 *                             device's fault, and a kernel's store dies
 *                             of SIGSEGV, the kernel named (fiber.cc)
 *   cuMemUnmap                back to the PROT_NONE reservation
 *   cuMemAddressFree          munmap of the reservation
 *   cuMemRelease              drops the handle; a mapping holds the
 *                             memory (its own reference to the memfd)
 *                             until cuMemUnmap, like the driver's count
 *
 * The granularity is 2 MiB, the device (0) reports VMM and POSIX-fd
 * support, and arguments are checked as the driver documents: sizes and
 * addresses in whole granules, a mapping at offset 0 inside one
 * reservation and over no other mapping, unmapping and access changes
 * over whole mappings (a range the driver would accept too, but narrower
 * than what it allows), a reservation freed only once nothing is mapped in
 * it.  Errors are explained on stderr, as the runtime's are.
 *
 * kvt_emu_set_driver (emulator only) takes the driver API away (no entry
 * point found, as before the VMM calls were emulated) or leaves the
 * calls but makes the device report no VMM support: the backend's
 * fallbacks to legacy IPC stay testable.
 */
#include <errno.h>
#include <fcntl.h>
#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <map>
#include <memory>

#include "cudaTypedefs.h"
#include "emu.h"
#include "internal.h"

static CUresult CUDAAPI emu_cuGetErrorString(CUresult r, const char **s);

namespace kvt_emu {

namespace {

const size_t GRAN = (size_t)2 << 20;
const char MEMFD_PREFIX[] = "kvtemu-vmm-";

void forget(ino_t ino);

/* The memory of one cuMemCreate, in this process (created or imported):
 * held by its handle and by every mapping of it. */
struct phys {
	int fd;
	size_t bytes;
	bool counted; /* created here: in cudaMemGetInfo */
	ino_t ino;    /* of the memfd: an import here finds this one */
	phys(int f, size_t n, bool c) : fd(f), bytes(n), counted(c), ino(0)
	{
		struct stat st;
		if (fstat(f, &st) == 0)
			ino = st.st_ino;
	}
	phys(const phys &) = delete;
	phys &operator=(const phys &) = delete;
	~phys()
	{
		close(fd);
		forget(ino);
		if (counted)
			add_device_bytes(-(long long)bytes);
	}
};

struct handle_rec {
	std::shared_ptr<phys> ph;
	bool exportable; /* POSIX_FILE_DESCRIPTOR requested, or imported */
};

struct mapping {
	size_t bytes;
	std::shared_ptr<phys> ph;
	int access; /* CUmemAccess_flags */
};

std::map<CUmemGenericAllocationHandle, handle_rec> handles;
/* memfd inode -> its memory in this process, while a handle or mapping
 * holds it: importing an fd of memory this process already has gives a
 * handle to the same memory (counted once), as the driver does. */
std::map<ino_t, std::weak_ptr<phys>> live;
CUmemGenericAllocationHandle next_handle = 0x1000;
std::map<uintptr_t, size_t> reservations; /* base -> bytes */
std::map<uintptr_t, mapping> mappings;    /* base -> mapping */
uint64_t next_memfd = 1;
int driver_level = KVT_EMU_DRIVER_VMM;

void forget(ino_t ino)
{
	auto it = live.find(ino);
	if (it != live.end() && it->second.expired())
		live.erase(it);
}

CUresult cu_fail(CUresult r, const char *fmt, ...)
	__attribute__((format(printf, 2, 3)));
CUresult cu_fail(CUresult r, const char *fmt, ...)
{
	char b[512];
	va_list ap;
	va_start(ap, fmt);
	vsnprintf(b, sizeof(b), fmt, ap);
	va_end(ap);
	const char *s = nullptr;
	emu_cuGetErrorString(r, &s);
	note("%s: %s", b, s ? s : "CUDA driver error");
	return r;
}

/* The allocation properties cuMemCreate and the granularity accept: pinned
 * memory on device 0, shareable as an fd or not at all. */
CUresult check_prop(const char *fn, const CUmemAllocationProp *prop)
{
	if (!prop)
		return cu_fail(CUDA_ERROR_INVALID_VALUE, "%s: NULL prop", fn);
	if (prop->type != CU_MEM_ALLOCATION_TYPE_PINNED)
		return cu_fail(CUDA_ERROR_INVALID_VALUE, "%s: type %d", fn,
		               (int)prop->type);
	if (prop->location.type != CU_MEM_LOCATION_TYPE_DEVICE)
		return cu_fail(CUDA_ERROR_INVALID_VALUE,
		               "%s: location type %d", fn,
		               (int)prop->location.type);
	if (prop->location.id != 0)
		return cu_fail(CUDA_ERROR_INVALID_DEVICE,
		               "%s: device %d (the emulator has device 0)", fn,
		               prop->location.id);
	if (prop->requestedHandleTypes & ~CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR)
		return cu_fail(CUDA_ERROR_NOT_SUPPORTED,
		               "%s: handle types %#x (only "
		               "POSIX_FILE_DESCRIPTOR is emulated)",
		               fn, (unsigned)prop->requestedHandleTypes);
	return CUDA_SUCCESS;
}

bool granules(uint64_t n)
{
	return n && n % GRAN == 0;
}

/* The reservation holding [p, p + n), or reservations.end(). */
std::map<uintptr_t, size_t>::iterator reservation_of(uintptr_t p, size_t n)
{
	auto it = reservations.upper_bound(p);
	if (it == reservations.begin())
		return reservations.end();
	--it;
	return p - it->first < it->second && n <= it->second - (p - it->first)
	               ? it
	               : reservations.end();
}

/* True when [p, p + n) is exactly a run of adjacent whole mappings. */
bool whole_mappings(uintptr_t p, size_t n)
{
	uintptr_t end = p + n;
	while (p < end) {
		auto it = mappings.find(p);
		if (it == mappings.end())
			return false;
		p += it->second.bytes;
	}
	return n && p == end;
}

bool overlaps_mapping(uintptr_t p, size_t n)
{
	auto it = mappings.lower_bound(p + n);
	if (it == mappings.begin())
		return false;
	--it;
	return it->first + it->second.bytes > p;
}

/* A PROT_NONE placeholder over [p, p + n) (a reservation's pages). */
bool placeholder(uintptr_t p, size_t n)
{
	return mmap((void *)p, n, PROT_NONE,
	            MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE | MAP_FIXED, -1,
	            0) != MAP_FAILED;
}

} /* namespace */

} /* namespace kvt_emu */

using namespace kvt_emu;

/* ------------------------------------------------------ the entry points */

static CUresult CUDAAPI emu_cuGetErrorString(CUresult r, const char **s)
{
	if (!s)
		return CUDA_ERROR_INVALID_VALUE;
	switch (r) {
	case CUDA_SUCCESS:
		*s = "no error";
		break;
	case CUDA_ERROR_INVALID_VALUE:
		*s = "invalid argument";
		break;
	case CUDA_ERROR_OUT_OF_MEMORY:
		*s = "out of memory";
		break;
	case CUDA_ERROR_NO_DEVICE:
		*s = "no CUDA-capable device is detected";
		break;
	case CUDA_ERROR_INVALID_DEVICE:
		*s = "invalid device ordinal";
		break;
	case CUDA_ERROR_NOT_FOUND:
		*s = "named symbol not found";
		break;
	case CUDA_ERROR_NOT_SUPPORTED:
		*s = "operation not supported";
		break;
	case CUDA_ERROR_UNKNOWN:
		*s = "unknown error";
		break;
	default: /* as the driver: no text for a code it does not know */
		*s = nullptr;
		return CUDA_ERROR_INVALID_VALUE;
	}
	return CUDA_SUCCESS;
}

static CUresult CUDAAPI emu_cuDeviceGet(CUdevice *dev, int ordinal)
{
	EMU_API_LOCK();
	if (!dev)
		return cu_fail(CUDA_ERROR_INVALID_VALUE, "cuDeviceGet: NULL");
	if (ordinal != 0)
		return cu_fail(CUDA_ERROR_INVALID_DEVICE,
		               "cuDeviceGet(%d): the emulator has device 0",
		               ordinal);
	*dev = 0;
	return CUDA_SUCCESS;
}

static CUresult CUDAAPI emu_cuDeviceGetAttribute(int *pi,
                                                 CUdevice_attribute attrib,
                                                 CUdevice dev)
{
	EMU_API_LOCK();
	if (!pi)
		return cu_fail(CUDA_ERROR_INVALID_VALUE,
		               "cuDeviceGetAttribute: NULL");
	if (dev != 0)
		return cu_fail(CUDA_ERROR_INVALID_DEVICE,
		               "cuDeviceGetAttribute: device %d", dev);
	switch (attrib) {
	case CU_DEVICE_ATTRIBUTE_VIRTUAL_MEMORY_MANAGEMENT_SUPPORTED:
	case CU_DEVICE_ATTRIBUTE_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR_SUPPORTED:
		*pi = driver_level >= KVT_EMU_DRIVER_VMM;
		return CUDA_SUCCESS;
	default:
		return cu_fail(CUDA_ERROR_INVALID_VALUE,
		               "cuDeviceGetAttribute: attribute %d is not "
		               "emulated",
		               (int)attrib);
	}
}

static CUresult CUDAAPI emu_cuMemGetAllocationGranularity(
	size_t *granularity, const CUmemAllocationProp *prop,
	CUmemAllocationGranularity_flags option)
{
	EMU_API_LOCK();
	if (!granularity)
		return cu_fail(CUDA_ERROR_INVALID_VALUE,
		               "cuMemGetAllocationGranularity: NULL");
	CUresult r = check_prop("cuMemGetAllocationGranularity", prop);
	if (r != CUDA_SUCCESS)
		return r;
	if (option != CU_MEM_ALLOC_GRANULARITY_MINIMUM &&
	    option != CU_MEM_ALLOC_GRANULARITY_RECOMMENDED)
		return cu_fail(CUDA_ERROR_INVALID_VALUE,
		               "cuMemGetAllocationGranularity: option %d",
		               (int)option);
	*granularity = GRAN;
	return CUDA_SUCCESS;
}

static CUresult CUDAAPI emu_cuMemCreate(CUmemGenericAllocationHandle *handle,
                                        size_t size,
                                        const CUmemAllocationProp *prop,
                                        unsigned long long flags)
{
	EMU_API_LOCK();
	if (!handle)
		return cu_fail(CUDA_ERROR_INVALID_VALUE, "cuMemCreate: NULL");
	CUresult r = check_prop("cuMemCreate", prop);
	if (r != CUDA_SUCCESS)
		return r;
	if (flags)
		return cu_fail(CUDA_ERROR_INVALID_VALUE,
		               "cuMemCreate: flags %#llx", flags);
	if (!granules(size))
		return cu_fail(CUDA_ERROR_INVALID_VALUE,
		               "cuMemCreate(%zu): not a multiple of the "
		               "granularity %zu",
		               size, GRAN);
	char name[64];
	snprintf(name, sizeof(name), "%s%llu", MEMFD_PREFIX,
	         (unsigned long long)next_memfd++);
	int fd = memfd_create(name, MFD_CLOEXEC);
	void *m = MAP_FAILED;
	if (fd >= 0 && ftruncate(fd, (off_t)size) == 0)
		m = mmap(nullptr, size, PROT_READ | PROT_WRITE, MAP_SHARED, fd,
		         0);
	if (m == MAP_FAILED) {
		int e = errno;
		if (fd >= 0)
			close(fd);
		return cu_fail(CUDA_ERROR_OUT_OF_MEMORY, "cuMemCreate(%zu): %s",
		               size, strerror(e));
	}
	memset(m, 0xff, size); /* device memory starts out as garbage */
	munmap(m, size);
	add_device_bytes((long long)size);
	auto ph = std::make_shared<phys>(fd, size, true);
	live[ph->ino] = ph;
	*handle = next_handle++;
	handles[*handle] = handle_rec{
		ph, prop->requestedHandleTypes ==
		            CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR};
	return CUDA_SUCCESS;
}

static CUresult CUDAAPI emu_cuMemRelease(CUmemGenericAllocationHandle handle)
{
	EMU_API_LOCK();
	if (!handles.erase(handle))
		return cu_fail(CUDA_ERROR_INVALID_VALUE,
		               "cuMemRelease(%#llx): not a live handle",
		               (unsigned long long)handle);
	return CUDA_SUCCESS;
}

static CUresult CUDAAPI emu_cuMemExportToShareableHandle(
	void *shareableHandle, CUmemGenericAllocationHandle handle,
	CUmemAllocationHandleType handleType, unsigned long long flags)
{
	EMU_API_LOCK();
	if (!shareableHandle)
		return cu_fail(CUDA_ERROR_INVALID_VALUE,
		               "cuMemExportToShareableHandle: NULL");
	auto it = handles.find(handle);
	if (it == handles.end())
		return cu_fail(CUDA_ERROR_INVALID_VALUE,
		               "cuMemExportToShareableHandle(%#llx): not a live "
		               "handle",
		               (unsigned long long)handle);
	if (flags)
		return cu_fail(CUDA_ERROR_INVALID_VALUE,
		               "cuMemExportToShareableHandle: flags %#llx",
		               flags);
	if (handleType != CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR ||
	    !it->second.exportable)
		return cu_fail(CUDA_ERROR_INVALID_VALUE,
		               "cuMemExportToShareableHandle: type %d, not a "
		               "type the allocation was created with",
		               (int)handleType);
	int fd = dup(it->second.ph->fd);
	if (fd < 0)
		return cu_fail(CUDA_ERROR_OUT_OF_MEMORY,
		               "cuMemExportToShareableHandle: dup: %s",
		               strerror(errno));
	*(int *)shareableHandle = fd;
	return CUDA_SUCCESS;
}

static CUresult CUDAAPI emu_cuMemImportFromShareableHandle(
	CUmemGenericAllocationHandle *handle, void *osHandle,
	CUmemAllocationHandleType shHandleType)
{
	EMU_API_LOCK();
	if (!handle)
		return cu_fail(CUDA_ERROR_INVALID_VALUE,
		               "cuMemImportFromShareableHandle: NULL");
	if (shHandleType != CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR)
		return cu_fail(CUDA_ERROR_INVALID_VALUE,
		               "cuMemImportFromShareableHandle: type %d",
		               (int)shHandleType);
	int fd = (int)(intptr_t)osHandle;
	char path[64], got[128];
	snprintf(path, sizeof(path), "/proc/self/fd/%d", fd);
	ssize_t n = fd >= 0 ? readlink(path, got, sizeof(got) - 1) : -1;
	got[n > 0 ? n : 0] = '\0';
	struct stat st;
	if (n <= 0 || strncmp(got, "/memfd:", 7) ||
	    strncmp(got + 7, MEMFD_PREFIX, sizeof(MEMFD_PREFIX) - 1) ||
	    fstat(fd, &st) || !granules((uint64_t)st.st_size))
		return cu_fail(CUDA_ERROR_INVALID_VALUE,
		               "cuMemImportFromShareableHandle(fd %d): not an "
		               "fd from cuMemExportToShareableHandle (%s)",
		               fd, n > 0 ? got : "no such fd");
	std::shared_ptr<phys> ph;
	auto l = live.find(st.st_ino);
	if (l != live.end())
		ph = l->second.lock();
	if (!ph) {
		int own = fcntl(fd, F_DUPFD_CLOEXEC, 0);
		if (own < 0)
			return cu_fail(CUDA_ERROR_OUT_OF_MEMORY,
			               "cuMemImportFromShareableHandle: dup: %s",
			               strerror(errno));
		ph = std::make_shared<phys>(own, (size_t)st.st_size, false);
		live[ph->ino] = ph;
	}
	*handle = next_handle++;
	handles[*handle] = handle_rec{ph, true};
	return CUDA_SUCCESS;
}

static CUresult CUDAAPI emu_cuMemAddressReserve(CUdeviceptr *ptr, size_t size,
                                                size_t alignment,
                                                CUdeviceptr addr,
                                                unsigned long long flags)
{
	EMU_API_LOCK();
	if (!ptr)
		return cu_fail(CUDA_ERROR_INVALID_VALUE,
		               "cuMemAddressReserve: NULL");
	*ptr = 0;
	if (!granules(size))
		return cu_fail(CUDA_ERROR_INVALID_VALUE,
		               "cuMemAddressReserve(%zu): not a multiple of the "
		               "granularity %zu",
		               size, GRAN);
	if (alignment == 0)
		alignment = GRAN;
	if (alignment % GRAN || (alignment & (alignment - 1)))
		return cu_fail(CUDA_ERROR_INVALID_VALUE,
		               "cuMemAddressReserve: alignment %zu (a power of "
		               "two, in granules)",
		               alignment);
	if (flags)
		return cu_fail(CUDA_ERROR_INVALID_VALUE,
		               "cuMemAddressReserve: flags %#llx", flags);
	(void)addr; /* a hint; the driver may ignore it too */
	size_t span = size + alignment;
	void *m = mmap(nullptr, span, PROT_NONE,
	               MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
	if (m == MAP_FAILED)
		return cu_fail(CUDA_ERROR_OUT_OF_MEMORY,
		               "cuMemAddressReserve(%zu): %s", size,
		               strerror(errno));
	uintptr_t b = (uintptr_t)m, a = (b + alignment - 1) & ~(alignment - 1);
	if (a > b)
		munmap(m, a - b);
	if (b + span > a + size)
		munmap((void *)(a + size), b + span - (a + size));
	reservations[a] = size;
	*ptr = (CUdeviceptr)a;
	return CUDA_SUCCESS;
}

static CUresult CUDAAPI emu_cuMemAddressFree(CUdeviceptr ptr, size_t size)
{
	EMU_API_LOCK();
	auto it = reservations.find((uintptr_t)ptr);
	if (it == reservations.end() || it->second != size)
		return cu_fail(CUDA_ERROR_INVALID_VALUE,
		               "cuMemAddressFree(%#llx, %zu): not a reservation "
		               "of that size",
		               (unsigned long long)ptr, size);
	if (overlaps_mapping((uintptr_t)ptr, size))
		return cu_fail(CUDA_ERROR_INVALID_VALUE,
		               "cuMemAddressFree(%#llx): still mapped "
		               "(cuMemUnmap first)",
		               (unsigned long long)ptr);
	munmap((void *)(uintptr_t)ptr, size);
	reservations.erase(it);
	return CUDA_SUCCESS;
}

static CUresult CUDAAPI emu_cuMemMap(CUdeviceptr ptr, size_t size,
                                     size_t offset,
                                     CUmemGenericAllocationHandle handle,
                                     unsigned long long flags)
{
	EMU_API_LOCK();
	auto h = handles.find(handle);
	if (h == handles.end())
		return cu_fail(CUDA_ERROR_INVALID_VALUE,
		               "cuMemMap(%#llx): not a live handle",
		               (unsigned long long)handle);
	if (flags || offset)
		return cu_fail(CUDA_ERROR_INVALID_VALUE,
		               "cuMemMap: flags %#llx, offset %zu (both must be "
		               "0)",
		               flags, offset);
	uintptr_t p = (uintptr_t)ptr;
	if (!granules(size) || p % GRAN || size > h->second.ph->bytes)
		return cu_fail(CUDA_ERROR_INVALID_VALUE,
		               "cuMemMap(%#llx, %zu): not whole granules of the "
		               "%zu-byte allocation",
		               (unsigned long long)ptr, size,
		               h->second.ph->bytes);
	if (reservation_of(p, size) == reservations.end())
		return cu_fail(CUDA_ERROR_INVALID_VALUE,
		               "cuMemMap(%#llx, %zu): not inside one "
		               "cuMemAddressReserve range",
		               (unsigned long long)ptr, size);
	if (overlaps_mapping(p, size))
		return cu_fail(CUDA_ERROR_INVALID_VALUE,
		               "cuMemMap(%#llx, %zu): already mapped",
		               (unsigned long long)ptr, size);
	if (mmap((void *)p, size, PROT_NONE, MAP_SHARED | MAP_FIXED,
	         h->second.ph->fd, 0) == MAP_FAILED) {
		int e = errno;
		placeholder(p, size);
		return cu_fail(CUDA_ERROR_OUT_OF_MEMORY, "cuMemMap: mmap: %s",
		               strerror(e));
	}
	mappings[p] = mapping{size, h->second.ph, CU_MEM_ACCESS_FLAGS_PROT_NONE};
	return CUDA_SUCCESS;
}

static CUresult CUDAAPI emu_cuMemUnmap(CUdeviceptr ptr, size_t size)
{
	EMU_API_LOCK();
	uintptr_t p = (uintptr_t)ptr;
	if (!whole_mappings(p, size))
		return cu_fail(CUDA_ERROR_INVALID_VALUE,
		               "cuMemUnmap(%#llx, %zu): not a range of whole "
		               "mappings",
		               (unsigned long long)ptr, size);
	for (uintptr_t end = p + size; p < end;) {
		auto it = mappings.find(p);
		size_t n = it->second.bytes;
		drop_vmm_range((void *)p);
		placeholder(p, n);
		mappings.erase(it); /* the memory goes with its last holder */
		p += n;
	}
	return CUDA_SUCCESS;
}

static CUresult CUDAAPI emu_cuMemSetAccess(CUdeviceptr ptr, size_t size,
                                           const CUmemAccessDesc *desc,
                                           size_t count)
{
	EMU_API_LOCK();
	if (!desc || count == 0)
		return cu_fail(CUDA_ERROR_INVALID_VALUE,
		               "cuMemSetAccess: no access descriptor");
	int access = -1;
	for (size_t i = 0; i < count; i++) {
		if (desc[i].location.type != CU_MEM_LOCATION_TYPE_DEVICE)
			return cu_fail(CUDA_ERROR_INVALID_VALUE,
			               "cuMemSetAccess: location type %d",
			               (int)desc[i].location.type);
		if (desc[i].location.id != 0)
			return cu_fail(CUDA_ERROR_INVALID_DEVICE,
			               "cuMemSetAccess: device %d",
			               desc[i].location.id);
		if (desc[i].flags != CU_MEM_ACCESS_FLAGS_PROT_NONE &&
		    desc[i].flags != CU_MEM_ACCESS_FLAGS_PROT_READ &&
		    desc[i].flags != CU_MEM_ACCESS_FLAGS_PROT_READWRITE)
			return cu_fail(CUDA_ERROR_INVALID_VALUE,
			               "cuMemSetAccess: flags %d",
			               (int)desc[i].flags);
		access = desc[i].flags; /* the last one for device 0 wins */
	}
	uintptr_t p = (uintptr_t)ptr;
	if (!whole_mappings(p, size))
		return cu_fail(CUDA_ERROR_INVALID_VALUE,
		               "cuMemSetAccess(%#llx, %zu): not a range of whole "
		               "mappings",
		               (unsigned long long)ptr, size);
	int prot = access == CU_MEM_ACCESS_FLAGS_PROT_READWRITE
	                   ? PROT_READ | PROT_WRITE
	                   : access == CU_MEM_ACCESS_FLAGS_PROT_READ ? PROT_READ
	                                                             : PROT_NONE;
	for (uintptr_t end = p + size; p < end;) {
		mapping &m = mappings.find(p)->second;
		if (mprotect((void *)p, m.bytes, prot))
			return cu_fail(CUDA_ERROR_INVALID_VALUE,
			               "cuMemSetAccess: mprotect: %s",
			               strerror(errno));
		drop_vmm_range((void *)p);
		if (prot != PROT_NONE)
			add_vmm_range((void *)p, m.bytes,
			              !(prot & PROT_WRITE));
		m.access = access;
		p += m.bytes;
	}
	return CUDA_SUCCESS;
}

namespace kvt_emu {

void *driver_entry(const char *symbol)
{
	static const struct {
		const char *name;
		void *fn;
	} table[] = {
		{"cuGetErrorString", (void *)emu_cuGetErrorString},
		{"cuDeviceGet", (void *)emu_cuDeviceGet},
		{"cuDeviceGetAttribute", (void *)emu_cuDeviceGetAttribute},
		{"cuMemGetAllocationGranularity",
		 (void *)emu_cuMemGetAllocationGranularity},
		{"cuMemCreate", (void *)emu_cuMemCreate},
		{"cuMemRelease", (void *)emu_cuMemRelease},
		{"cuMemExportToShareableHandle",
		 (void *)emu_cuMemExportToShareableHandle},
		{"cuMemImportFromShareableHandle",
		 (void *)emu_cuMemImportFromShareableHandle},
		{"cuMemAddressReserve", (void *)emu_cuMemAddressReserve},
		{"cuMemAddressFree", (void *)emu_cuMemAddressFree},
		{"cuMemMap", (void *)emu_cuMemMap},
		{"cuMemUnmap", (void *)emu_cuMemUnmap},
		{"cuMemSetAccess", (void *)emu_cuMemSetAccess},
	};
	if (driver_level == KVT_EMU_DRIVER_NONE)
		return nullptr;
	for (const auto &e : table)
		if (!strcmp(e.name, symbol))
			return e.fn;
	return nullptr;
}

} /* namespace kvt_emu */

extern "C" int kvt_emu_set_driver(int level)
{
	EMU_API_LOCK();
	int old = driver_level;
	driver_level = level;
	return old;
}
