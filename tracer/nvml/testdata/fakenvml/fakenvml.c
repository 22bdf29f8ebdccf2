/*
 * fakenvml: a stand-in for libnvidia-ml.so.1, built by the tests of package tracer/nvml so the real
 * go-nvml binding path (dlopen, dlsym of versioned symbols, cgo calls) runs on machines without a GPU.
 *
 * It implements only the NVML entry points oomdbg calls, with the types and prototypes of NVIDIA's
 * nvml.h (NVML_NO_UNVERSIONED_FUNC_DEFS style: versioned names are the real symbol names). It reports two
 * devices named "Fake GPU 80GB" with the fixed readings below; the Go test holds the same numbers.
 *
 * Environment, read at call time:
 *   FAKENVML_INIT_RESULT  an nvmlReturn_t that nvmlInit_v2 returns instead of succeeding (e.g. 9,
 *                         NVML_ERROR_DRIVER_NOT_LOADED: the library is present but the kernel driver is not)
 *   FAKENVML_LOG          a file to which nvmlInit_v2 and nvmlShutdown append one line per call, so a test
 *                         can prove which of them ran
 *
 * Build: gcc -shared -fPIC -o libnvidia-ml.so.1 fakenvml.c
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

typedef enum nvmlReturn_enum {
    NVML_SUCCESS = 0,
    NVML_ERROR_UNINITIALIZED = 1,
    NVML_ERROR_INVALID_ARGUMENT = 2,
    NVML_ERROR_NOT_SUPPORTED = 3,
    NVML_ERROR_INSUFFICIENT_SIZE = 7,
    NVML_ERROR_DRIVER_NOT_LOADED = 9,
    NVML_ERROR_ARGUMENT_VERSION_MISMATCH = 25,
    NVML_ERROR_UNKNOWN = 999
} nvmlReturn_t;

/* As in nvml.h: an opaque handle. */
typedef struct nvmlDevice_st *nvmlDevice_t;

typedef struct nvmlMemory_st {
    unsigned long long total;
    unsigned long long free;
    unsigned long long used; /* v1: includes the memory reserved by the driver */
} nvmlMemory_t;

typedef struct nvmlMemory_v2_st {
    unsigned int version;
    unsigned long long total;
    unsigned long long reserved;
    unsigned long long free;
    unsigned long long used; /* v2: excludes the reserved memory */
} nvmlMemory_v2_t;

#define NVML_STRUCT_VERSION(data, ver) (unsigned int)(sizeof(nvml##data##_v##ver##_t) | (ver << 24U))

typedef struct nvmlUtilization_st {
    unsigned int gpu;
    unsigned int memory;
} nvmlUtilization_t;

typedef struct nvmlProcessInfo_v2_st {
    unsigned int pid;
    unsigned long long usedGpuMemory;
    unsigned int gpuInstanceId;
    unsigned int computeInstanceId;
} nvmlProcessInfo_v2_t, nvmlProcessInfo_t;

#define GiB (1024ULL * 1024ULL * 1024ULL)
#define MiB (1024ULL * 1024ULL)
#define NOT_AVAILABLE 0xFFFFFFFFFFFFFFFFULL /* NVML_VALUE_NOT_AVAILABLE as an unsigned long long */
#define NO_ID 0xFFFFFFFFU                   /* gpuInstanceId / computeInstanceId without MIG */

/* PID_SELF stands for the calling process, so the test can check a PID that /proc resolves. */
#define PID_SELF 0U
/* Above the kernel's largest pid_max (2^22), so no /proc entry can exist: a host PID seen from a container. */
#define PID_HIDDEN 4194309U
#define PID_HIDDEN_GRAPHICS 4194310U

struct proc {
    unsigned int pid;
    unsigned long long used;
};

struct nvmlDevice_st {
    const char *name;
    const char *uuid;
    unsigned long long total, reserved, used; /* v2 meanings; free = total - reserved - used */
    nvmlReturn_t utilResult;
    unsigned int utilGPU, utilMemory;
    unsigned int ncompute, ngraphics;
    struct proc compute[4], graphics[4];
};

