// fakecuda: a CUDA driver (libcuda.so.1) for testing the cuda device on machines without a GPU.
//
// It implements the driver calls gorgonia.org/cu's init and the cuda device make, with the driver's
// signatures (this file includes the real cuda.h, whose macros give the versioned names: cuMemAlloc is
// cuMemAlloc_v2, ...). Device memory is host memory: cuMemAlloc is posix_memalign, cuMemsetD8 is memset,
// and the virtual memory management API is real address-space management (cuMemAddressReserve reserves
// PROT_NONE pages, cuMemCreate makes a memfd, cuMemMap maps it into the reservation, cuMemSetAccess makes it
// readable and writable). Every byte a device allocates counts against a fixed capacity, so a driver out of
// memory happens exactly where the test wants it.
//
// Every other symbol the test binary imports from libcuda is a stub returning CUDA_ERROR_NOT_SUPPORTED,
// generated next to this file by .ci/cuda from the binary's own import list.
//
// Settings, from the environment at cuInit:
//   FAKECUDA_MEMORY          bytes of memory per device (default 64 MiB)
//   FAKECUDA_CONTEXT_MEMORY  bytes a primary context takes while retained (default 0)
//   FAKECUDA_DEVICES         number of devices (default 1)
//   FAKECUDA_VMM             0: report no virtual memory management support (default 1)
//   FAKECUDA_INIT_RESULT     the CUresult cuInit returns (default 0, CUDA_SUCCESS)
//   FAKECUDA_LOG             a file to which every call that changes memory appends one line:
//                            "<call> key=value ... result=<CUresult name>"
#define _GNU_SOURCE
#include <cuda.h>

#include <fcntl.h>
#include <pthread.h>
#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

#define FAKE_NAME "oomdbg fakecuda"
#define MAX_DEVICES 8
#define MAX_ITEMS 4096
#define GRANULARITY (2u << 20)
#define ALLOC_ALIGN 512 // cudaMalloc guarantees at least 256 bytes

// The primary context of a device. cuda.h declares the type incomplete; the driver completes it.
struct CUctx_st {
	int device;
	int refs;
};

typedef struct {
	uintptr_t ptr;
	size_t size;
	int device;
} allocation; // cuMemAlloc

typedef struct {
	int fd; // -1 when the slot is free
	size_t size;
	int device;
} physical; // cuMemCreate; the handle is the slot index + 1

typedef struct {
	uintptr_t ptr;
	size_t size;
	int accessible; // mappings only: cuMemSetAccess was called
} range;

static pthread_mutex_t mu = PTHREAD_MUTEX_INITIALIZER;
static int initialized;
static CUresult init_result;
static int num_devices = 1;
static size_t capacity = 64u << 20;
static size_t context_memory;
static int vmm = 1;
static int log_fd = -1;

static struct CUctx_st contexts[MAX_DEVICES];
static size_t used[MAX_DEVICES]; // bytes of cuMemAlloc and cuMemCreate
static allocation allocations[MAX_ITEMS];
static int num_allocations;
static physical physicals[MAX_ITEMS];
static range reservations[MAX_ITEMS];
static int num_reservations;
static range mappings[MAX_ITEMS];
static int num_mappings;

static __thread CUcontext current; // the context is per thread, as in the driver

static const struct {
	CUresult code;
	const char *name, *text;
} results[] = {
	{CUDA_SUCCESS, "CUDA_SUCCESS", "no error"},
	{CUDA_ERROR_INVALID_VALUE, "CUDA_ERROR_INVALID_VALUE", "invalid argument"},
	{CUDA_ERROR_OUT_OF_MEMORY, "CUDA_ERROR_OUT_OF_MEMORY", "out of memory"},
	{CUDA_ERROR_NOT_INITIALIZED, "CUDA_ERROR_NOT_INITIALIZED", "initialization error"},
	{CUDA_ERROR_NO_DEVICE, "CUDA_ERROR_NO_DEVICE", "no CUDA-capable device is detected"},
	{CUDA_ERROR_INVALID_DEVICE, "CUDA_ERROR_INVALID_DEVICE", "invalid device ordinal"},
	{CUDA_ERROR_INVALID_CONTEXT, "CUDA_ERROR_INVALID_CONTEXT", "invalid device context"},
	{CUDA_ERROR_ALREADY_MAPPED, "CUDA_ERROR_ALREADY_MAPPED", "resource already mapped"},
	{CUDA_ERROR_NOT_MAPPED, "CUDA_ERROR_NOT_MAPPED", "resource not mapped"},
	{CUDA_ERROR_INVALID_HANDLE, "CUDA_ERROR_INVALID_HANDLE", "invalid resource handle"},
	{CUDA_ERROR_NOT_SUPPORTED, "CUDA_ERROR_NOT_SUPPORTED", "operation not supported"},
	{CUDA_ERROR_UNKNOWN, "CUDA_ERROR_UNKNOWN", "unknown error"},
};

