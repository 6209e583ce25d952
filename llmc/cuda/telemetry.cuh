/*
 * telemetry.cuh - reads the GPU's state for -lg (--gpu-log-every) into a GpuReading
 * (llmc/cuda/telemetry.h: what is printed and logged): device memory from cudaMemGetInfo (always),
 * and through NVML the SM clock and its maximum, the memory clock, temperature, power draw and
 * limit, utilisation and the clocks-event (throttle) reasons.
 *
 * NVML is optional and loaded at run time (dlopen of libnvidia-ml.so.1, which comes with the
 * driver, not the toolkit), so ./train_gpt has no link-time dependency on it and the few types
 * it needs are declared here. The NVML device is the one at the CUDA device's PCI bus id
 * (cudaDeviceGetPCIBusId -> nvmlDeviceGetHandleByPciBusId_v2): CUDA and NVML number devices
 * differently (CUDA_VISIBLE_DEVICES, CUDA_DEVICE_ORDER), bus ids are the same.
 *
 * Nothing here ends the run: when NVML is missing or does not know the device, every reading
 * has nvml = 0 (printed as "NVML unavailable") and why_unavailable says why; a query that fails
 * leaves its field out, and the first failure of each query is reported once on stdout.
 */
#ifndef LLMC_CUDA_TELEMETRY_CUH
#define LLMC_CUDA_TELEMETRY_CUH

#include <cuda_runtime.h>
#include <dlfcn.h>
#include <stdio.h>
#include <string.h>

#include "llmc/cuda/telemetry.h"

#define LLMC_NVML_LIBRARY "libnvidia-ml.so.1"

/* The subset of nvml.h used here. NVML returns nvmlReturn_t (an enum, 0 = NVML_SUCCESS) and
 * takes its enums by value: both are ints in the C ABI. */
typedef struct LlmcNvmlDevice_ *LlmcNvmlDevice; /* nvmlDevice_t */
typedef struct {
    unsigned int gpu, memory;                    /* nvmlUtilization_t, percent */
} LlmcNvmlUtilization;
enum { LLMC_NVML_SUCCESS = 0, LLMC_NVML_CLOCK_SM = 1, LLMC_NVML_CLOCK_MEM = 2, LLMC_NVML_TEMPERATURE_GPU = 0 };

typedef int (*LlmcNvmlVoidFn)(void);                                      /* nvmlInit_v2, nvmlShutdown */
typedef const char *(*LlmcNvmlErrorStringFn)(int);                        /* nvmlErrorString */
typedef int (*LlmcNvmlHandleByBusIdFn)(const char *, LlmcNvmlDevice *);   /* ..._HandleByPciBusId_v2 */
typedef int (*LlmcNvmlDeviceEnumUintFn)(LlmcNvmlDevice, int, unsigned int *); /* clock, max clock, temperature */
typedef int (*LlmcNvmlDeviceUintFn)(LlmcNvmlDevice, unsigned int *);      /* power usage / limit, mW */
typedef int (*LlmcNvmlUtilizationFn)(LlmcNvmlDevice, LlmcNvmlUtilization *);
typedef int (*LlmcNvmlReasonsFn)(LlmcNvmlDevice, unsigned long long *);   /* clocks-event reasons */

/* The queries a reading makes, one bit each in GpuTelemetry.reported (first failure printed). */
enum {
    GPU_QUERY_SM_CLOCK, GPU_QUERY_SM_MAX, GPU_QUERY_MEM_CLOCK, GPU_QUERY_TEMPERATURE, GPU_QUERY_POWER,
    GPU_QUERY_POWER_LIMIT, GPU_QUERY_UTILIZATION, GPU_QUERY_THROTTLE, GPU_QUERY_MEMINFO, GPU_NUM_QUERIES
};

typedef struct {
    int device;                 /* the CUDA device */
    void *lib;                  /* dlopen handle; NULL: NVML unavailable (why_unavailable says why) */
    LlmcNvmlDevice nvml_device;
    char bus_id[64];            /* e.g. "0000:3B:00.0" */
    char why_unavailable[384];
    unsigned reported;          /* GPU_QUERY_* bits whose failure was already printed */
    LlmcNvmlVoidFn shutdown;
    LlmcNvmlErrorStringFn error_string;
    LlmcNvmlDeviceEnumUintFn clock, max_clock, temperature;
    LlmcNvmlDeviceUintFn power, power_limit;
    LlmcNvmlUtilizationFn utilization;
    LlmcNvmlReasonsFn reasons;
    const char *reasons_name;   /* which NVML entry point answers the throttle reasons */
} GpuTelemetry;

/* Symbols are looked up by name; a missing one comes back NULL (an old driver lacks newer
 * entry points, which then count as failed queries). */
template <class Fn> inline Fn gpu_telemetry_symbol(void *lib, const char *name) {
    return reinterpret_cast<Fn>(dlsym(lib, name));
}