static struct nvmlDevice_st devices[] = {
    {
        .name = "Fake GPU 80GB",
        .uuid = "GPU-fa4e0000-0000-4000-8000-000000000000",
        .total = 80 * GiB, .reserved = 512 * MiB, .used = 12 * GiB,
        .utilResult = NVML_SUCCESS, .utilGPU = 87, .utilMemory = 41,
        .ncompute = 2, .compute = {{PID_SELF, 8 * GiB}, {PID_HIDDEN, 2 * GiB}},
        .ngraphics = 1, .graphics = {{PID_HIDDEN, 2 * GiB}},
    },
    {
        .name = "Fake GPU 80GB",
        .uuid = "GPU-fa4e0000-0000-4000-8000-000000000001",
        .total = 80 * GiB, .reserved = 512 * MiB, .used = 1 * GiB + 300 * MiB,
        .utilResult = NVML_ERROR_NOT_SUPPORTED,
        .ncompute = 0,
        .ngraphics = 1, .graphics = {{PID_HIDDEN_GRAPHICS, NOT_AVAILABLE}},
    },
};
#define NDEVICES (sizeof devices / sizeof devices[0])

static int initCount; /* NVML reference-counts nvmlInit/nvmlShutdown pairs */

static void logCall(const char *what, nvmlReturn_t ret) {
    const char *path = getenv("FAKENVML_LOG");
    if (path == NULL || *path == '\0') {
        return;
    }
    FILE *f = fopen(path, "a");
    if (f != NULL) {
        fprintf(f, "%s %d\n", what, (int)ret);
        fclose(f);
    }
}

static int valid(nvmlDevice_t d) {
    for (unsigned int i = 0; i < NDEVICES; i++) {
        if (d == &devices[i]) {
            return 1;
        }
    }
    return 0;
}

/* check is the preamble of every device query. */
static nvmlReturn_t check(nvmlDevice_t d, const void *out) {
    if (initCount == 0) {
        return NVML_ERROR_UNINITIALIZED;
    }
    if (!valid(d) || out == NULL) {
        return NVML_ERROR_INVALID_ARGUMENT;
    }
    return NVML_SUCCESS;
}

static nvmlReturn_t copyString(char *dst, unsigned int length, const char *src) {
    if (dst == NULL) {
        return NVML_ERROR_INVALID_ARGUMENT;
    }
    if (strlen(src) + 1 > length) {
        return NVML_ERROR_INSUFFICIENT_SIZE;
    }
    strcpy(dst, src);
    return NVML_SUCCESS;
}

nvmlReturn_t nvmlInit_v2(void) {
    nvmlReturn_t ret = NVML_SUCCESS;
    const char *forced = getenv("FAKENVML_INIT_RESULT");
    if (forced != NULL && *forced != '\0') {
        ret = (nvmlReturn_t)atoi(forced);
    }
    if (ret == NVML_SUCCESS) {
        initCount++;
    }
    logCall("nvmlInit_v2", ret);
    return ret;
}

nvmlReturn_t nvmlShutdown(void) {
    nvmlReturn_t ret = NVML_SUCCESS;
    if (initCount == 0) {
        ret = NVML_ERROR_UNINITIALIZED;
    } else {
        initCount--;
    }
    logCall("nvmlShutdown", ret);
    return ret;
}

const char *nvmlErrorString(nvmlReturn_t result) {
    switch (result) {
    case NVML_SUCCESS:
        return "Success";
    case NVML_ERROR_UNINITIALIZED:
        return "Uninitialized";
    case NVML_ERROR_INVALID_ARGUMENT:
        return "Invalid Argument";
    case NVML_ERROR_NOT_SUPPORTED:
        return "Not Supported";
    case NVML_ERROR_INSUFFICIENT_SIZE:
        return "Insufficient Size";
    case NVML_ERROR_DRIVER_NOT_LOADED:
        return "Driver Not Loaded";
    case NVML_ERROR_ARGUMENT_VERSION_MISMATCH:
        return "Argument version mismatch";
    default:
        return "Unknown Error";
    }
}

nvmlReturn_t nvmlSystemGetDriverVersion(char *version, unsigned int length) {
    if (initCount == 0) {
        return NVML_ERROR_UNINITIALIZED;
    }
    return copyString(version, length, "999.99.01");
}

nvmlReturn_t nvmlDeviceGetCount_v2(unsigned int *deviceCount) {
    if (initCount == 0) {
        return NVML_ERROR_UNINITIALIZED;
    }
    if (deviceCount == NULL) {
        return NVML_ERROR_INVALID_ARGUMENT;
    }
    *deviceCount = NDEVICES;
    return NVML_SUCCESS;
}