static const char *result_name(CUresult r) {
	for (size_t i = 0; i < sizeof results / sizeof results[0]; i++)
		if (results[i].code == r)
			return results[i].name;
	return "CUDA_ERROR_UNKNOWN";
}

// trace appends one line to FAKECUDA_LOG with a single write, so lines from several threads never mix.
static void trace(const char *format, ...) {
	if (log_fd < 0)
		return;
	char line[512];
	va_list ap;
	va_start(ap, format);
	int n = vsnprintf(line, sizeof line - 1, format, ap);
	va_end(ap);
	if (n < 0)
		return;
	if (n > (int)sizeof line - 2)
		n = sizeof line - 2;
	line[n++] = '\n';
	ssize_t w = write(log_fd, line, n);
	(void)w;
}

static size_t env_size(const char *name, size_t def) {
	const char *s = getenv(name);
	return s && *s ? strtoull(s, NULL, 0) : def;
}

// active returns the device of the calling thread's context, or -1 with the reason in *r.
static int active(CUresult *r) {
	if (!initialized) {
		*r = CUDA_ERROR_NOT_INITIALIZED;
		return -1;
	}
	if (current == NULL || current->refs == 0) {
		*r = CUDA_ERROR_INVALID_CONTEXT;
		return -1;
	}
	return current->device;
}

static size_t free_bytes(int dev) {
	size_t taken = used[dev] + (contexts[dev].refs > 0 ? context_memory : 0);
	return taken >= capacity ? 0 : capacity - taken;
}

// accessible_range reports whether [p, p+n) lies in one cuMemAlloc allocation or in mapped, accessible
// memory of a reservation.
static int accessible_range(uintptr_t p, size_t n) {
	for (int i = 0; i < num_allocations; i++)
		if (p >= allocations[i].ptr && p + n <= allocations[i].ptr + allocations[i].size)
			return 1;
	size_t covered = 0;
	for (int i = 0; i < num_mappings; i++) {
		range *m = &mappings[i];
		uintptr_t lo = p > m->ptr ? p : m->ptr, hi = p + n < m->ptr + m->size ? p + n : m->ptr + m->size;
		if (lo < hi) {
			if (!m->accessible)
				return 0;
			covered += hi - lo;
		}
	}
	return covered == n;
}

CUresult CUDAAPI cuInit(unsigned int flags) {
	pthread_mutex_lock(&mu);
	if (!initialized) {
		capacity = env_size("FAKECUDA_MEMORY", capacity);
		context_memory = env_size("FAKECUDA_CONTEXT_MEMORY", 0);
		num_devices = (int)env_size("FAKECUDA_DEVICES", 1);
		if (num_devices > MAX_DEVICES)
			num_devices = MAX_DEVICES;
		vmm = (int)env_size("FAKECUDA_VMM", 1);
		init_result = (CUresult)env_size("FAKECUDA_INIT_RESULT", CUDA_SUCCESS);
		const char *path = getenv("FAKECUDA_LOG");
		if (path && *path)
			log_fd = open(path, O_WRONLY | O_CREAT | O_APPEND | O_CLOEXEC, 0644);
		for (int d = 0; d < MAX_DEVICES; d++)
			contexts[d].device = d;
		for (int i = 0; i < MAX_ITEMS; i++)
			physicals[i].fd = -1;
	}
	CUresult r = flags != 0 ? CUDA_ERROR_INVALID_VALUE : init_result;
	if (r == CUDA_SUCCESS && num_devices == 0)
		r = CUDA_ERROR_NO_DEVICE;
	initialized = r == CUDA_SUCCESS;
	trace("cuInit result=%s", result_name(r));
	pthread_mutex_unlock(&mu);
	return r;
}

CUresult CUDAAPI cuDriverGetVersion(int *version) {
	if (!version)
		return CUDA_ERROR_INVALID_VALUE;
	*version = CUDA_VERSION;
	return CUDA_SUCCESS;
}