inline void gpu_telemetry_unload(GpuTelemetry *t) {
    if (t->lib) dlclose(t->lib);
    t->lib = NULL;
}

/* Loads NVML from nvml_library (LLMC_NVML_LIBRARY) and finds the CUDA device in it. Never fails:
 * on any problem t->lib is NULL and t->why_unavailable explains. */
inline void gpu_telemetry_open(GpuTelemetry *t, int device, const char *nvml_library) {
    memset(t, 0, sizeof *t);
    t->device = device;
    t->lib = dlopen(nvml_library, RTLD_NOW | RTLD_LOCAL);
    if (!t->lib) {
        const char *e = dlerror();
        snprintf(t->why_unavailable, sizeof t->why_unavailable, "%s", e ? e : nvml_library);
        return;
    }
    LlmcNvmlVoidFn init = gpu_telemetry_symbol<LlmcNvmlVoidFn>(t->lib, "nvmlInit_v2");
    t->shutdown = gpu_telemetry_symbol<LlmcNvmlVoidFn>(t->lib, "nvmlShutdown");
    t->error_string = gpu_telemetry_symbol<LlmcNvmlErrorStringFn>(t->lib, "nvmlErrorString");
    LlmcNvmlHandleByBusIdFn by_bus_id =
        gpu_telemetry_symbol<LlmcNvmlHandleByBusIdFn>(t->lib, "nvmlDeviceGetHandleByPciBusId_v2");
    if (!init || !t->shutdown || !t->error_string || !by_bus_id) {
        snprintf(t->why_unavailable, sizeof t->why_unavailable,
                 "%s lacks nvmlInit_v2/nvmlShutdown/nvmlErrorString/nvmlDeviceGetHandleByPciBusId_v2", nvml_library);
        gpu_telemetry_unload(t);
        return;
    }
    int st = init();
    if (st != LLMC_NVML_SUCCESS) {
        snprintf(t->why_unavailable, sizeof t->why_unavailable, "nvmlInit_v2: %s", t->error_string(st));
        gpu_telemetry_unload(t);
        return;
    }
    cudaError_t ce = cudaDeviceGetPCIBusId(t->bus_id, (int)sizeof t->bus_id, device);
    if (ce != cudaSuccess) {
        (void)cudaGetLastError(); /* not a training error: do not leave it for the next kernelCheck */
        snprintf(t->why_unavailable, sizeof t->why_unavailable, "cudaDeviceGetPCIBusId(%d): %s", device,
                 cudaGetErrorString(ce));
        t->shutdown();
        gpu_telemetry_unload(t);
        return;
    }
    st = by_bus_id(t->bus_id, &t->nvml_device);
    if (st != LLMC_NVML_SUCCESS) {
        snprintf(t->why_unavailable, sizeof t->why_unavailable, "NVML has no device at PCI bus id %s: %s", t->bus_id,
                 t->error_string(st));
        t->shutdown();
        gpu_telemetry_unload(t);
        return;
    }
    t->clock = gpu_telemetry_symbol<LlmcNvmlDeviceEnumUintFn>(t->lib, "nvmlDeviceGetClockInfo");
    t->max_clock = gpu_telemetry_symbol<LlmcNvmlDeviceEnumUintFn>(t->lib, "nvmlDeviceGetMaxClockInfo");
    t->temperature = gpu_telemetry_symbol<LlmcNvmlDeviceEnumUintFn>(t->lib, "nvmlDeviceGetTemperature");
    t->power = gpu_telemetry_symbol<LlmcNvmlDeviceUintFn>(t->lib, "nvmlDeviceGetPowerUsage");
    t->power_limit = gpu_telemetry_symbol<LlmcNvmlDeviceUintFn>(t->lib, "nvmlDeviceGetEnforcedPowerLimit");
    t->utilization = gpu_telemetry_symbol<LlmcNvmlUtilizationFn>(t->lib, "nvmlDeviceGetUtilizationRates");
    /* renamed in driver 535; the old name is kept for older drivers */
    t->reasons_name = "nvmlDeviceGetCurrentClocksEventReasons";
    t->reasons = gpu_telemetry_symbol<LlmcNvmlReasonsFn>(t->lib, t->reasons_name);
    if (!t->reasons) {
        t->reasons_name = "nvmlDeviceGetCurrentClocksThrottleReasons";
        t->reasons = gpu_telemetry_symbol<LlmcNvmlReasonsFn>(t->lib, t->reasons_name);
    }
}

inline void gpu_telemetry_close(GpuTelemetry *t) {
    if (t->lib) t->shutdown();
    gpu_telemetry_unload(t);
}

/* Prints the first failure of a query (what is left out of the lines from now on, and why). */
inline void gpu_telemetry_query_failed(GpuTelemetry *t, int query, const char *call, int status, const char *field) {
    if (t->reported & (1u << query)) return;
    t->reported |= 1u << query;
    printf("gpu telemetry: %s: %s; %s is left out while it fails\n", call,
           status < 0 ? "not in this NVML library" : t->error_string(status), field);
}