nvmlReturn_t nvmlDeviceGetHandleByIndex_v2(unsigned int index, nvmlDevice_t *device) {
    if (initCount == 0) {
        return NVML_ERROR_UNINITIALIZED;
    }
    if (index >= NDEVICES || device == NULL) {
        return NVML_ERROR_INVALID_ARGUMENT;
    }
    *device = &devices[index];
    return NVML_SUCCESS;
}

nvmlReturn_t nvmlDeviceGetName(nvmlDevice_t device, char *name, unsigned int length) {
    nvmlReturn_t ret = check(device, name);
    return ret != NVML_SUCCESS ? ret : copyString(name, length, device->name);
}

nvmlReturn_t nvmlDeviceGetUUID(nvmlDevice_t device, char *uuid, unsigned int length) {
    nvmlReturn_t ret = check(device, uuid);
    return ret != NVML_SUCCESS ? ret : copyString(uuid, length, device->uuid);
}

nvmlReturn_t nvmlDeviceGetMemoryInfo(nvmlDevice_t device, nvmlMemory_t *memory) {
    nvmlReturn_t ret = check(device, memory);
    if (ret != NVML_SUCCESS) {
        return ret;
    }
    memory->total = device->total;
    memory->used = device->reserved + device->used;
    memory->free = device->total - memory->used;
    return NVML_SUCCESS;
}

nvmlReturn_t nvmlDeviceGetMemoryInfo_v2(nvmlDevice_t device, nvmlMemory_v2_t *memory) {
    nvmlReturn_t ret = check(device, memory);
    if (ret != NVML_SUCCESS) {
        return ret;
    }
    /* Like the driver: the caller must declare the struct layout it was compiled against. */
    if (memory->version != NVML_STRUCT_VERSION(Memory, 2)) {
        return NVML_ERROR_ARGUMENT_VERSION_MISMATCH;
    }
    memory->total = device->total;
    memory->reserved = device->reserved;
    memory->used = device->used;
    memory->free = device->total - device->reserved - device->used;
    return NVML_SUCCESS;
}

nvmlReturn_t nvmlDeviceGetUtilizationRates(nvmlDevice_t device, nvmlUtilization_t *utilization) {
    nvmlReturn_t ret = check(device, utilization);
    if (ret != NVML_SUCCESS) {
        return ret;
    }
    if (device->utilResult != NVML_SUCCESS) {
        return device->utilResult;
    }
    utilization->gpu = device->utilGPU;
    utilization->memory = device->utilMemory;
    return NVML_SUCCESS;
}

/* listProcesses follows NVML's protocol: too small a buffer gets the needed count and INSUFFICIENT_SIZE. */
static nvmlReturn_t listProcesses(const struct proc *procs, unsigned int n, unsigned int *infoCount,
                                  nvmlProcessInfo_t *infos) {
    if (infoCount == NULL) {
        return NVML_ERROR_INVALID_ARGUMENT;
    }
    if (*infoCount < n) {
        *infoCount = n;
        return NVML_ERROR_INSUFFICIENT_SIZE;
    }
    if (n > 0 && infos == NULL) {
        return NVML_ERROR_INVALID_ARGUMENT;
    }
    for (unsigned int i = 0; i < n; i++) {
        infos[i].pid = procs[i].pid == PID_SELF ? (unsigned int)getpid() : procs[i].pid;
        infos[i].usedGpuMemory = procs[i].used;
        infos[i].gpuInstanceId = NO_ID;
        infos[i].computeInstanceId = NO_ID;
    }
    *infoCount = n;
    return NVML_SUCCESS;
}

nvmlReturn_t nvmlDeviceGetComputeRunningProcesses_v3(nvmlDevice_t device, unsigned int *infoCount,
                                                     nvmlProcessInfo_t *infos) {
    nvmlReturn_t ret = check(device, infoCount);
    return ret != NVML_SUCCESS ? ret : listProcesses(device->compute, device->ncompute, infoCount, infos);
}

nvmlReturn_t nvmlDeviceGetGraphicsRunningProcesses_v3(nvmlDevice_t device, unsigned int *infoCount,
                                                      nvmlProcessInfo_t *infos) {
    nvmlReturn_t ret = check(device, infoCount);
    return ret != NVML_SUCCESS ? ret : listProcesses(device->graphics, device->ngraphics, infoCount, infos);
}