CUresult CUDAAPI cuGetErrorName(CUresult r, const char **s) {
	for (size_t i = 0; i < sizeof results / sizeof results[0]; i++)
		if (results[i].code == r) {
			*s = results[i].name;
			return CUDA_SUCCESS;
		}
	*s = NULL;
	return CUDA_ERROR_INVALID_VALUE;
}

CUresult CUDAAPI cuGetErrorString(CUresult r, const char **s) {
	for (size_t i = 0; i < sizeof results / sizeof results[0]; i++)
		if (results[i].code == r) {
			*s = results[i].text;
			return CUDA_SUCCESS;
		}
	*s = NULL;
	return CUDA_ERROR_INVALID_VALUE;
}

CUresult CUDAAPI cuDeviceGetCount(int *count) {
	if (!initialized)
		return CUDA_ERROR_NOT_INITIALIZED;
	*count = num_devices;
	return CUDA_SUCCESS;
}

CUresult CUDAAPI cuDeviceGet(CUdevice *dev, int ordinal) {
	if (!initialized)
		return CUDA_ERROR_NOT_INITIALIZED;
	if (ordinal < 0 || ordinal >= num_devices)
		return CUDA_ERROR_INVALID_DEVICE;
	*dev = ordinal;
	return CUDA_SUCCESS;
}

CUresult CUDAAPI cuDeviceGetName(char *name, int len, CUdevice dev) {
	if (!initialized)
		return CUDA_ERROR_NOT_INITIALIZED;
	if (dev < 0 || dev >= num_devices)
		return CUDA_ERROR_INVALID_DEVICE;
	if (!name || len <= 0)
		return CUDA_ERROR_INVALID_VALUE;
	snprintf(name, (size_t)len, "%s", FAKE_NAME);
	return CUDA_SUCCESS;
}

CUresult CUDAAPI cuDeviceTotalMem(size_t *bytes, CUdevice dev) {
	if (!initialized)
		return CUDA_ERROR_NOT_INITIALIZED;
	if (dev < 0 || dev >= num_devices)
		return CUDA_ERROR_INVALID_DEVICE;
	*bytes = capacity;
	return CUDA_SUCCESS;
}

CUresult CUDAAPI cuDeviceGetAttribute(int *value, CUdevice_attribute attr, CUdevice dev) {
	if (!initialized)
		return CUDA_ERROR_NOT_INITIALIZED;
	if (dev < 0 || dev >= num_devices)
		return CUDA_ERROR_INVALID_DEVICE;
	*value = attr == CU_DEVICE_ATTRIBUTE_VIRTUAL_MEMORY_MANAGEMENT_SUPPORTED ? vmm : 0;
	return CUDA_SUCCESS;
}

CUresult CUDAAPI cuDevicePrimaryCtxRetain(CUcontext *ctx, CUdevice dev) {
	if (!initialized)
		return CUDA_ERROR_NOT_INITIALIZED;
	if (dev < 0 || dev >= num_devices)
		return CUDA_ERROR_INVALID_DEVICE;
	pthread_mutex_lock(&mu);
	CUresult r = CUDA_SUCCESS;
	if (contexts[dev].refs == 0 && free_bytes(dev) < context_memory)
		r = CUDA_ERROR_OUT_OF_MEMORY;
	else {
		contexts[dev].refs++;
		*ctx = &contexts[dev];
	}
	trace("cuDevicePrimaryCtxRetain device=%d refs=%d result=%s", dev, contexts[dev].refs, result_name(r));
	pthread_mutex_unlock(&mu);
	return r;
}

CUresult CUDAAPI cuDevicePrimaryCtxRelease(CUdevice dev) {
	if (!initialized)
		return CUDA_ERROR_NOT_INITIALIZED;
	if (dev < 0 || dev >= num_devices)
		return CUDA_ERROR_INVALID_DEVICE;
	pthread_mutex_lock(&mu);
	CUresult r = contexts[dev].refs > 0 ? CUDA_SUCCESS : CUDA_ERROR_INVALID_CONTEXT;
	if (r == CUDA_SUCCESS)
		contexts[dev].refs--;
	trace("cuDevicePrimaryCtxRelease device=%d refs=%d result=%s", dev, contexts[dev].refs, result_name(r));
	pthread_mutex_unlock(&mu);
	return r;
}

CUresult CUDAAPI cuCtxSetCurrent(CUcontext ctx) {
	if (!initialized)
		return CUDA_ERROR_NOT_INITIALIZED;
	if (ctx != NULL && (ctx < contexts || ctx >= contexts + num_devices))
		return CUDA_ERROR_INVALID_CONTEXT;
	current = ctx;
	return CUDA_SUCCESS;
}