/* NVML query of one unsigned value through fn(device, [arg,] &value); -1 when it fails. */
inline int gpu_telemetry_uint(GpuTelemetry *t, int query, LlmcNvmlDeviceEnumUintFn fn, int arg, const char *call,
                              const char *field) {
    unsigned int v = 0;
    int st = fn ? fn(t->nvml_device, arg, &v) : -1;
    if (st == LLMC_NVML_SUCCESS) return (int)v;
    gpu_telemetry_query_failed(t, query, call, st, field);
    return -1;
}
inline double gpu_telemetry_watts(GpuTelemetry *t, int query, LlmcNvmlDeviceUintFn fn, const char *call, const char *field) {
    unsigned int mw = 0;
    int st = fn ? fn(t->nvml_device, &mw) : -1;
    if (st == LLMC_NVML_SUCCESS) return mw / 1000.0;
    gpu_telemetry_query_failed(t, query, call, st, field);
    return -1.0;
}

/* Reads everything available now. Synchronous, outside the timed step; never fails. */
inline void gpu_telemetry_read(GpuTelemetry *t, GpuReading *r) {
    gpu_reading_clear(r);
    size_t free_b = 0, total_b = 0;
    cudaError_t ce = cudaMemGetInfo(&free_b, &total_b);
    if (ce == cudaSuccess) {
        const double GiB = 1073741824.0;
        r->mem_used_gib = (double)(total_b - free_b) / GiB;
        r->mem_total_gib = (double)total_b / GiB;
    } else {
        (void)cudaGetLastError();
        if (!(t->reported & (1u << GPU_QUERY_MEMINFO)))
            printf("gpu telemetry: cudaMemGetInfo: %s; memory is left out while it fails\n", cudaGetErrorString(ce));
        t->reported |= 1u << GPU_QUERY_MEMINFO;
    }
    if (!t->lib) return;
    r->nvml = 1;
    r->sm_mhz = gpu_telemetry_uint(t, GPU_QUERY_SM_CLOCK, t->clock, LLMC_NVML_CLOCK_SM, "nvmlDeviceGetClockInfo(SM)", "the SM clock");
    r->sm_max_mhz = gpu_telemetry_uint(t, GPU_QUERY_SM_MAX, t->max_clock, LLMC_NVML_CLOCK_SM, "nvmlDeviceGetMaxClockInfo(SM)",
                                       "the SM clock maximum");
    r->mem_mhz = gpu_telemetry_uint(t, GPU_QUERY_MEM_CLOCK, t->clock, LLMC_NVML_CLOCK_MEM, "nvmlDeviceGetClockInfo(MEM)",
                                    "the memory clock");
    r->temp_c = gpu_telemetry_uint(t, GPU_QUERY_TEMPERATURE, t->temperature, LLMC_NVML_TEMPERATURE_GPU, "nvmlDeviceGetTemperature",
                                   "the temperature");
    r->power_w = gpu_telemetry_watts(t, GPU_QUERY_POWER, t->power, "nvmlDeviceGetPowerUsage", "the power draw");
    r->power_limit_w = gpu_telemetry_watts(t, GPU_QUERY_POWER_LIMIT, t->power_limit, "nvmlDeviceGetEnforcedPowerLimit",
                                           "the power limit");
    LlmcNvmlUtilization u = {0, 0};
    int st = t->utilization ? t->utilization(t->nvml_device, &u) : -1;
    if (st == LLMC_NVML_SUCCESS) r->util_pct = (int)u.gpu;
    else gpu_telemetry_query_failed(t, GPU_QUERY_UTILIZATION, "nvmlDeviceGetUtilizationRates", st, "the utilisation");
    unsigned long long reasons = 0;
    st = t->reasons ? t->reasons(t->nvml_device, &reasons) : -1;
    if (st == LLMC_NVML_SUCCESS) {
        r->have_throttle = 1;
        r->throttle = reasons;
    } else {
        gpu_telemetry_query_failed(t, GPU_QUERY_THROTTLE, t->reasons_name, st, "the throttle reasons");
    }
}

/* At startup: where the readings come from, then a probe reading, so that queries this device
 * does not answer are reported here rather than between the step lines. */
inline void gpu_telemetry_print_source(GpuTelemetry *t, int every) {
    if (t->lib)
        printf("gpu telemetry every %d step%s: NVML, device %s\n", every, every == 1 ? "" : "s", t->bus_id);
    else
        printf("gpu telemetry every %d step%s: NVML unavailable (%s); device memory only\n", every,
               every == 1 ? "" : "s", t->why_unavailable);
    GpuReading probe;
    gpu_telemetry_read(t, &probe);
}

#endif