CUresult CUDAAPI cuCtxGetCurrent(CUcontext *ctx) {
	if (!initialized)
		return CUDA_ERROR_NOT_INITIALIZED;
	*ctx = current;
	return CUDA_SUCCESS;
}

CUresult CUDAAPI cuMemGetInfo(size_t *free_out, size_t *total_out) {
	CUresult r = CUDA_SUCCESS;
	pthread_mutex_lock(&mu);
	int dev = active(&r);
	if (dev >= 0) {
		*free_out = free_bytes(dev);
		*total_out = capacity;
	}
	pthread_mutex_unlock(&mu);
	return r;
}

CUresult CUDAAPI cuMemAlloc(CUdeviceptr *dptr, size_t size) {
	CUresult r = CUDA_SUCCESS;
	void *p = NULL;
	pthread_mutex_lock(&mu);
	int dev = active(&r);
	if (dev < 0)
		goto out;
	if (size == 0) {
		r = CUDA_ERROR_INVALID_VALUE;
	} else if (size > free_bytes(dev) || num_allocations == MAX_ITEMS) {
		r = CUDA_ERROR_OUT_OF_MEMORY;
	} else if (posix_memalign(&p, ALLOC_ALIGN, size) != 0) {
		r = CUDA_ERROR_OUT_OF_MEMORY;
	} else {
		allocations[num_allocations++] = (allocation){(uintptr_t)p, size, dev};
		used[dev] += size;
		*dptr = (CUdeviceptr)(uintptr_t)p;
	}
out:
	trace("cuMemAlloc_v2 size=%zu ptr=%#lx result=%s", size, (unsigned long)(uintptr_t)p, result_name(r));
	pthread_mutex_unlock(&mu);
	return r;
}

CUresult CUDAAPI cuMemFree(CUdeviceptr dptr) {
	CUresult r = CUDA_SUCCESS;
	size_t size = 0;
	pthread_mutex_lock(&mu);
	if (active(&r) < 0)
		goto out;
	r = CUDA_ERROR_INVALID_VALUE;
	for (int i = 0; i < num_allocations; i++) {
		if (allocations[i].ptr == (uintptr_t)dptr) {
			size = allocations[i].size;
			used[allocations[i].device] -= size;
			free((void *)allocations[i].ptr);
			allocations[i] = allocations[--num_allocations];
			r = CUDA_SUCCESS;
			break;
		}
	}
out:
	trace("cuMemFree_v2 ptr=%#llx size=%zu result=%s", (unsigned long long)dptr, size, result_name(r));
	pthread_mutex_unlock(&mu);
	return r;
}

CUresult CUDAAPI cuMemsetD8(CUdeviceptr dptr, unsigned char value, size_t n) {
	CUresult r = CUDA_SUCCESS;
	pthread_mutex_lock(&mu);
	if (active(&r) >= 0) {
		if (accessible_range((uintptr_t)dptr, n))
			memset((void *)(uintptr_t)dptr, value, n); // the host pages become resident, as the card's would
		else
			r = CUDA_ERROR_INVALID_VALUE;
	}
	trace("cuMemsetD8_v2 ptr=%#llx size=%zu result=%s", (unsigned long long)dptr, n, result_name(r));
	pthread_mutex_unlock(&mu);
	return r;
}

CUresult CUDAAPI cuMemGetAllocationGranularity(size_t *granularity, const CUmemAllocationProp *prop,
                                               CUmemAllocationGranularity_flags option) {
	if (!initialized)
		return CUDA_ERROR_NOT_INITIALIZED;
	if (!vmm)
		return CUDA_ERROR_NOT_SUPPORTED;
	if (option != CU_MEM_ALLOC_GRANULARITY_MINIMUM && option != CU_MEM_ALLOC_GRANULARITY_RECOMMENDED)
		return CUDA_ERROR_INVALID_VALUE;
	if (!granularity || !prop || prop->location.id < 0 || prop->location.id >= num_devices)
		return CUDA_ERROR_INVALID_VALUE;
	*granularity = GRANULARITY;
	return CUDA_SUCCESS;
}

CUresult CUDAAPI cuMemAddressReserve(CUdeviceptr *ptr, size_t size, size_t alignment, CUdeviceptr addr,
                                     unsigned long long flags) {
	CUresult r = CUDA_SUCCESS;
	void *p = MAP_FAILED;
	(void)addr; // a placement hint, which the driver may ignore
	pthread_mutex_lock(&mu);
	if (!initialized)
		r = CUDA_ERROR_NOT_INITIALIZED;
	else if (!vmm)
		r = CUDA_ERROR_NOT_SUPPORTED;
	else if (size == 0 || size % GRANULARITY != 0 || alignment % GRANULARITY != 0 || flags != 0 ||
	         num_reservations == MAX_ITEMS)
		r = CUDA_ERROR_INVALID_VALUE;
	else if ((p = mmap(NULL, size, PROT_NONE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0)) == MAP_FAILED)
		r = CUDA_ERROR_OUT_OF_MEMORY;
	else {
		reservations[num_reservations++] = (range){(uintptr_t)p, size, 0};
		*ptr = (CUdeviceptr)(uintptr_t)p;
	}
	trace("cuMemAddressReserve size=%zu ptr=%#lx result=%s", size,
	     (unsigned long)(p == MAP_FAILED ? 0 : (uintptr_t)p), result_name(r));
	pthread_mutex_unlock(&mu);
	return r;
}

CUresult CUDAAPI cuMemAddressFree(CUdeviceptr ptr, size_t size) {
	CUresult r = CUDA_ERROR_INVALID_VALUE;
	pthread_mutex_lock(&mu);
	for (int i = 0; i < num_reservations; i++) {
		if (reservations[i].ptr == (uintptr_t)ptr && reservations[i].size == size) {
			munmap((void *)reservations[i].ptr, size);
			reservations[i] = reservations[--num_reservations];
			r = CUDA_SUCCESS;
			break;
		}
	}
	trace("cuMemAddressFree ptr=%#llx size=%zu result=%s", (unsigned long long)ptr, size, result_name(r));
	pthread_mutex_unlock(&mu);
	return r;
}

CUresult CUDAAPI cuMemCreate(CUmemGenericAllocationHandle *handle, size_t size, const CUmemAllocationProp *prop,
                             unsigned long long flags) {
	CUresult r = CUDA_SUCCESS;
	int slot = -1;
	pthread_mutex_lock(&mu);
	int dev = prop ? prop->location.id : -1;
	if (!initialized)
		r = CUDA_ERROR_NOT_INITIALIZED;
	else if (!vmm)
		r = CUDA_ERROR_NOT_SUPPORTED;
	else if (!prop || prop->type != CU_MEM_ALLOCATION_TYPE_PINNED || prop->location.type != CU_MEM_LOCATION_TYPE_DEVICE ||
	         dev < 0 || dev >= num_devices || size == 0 || size % GRANULARITY != 0 || flags != 0)
		r = CUDA_ERROR_INVALID_VALUE;
	else if (size > free_bytes(dev))
		r = CUDA_ERROR_OUT_OF_MEMORY;
	else {
		for (int i = 0; i < MAX_ITEMS && slot < 0; i++)
			if (physicals[i].fd < 0)
				slot = i;
		int fd = slot < 0 ? -1 : memfd_create("fakecuda", MFD_CLOEXEC);
		if (fd < 0 || ftruncate(fd, (off_t)size) != 0) {
			if (fd >= 0)
				close(fd);
			slot = -1;
			r = CUDA_ERROR_OUT_OF_MEMORY;
		} else {
			physicals[slot] = (physical){fd, size, dev};
			used[dev] += size;
			*handle = (CUmemGenericAllocationHandle)(slot + 1);
		}
	}
	trace("cuMemCreate size=%zu handle=%d result=%s", size, slot + 1, result_name(r));
	pthread_mutex_unlock(&mu);
	return r;
}

CUresult CUDAAPI cuMemRelease(CUmemGenericAllocationHandle handle) {
	CUresult r = CUDA_ERROR_INVALID_HANDLE;
	size_t size = 0;
	pthread_mutex_lock(&mu);
	if (handle >= 1 && handle <= MAX_ITEMS && physicals[handle - 1].fd >= 0) {
		physical *ph = &physicals[handle - 1];
		// Mappings of the memory keep it alive in the driver; here the pages outlive the descriptor.
		close(ph->fd);
		ph->fd = -1;
		used[ph->device] -= ph->size;
		size = ph->size;
		r = CUDA_SUCCESS;
	}
	trace("cuMemRelease handle=%llu size=%zu result=%s", (unsigned long long)handle, size, result_name(r));
	pthread_mutex_unlock(&mu);
	return r;
}

CUresult CUDAAPI cuMemMap(CUdeviceptr ptr, size_t size, size_t offset, CUmemGenericAllocationHandle handle,
                          unsigned long long flags) {
	CUresult r = CUDA_SUCCESS;
	uintptr_t p = (uintptr_t)ptr;
	pthread_mutex_lock(&mu);
	int inside = 0;
	for (int i = 0; i < num_reservations && !inside; i++)
		inside = p >= reservations[i].ptr && p + size <= reservations[i].ptr + reservations[i].size;
	if (handle < 1 || handle > MAX_ITEMS || physicals[handle - 1].fd < 0)
		r = CUDA_ERROR_INVALID_HANDLE;
	else if (!inside || flags != 0 || size == 0 || p % GRANULARITY != 0 || offset + size > physicals[handle - 1].size ||
	         num_mappings == MAX_ITEMS)
		r = CUDA_ERROR_INVALID_VALUE;
	else {
		for (int i = 0; i < num_mappings; i++)
			if (p < mappings[i].ptr + mappings[i].size && mappings[i].ptr < p + size)
				r = CUDA_ERROR_ALREADY_MAPPED;
		if (r == CUDA_SUCCESS) {
			if (mmap((void *)p, size, PROT_NONE, MAP_SHARED | MAP_FIXED, physicals[handle - 1].fd, (off_t)offset) == MAP_FAILED)
				r = CUDA_ERROR_UNKNOWN;
			else
				mappings[num_mappings++] = (range){p, size, 0};
		}
	}
	trace("cuMemMap ptr=%#lx size=%zu handle=%llu result=%s", (unsigned long)p, size, (unsigned long long)handle,
	     result_name(r));
	pthread_mutex_unlock(&mu);
	return r;
}

CUresult CUDAAPI cuMemSetAccess(CUdeviceptr ptr, size_t size, const CUmemAccessDesc *desc, size_t count) {
	CUresult r = CUDA_SUCCESS;
	uintptr_t p = (uintptr_t)ptr;
	pthread_mutex_lock(&mu);
	size_t covered = 0;
	for (int i = 0; i < num_mappings; i++)
		if (mappings[i].ptr >= p && mappings[i].ptr + mappings[i].size <= p + size)
			covered += mappings[i].size;
	if (!desc || count != 1 || desc->location.type != CU_MEM_LOCATION_TYPE_DEVICE || desc->location.id < 0 ||
	    desc->location.id >= num_devices || desc->flags != CU_MEM_ACCESS_FLAGS_PROT_READWRITE)
		r = CUDA_ERROR_INVALID_VALUE;
	else if (size == 0 || covered != size)
		r = CUDA_ERROR_NOT_MAPPED;
	else if (mprotect((void *)p, size, PROT_READ | PROT_WRITE) != 0)
		r = CUDA_ERROR_UNKNOWN;
	else
		for (int i = 0; i < num_mappings; i++)
			if (mappings[i].ptr >= p && mappings[i].ptr + mappings[i].size <= p + size)
				mappings[i].accessible = 1;
	trace("cuMemSetAccess ptr=%#lx size=%zu result=%s", (unsigned long)p, size, result_name(r));
	pthread_mutex_unlock(&mu);
	return r;
}

CUresult CUDAAPI cuMemUnmap(CUdeviceptr ptr, size_t size) {
	CUresult r = CUDA_SUCCESS;
	uintptr_t p = (uintptr_t)ptr;
	pthread_mutex_lock(&mu);
	size_t covered = 0;
	for (int i = 0; i < num_mappings; i++)
		if (mappings[i].ptr >= p && mappings[i].ptr + mappings[i].size <= p + size)
			covered += mappings[i].size;
	if (size == 0 || covered != size)
		r = CUDA_ERROR_NOT_MAPPED;
	// Put the reservation's PROT_NONE pages back in place of the mapping.
	else if (mmap((void *)p, size, PROT_NONE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE | MAP_FIXED, -1, 0) == MAP_FAILED)
		r = CUDA_ERROR_UNKNOWN;
	else
		for (int i = 0; i < num_mappings;)
			if (mappings[i].ptr >= p && mappings[i].ptr + mappings[i].size <= p + size)
				mappings[i] = mappings[--num_mappings];
			else
				i++;
	trace("cuMemUnmap ptr=%#lx size=%zu result=%s", (unsigned long)p, size, result_name(r));
	pthread_mutex_unlock(&mu);
	return r;
}
